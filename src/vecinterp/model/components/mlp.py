"""The position-wise two-layer perceptron."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig

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
        # what contract("batch pos d_model, d_model d_mlp -> batch pos d_mlp", ...) runs
        # (one addmm on the flattened rows), without its per-call bookkeeping
        batch, n_pos, d_model = x.shape
        pre = torch.addmm(self.b_in, x.reshape(-1, d_model), self.W_in)
        post = self.hook_post(self.act_fn(self.hook_pre(pre.view(batch, n_pos, -1))))
        out = torch.addmm(self.b_out, post.reshape(batch * n_pos, -1), self.W_out)
        return out.view(batch, n_pos, d_model)


class GatedMLP(nn.Module):
    """``(act(x W_gate + b_gate) * (x W_in + b_in)) W_out + b_out``: Llama's
    ``down_proj(act(gate_proj(x)) * up_proj(x))``, with its ``mlp_bias`` as the biases.

    Hooks, all ``[batch, pos, d_mlp]``: ``hook_pre`` (``x W_gate + b_gate``, the gate
    before the nonlinearity), ``hook_pre_linear`` (``x W_in + b_in``) and ``hook_post``
    (the product). TransformerLens's ``GatedMLP`` names its hooks the same, but has no
    gate bias and adds its ``b_in`` after the product; see
    :func:`~vecinterp.to_transformer_lens` for how the two map.
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        assert cfg.d_mlp is not None
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_gate = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        batch, n_pos, d_model = x.shape
        rows = x.reshape(-1, d_model)
        gate = self.hook_pre(torch.addmm(self.b_gate, rows, self.W_gate).view(batch, n_pos, -1))
        linear = torch.addmm(self.b_in, rows, self.W_in).view(batch, n_pos, -1)
        post = self.hook_post(self.act_fn(gate) * self.hook_pre_linear(linear))
        out = torch.addmm(self.b_out, post.reshape(batch * n_pos, -1), self.W_out)
        return out.view(batch, n_pos, d_model)
