"""Multi-head self-attention with a hook at every intermediate activation."""

import math

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig
from ..contract import contract
from .rotary import Rotary


class Attention(nn.Module):
    """Multi-head attention on the (normalised) residual stream.

    ``q = x W_Q + b_Q`` (likewise ``k``, ``v``); ``scores = q k^T / sqrt(d_head)``, masked
    causally if ``cfg.causal``; ``pattern = softmax(scores)`` over source positions;
    ``z = pattern v``; each head writes ``result_h = z_h W_O[h]`` and the layer writes
    ``Σ_h result_h + b_O``.

    Hooks: ``hook_q``, ``hook_k``, ``hook_v``, ``hook_z`` ``[batch, pos, n_heads, d_head]``;
    ``hook_rot_q``, ``hook_rot_k`` (rotary only); ``hook_attn_scores`` and ``hook_pattern``
    ``[batch, n_heads, dest_pos, src_pos]``; ``hook_result`` ``[batch, pos, n_heads,
    d_model]``, computed only when a hook is attached to it (it costs ``n_heads`` times
    the memory of the output). Unless a hook edits ``hook_result``, the layer's output is
    computed the same way with or without it, so caching never changes a bit of it.
    """

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(h, d, dh))
        self.W_K = nn.Parameter(torch.empty(h, d, dh))
        self.W_V = nn.Parameter(torch.empty(h, d, dh))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        self.b_Q = nn.Parameter(torch.zeros(h, dh))
        self.b_K = nn.Parameter(torch.zeros(h, dh))
        self.b_V = nn.Parameter(torch.zeros(h, dh))
        self.b_O = nn.Parameter(torch.zeros(d))
        self.causal = cfg.causal
        self.scale = 1.0 / math.sqrt(dh)
        self.register_buffer(
            "future", torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1), persistent=False
        )
        self.rotary = Rotary(cfg) if cfg.positional == "rotary" else None
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        if self.rotary is not None:
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self.hook_result = HookPoint()

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        spec = "batch pos d_model, n_heads d_model d_head -> batch pos n_heads d_head"
        q = self.hook_q(contract(spec, x, self.W_Q, self.b_Q))
        k = self.hook_k(contract(spec, x, self.W_K, self.b_K))
        v = self.hook_v(contract(spec, x, self.W_V, self.b_V))
        if self.rotary is not None:
            q = self.hook_rot_q(self.rotary(q))
            k = self.hook_rot_k(self.rotary(k))
        scores = contract(
            "batch dest_pos n_heads d_head, batch src_pos n_heads d_head "
            "-> batch n_heads dest_pos src_pos",
            q,
            k,
        ).mul_(self.scale)
        if self.causal:
            n_pos = x.shape[1]
            scores.masked_fill_(self.future[:n_pos, :n_pos], float("-inf"))
        pattern = self.hook_pattern(self.hook_attn_scores(scores).softmax(dim=-1))
        z = self.hook_z(
            contract(
                "batch n_heads dest_pos src_pos, batch src_pos n_heads d_head "
                "-> batch dest_pos n_heads d_head",
                pattern,
                v,
            )
        )
        if self.hook_result.has_hooks:
            result = contract(
                "batch pos n_heads d_head, n_heads d_head d_model -> batch pos n_heads d_model",
                z,
                self.W_O,
            )
            # inference tensors keep no version counter: compare with a copy instead
            before = result.clone() if result.is_inference() else result._version
            hooked = self.hook_result(result)
            if hooked is not result or not _unchanged(result, before):
                # a hook edited the per-head outputs: the layer writes their sum
                return hooked.sum(dim=-2) + self.b_O
        # same arithmetic whether or not hook_result is read, so caching changes no bit
        return contract(
            "batch pos n_heads d_head, n_heads d_head d_model -> batch pos d_model",
            z,
            self.W_O,
            self.b_O,
        )


def _unchanged(t: torch.Tensor, before: torch.Tensor | int) -> bool:
    if isinstance(before, torch.Tensor):
        return torch.equal(t, before)
    return t._version == before
