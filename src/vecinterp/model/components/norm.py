"""Normalization layers: LayerNorm and RMSNorm, with or without learned weights."""

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig

_HALF = (torch.float16, torch.bfloat16)


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a :class:`Norm` computes its mean and scale in for inputs of ``dtype``:
    float32 for float16 and bfloat16, ``dtype`` itself otherwise.

    Example:
        >>> import torch
        >>> from vecinterp.model.components.norm import statistics_dtype
        >>> statistics_dtype(torch.float16), statistics_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in _HALF else dtype


class Norm(nn.Module):
    """One of ``LN``, ``LNPre``, ``RMS``, ``RMSPre`` (``cfg.normalization``).

    ``LN``: ``(x - mean(x)) / scale * w + b`` with ``scale = sqrt(var(x) + eps)``.
    ``RMS``: ``x / scale * w`` with ``scale = sqrt(mean(x^2) + eps)``.
    The ``Pre`` variants drop ``w`` and ``b`` (what folding produces).

    Hooks: ``hook_scale [batch, pos, 1]`` and ``hook_normalized [batch, pos, d_model]``
    (after centring and division, before ``w`` and ``b``).

    Precision: the mean, the scale and the division are computed in
    :func:`statistics_dtype` of the input: float32 for a float16 or bfloat16 model (as
    torch's ``layer_norm`` and transformers' ``LlamaRMSNorm`` do inside; in float16,
    ``x**2`` overflows above ``|x| ≈ 256`` and the scale would be inf), the model's own
    dtype otherwise (float32 and float64 unchanged). ``hook_scale`` holds the scale in
    that dtype (float32 for a half-precision model, so a hook that replaces it returns
    float32); ``hook_normalized`` and the output are in the model's dtype.
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
        dtype = x.dtype
        x = x.to(statistics_dtype(dtype))  # itself unless half precision
        if self.centre:
            # not torch.var_mean: it is ~6x slower on CPU for rows this short
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized((x / scale).to(dtype))
        if self.w is None:
            return x
        return x * self.w if self.b is None else torch.addcmul(self.b, x, self.w)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, eps={self.eps}"
