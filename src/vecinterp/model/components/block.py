"""One pre-norm transformer block."""

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ..config import VectorTransformerConfig
from .attention import Attention, GroupedQueryAttention
from .mlp import MLP, GatedMLP
from .norm import Norm


def _maybe_norm(cfg: VectorTransformerConfig) -> nn.Module:
    return Norm(cfg) if cfg.normalization is not None else nn.Identity()


class TransformerBlock(nn.Module):
    """``resid_mid = resid_pre + attn(ln1(resid_pre))``;
    ``resid_post = resid_mid + mlp(ln2(resid_mid))`` (no MLP when ``attn_only``).

    Hooks: ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``,
    ``hook_resid_post``, all ``[batch, pos, d_model]`` (the last three of the MLP half only
    without ``attn_only``), plus those of ``ln1``, ``attn``, ``ln2`` and ``mlp``.
    """

    ln1: nn.Module
    attn: Attention
    ln2: nn.Module  # absent when attn_only
    mlp: MLP | GatedMLP  # absent when attn_only

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        # created in forward order, so that hook_dict lists hooks in the order they fire
        self.hook_resid_pre = HookPoint()
        self.ln1 = _maybe_norm(cfg)
        self.attn = GroupedQueryAttention(cfg) if cfg.is_gqa else Attention(cfg)
        self.hook_attn_out = HookPoint()
        self.attn_only = cfg.attn_only
        if not cfg.attn_only:
            self.hook_resid_mid = HookPoint()
            self.ln2 = _maybe_norm(cfg)
            self.mlp = GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self, resid_pre: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        resid = resid_pre + self.hook_attn_out(self.attn(self.ln1(resid_pre)))
        if not self.attn_only:
            resid = self.hook_resid_mid(resid)
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid)
