"""A plain PyTorch transformer of the same math, written independently of vecinterp's
components: fused ``F.linear``/``F.layer_norm``/``scaled_dot_product_attention``, no
hooks, no einsum. Tests compare against it; benchmarks time against it."""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..model.config import VectorTransformerConfig

_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class PlainTransformer(nn.Module):
    """Weights as plain matrices in ``nn.Linear`` layout, built from a vecinterp state dict.

    Args:
        cfg: the configuration the state dict belongs to.
        state_dict: a :class:`~vecinterp.HookedVectorTransformer` state dict (its tensors
            are copied).

    Its ``forward`` maps ``[batch, pos, d_in]`` to ``[batch, pos, d_out]`` like the hooked
    model's.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.testing import PlainTransformer
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> plain = PlainTransformer(model.cfg, model.state_dict())
        >>> x = torch.randn(2, 5, 3)
        >>> bool(torch.allclose(plain(x), model(x), atol=1e-5))
        True
    """

    # buffers registered in __init__ (only for the matching cfg.positional)
    pos_fixed: torch.Tensor
    rot_cos: torch.Tensor
    rot_sin: torch.Tensor

    def __init__(self, cfg: VectorTransformerConfig, state_dict: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        sd = {k: v.detach().clone() for k, v in state_dict.items()}
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        kv = "_" if cfg.is_gqa else ""  # grouped-query keys and values: _W_K, ...
        p = nn.ParameterDict()
        p["embed_w"] = nn.Parameter(sd["embed.W_E"].T.contiguous())
        p["embed_b"] = nn.Parameter(
            sd.get("embed.b_E", torch.zeros(d, dtype=sd["embed.W_E"].dtype))
        )
        if cfg.positional == "learned":
            p["pos"] = nn.Parameter(sd["pos_embed.W_pos"])
        elif cfg.positional == "sinusoidal":
            self.register_buffer("pos_fixed", sd["pos_embed.W_pos"])
        for i in range(cfg.n_layers):
            b = f"blocks.{i}."
            names = ("attn.W_Q", f"attn.{kv}W_K", f"attn.{kv}W_V")
            qkv = [sd[b + n].permute(0, 2, 1).reshape(-1, d) for n in names]
            p[f"{i}_qkv_w"] = nn.Parameter(torch.cat(qkv))
            names = ("attn.b_Q", f"attn.{kv}b_K", f"attn.{kv}b_V")
            p[f"{i}_qkv_b"] = nn.Parameter(torch.cat([sd[b + n].reshape(-1) for n in names]))
            p[f"{i}_o_w"] = nn.Parameter(sd[b + "attn.W_O"].reshape(h * dh, d).T.contiguous())
            p[f"{i}_o_b"] = nn.Parameter(sd[b + "attn.b_O"])
            for ln in ("ln1", "ln2"):
                for wb in ("w", "b"):
                    if b + f"{ln}.{wb}" in sd:
                        p[f"{i}_{ln}_{wb}"] = nn.Parameter(sd[b + f"{ln}.{wb}"])
            if not cfg.attn_only:
                p[f"{i}_in_w"] = nn.Parameter(sd[b + "mlp.W_in"].T.contiguous())
                p[f"{i}_in_b"] = nn.Parameter(sd[b + "mlp.b_in"])
                if cfg.gated_mlp:
                    p[f"{i}_gate_w"] = nn.Parameter(sd[b + "mlp.W_gate"].T.contiguous())
                    p[f"{i}_gate_b"] = nn.Parameter(sd[b + "mlp.b_gate"])
                p[f"{i}_out_w"] = nn.Parameter(sd[b + "mlp.W_out"].T.contiguous())
                p[f"{i}_out_b"] = nn.Parameter(sd[b + "mlp.b_out"])
        for wb in ("w", "b"):
            if f"ln_final.{wb}" in sd:
                p[f"final_{wb}"] = nn.Parameter(sd[f"ln_final.{wb}"])
        p["unembed_w"] = nn.Parameter(sd["unembed.W_U"].T.contiguous())
        p["unembed_b"] = nn.Parameter(sd["unembed.b_U"])
        self.p = p
        if cfg.positional == "rotary":
            half = dh // 2
            inv = cfg.rotary_base ** (-torch.arange(half, dtype=torch.float64) * 2 / dh)
            ang = torch.outer(torch.arange(cfg.n_ctx, dtype=torch.float64), inv)
            self.register_buffer("rot_cos", ang.cos().to(p["embed_w"].dtype))
            self.register_buffer("rot_sin", ang.sin().to(p["embed_w"].dtype))

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        kind = self.cfg.normalization
        if kind is None:
            return x
        w = self.p[prefix + "_w"] if prefix + "_w" in self.p else None
        b = self.p[prefix + "_b"] if prefix + "_b" in self.p else None
        if kind in ("LN", "LNPre"):
            return F.layer_norm(x, (x.shape[-1],), w, b, self.cfg.eps)
        return F.rms_norm(x, (x.shape[-1],), w, self.cfg.eps)

    def _rotate(self, t: torch.Tensor) -> torch.Tensor:
        # t: [batch, heads, pos, d_head]; complex-number form of the rotate-half layout
        n = t.shape[-2]
        half = t.shape[-1] // 2
        re, im = t[..., :half], t[..., half:]
        cos, sin = self.rot_cos[:n], self.rot_sin[:n]
        return torch.cat([re * cos - im * sin, re * sin + im * cos], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, p = self.cfg, self.p
        batch, n, _ = x.shape
        h, dh, n_kv = cfg.n_heads, cfg.d_head, cfg.n_kv_heads
        resid = F.linear(x, p["embed_w"], p["embed_b"])
        if cfg.positional == "learned":
            resid = resid + p["pos"][:n]
        elif cfg.positional == "sinusoidal":
            resid = resid + self.pos_fixed[:n]
        for i in range(cfg.n_layers):
            qkv = F.linear(self._norm(resid, f"{i}_ln1"), p[f"{i}_qkv_w"], p[f"{i}_qkv_b"])
            q, k, v = qkv.split([h * dh, n_kv * dh, n_kv * dh], dim=-1)
            q = q.view(batch, n, h, dh).transpose(1, 2)
            k = k.view(batch, n, n_kv, dh).transpose(1, 2)
            v = v.view(batch, n, n_kv, dh).transpose(1, 2)
            if cfg.positional == "rotary":
                q, k = self._rotate(q), self._rotate(k)
            # enable_gqa: query head j reads key/value head j // (h // n_kv)
            z = F.scaled_dot_product_attention(
                q, k, v, is_causal=cfg.causal, scale=1 / math.sqrt(dh), enable_gqa=n_kv < h
            )
            z = z.transpose(1, 2).reshape(batch, n, h * dh)
            resid = resid + F.linear(z, p[f"{i}_o_w"], p[f"{i}_o_b"])
            if not cfg.attn_only:
                normed = self._norm(resid, f"{i}_ln2")
                hidden = F.linear(normed, p[f"{i}_in_w"], p[f"{i}_in_b"])
                if cfg.gated_mlp:  # act(gate) * linear, Llama's MLP
                    gate = F.linear(normed, p[f"{i}_gate_w"], p[f"{i}_gate_b"])
                    hidden = _ACTS[cfg.act_fn](gate) * hidden
                else:
                    hidden = _ACTS[cfg.act_fn](hidden)
                resid = resid + F.linear(hidden, p[f"{i}_out_w"], p[f"{i}_out_b"])
        return F.linear(self._norm(resid, "final"), p["unembed_w"], p["unembed_b"])
