"""Import Hugging Face ``transformers`` backbones trained on vectors, and export back.

Most vector in-context-learning code (Garg et al., "What Can Transformers Learn
In-Context? A Case Study of Simple Function Classes", 2022, arXiv:2208.01066, and its
descendants) trains a Hugging Face backbone between two linear maps::

    read_in = nn.Linear(n_dims, n_embd)             # vectors in
    backbone = GPT2Model(GPT2Config(...))           # fed with inputs_embeds
    read_out = nn.Linear(n_embd, d_out)             # vectors out
    output = read_out(backbone(inputs_embeds=read_in(x)).last_hidden_state)

:func:`from_hf` turns the three into one :class:`~vecinterp.HookedVectorTransformer`
computing the same function; :func:`to_hf` goes back. ``transformers`` is an optional
extra (``pip install "vecinterp[hf]"``), imported only inside the functions.

Supported backbone classes: ``transformers.GPT2Model`` (see
:mod:`vecinterp.interop.hf_gpt2` for the mapping and what is refused) and the Llama
family, ``transformers.LlamaModel``, ``MistralModel`` and ``Qwen2Model`` (see
:mod:`vecinterp.interop.hf_llama`). Other classes raise
a ``TypeError`` naming the supported ones; a model with a head (``GPT2LMHeadModel``, ...)
is refused with the hint to pass its backbone (``model.transformer``, or
``model.model`` for ``LlamaForCausalLM`` and its relatives).
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..model.transformer import HookedVectorTransformer

__all__ = ["from_hf", "to_hf"]

INSTALL_HINT = 'pip install "vecinterp[hf]"'


def transformers_module() -> Any:
    """The ``transformers`` module, or an ``ImportError`` saying how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            f"importing or exporting Hugging Face models needs the optional transformers "
            f"package: {INSTALL_HINT}"
        ) from err
    return transformers


def _importers(transformers: Any) -> dict[type, Callable[..., HookedVectorTransformer]]:
    """The backbone classes :func:`from_hf` reads, and the converter of each (a new
    architecture adds an entry here)."""
    from .hf_gpt2 import from_gpt2
    from .hf_llama import from_llama

    return {
        transformers.GPT2Model: from_gpt2,
        transformers.LlamaModel: from_llama,
        transformers.MistralModel: from_llama,
        transformers.Qwen2Model: from_llama,
    }


def from_hf(
    backbone: nn.Module,
    read_in: nn.Linear | tuple[torch.Tensor, ...],
    read_out: nn.Linear | tuple[torch.Tensor, ...],
    *,
    dtype: torch.dtype | None = None,
    n_ctx: int | None = None,
) -> HookedVectorTransformer:
    """A :class:`~vecinterp.HookedVectorTransformer` computing
    ``read_out(backbone(inputs_embeds=read_in(x)).last_hidden_state)``.

    ``read_in``'s weight and bias become ``W_E`` and ``b_E`` (``embed_bias=True`` when it
    has a bias), ``read_out``'s become ``W_U`` and ``b_U`` (zeros without a bias), so
    ``d_in`` and ``d_out`` are theirs (Garg et al.'s models have ``d_out = 1``). The
    backbone's token table (``wte``) is not used: vector models feed ``inputs_embeds``.
    The new model holds copies (the source is not modified), on the backbone's device, in
    its dtype unless ``dtype`` says otherwise, in eval mode. It has no dropout: it computes
    the source as the source computes in eval mode (a source in training mode with a
    nonzero dropout is refused: call ``.eval()`` on it first). The MLP activation is read
    from the backbone's activation modules, not its config. Supported ``transformers``:
    4.46.3 to 5.24.0 (the ``hf`` extra's range; both ends are tested).

    Args:
        backbone: the Hugging Face backbone: a ``transformers.GPT2Model`` (see
            :mod:`vecinterp.interop.hf_gpt2`), or a ``LlamaModel``, ``MistralModel`` or
            ``Qwen2Model`` (RMSNorm, rotary positions, a gated MLP, grouped-query
            attention; see :mod:`vecinterp.interop.hf_llama`). For a model with a head,
            pass its backbone: ``GPT2LMHeadModel.transformer``, ``LlamaForCausalLM.model``
            (and likewise for Mistral's and Qwen2's).
        read_in: the map from input vectors to the backbone's width: an ``nn.Linear`` or
            ``(weight [d_model, d_in], bias [d_model])`` tensors in ``nn.Linear``'s layout
            (the bias may be left out).
        read_out: the map from the backbone's last hidden state to the outputs, likewise
            (``weight [d_out, d_model]``).
        dtype: the new model's dtype (default: the backbone's).
        n_ctx: the longest sequence the new model accepts, for backbones with rotary
            positions (Llama, Mistral, Qwen2; default: ``max_position_embeddings``, which
            must then be at most 4096). GPT-2's is its ``n_positions``, and giving
            ``n_ctx`` for it raises a ``ValueError``.

    Returns:
        The imported model.

    Raises:
        ImportError: ``transformers`` is not installed.
        TypeError: ``backbone`` is not a supported class, or ``read_in``/``read_out`` is
            neither an ``nn.Linear`` nor a tuple of tensors.
        ValueError: the backbone has a feature vecinterp cannot represent exactly (every
            reason is listed; see :mod:`vecinterp.interop.hf_gpt2` and
            :mod:`vecinterp.interop.hf_llama`), it is in training mode with a nonzero
            dropout, its tensors are on the meta device, or a shape does not fit.

    Example:
        >>> import torch, vecinterp as vi
        >>> from torch import nn
        >>> from transformers import GPT2Config, GPT2Model
        >>> backbone = GPT2Model(GPT2Config(
        ...     n_positions=8, n_embd=16, n_layer=2, n_head=4, vocab_size=1, bos_token_id=0,
        ...     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
        >>> read_in, read_out = nn.Linear(3, 16), nn.Linear(16, 1)
        >>> model = vi.from_hf(backbone, read_in=read_in, read_out=read_out)
        >>> model.cfg.d_in, model.cfg.d_out, model.cfg.act_fn, model.cfg.n_ctx
        (3, 1, 'gelu_tanh', 8)
        >>> x = torch.randn(2, 5, 3)
        >>> with torch.no_grad():
        ...     y = read_out(backbone(inputs_embeds=read_in(x)).last_hidden_state)
        ...     torch.allclose(model(x), y, atol=1e-5)
        True
    """
    transformers = transformers_module()
    importers = _importers(transformers)
    for cls, convert in importers.items():
        if not isinstance(backbone, cls):
            continue
        if n_ctx is None:
            return convert(backbone, read_in, read_out, dtype=dtype)
        if cls is transformers.GPT2Model:
            n_positions = backbone.config.n_positions  # type: ignore[union-attr]
            raise ValueError(
                f"n_ctx={n_ctx!r}: a GPT2Model's n_ctx is its n_positions ({n_positions}, "
                "the rows of its learned position table); leave n_ctx out"
            )
        return convert(backbone, read_in, read_out, dtype=dtype, n_ctx=n_ctx)
    supported = ", ".join(f"transformers.{cls.__name__}" for cls in importers)
    hint = ""
    for attr in ("transformer", "model"):  # GPT2LMHeadModel.transformer, LlamaFor*.model
        inner = getattr(backbone, attr, None)
        if any(isinstance(inner, cls) for cls in importers):
            hint = (
                f"; {type(backbone).__name__} has a head: pass its backbone, "
                f"{type(backbone).__name__}.{attr} ({type(inner).__name__}), and the head's "
                "linear map as read_out"
            )
    raise TypeError(
        f"from_hf reads {supported}; got {type(backbone).__module__}."
        f"{type(backbone).__name__}{hint}"
    )


def to_hf(
    model: HookedVectorTransformer, *, attn_implementation: str | None = None
) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """``(backbone, read_in, read_out)``: a ``transformers.GPT2Model`` (or, for a model
    with rotary positions, a gated MLP or grouped-query attention, a
    ``transformers.LlamaModel``) and two ``nn.Linear`` computing ``model``, the inverse of
    :func:`from_hf`.

    Llama holds a model with ``positional="rotary"``, ``normalization="RMS"`` (or
    ``"RMSPre"``, stored as weights of 1), ``gated_mlp=True``, causal attention and
    ``act_fn`` ``"silu"``, ``"gelu"``, ``"relu"`` or ``"gelu_tanh"``; its projections get
    biases (``attention_bias``, ``mlp_bias``) where any of the model's is nonzero.

    ``read_out(backbone(inputs_embeds=read_in(x)).last_hidden_state)`` equals
    ``model(x)`` (to rounding), and :func:`from_hf` of the three gives ``model``'s
    parameters back bit for bit. The copies are on ``model``'s device and dtype, in eval
    mode, with every dropout probability 0; the global random state is left alone.
    GPT-2 can represent a model with learned positions, ``normalization="LN"`` (or
    ``"LNPre"``, stored as LayerNorms of weight 1 and bias 0), ``act_fn`` ``"gelu_tanh"``
    (GPT-2's ``gelu_new``), ``"gelu"``, ``"relu"`` or ``"silu"``, ungated MLPs, causal
    attention and ``d_model = n_heads * d_head``; anything else (a gated MLP with learned
    positions or LayerNorm, say, which neither GPT-2 nor Llama holds) raises a
    ``ValueError`` listing every reason. The backbone's token table ``wte`` has one row
    (``vocab_size=1``): it is not used.

    Args:
        model: the model to export.
        attn_implementation: passed to ``transformers`` (``"eager"``, ``"sdpa"``; default:
            transformers' choice).

    Returns:
        ``(GPT2Model or LlamaModel, read_in, read_out)``.

    Raises:
        ImportError: ``transformers`` is not installed.
        TypeError: ``model`` is not a :class:`~vecinterp.HookedVectorTransformer`.
        ValueError: neither GPT-2 nor Llama can represent the model's configuration
            (both lists of reasons are given), or the installed ``transformers``' Llama
            cannot hold it (nonzero MLP biases without ``mlp_bias``).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6,
        ...     act_fn="gelu_tanh"), seed=0)
        >>> backbone, read_in, read_out = vi.to_hf(model)
        >>> type(backbone).__name__, backbone.config.activation_function
        ('GPT2Model', 'gelu_new')
        >>> x = torch.randn(2, 6, 3)
        >>> with torch.no_grad():
        ...     y = read_out(backbone(inputs_embeds=read_in(x)).last_hidden_state)
        ...     torch.allclose(model(x), y, atol=1e-6)
        True
    """
    transformers = transformers_module()
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"expected a HookedVectorTransformer, got {type(model).__name__}")
    from .hf_gpt2 import to_gpt2
    from .hf_llama import llama_problems, to_llama

    if not llama_problems(model.cfg):
        return to_llama(transformers, model, attn_implementation=attn_implementation)
    try:
        return to_gpt2(transformers, model, attn_implementation=attn_implementation)
    except ValueError as err:
        why_not_llama = "".join(f"\n  - {p}" for p in llama_problems(model.cfg))
        raise ValueError(f"{err}\nnor to Llama:{why_not_llama}") from None
