"""Conversion to and from TransformerLens 3 ``HookedTransformer`` models.

TransformerLens (TL) is an optional extra: ``pip install "vecinterp[transformer-lens]"``.
It is imported inside the functions, never when :mod:`vecinterp` is imported.

The two libraries share parameter names and shapes, so a conversion copies every
parameter under the same name (``embed.W_E``, ``pos_embed.W_pos``,
``blocks.{l}.attn.W_Q``, ..., ``unembed.W_U``, ``unembed.b_U``); the configurations map as

==========================  ==========================================================
vecinterp                   TransformerLens ``HookedTransformerConfig``
==========================  ==========================================================
``d_in``, ``d_out``         ``d_vocab``, ``d_vocab_out``
``d_model``, ``d_head``,    the same names
``n_heads``, ``n_layers``,
``d_mlp``, ``n_ctx``,
``attn_only``, ``eps``
``act_fn``                  ``relu``, ``gelu``, ``silu``; ``gelu_tanh`` is
                            ``gelu_pytorch_tanh`` (TL's ``gelu_new`` and
                            ``gelu_fast`` are the same function and convert to
                            ``gelu_tanh``)
``normalization``           ``normalization_type`` (``LN``, ``LNPre``, ``RMS``,
                            ``RMSPre``, ``None``)
``positional``              ``positional_embedding_type``: ``"learned"`` is
                            ``"standard"``; ``"rotary"`` is ``"rotary"`` with
                            ``rotary_dim = d_head``, GPT-NeoX pairs
                            (``rotary_adjacent_pairs=False``) and ``rotary_base``
``causal``                  ``attention_dir`` (``"causal"`` / ``"bidirectional"``)
``gated_mlp``               ``gated_mlp``: TL's ``W_gate``, ``W_in``, ``W_out``,
                            ``b_out`` are ours; TL has no gate bias and adds its
                            ``b_in`` after the product (see below)
``n_key_value_heads``       ``n_key_value_heads`` (``None`` to TL when every query
                            head has its own; both store ``_W_K``, ``_W_V``,
                            ``_b_K``, ``_b_V`` ``[n_key_value_heads, ...]``)
``init``, ``init_range``    ``initializer_range`` (``init_std`` to TL; from TL,
                            ``init="transformer_lens"`` with TL's range: TL's
                            ``init_mode="gpt2"``)
==========================  ==========================================================

Gated MLPs: ours is Llama's ``(act(x W_gate + b_gate) * (x W_in + b_in)) W_out + b_out``,
TL's ``(act(x W_gate) * (x W_in) + b_in) W_out + b_out``. To TL a model converts exactly
when its ``b_gate`` and ``b_in`` are zero (then TL's ``b_in`` is 0), and is refused
otherwise: a bias before the product has no TL form. From TL, TL's post-product ``b_in``
is folded into ``b_out`` (``b_out + b_in W_out``; ``b_gate = b_in = 0``), which keeps every
output and every other activation exact, while ``hook_post`` is TL's minus the constant
``b_in``.

What cannot be converted raises a :class:`ValueError` listing every reason. From
vecinterp: ``embed_bias=True`` (TL's embedding has no bias); a gated MLP with a nonzero
``b_gate`` or ``b_in``; ``positional="sinusoidal"``
and ``"none"`` (TL has no fixed or absent absolute positions; with
``as_learned_positions=True`` they become a learned ``W_pos`` holding the fixed table or
zeros: the same function, but converting back gives ``positional="learned"``). From TL:
parallel attention and MLP, mixture of experts,
local attention, shortformer/ALiBi/relative positions, partial or adjacent-pair rotary,
rotary scaling (NTK, YaRN, dynamic NTK), a final RMS norm in an LN model, extra norms
(after the embedding, after each sub-layer, on queries and keys), soft caps, attention
sinks, Q/K/V clipping, log-n attention, an attention scale other than ``sqrt(d_head)``,
layer-index attention scaling, post-norm architectures, 4-bit weights, several devices,
and any activation function but the ones above.

Running the converted model on vectors (``x @ W_E`` in place of TL's token lookup) is
:func:`tl_forward_vectors` and :func:`tl_run_with_cache_vectors`, defined in
:mod:`vecinterp.interop.tl_vectors` and re-exported here.
"""

import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..model.config import VectorTransformerConfig
from ..model.transformer import HookedVectorTransformer
from ._tl import INSTALL_HINT as INSTALL_HINT
from ._tl import _check_tl_model, _transformer_lens
from .tl_vectors import tl_forward_vectors, tl_run_with_cache_vectors

__all__ = [
    "from_transformer_lens",
    "tl_forward_vectors",
    "tl_run_with_cache_vectors",
    "to_transformer_lens",
]

_ACT_TO_TL = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}
# gelu_new (GPT-2's) and gelu_fast are the tanh approximation written out by hand
_ACT_FROM_TL = {
    "relu": "relu",
    "gelu": "gelu",
    "silu": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}

# TL config fields that must hold their default for vecinterp to express the model:
# (field, required value, what a different value means)
_TL_REQUIRED: tuple[tuple[str, object, str], ...] = (
    ("parallel_attn_mlp", False, "attention and MLP in parallel"),
    ("num_experts", None, "a mixture of experts"),
    ("use_local_attn", False, "local attention"),
    ("post_embedding_ln", False, "a norm after the embedding"),
    ("use_normalization_before_and_after", False, "norms after each sub-layer"),
    ("use_qk_norm", False, "norms on queries and keys"),
    ("use_attn_scale", True, "unscaled attention scores"),
    ("scale_attn_by_inverse_layer_idx", False, "attention scaled by 1/(layer+1)"),
    ("clip_qkv", None, "clipped queries, keys and values"),
    ("use_logn_attn", False, "log-n attention scaling"),
    ("use_dynamic_ntk_rope", False, "dynamic NTK rotary scaling"),
    ("use_attention_sinks", False, "attention sinks"),
    ("load_in_4bit", False, "4-bit weights"),
    ("n_devices", 1, "a model split over several devices"),
)
_TL_ROTARY_REQUIRED: tuple[tuple[str, object, str], ...] = (
    ("rotary_adjacent_pairs", False, "GPT-J adjacent-pair rotary (vecinterp rotates halves)"),
    ("use_NTK_by_parts_rope", False, "NTK-by-parts rotary scaling"),
    ("use_yarn_rope", False, "YaRN rotary scaling"),
    ("rotary_scaling_factor", 1.0, "linearly scaled rotary positions"),
)


def _post_norm_architectures() -> set[str]:
    try:
        from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES
    except ImportError:  # an older TransformerLens 3 without post-norm models
        return set()
    return set(POST_NORM_ARCHITECTURES)


def _fail(what: str, problems: list[str]) -> None:
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise ValueError(f"cannot convert {what}:{listed}")


def to_transformer_lens(
    model: HookedVectorTransformer, *, as_learned_positions: bool = False
) -> nn.Module:
    """A TransformerLens ``HookedTransformer`` holding a copy of ``model``'s weights.

    ``d_vocab = d_in`` and ``d_vocab_out = d_out``: ``W_E [d_in, d_model]`` is TL's
    ``[d_vocab, d_model]`` table and ``W_U [d_model, d_out]`` its unembedding. Feed it
    vectors with :func:`tl_forward_vectors` (``x @ W_E + W_pos``, then
    ``start_at_layer=0``); its outputs and every activation the two models share agree
    with ``model``'s. The TL model is built on ``model``'s device and dtype, in the same
    train/eval mode, without touching the global random state; ``model`` is not
    modified. TL's deprecation warning for ``HookedTransformer`` (it is removed in TL 4)
    is silenced here.

    Args:
        model: the model to convert.
        as_learned_positions: convert ``positional="sinusoidal"`` (or ``"none"``) into a
            learned ``W_pos [n_ctx, d_model]`` holding the fixed table (or zeros): the same
            function, but :func:`from_transformer_lens` then gives ``"learned"``. Without
            it those configurations raise ``ValueError``.

    Returns:
        ``transformer_lens.HookedTransformer`` (its parameters are copies).

    Raises:
        ImportError: TransformerLens 3 is not installed.
        TypeError: ``model`` is not a :class:`~vecinterp.HookedVectorTransformer`.
        ValueError: the configuration has no TransformerLens equivalent (every reason is
            listed): ``embed_bias=True``; sinusoidal or no positions without
            ``as_learned_positions``; a gated MLP with a nonzero ``b_gate`` or ``b_in``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.interop.transformer_lens import to_transformer_lens
        >>> from vecinterp.interop.transformer_lens import tl_forward_vectors
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> tl_model = to_transformer_lens(model)
        >>> tl_model.cfg.d_vocab, tl_model.W_E.shape
        (3, torch.Size([3, 8]))
        >>> x = torch.randn(2, 5, 3)
        >>> torch.allclose(tl_forward_vectors(tl_model, x), model(x), atol=1e-6)
        True
    """
    tl = _transformer_lens()
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"expected a HookedVectorTransformer, got {type(model).__name__}")
    if not isinstance(as_learned_positions, bool):
        raise TypeError(f"as_learned_positions must be a bool, got {as_learned_positions!r}")
    cfg = model.cfg
    problems = []
    if cfg.embed_bias:
        problems.append(
            "embed_bias=True: TransformerLens's embedding has no bias b_E "
            "(fold b_E into W_pos first for a learned-position model)"
        )
    if cfg.gated_mlp and not cfg.attn_only:
        for name, b in model.named_parameters():
            if name.endswith(("mlp.b_gate", "mlp.b_in")) and bool(b.ne(0).any()):
                problems.append(
                    f"{name} is not zero: TransformerLens's gated MLP has no gate bias and "
                    "adds its b_in after the product (act(x W_gate) * (x W_in) + b_in), so "
                    "a bias before the product has no TransformerLens equivalent"
                )
    if cfg.positional in ("sinusoidal", "none") and not as_learned_positions:
        problems.append(
            f"positional={cfg.positional!r}: TransformerLens has learned ('standard') or "
            "rotary positions only; pass as_learned_positions=True to store "
            + ("the sinusoidal table" if cfg.positional == "sinusoidal" else "zeros")
            + " as a learned W_pos"
        )
    _fail("this HookedVectorTransformer to TransformerLens", problems)

    W_E = model.embed.W_E
    rotary = cfg.positional == "rotary"
    tl_cfg = tl.HookedTransformerConfig(
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        n_heads=cfg.n_heads,
        n_layers=cfg.n_layers,
        n_ctx=cfg.n_ctx,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.d_in,
        d_vocab_out=cfg.d_out,
        act_fn=_ACT_TO_TL[cfg.act_fn],
        eps=cfg.eps,
        normalization_type=cfg.normalization,
        positional_embedding_type="rotary" if rotary else "standard",
        rotary_dim=cfg.d_head if rotary else None,
        rotary_base=cfg.rotary_base,
        rotary_adjacent_pairs=False,
        attn_only=cfg.attn_only,
        attention_dir="causal" if cfg.causal else "bidirectional",
        gated_mlp=cfg.gated_mlp,
        n_key_value_heads=cfg.n_key_value_heads if cfg.is_gqa else None,
        initializer_range=cfg.init_std,
        init_weights=False,  # every weight is copied below; leaves the global RNG alone
        seed=None,
        dtype=W_E.dtype,
        device=str(W_E.device),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="HookedTransformer is deprecated", category=DeprecationWarning
        )
        tl_model = tl.HookedTransformer(tl_cfg)

    ours = dict(model.named_parameters())
    if cfg.positional != "learned" and not rotary:
        W_pos = (
            model.pos_embed.W_pos
            if model.pos_embed is not None
            else torch.zeros(cfg.n_ctx, cfg.d_model, dtype=W_E.dtype, device=W_E.device)
        )
        ours["pos_embed.W_pos"] = nn.Parameter(W_pos.detach(), requires_grad=True)
    # b_gate is zero (checked above) and TransformerLens has none; our b_in, zero too, is
    # TransformerLens's (post-product) b_in
    ours = {name: p for name, p in ours.items() if not name.endswith("mlp.b_gate")}
    _copy_parameters(ours, tl_model, "vecinterp", "TransformerLens")
    tl_model.train(model.training)
    return tl_model


def from_transformer_lens(tl_model: nn.Module) -> HookedVectorTransformer:
    """A :class:`~vecinterp.HookedVectorTransformer` holding a copy of a TransformerLens
    model's weights.

    The inverse of :func:`to_transformer_lens`: ``d_in = d_vocab``, ``d_out =
    d_vocab_out``, and the TL model's token table ``W_E [d_vocab, d_model]`` becomes the
    linear embedding (one-hot inputs reproduce the token model exactly). Converting a
    vecinterp model to TL and back gives the same configuration and a bit-identical
    state dict. The new model has ``tl_model``'s device, dtype and train/eval mode;
    ``tl_model`` is not modified.

    Args:
        tl_model: a ``transformer_lens.HookedTransformer``.

    Returns:
        The converted model.

    Raises:
        ImportError: TransformerLens 3 is not installed.
        TypeError: ``tl_model`` is not a ``HookedTransformer``.
        ValueError: its configuration has no vecinterp equivalent (every reason is
            listed; see the module docstring).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.interop.transformer_lens import (
        ...     from_transformer_lens, to_transformer_lens)
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> back = from_transformer_lens(to_transformer_lens(model))
        >>> back.cfg.init    # initialised as TransformerLens initialises; the range kept
        'transformer_lens'
        >>> back.cfg == model.cfg.replace(init="transformer_lens", init_range=0.02)
        True
        >>> all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
        True
    """
    tl = _transformer_lens()
    hooked: Any = _check_tl_model(tl, tl_model)
    c = hooked.cfg
    problems = [
        f"{field}={getattr(c, field)!r} ({meaning})"
        for field, required, meaning in _TL_REQUIRED
        if getattr(c, field, required) != required
    ]
    pos_type = c.positional_embedding_type
    if pos_type not in ("standard", "rotary"):
        problems.append(
            f"positional_embedding_type={pos_type!r} (vecinterp has 'standard' as "
            "positional='learned', and 'rotary')"
        )
    if pos_type == "rotary":
        problems += [
            f"{field}={getattr(c, field)!r} ({meaning})"
            for field, required, meaning in _TL_ROTARY_REQUIRED
            if getattr(c, field, required) != required
        ]
        if c.rotary_dim != c.d_head:
            problems.append(
                f"rotary_dim={c.rotary_dim} != d_head={c.d_head} (vecinterp rotates whole heads)"
            )
    if c.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre", None):
        problems.append(f"normalization_type={c.normalization_type!r}")
    if c.normalization_type in ("LN", "LNPre") and c.final_rms:
        problems.append("final_rms=True (an RMS norm before the unembedding of an LN model)")
    if not c.attn_only and c.act_fn not in _ACT_FROM_TL:
        problems.append(f"act_fn={c.act_fn!r} (vecinterp has {sorted(_ACT_FROM_TL)})")
    if c.attention_dir not in ("causal", "bidirectional"):
        problems.append(f"attention_dir={c.attention_dir!r}")
    if c.use_attn_scale and not math.isclose(c.attn_scale, math.sqrt(c.d_head), rel_tol=1e-12):
        problems.append(
            f"attn_scale={c.attn_scale} (vecinterp divides scores by sqrt(d_head)="
            f"{math.sqrt(c.d_head):g})"
        )
    for name, value in (
        ("attn_scores_soft_cap", getattr(c, "attn_scores_soft_cap", None)),
        ("output_logits_soft_cap", getattr(c, "output_logits_soft_cap", None)),
    ):
        if value is not None and value > 0:
            problems.append(f"{name}={value} (soft-capping)")
    if c.original_architecture in _post_norm_architectures():
        problems.append(f"original_architecture={c.original_architecture!r} (post-norm)")
    _fail("this TransformerLens model to vecinterp", problems)

    W_E = hooked.embed.W_E
    cfg = VectorTransformerConfig(
        d_in=c.d_vocab,
        d_out=c.d_vocab_out,
        d_model=c.d_model,
        d_head=c.d_head,
        n_heads=c.n_heads,
        n_layers=c.n_layers,
        n_ctx=c.n_ctx,
        d_mlp=c.d_mlp,
        act_fn="relu" if c.act_fn is None else _ACT_FROM_TL[c.act_fn],
        normalization=c.normalization_type,
        positional="rotary" if pos_type == "rotary" else "learned",
        attn_only=c.attn_only,
        causal=c.attention_dir == "causal",
        embed_bias=False,
        eps=float(c.eps),
        rotary_base=float(c.rotary_base),
        gated_mlp=bool(c.gated_mlp),
        n_key_value_heads=c.n_key_value_heads,
        init="transformer_lens",
        init_range=float(c.initializer_range),
    )
    model = HookedVectorTransformer(cfg, seed=0, dtype=W_E.dtype, device=W_E.device)
    _copy_parameters(_from_tl_parameters(hooked, cfg), model, "TransformerLens", "vecinterp")
    model.train(hooked.training)
    return model


def _from_tl_parameters(hooked: Any, cfg: VectorTransformerConfig) -> dict[str, torch.Tensor]:
    """``hooked``'s parameters under this library's names and meanings: a gated MLP's
    post-product ``b_in`` folded into ``b_out`` (``b_out + b_in W_out``, exact: the product
    plus a constant, then a linear map) with zero ``b_gate`` and ``b_in``; TL's
    grouped-query storage ``_W_K`` ... as ``W_K`` ... when every query head has its own
    key/value head."""
    params: dict[str, torch.Tensor] = dict(hooked.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        layer, leaf = name.rsplit(".", 1)
        if not cfg.is_gqa and leaf in ("_W_K", "_W_V", "_b_K", "_b_V"):
            out[f"{layer}.{leaf[1:]}"] = p
        elif cfg.gated_mlp and name.endswith("mlp.b_in"):
            W_out, b_out = params[layer + ".W_out"], params[layer + ".b_out"]
            with torch.no_grad():
                folded = b_out + p @ W_out
            out[layer + ".b_out"] = folded.requires_grad_(b_out.requires_grad)
            out[name] = torch.zeros_like(p).requires_grad_(p.requires_grad)
            out[layer + ".b_gate"] = torch.zeros_like(p).requires_grad_(p.requires_grad)
        elif not (cfg.gated_mlp and name.endswith("mlp.b_out")):
            out[name] = p
    return out


def _copy_parameters(
    source: Mapping[str, torch.Tensor], target: nn.Module, source_name: str, target_name: str
) -> None:
    """Copy ``source[name]`` into each parameter ``name`` of ``target``, after checking that
    both sides have the same names and shapes (a mismatch means a configuration the
    checks above did not anticipate)."""
    params = dict(target.named_parameters())
    problems = [
        f"{source_name} parameter {name} {tuple(source[name].shape)} has no counterpart"
        for name in sorted(set(source) - set(params))
    ]
    problems += [
        f"{target_name} parameter {name} has no counterpart in the {source_name} model"
        for name in sorted(set(params) - set(source))
    ]
    problems += [
        f"{name}: shape {tuple(source[name].shape)} vs {tuple(p.shape)}"
        for name, p in params.items()
        if name in source and source[name].shape != p.shape
    ]
    _fail(f"the {source_name} model's parameters", problems)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(source[name])
            p.requires_grad_(source[name].requires_grad)
