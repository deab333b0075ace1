"""Hugging Face GPT-2 (``transformers.GPT2Model``) to and from vecinterp.

Used by :func:`vecinterp.from_hf` and :func:`vecinterp.to_hf`. The parameters map as

==================================  ====================================================
``GPT2Model``                       vecinterp
==================================  ====================================================
``read_in`` (``nn.Linear``)         ``embed.W_E = weight.T``, ``embed.b_E = bias``
``wpe.weight [n_positions, d]``     ``pos_embed.W_pos`` (``n_ctx = n_positions``)
``h.{i}.ln_1``, ``ln_2``            ``blocks.{i}.ln1``, ``ln2`` (``w``, ``b``)
``h.{i}.attn.c_attn`` (Conv1D,      ``W_Q``, ``W_K``, ``W_V [n_heads, d, d_head]`` and
``[d, 3d]``: Q, K, V side by side,  ``b_Q``, ``b_K``, ``b_V [n_heads, d_head]``
heads side by side in each)
``h.{i}.attn.c_proj``               ``W_O [n_heads, d_head, d]``, ``b_O``
``h.{i}.mlp.c_fc``, ``c_proj``      ``W_in``, ``b_in``, ``W_out``, ``b_out``
``ln_f``                            ``ln_final``
``read_out`` (``nn.Linear``)        ``unembed.W_U = weight.T``, ``unembed.b_U = bias``
``wte``                             not used (vector models feed ``inputs_embeds``)
==================================  ====================================================

and the configuration as ``n_embd`` -> ``d_model``, ``n_head`` -> ``n_heads`` (``d_head =
n_embd / n_head``), ``n_layer`` -> ``n_layers``, ``n_inner`` -> ``d_mlp`` (``4 n_embd``
when ``None``), ``layer_norm_epsilon`` -> ``eps``, ``initializer_range`` ->
``init_range`` (``init="gpt2"``: GPT-2's initialisation). The MLP activation is read from
the modules that compute it, ``h.{i}.mlp.act``, not from the config: each is run on probe
points in float64 and must equal one of vecinterp's ``act_fn`` to 1e-9, the same one in
every layer, so a backbone whose ``act`` was replaced (an activation-swap experiment)
imports as it computes, and one whose module computes none of them is refused. The
config's ``activation_function`` names map as ``gelu_new``, ``gelu_pytorch_tanh``,
``gelu_python_tanh`` and ``gelu_fast`` -> ``gelu_tanh`` (``gelu_fast`` writes sqrt(2/pi)
with 10 digits: a relative difference of 4e-12 in the tanh's argument), ``gelu`` and
``gelu_python`` -> ``gelu`` (exact erf), ``relu``, ``silu`` and ``swish`` -> ``relu`` and
``silu``. The model is causal, with learned positions and LayerNorm.

Attention scaling: vecinterp divides scores by ``sqrt(d_head)``. GPT-2 with
``scale_attn_weights=False`` (no division) or ``scale_attn_by_inverse_layer_idx=True``
(a further ``1/(layer + 1)``) is imported with the difference folded into ``W_Q`` and
``b_Q`` of each layer: the same scores, to rounding. ``reorder_and_upcast_attn=True``
makes GPT-2's eager attention compute its scores in float32 (the other implementations
ignore it; in float64 transformers' eager path raises, its float64 mask upcasting the
scores): in float32 and float64 that changes only rounding, and the import is accepted; a
float16 or bfloat16 import is refused, since vecinterp would compute the scores in half
precision, which the flag exists to avoid.

Refused before anything else, with a ``ValueError`` saying what to do: a backbone with
tensors on the meta device (no values), and one in training mode with a nonzero dropout
(its outputs are random; call ``.eval()`` on it first).

Refused, with every reason listed in one ``ValueError``: ``add_cross_attention=True``
(cross-attention blocks), ``is_causal=False`` in the config (bidirectional masks, which
transformers' SDPA path does not apply consistently), pruned heads, fused projections of
other shapes, activation functions other than the ones above, and layer norms of
different epsilons. Dropout (``resid_pdrop``, ``embd_pdrop``, ``attn_pdrop``) is
ignored in eval mode: the imported model computes the source in eval mode.
"""

import math
from typing import Any

import torch
from torch import nn

from ..model.config import VectorTransformerConfig
from ..model.transformer import HookedVectorTransformer
from ._convert import (
    build_model,
    check_dtype,
    check_source,
    copy_norm,
    embed_params,
    export_maps,
    fail,
    heads_in,
    heads_out,
    layer_norm_parts,
    linear_parts,
    ln_params,
    merge_heads_in,
    module_activations,
    module_device_dtype,
)

ACT_FROM_GPT2 = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
ACT_TO_GPT2 = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
_HALF = (torch.float16, torch.bfloat16)


def _score_factor(config: Any, layer: int, d_head: int) -> float:
    """What GPT-2's scores are multiplied by, relative to vecinterp's ``1/sqrt(d_head)``."""
    scale = d_head**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        scale /= float(layer + 1)
    return scale * math.sqrt(d_head)


def _problems(backbone: Any, dtype: torch.dtype) -> tuple[list[str], list[float], str]:
    """Everything about ``backbone`` vecinterp cannot represent, each norm's eps, and the
    activation its MLPs compute (read from the modules)."""
    c = backbone.config
    d = backbone.wpe.weight.shape[1]
    problems = []
    act = c.activation_function
    act_fn, act_problems = module_activations(
        [(f"h.{i}.mlp.act", block.mlp.act) for i, block in enumerate(backbone.h)]
    )
    if act not in ACT_FROM_GPT2 and (act_problems or act_fn is None):
        problems.append(
            f"activation_function={act!r} (vecinterp has {sorted(ACT_FROM_GPT2)} of GPT-2's)"
        )
    else:
        problems += act_problems
    if getattr(c, "add_cross_attention", False):
        problems.append(
            "add_cross_attention=True (cross-attention to an encoder's states; vecinterp "
            "models are decoders without an encoder)"
        )
    if getattr(c, "is_causal", True) is False:
        problems.append(
            "is_causal=False (transformers builds a bidirectional mask but its SDPA path may "
            "still run causally; convert a causal GPT-2)"
        )
    if getattr(c, "pruned_heads", None):
        problems.append(f"pruned heads {dict(c.pruned_heads)} (layers of fewer heads)")
    impl = getattr(c, "_attn_implementation", None) or "eager"
    unscaled = not getattr(c, "scale_attn_weights", True)
    by_layer = bool(getattr(c, "scale_attn_by_inverse_layer_idx", False))
    if (
        (unscaled or by_layer)
        and impl != "eager"
        and any(not hasattr(b.attn, "scaling") for b in backbone.h)
    ):
        # transformers 4.x passes no scale to SDPA (5.x passes attn.scaling)
        problems.append(
            f"scale_attn_weights={not unscaled} / scale_attn_by_inverse_layer_idx={by_layer} "
            f"with attn_implementation={impl!r}: this transformers' {impl} attention for GPT-2 "
            "ignores both (only its eager path applies them), so the source computes two "
            "different functions; build or load it with attn_implementation='eager' (or use "
            "transformers >= 5, whose every path applies them)"
        )
    if getattr(c, "reorder_and_upcast_attn", False) and dtype in _HALF:
        problems.append(
            f"reorder_and_upcast_attn=True with dtype={dtype}: GPT-2 computes the attention "
            "scores in float32 and vecinterp would compute them in "
            f"{dtype}; import in float32 or float64 (dtype=torch.float32)"
        )
    eps = []
    for i, block in enumerate(backbone.h):
        if getattr(block.attn, "pruned_heads", None):
            problems.append(f"h.{i}.attn has pruned heads {sorted(block.attn.pruned_heads)}")
        if tuple(block.attn.c_attn.weight.shape) != (d, 3 * d):
            problems.append(
                f"h.{i}.attn.c_attn.weight has shape {tuple(block.attn.c_attn.weight.shape)}, "
                f"not ({d}, {3 * d}) (n_embd={d}, query, key and value)"
            )
        for name in ("ln_1", "ln_2"):
            *_, e, found = layer_norm_parts(f"h.{i}.{name}", getattr(block, name), d)
            problems += found
            eps.append(e)
    *_, e, found = layer_norm_parts("ln_f", backbone.ln_f, d)
    problems += found
    eps.append(e)
    if not problems and len(set(eps)) > 1:
        problems.append(f"layer norms of different eps {sorted(set(eps))} (vecinterp has one eps)")
    return problems, eps, act_fn or ACT_FROM_GPT2.get(act, "")


def from_gpt2(
    backbone: Any,
    read_in: object,
    read_out: object,
    *,
    dtype: torch.dtype | None = None,
) -> HookedVectorTransformer:
    """:func:`vecinterp.from_hf` for a ``transformers.GPT2Model`` (see the module docstring)."""
    c = backbone.config
    check_source(type(backbone).__name__, backbone)
    device, source_dtype = module_device_dtype(backbone)
    dtype = check_dtype(dtype, source_dtype)
    n_ctx, d = backbone.wpe.weight.shape
    n_heads = c.n_head
    d_head = d // n_heads
    w_in = linear_parts("read_in", read_in, d_out=d)
    w_out = linear_parts("read_out", read_out, d_in=d)
    problems, eps, act_fn = _problems(backbone, dtype)
    fail(f"this {type(backbone).__name__} to vecinterp", problems)

    init_range = getattr(c, "initializer_range", None)
    if not (isinstance(init_range, float | int) and 0 < init_range <= 1000):
        init_range = None
    cfg = VectorTransformerConfig(
        d_in=w_in[0].shape[1],
        d_out=w_out[0].shape[0],
        d_model=d,
        d_head=d_head,
        n_heads=n_heads,
        n_layers=len(backbone.h),
        n_ctx=n_ctx,
        d_mlp=backbone.h[0].mlp.c_fc.weight.shape[1] if len(backbone.h) else None,
        act_fn=act_fn,
        normalization="LN",
        positional="learned",
        causal=True,
        embed_bias=w_in[1] is not None,
        eps=eps[0],
        init="gpt2",
        init_range=None if init_range is None else float(init_range),
    )
    params = embed_params(w_in, w_out)
    params["pos_embed.W_pos"] = backbone.wpe.weight.detach()
    for i, block in enumerate(backbone.h):
        p = f"blocks.{i}"
        attn, mlp = block.attn, block.mlp
        w, b = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()
        factor = _score_factor(c, i, d_head)
        if factor != 1.0:  # fold GPT-2's other score scale into the queries, in float64
            w = torch.cat([w[:, :d].double() * factor, w[:, d:].double()], dim=1)
            b = torch.cat([b[:d].double() * factor, b[d:].double()])
        for i, name in enumerate("QKV"):
            params[f"{p}.attn.W_{name}"] = heads_in(w[:, i * d : (i + 1) * d], n_heads)
            params[f"{p}.attn.b_{name}"] = b[i * d : (i + 1) * d].reshape(n_heads, d_head)
        params[f"{p}.attn.W_O"] = heads_out(attn.c_proj.weight.detach(), n_heads)
        params[f"{p}.attn.b_O"] = attn.c_proj.bias.detach()
        params[f"{p}.mlp.W_in"] = mlp.c_fc.weight.detach()
        params[f"{p}.mlp.b_in"] = mlp.c_fc.bias.detach()
        params[f"{p}.mlp.W_out"] = mlp.c_proj.weight.detach()
        params[f"{p}.mlp.b_out"] = mlp.c_proj.bias.detach()
        params |= ln_params(f"{p}.ln1", block.ln_1.weight, block.ln_1.bias, d)
        params |= ln_params(f"{p}.ln2", block.ln_2.weight, block.ln_2.bias, d)
    params |= ln_params("ln_final", backbone.ln_f.weight, backbone.ln_f.bias, d)
    model = build_model(cfg, params, dtype=dtype, device=device, source=type(backbone).__name__)
    return model.eval()


def to_gpt2(
    transformers: Any, model: HookedVectorTransformer, *, attn_implementation: str | None
) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """:func:`vecinterp.to_hf`: ``(GPT2Model, read_in, read_out)`` holding ``model``."""
    cfg = model.cfg
    problems = []
    if cfg.positional != "learned":
        problems.append(f"positional={cfg.positional!r} (GPT-2 has learned positions only)")
    if cfg.normalization not in ("LN", "LNPre"):
        problems.append(f"normalization={cfg.normalization!r} (GPT-2 has LayerNorm)")
    if cfg.attn_only:
        problems.append("attn_only=True (GPT-2's blocks have MLPs)")
    elif cfg.gated_mlp:
        problems.append(
            "gated_mlp=True (GPT-2's MLP has no gate: W_gate and b_gate would be dropped; "
            "Llama holds a gated MLP with rotary positions and RMSNorm)"
        )
    if not cfg.causal:
        problems.append("causal=False (GPT-2 is causal)")
    if cfg.d_model != cfg.n_heads * cfg.d_head:
        problems.append(
            f"d_model={cfg.d_model} != n_heads * d_head = {cfg.n_heads * cfg.d_head} "
            "(GPT-2's heads split n_embd)"
        )
    if cfg.act_fn not in ACT_TO_GPT2:
        problems.append(f"act_fn={cfg.act_fn!r} (GPT-2 has {sorted(ACT_TO_GPT2)} here)")
    fail("this HookedVectorTransformer to GPT-2", problems)

    W_E = model.embed.W_E
    blocks: list[Any] = list(model.blocks)
    d_mlp: Any = cfg.d_mlp
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    config = transformers.GPT2Config(
        vocab_size=1,  # wte is not used: vectors come in as inputs_embeds
        bos_token_id=0,
        eos_token_id=0,
        n_positions=cfg.n_ctx,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=d_mlp,
        activation_function=ACT_TO_GPT2[cfg.act_fn],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=cfg.eps,
        initializer_range=cfg.init_std,
        use_cache=False,
        **extra,
    )
    with torch.random.fork_rng(devices=[]):  # the initialisation is overwritten below
        backbone = transformers.GPT2Model(config)
    backbone.to(device=W_E.device, dtype=W_E.dtype)
    read_in, read_out = export_maps(model)
    d = cfg.d_model

    with torch.no_grad():
        backbone.wpe.weight.copy_(model.pos_embed.W_pos)  # type: ignore[union-attr]
        for ours, theirs in zip(blocks, backbone.h, strict=True):
            a = ours.attn
            theirs.attn.c_attn.weight.copy_(
                torch.cat([merge_heads_in(W) for W in (a.W_Q, a.W_K, a.W_V)], dim=1)
            )
            theirs.attn.c_attn.bias.copy_(torch.cat([a.b_Q, a.b_K, a.b_V]).reshape(-1))
            theirs.attn.c_proj.weight.copy_(a.W_O.reshape(-1, d))
            theirs.attn.c_proj.bias.copy_(a.b_O)
            theirs.mlp.c_fc.weight.copy_(ours.mlp.W_in)
            theirs.mlp.c_fc.bias.copy_(ours.mlp.b_in)
            theirs.mlp.c_proj.weight.copy_(ours.mlp.W_out)
            theirs.mlp.c_proj.bias.copy_(ours.mlp.b_out)
            copy_norm(theirs.ln_1, ours.ln1)
            copy_norm(theirs.ln_2, ours.ln2)
        copy_norm(backbone.ln_f, model.ln_final)
    return backbone.eval(), read_in, read_out
