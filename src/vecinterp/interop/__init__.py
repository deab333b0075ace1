"""Interoperability with other libraries (optional extras, imported only when used).

- TransformerLens 3 (``pip install "vecinterp[transformer-lens]"``):
  :func:`to_transformer_lens`, :func:`from_transformer_lens`, and
  :func:`tl_forward_vectors` / :func:`tl_run_with_cache_vectors` to run a TransformerLens
  model on vector inputs.
- Hugging Face transformers (``pip install "vecinterp[hf]"``): :func:`from_hf` imports a
  ``GPT2Model`` or a Llama-family backbone between two linear maps, :func:`to_hf` exports
  to one, and :func:`from_garg_checkpoint` opens a checkpoint of Garg et al.'s
  in-context-learning code.
- PyTorch: :func:`from_torch_encoder` imports a pre-norm ``nn.TransformerEncoder``,
  :func:`to_torch_encoder` exports to one.
"""

from .garg import from_garg_checkpoint
from .hf import from_hf, to_hf
from .torch_encoder import from_torch_encoder, to_torch_encoder
from .transformer_lens import (
    from_transformer_lens,
    tl_forward_vectors,
    tl_run_with_cache_vectors,
    to_transformer_lens,
)

__all__ = [
    "from_garg_checkpoint",
    "from_hf",
    "from_torch_encoder",
    "from_transformer_lens",
    "tl_forward_vectors",
    "tl_run_with_cache_vectors",
    "to_hf",
    "to_torch_encoder",
    "to_transformer_lens",
]
