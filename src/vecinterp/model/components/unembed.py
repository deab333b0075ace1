"""Linear read-out of the residual stream into output vectors."""

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig
from ..contract import _plan

# made once at import, as Embed's (see there)
_UNEMBED = _plan("batch pos d_model, d_model d_out -> batch pos d_out")


class Unembed(nn.Module):
    """``x W_U + b_U`` with ``W_U [d_model, d_out]``; ``hook_out`` sees the model's output."""

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        assert cfg.d_out is not None
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_out))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_out))
        self.hook_out = HookPoint()

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_out"]:
        return self.hook_out(_UNEMBED(x, self.W_U, self.b_U))
