"""Additive positional embeddings: learned or fixed sinusoidal."""

import math

import torch
from jaxtyping import Float
from torch import nn

from ..config import VectorTransformerConfig


def sinusoidal_table(n_ctx: int, d_model: int) -> Float[torch.Tensor, "n_ctx d_model"]:
    """The fixed table of "Attention is all you need" (float64): ``sin`` on even, ``cos``
    on odd dims."""
    pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class PosEmbed(nn.Module):
    """``W_pos [n_ctx, d_model]``, row ``p`` added at position ``p``.

    Learned: a parameter. Sinusoidal: a fixed buffer (saved with the weights, so that
    weight processing that centres it round-trips).
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        else:
            self.register_buffer("W_pos", sinusoidal_table(cfg.n_ctx, cfg.d_model))

    def forward(self, batch: int, n_pos: int) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.W_pos[:n_pos].unsqueeze(0).expand(batch, n_pos, self.W_pos.shape[-1])
