"""Hugging Face Llama-family backbones (``LlamaModel``, ``MistralModel``, ``Qwen2Model``) to
and from vecinterp.

Used by :func:`vecinterp.from_hf` and :func:`vecinterp.to_hf`. The three classes share one
decoder layer (RMSNorm, rotary queries and keys, grouped-query attention, a gated SiLU
MLP); they differ in which projections carry biases (read from the modules themselves)
and in Mistral's and Qwen2's optional sliding windows. The parameters map as

=========================================  ===============================================
``LlamaModel``                             vecinterp
=========================================  ===============================================
``read_in`` (``nn.Linear``)                ``embed.W_E = weight.T``, ``embed.b_E = bias``
``layers.{i}.input_layernorm``             ``blocks.{i}.ln1.w`` (``normalization="RMS"``)
``layers.{i}.self_attn.q_proj``            ``W_Q [n_heads, d, d_head]``, ``b_Q``
``layers.{i}.self_attn.k_proj``, ``v_proj``  ``W_K``, ``W_V`` (``_W_K``, ``_W_V [n_kv, d,
                                           d_head]`` with grouped-query attention),
                                           ``b_K``, ``b_V``
``layers.{i}.self_attn.o_proj``            ``W_O [n_heads, d_head, d]``, ``b_O``
``layers.{i}.post_attention_layernorm``    ``blocks.{i}.ln2.w``
``layers.{i}.mlp.gate_proj``               ``W_gate``, ``b_gate`` (``gated_mlp=True``)
``layers.{i}.mlp.up_proj``                 ``W_in``, ``b_in``
``layers.{i}.mlp.down_proj``               ``W_out``, ``b_out``
``norm``                                   ``ln_final.w``
``read_out`` (``nn.Linear``)               ``unembed.W_U = weight.T``, ``unembed.b_U``
``embed_tokens``                           not used (vector models feed ``inputs_embeds``)
=========================================  ===============================================

A projection without a bias gets a zero one. The configuration maps ``hidden_size`` ->
``d_model``, ``num_attention_heads`` -> ``n_heads``, ``num_key_value_heads`` ->
``n_key_value_heads``, ``head_dim`` -> ``d_head``, ``intermediate_size`` -> ``d_mlp``,
``rms_norm_eps`` -> ``eps``, the rotary base ``rope_theta`` -> ``rotary_base``
(``positional="rotary"``: vecinterp's rotary embedding is the same "rotate half" layout),
``hidden_act`` -> ``act_fn`` (``silu``/``swish``, ``gelu``, ``relu``, and the tanh
approximations ``gelu_pytorch_tanh``/``gelu_new`` -> ``gelu_tanh``; the activation itself
is read from the modules that compute it, ``layers.{i}.mlp.act_fn``, run on probe points
in float64 as for GPT-2 (:mod:`vecinterp.interop.hf_gpt2`), so a swapped activation imports
as it computes and one that is none of vecinterp's is refused), and
``max_position_embeddings`` -> ``n_ctx`` unless ``n_ctx`` is given (each attention layer
of a vecinterp model keeps an ``n_ctx x n_ctx`` mask, so a backbone configured for long
contexts is imported for the lengths it will be used with). The model is causal.

Precision: transformers computes Llama's RMSNorm and its rotary tables in float32 whatever
the model's dtype (and the eager attention's softmax too). A float64 import computes them
in float64, so it agrees with the float64 source to float32 rounding only (~1e-7
relative), and to float64 rounding with those float32 steps computed in float64 (the
tests do both). A float16 or bfloat16 import computes the norms in that precision:
vecinterp's normalization does not upcast.

Refused, with every reason listed in one ``ValueError``: rotary scaling
(``rope_type`` other than ``"default"``: linear, dynamic, YaRN, Llama 3's), partial rotary
embeddings, a sliding window shorter than ``n_ctx`` (import with ``n_ctx`` at most the
window, where the window changes nothing), normalization layers or submodules other than
Llama's (Qwen3's query/key norms, Gemma's ``1 + w`` RMSNorm: other classes are refused by
:func:`vecinterp.from_hf` before they get here), activation functions other than the ones
above, norms of different epsilons, and projections of unexpected shapes. Dropout
(``attention_dropout``) is ignored in eval mode: the imported model computes the source in
eval mode; a backbone in training mode with a nonzero ``attention_dropout``, and one with
tensors on the meta device, are refused first (see :mod:`vecinterp.interop.hf_gpt2`).
"""

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
    linear_parts,
    merge_heads_in,
    module_activations,
    module_device_dtype,
)
from .hf import transformers_module

ACT_FROM_LLAMA = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "relu": "relu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}
ACT_TO_LLAMA = {"silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_pytorch_tanh"}
# RMSNorm classes computing weight * x / sqrt(mean(x^2) + eps) (Gemma's computes (1 + w))
_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")
_ATTN_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj"}
_MLP_CHILDREN = {"gate_proj", "up_proj", "down_proj", "act_fn"}
_LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
# the largest n_ctx taken from max_position_embeddings without the caller asking for it
MAX_DEFAULT_N_CTX = 4096


def rope_in_parameters(transformers: Any) -> bool:
    """Whether this ``transformers`` reads the rotary settings from ``rope_parameters``
    (5.x) rather than from ``rope_theta`` / ``rope_scaling`` (4.x)."""
    return int(str(transformers.__version__).split(".")[0]) >= 5


def _rope(c: Any, in_parameters: bool) -> tuple[str, float | None, float]:
    """``(rope_type, rope_theta, partial_rotary_factor)`` from a transformers 5 config
    (``rope_parameters``) or a 4.x one (``rope_theta``, ``rope_scaling``): from the fields
    the installed version reads (a 4.x config may carry a ``rope_parameters`` attribute
    that 4.x never reads, and the other way round)."""
    if in_parameters:
        params = dict(getattr(c, "rope_parameters", None) or {})
        rope_type = params.get("rope_type", "default")
        theta = params.get("rope_theta")
        partial = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
    else:
        scaling = dict(getattr(c, "rope_scaling", None) or {})
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        theta = getattr(c, "rope_theta", None)
        partial = getattr(c, "partial_rotary_factor", 1.0)
    return str(rope_type), None if theta is None else float(theta), float(partial or 1.0)


# the rotary embeddings computing the default, unscaled rotation (4.40-4.46 keep one in
# every attention layer, later versions one in the model)
_ROTARY = ("LlamaRotaryEmbedding", "MistralRotaryEmbedding", "Qwen2RotaryEmbedding")


def rotary_problems(backbone: Any, theta: float, d_head: int) -> list[str]:
    """Why the rotary embeddings of ``backbone`` do not rotate by ``theta`` (each one's
    ``inv_freq`` is ``theta ** (-2k / d_head)``, computed in float32 by transformers):
    empty when they all do."""
    expected = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    problems = []
    for name, module in backbone.named_modules():
        inv_freq = getattr(module, "inv_freq", None)
        if not name.endswith("rotary_emb") or not isinstance(inv_freq, torch.Tensor):
            continue
        found = inv_freq.detach().to(device="cpu", dtype=torch.float64)
        if found.shape != expected.shape or not bool(
            ((found - expected).abs() <= 1e-6 * expected).all()
        ):
            problems.append(
                f"{name}.inv_freq is not rope_theta={theta:g}'s (the config and the rotary "
                "embedding disagree: the config's rotary base is not what the model uses)"
            )
    return problems


def _sliding_windows(c: Any) -> list[int]:
    """The sliding windows some of the layers use (none: every layer attends to all earlier
    positions)."""
    window = getattr(c, "sliding_window", None)
    if window is None:
        return []
    layer_types = getattr(c, "layer_types", None)
    if layer_types is not None:
        return [int(window)] if "sliding_attention" in layer_types else []
    if getattr(c, "use_sliding_window", True) is False:  # Qwen2's switch
        return []
    return [int(window)]


def _problems(backbone: Any, n_ctx: int, in_parameters: bool) -> tuple[list[str], list[float], str]:
    """Everything about ``backbone`` vecinterp cannot represent, each norm's eps, and the
    activation its MLPs compute (read from the modules)."""
    c = backbone.config
    problems = []
    act = getattr(c, "hidden_act", None)
    act_fn, act_problems = module_activations(
        [
            (f"layers.{i}.mlp.act_fn", getattr(layer.mlp, "act_fn", None))
            for i, layer in enumerate(backbone.layers)
        ]
    )
    if act not in ACT_FROM_LLAMA and (act_problems or act_fn is None):
        problems.append(f"hidden_act={act!r} (vecinterp has {sorted(ACT_FROM_LLAMA)} of these)")
    else:
        problems += act_problems
    rope_type, theta, partial = _rope(c, in_parameters)
    if rope_type != "default":
        problems.append(
            f"rope_type={rope_type!r} (rotary scaling; vecinterp's rotary embedding is the "
            "default, unscaled one)"
        )
    if theta is None or not theta > 0:
        problems.append(f"rope_theta={theta!r} (a positive rotary base is needed)")
    if partial != 1.0:
        problems.append(
            f"partial_rotary_factor={partial} (vecinterp rotates all of each head's query and key)"
        )
    for window in _sliding_windows(c):
        if window < n_ctx:
            problems.append(
                f"sliding_window={window} < n_ctx={n_ctx} (a position would see only the "
                f"last {window} positions; import with n_ctx <= {window}, where the window "
                "changes nothing)"
            )
    eps: list[float] = []
    for i, layer in enumerate(backbone.layers):
        extra = {name for name, _ in layer.named_children()} - _LAYER_CHILDREN
        extra |= {
            f"self_attn.{n}"
            for n, child in layer.self_attn.named_children()
            if n not in _ATTN_CHILDREN
            and not (n == "rotary_emb" and type(child).__name__ in _ROTARY)
        }
        extra |= {f"mlp.{n}" for n, _ in layer.mlp.named_children()} - {
            f"mlp.{n}" for n in _MLP_CHILDREN
        }
        if extra:
            problems.append(
                f"layers.{i} has {sorted(extra)}, which a Llama decoder layer has not "
                "(vecinterp represents Llama's layer exactly, nothing more)"
            )
        for name in ("input_layernorm", "post_attention_layernorm"):
            problems += _rms_problems(f"layers.{i}.{name}", getattr(layer, name, None), eps)
    problems += _rms_problems("norm", getattr(backbone, "norm", None), eps)
    if not problems and len(set(eps)) > 1:
        problems.append(f"norms of different eps {sorted(set(eps))} (vecinterp has one eps)")
    if not problems and theta is not None:
        d_head = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        problems += rotary_problems(backbone, theta, d_head)
    return problems, eps, act_fn or ACT_FROM_LLAMA.get(str(act), "")


def _rms_problems(name: str, norm: object, eps: list[float]) -> list[str]:
    if type(norm).__name__ not in _RMS_NORMS:
        return [
            f"{name} is a {type(norm).__name__}, not one of {list(_RMS_NORMS)} (the RMSNorm "
            "vecinterp computes: weight * x / sqrt(mean(x^2) + eps))"
        ]
    eps.append(float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 0.0))))
    return []


def _proj(name: str, linear: Any, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight [rows, cols], bias [rows])`` of an ``nn.Linear``, a zero bias where it has
    none."""
    weight, bias = linear_parts(name, linear, d_in=cols, d_out=rows)
    return weight, torch.zeros_like(weight[:, 0]) if bias is None else bias


def from_llama(
    backbone: Any,
    read_in: object,
    read_out: object,
    *,
    dtype: torch.dtype | None = None,
    n_ctx: int | None = None,
) -> HookedVectorTransformer:
    """:func:`vecinterp.from_hf` for a ``transformers.LlamaModel``, ``MistralModel`` or
    ``Qwen2Model`` (see the module docstring)."""
    c = backbone.config
    check_source(type(backbone).__name__, backbone)
    device, source_dtype = module_device_dtype(backbone)
    dtype = check_dtype(dtype, source_dtype)
    d = int(c.hidden_size)
    n_heads = int(c.num_attention_heads)
    n_kv = int(getattr(c, "num_key_value_heads", None) or n_heads)
    d_head = int(getattr(c, "head_dim", None) or d // n_heads)
    if n_ctx is None:
        n_ctx = int(c.max_position_embeddings)
        if n_ctx > MAX_DEFAULT_N_CTX:
            raise ValueError(
                f"{type(backbone).__name__} is configured for max_position_embeddings="
                f"{n_ctx} positions; every attention layer of the imported model would keep "
                f"an {n_ctx} x {n_ctx} mask: pass n_ctx= (the longest sequence you will run)"
            )
    elif isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
        raise ValueError(f"n_ctx must be a positive int, got {n_ctx!r}")
    w_in = linear_parts("read_in", read_in, d_out=d)
    w_out = linear_parts("read_out", read_out, d_in=d)
    in_parameters = rope_in_parameters(transformers_module())
    problems, eps, act_fn = _problems(backbone, n_ctx, in_parameters)
    fail(f"this {type(backbone).__name__} to vecinterp", problems)

    layers = list(backbone.layers)
    d_mlp = int(c.intermediate_size)
    init_range = getattr(c, "initializer_range", None)
    if not (isinstance(init_range, float | int) and 0 < init_range <= 1000):
        init_range = None
    cfg = VectorTransformerConfig(
        d_in=w_in[0].shape[1],
        d_out=w_out[0].shape[0],
        d_model=d,
        d_head=d_head,
        n_heads=n_heads,
        n_key_value_heads=n_kv,
        n_layers=len(layers),
        n_ctx=n_ctx,
        d_mlp=d_mlp,
        act_fn=act_fn,
        normalization="RMS",
        positional="rotary",
        rotary_base=_rope(c, in_parameters)[1] or 10000.0,
        gated_mlp=True,
        causal=True,
        embed_bias=w_in[1] is not None,
        eps=eps[0],
        init="transformer_lens" if init_range is None else "gpt2",
        init_range=None if init_range is None else float(init_range),
    )
    kv = "_" if cfg.is_gqa else ""
    params = embed_params(w_in, w_out)
    for i, layer in enumerate(layers):
        p, a, m = f"blocks.{i}", layer.self_attn, layer.mlp
        projections = (("Q", a.q_proj, n_heads), ("K", a.k_proj, n_kv), ("V", a.v_proj, n_kv))
        for name, proj, heads in projections:
            w, b = _proj(f"layers.{i}.self_attn.{name.lower()}_proj", proj, heads * d_head, d)
            prefix = kv if name != "Q" else ""
            params[f"{p}.attn.{prefix}W_{name}"] = heads_in(w.T, heads)
            params[f"{p}.attn.{prefix}b_{name}"] = b.reshape(heads, d_head)
        w, b = _proj(f"layers.{i}.self_attn.o_proj", a.o_proj, d, n_heads * d_head)
        params[f"{p}.attn.W_O"] = heads_out(w.T, n_heads)
        params[f"{p}.attn.b_O"] = b
        for ours, proj, rows, cols in (
            ("gate", m.gate_proj, d_mlp, d),
            ("in", m.up_proj, d_mlp, d),
            ("out", m.down_proj, d, d_mlp),
        ):
            w, b = _proj(f"layers.{i}.mlp.{ours}", proj, rows, cols)
            params[f"{p}.mlp.W_{ours}"] = w.T
            params[f"{p}.mlp.b_{ours}"] = b
        params[f"{p}.ln1.w"] = layer.input_layernorm.weight.detach()
        params[f"{p}.ln2.w"] = layer.post_attention_layernorm.weight.detach()
    params["ln_final.w"] = backbone.norm.weight.detach()
    model = build_model(cfg, params, dtype=dtype, device=device, source=type(backbone).__name__)
    return model.eval()


def llama_problems(cfg: VectorTransformerConfig) -> list[str]:
    """Why a ``transformers.LlamaModel`` cannot hold a model of ``cfg`` (empty: it can)."""
    problems = []
    if cfg.positional != "rotary":
        problems.append(f"positional={cfg.positional!r} (Llama has rotary positions only)")
    if cfg.normalization not in ("RMS", "RMSPre"):
        problems.append(f"normalization={cfg.normalization!r} (Llama has RMSNorm)")
    if cfg.attn_only:
        problems.append("attn_only=True (Llama's layers have MLPs)")
    elif not cfg.gated_mlp:
        problems.append("gated_mlp=False (Llama's MLP is gated)")
    if not cfg.causal:
        problems.append("causal=False (Llama is causal)")
    if cfg.act_fn not in ACT_TO_LLAMA:
        problems.append(f"act_fn={cfg.act_fn!r} (Llama has {sorted(ACT_TO_LLAMA)} here)")
    return problems


def to_llama(
    transformers: Any, model: HookedVectorTransformer, *, attn_implementation: str | None
) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """:func:`vecinterp.to_hf` for a model Llama can hold: ``(LlamaModel, read_in,
    read_out)``."""
    cfg = model.cfg
    fail("this HookedVectorTransformer to Llama", llama_problems(cfg))
    blocks: list[Any] = list(model.blocks)
    W_E = model.embed.W_E

    def has_bias(*tensors: torch.Tensor) -> bool:
        return any(bool((t != 0).any()) for t in tensors)

    attention_bias = any(
        has_bias(*(getattr(b.attn, n) for n in ("b_Q", "b_K", "b_V", "b_O"))) for b in blocks
    )
    mlp_bias = any(has_bias(b.mlp.b_gate, b.mlp.b_in, b.mlp.b_out) for b in blocks)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    config = transformers.LlamaConfig(
        vocab_size=1,  # embed_tokens is not used: vectors come in as inputs_embeds
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.d_head,
        hidden_act=ACT_TO_LLAMA[cfg.act_fn],
        max_position_embeddings=cfg.n_ctx,
        rms_norm_eps=cfg.eps,
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
        attention_dropout=0.0,
        initializer_range=cfg.init_std,
        use_cache=False,
        **extra,
        # the field this version reads: rope_theta in 4.x, rope_parameters in 5.x
        **(
            {"rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base}}
            if rope_in_parameters(transformers)
            else {"rope_theta": cfg.rotary_base}
        ),
    )
    with torch.random.fork_rng(devices=[]):  # the initialisation is overwritten below
        backbone = transformers.LlamaModel(config)
    problems = rotary_problems(backbone, cfg.rotary_base, cfg.d_head)
    if mlp_bias and any(layer.mlp.up_proj.bias is None for layer in backbone.layers):
        problems.append(
            f"the MLP biases are nonzero, and transformers {transformers.__version__}'s "
            "LlamaModel has none (mlp_bias); upgrade transformers, or export a model whose "
            "b_gate, b_in and b_out are zero"
        )
    fail(
        f"this HookedVectorTransformer to transformers {transformers.__version__}'s Llama", problems
    )
    backbone.to(device=W_E.device, dtype=W_E.dtype)
    read_in, read_out = export_maps(model)

    def copy(linear: nn.Linear, weight: torch.Tensor, bias: torch.Tensor) -> None:
        linear.weight.copy_(weight)
        if linear.bias is not None:
            linear.bias.copy_(bias)

    with torch.no_grad():
        for ours, theirs in zip(blocks, backbone.layers, strict=True):
            a, s = ours.attn, theirs.self_attn
            W_K, b_K, W_V, b_V = a.kv_parameters()
            copy(s.q_proj, merge_heads_in(a.W_Q).T, a.b_Q.reshape(-1))
            copy(s.k_proj, merge_heads_in(W_K).T, b_K.reshape(-1))
            copy(s.v_proj, merge_heads_in(W_V).T, b_V.reshape(-1))
            copy(s.o_proj, a.W_O.reshape(-1, cfg.d_model).T, a.b_O)
            m = ours.mlp
            copy(theirs.mlp.gate_proj, m.W_gate.T, m.b_gate)
            copy(theirs.mlp.up_proj, m.W_in.T, m.b_in)
            copy(theirs.mlp.down_proj, m.W_out.T, m.b_out)
            copy_norm(theirs.input_layernorm, ours.ln1)
            copy_norm(theirs.post_attention_layernorm, ours.ln2)
        copy_norm(backbone.norm, model.ln_final)
    return backbone.eval(), read_in, read_out
