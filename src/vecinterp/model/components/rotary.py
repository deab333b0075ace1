"""Rotary positional encoding of queries and keys (GPT-NeoX "rotate half" layout)."""

import torch
from jaxtyping import Float
from torch import nn

from ..config import VectorTransformerConfig


class Rotary(nn.Module):
    """Rotates each head's query/key by a position-dependent angle.

    Dimension ``i < d_head/2`` pairs with ``i + d_head/2``; the pair at position ``p`` is
    rotated by ``p * base^(-2i/d_head)``. The angles are computed in float64 on each call
    (a few hundred numbers), so any model dtype gets correctly rounded tables.
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        half = cfg.d_head // 2
        self.inv_freq = cfg.rotary_base ** (
            -torch.arange(half, dtype=torch.float64) * 2 / cfg.d_head
        )

    def forward(
        self, x: Float[torch.Tensor, "batch pos n_heads d_head"]
    ) -> Float[torch.Tensor, "batch pos n_heads d_head"]:
        n_pos = x.shape[1]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        pos = torch.arange(n_pos, dtype=torch.float64, device=x.device)
        angles = torch.outer(pos, self.inv_freq.to(x.device)).repeat(1, 2)[:, None, :]
        return x * angles.cos().to(x.dtype) + rotated * angles.sin().to(x.dtype)
