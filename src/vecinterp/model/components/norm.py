"""Normalization layers: LayerNorm and RMSNorm, with or without learned weights."""

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig


class Norm(nn.Module):
    """One of ``LN``, ``LNPre``, ``RMS``, ``RMSPre`` (``cfg.normalization``).

    ``LN``: ``(x - mean(x)) / scale * w + b`` with ``scale = sqrt(var(x) + eps)``.
    ``RMS``: ``x / scale * w`` with ``scale = sqrt(mean(x^2) + eps)``.
    The ``Pre`` variants drop ``w`` and ``b`` (what folding produces).

    Hooks: ``hook_scale [batch, pos, 1]`` and ``hook_normalized [batch, pos, d_model]``
    (after centring and division, before ``w`` and ``b``).
    """

    w: nn.Parameter | None
    b: nn.Parameter | None

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        self.kind: str = str(cfg.normalization)
        self.eps = cfg.eps
        self.centre = self.kind in ("LN", "LNPre")
        if self.kind in ("LN", "RMS"):
            self.w = nn.Parameter(torch.ones(cfg.d_model))
        else:
            self.w = None
        self.b = nn.Parameter(torch.zeros(cfg.d_model)) if self.kind == "LN" else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        if self.centre:
            # not torch.var_mean: it is ~6x slower on CPU for rows this short
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale)
        if self.w is None:
            return x
        return x * self.w if self.b is None else torch.addcmul(self.b, x, self.w)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, eps={self.eps}"
