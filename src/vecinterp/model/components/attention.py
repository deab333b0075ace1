"""Multi-head self-attention with a hook at every intermediate activation."""

import math

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ...hooks.hook_point import idle
from ..config import VectorTransformerConfig
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
    d_model]``. The layer's output is always ``Σ_h result_h + b_O`` computed the same way,
    so attaching or caching hooks never changes a bit of it.

    Layout: internally every per-head tensor is stored heads-first (``[n_heads, batch,
    pos, ...]``, one batched matrix product per step and no weight copies); hooks see
    the documented ``[batch, pos, n_heads, ...]`` axes as views of that storage, so an
    in-place edit in a hook is an edit of the activation itself.
    """

    mask_bias: torch.Tensor  # a non-persistent buffer registered in __init__

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
        self.n_heads = h
        future = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1)
        # added to the scores: 0 where a position may attend, -inf where it may not
        self.register_buffer(
            "mask_bias",
            torch.zeros(cfg.n_ctx, cfg.n_ctx).masked_fill(future, float("-inf")),
            persistent=False,
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
        if idle(
            self.hook_q,
            self.hook_k,
            self.hook_v,
            self.hook_attn_scores,
            self.hook_pattern,
            self.hook_z,
            self.hook_result,
            *((self.hook_rot_q, self.hook_rot_k) if self.rotary is not None else ()),
        ):
            return self._forward_idle(x)
        batch, n_pos, d_model = x.shape
        h = self.n_heads
        # [n_heads, batch*pos, d_model] view of x: q_h = x W_Q[h] + b_Q[h] for every head
        rows = x.reshape(1, batch * n_pos, d_model).expand(h, -1, -1)
        q = self.hook_q(_split(torch.baddbmm(self.b_Q.unsqueeze(1), rows, self.W_Q), batch))
        k = self.hook_k(_split(torch.baddbmm(self.b_K.unsqueeze(1), rows, self.W_K), batch))
        v = self.hook_v(_split(torch.baddbmm(self.b_V.unsqueeze(1), rows, self.W_V), batch))
        if self.rotary is not None:
            q = self.hook_rot_q(self.rotary(q))
            k = self.hook_rot_k(self.rotary(k))
        # [n_heads*batch, dest_pos, src_pos]: scores = q k^T / sqrt(d_head) (+ causal mask)
        q_hb, k_hb = _merge(q), _merge(k)
        if self.causal:
            scores = torch.baddbmm(
                self.mask_bias[:n_pos, :n_pos], q_hb, k_hb.transpose(1, 2), alpha=self.scale
            )
        else:
            scores = torch.bmm(q_hb, k_hb.transpose(1, 2)).mul_(self.scale)
        scores = _merge_scores(self.hook_attn_scores(_split_scores(scores, h)))
        pattern = _merge_scores(self.hook_pattern(_split_scores(scores.softmax(dim=-1), h)))
        # z = pattern v, then each head's result z_h W_O[h]
        z = self.hook_z(_split(torch.bmm(pattern, _merge(v)).view(h, -1, v.shape[-1]), batch))
        result = torch.bmm(_merge(z).view(h, batch * n_pos, -1), self.W_O)
        result = _merge(self.hook_result(_split(result, batch))).view(h, batch * n_pos, -1)
        return (result.sum(dim=0) + self.b_O).view(batch, n_pos, d_model)

    def _forward_idle(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """:meth:`forward` when none of its hook points has anything attached: the same
        kernels on the same storage, without the hook calls and without the round trips
        between the heads-first storage and the ``[batch, pos, n_heads, ...]`` views
        they would be shown, so the output is the same to the bit (tested)."""
        batch, n_pos, d_model = x.shape
        h = self.n_heads
        rows = x.reshape(1, batch * n_pos, d_model).expand(h, -1, -1)
        q = torch.baddbmm(self.b_Q.unsqueeze(1), rows, self.W_Q).view(h * batch, n_pos, -1)
        k = torch.baddbmm(self.b_K.unsqueeze(1), rows, self.W_K).view(h * batch, n_pos, -1)
        v = torch.baddbmm(self.b_V.unsqueeze(1), rows, self.W_V).view(h * batch, n_pos, -1)
        if self.rotary is not None:  # rotated as forward rotates them, on the same views
            q = _merge(self.rotary(_split(q.view(h, batch * n_pos, -1), batch)))
            k = _merge(self.rotary(_split(k.view(h, batch * n_pos, -1), batch)))
        if self.causal:
            scores = torch.baddbmm(
                self.mask_bias[:n_pos, :n_pos], q, k.transpose(1, 2), alpha=self.scale
            )
        else:
            scores = torch.bmm(q, k.transpose(1, 2)).mul_(self.scale)
        z = torch.bmm(scores.softmax(dim=-1), v).view(h, batch * n_pos, -1)
        result = torch.bmm(z, self.W_O)
        return (result.sum(dim=0) + self.b_O).view(batch, n_pos, d_model)


def _split(t: torch.Tensor, batch: int) -> torch.Tensor:
    """``[n_heads, batch*pos, d]`` storage as a ``[batch, pos, n_heads, d]`` view."""
    h, rows, d = t.shape
    return t.view(h, batch, rows // batch, d).permute(1, 2, 0, 3)


def _merge(t: torch.Tensor) -> torch.Tensor:
    """``[batch, pos, n_heads, d]`` as ``[n_heads*batch, pos, d]`` (a view when ``t``
    came from :func:`_split`, a copy when a hook replaced it)."""
    batch, n_pos, h, d = t.shape
    return t.permute(2, 0, 1, 3).reshape(h * batch, n_pos, d)


def _split_scores(t: torch.Tensor, h: int) -> torch.Tensor:
    """``[n_heads*batch, dest, src]`` storage as a ``[batch, n_heads, dest, src]`` view."""
    hb, dest, src = t.shape
    return t.view(h, hb // h, dest, src).transpose(0, 1)


def _merge_scores(t: torch.Tensor) -> torch.Tensor:
    batch, h, dest, src = t.shape
    return t.transpose(0, 1).reshape(h * batch, dest, src)
