"""Rotary positional encoding of queries and keys (GPT-NeoX "rotate half" layout)."""

import torch
from jaxtyping import Float
from torch import nn

from ..config import VectorTransformerConfig

_Tables = tuple[torch.Tensor, torch.Tensor]


class Rotary(nn.Module):
    """Rotates each head's query/key by a position-dependent angle.

    Dimension ``i < d_head/2`` pairs with ``i + d_head/2``; the pair at position ``p`` is
    rotated by ``p * base^(-2i/d_head)``. The angles are computed in float64 (a few
    hundred numbers), so any model dtype gets correctly rounded tables; see :meth:`tables`.
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        half = cfg.d_head // 2
        self.inv_freq = cfg.rotary_base ** (
            -torch.arange(half, dtype=torch.float64) * 2 / cfg.d_head
        )
        self._tables: dict[tuple[int, torch.device, torch.dtype], _Tables] = {}

    def forward(
        self, x: Float[torch.Tensor, "batch pos n_heads d_head"]
    ) -> Float[torch.Tensor, "batch pos n_heads d_head"]:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        cos, sin = self.tables(x.shape[1], x.device, x.dtype)
        return x * cos + rotated * sin

    def tables(self, n_pos: int, device: torch.device, dtype: torch.dtype) -> _Tables:
        """``cos`` and ``sin`` of the angles ``[n_pos, 1, d_head]``, computed in float64
        and rounded to ``dtype`` once per ``(n_pos, device, dtype)``, then kept: the same
        numbers as computing them on every call, without that call's eight kernels (and,
        on a GPU, its copy of ``inv_freq`` to the device)."""
        if torch.compiler.is_compiling():
            # in the graph, for any n_pos (a lookup keyed by a dynamic length would
            # recompile per length): the same float64 angles, rounded to dtype once
            return _angles(n_pos, self.inv_freq.to(device), dtype)
        key = (n_pos, device, dtype)
        found = self._tables.get(key)
        if found is not None:
            return found
        # ordinary tensors even when first asked for under inference_mode, so that a later
        # forward with autograd may save them for backward
        with torch.inference_mode(False), torch.no_grad():
            found = _angles(n_pos, self.inv_freq.to(device), dtype)
        self._tables[key] = found
        return found


def _angles(n_pos: int, inv_freq: torch.Tensor, dtype: torch.dtype) -> _Tables:
    """``cos`` and ``sin`` ``[n_pos, 1, d_head]`` of ``p * inv_freq`` (both halves), in
    float64 rounded to ``dtype``."""
    pos = torch.arange(n_pos, dtype=torch.float64, device=inv_freq.device)
    angles = torch.outer(pos, inv_freq).repeat(1, 2)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)
