"""Linear embedding of input vectors into the residual stream."""

import torch
from jaxtyping import Float
from torch import nn

from ..config import VectorTransformerConfig
from ..contract import _plan

# the contraction's plan, made once at import: a forward calls it directly (under
# torch.compile, dynamo then traces a plain function instead of a cached lookup)
_EMBED = _plan("batch pos d_in, d_in d_model -> batch pos d_model")


class Embed(nn.Module):
    """``x W_E (+ b_E)``: each ``d_in`` input vector becomes a ``d_model`` vector.

    Parameters: ``W_E [d_in, d_model]`` and, with ``cfg.embed_bias``, ``b_E [d_model]``.
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_in, cfg.d_model))
        self.b_E = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.embed_bias else None

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_in"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        return _EMBED(x, self.W_E, self.b_E)
