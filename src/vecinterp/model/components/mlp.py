"""The position-wise two-layer perceptron."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig
from ..contract import contract

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class MLP(nn.Module):
    """``act(x W_in + b_in) W_out + b_out``.

    Hooks: ``hook_pre`` and ``hook_post`` ``[batch, pos, d_mlp]`` (before and after the
    nonlinearity).
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        assert cfg.d_mlp is not None
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        pre = self.hook_pre(
            contract("batch pos d_model, d_model d_mlp -> batch pos d_mlp", x, self.W_in, self.b_in)
        )
        post = self.hook_post(self.act_fn(pre))
        return contract(
            "batch pos d_mlp, d_mlp d_model -> batch pos d_model", post, self.W_out, self.b_out
        )
