"""PyTorch ``nn.TransformerEncoder`` (pre-norm) to and from vecinterp.

A vector model built on PyTorch's encoder computes::

    h = read_in(x) + pos_embed[:n]                  # pos_embed: optional, added outside
    h = encoder(h, mask=nn.Transformer.generate_square_subsequent_mask(n), is_causal=True)
    y = read_out(h)                                 # (no mask for a bidirectional model)

:func:`from_torch_encoder` turns it into a :class:`~vecinterp.HookedVectorTransformer`;
:func:`to_torch_encoder` goes back. The parameters map as

======================================  ================================================
``nn.TransformerEncoder``               vecinterp
======================================  ================================================
``read_in``                             ``embed.W_E = weight.T``, ``embed.b_E = bias``
``pos_embed [n_ctx, d_model]``          ``pos_embed.W_pos`` (``positional="learned"``);
                                        without it ``positional="none"``
``layers.{i}.norm1``, ``norm2``         ``blocks.{i}.ln1``, ``ln2``
``layers.{i}.self_attn.in_proj_weight`` ``W_Q``, ``W_K``, ``W_V`` (rows Q, K, V, heads
(``[3d, d]``) and ``in_proj_bias``      stacked in each) and ``b_Q``, ``b_K``, ``b_V``
``layers.{i}.self_attn.out_proj``       ``W_O``, ``b_O``
``layers.{i}.linear1``, ``linear2``     ``W_in``, ``b_in``, ``W_out``, ``b_out``
``norm`` (the encoder's final norm)     ``ln_final``
``read_out``                            ``unembed.W_U = weight.T``, ``unembed.b_U = bias``
======================================  ================================================

with ``dim_feedforward`` -> ``d_mlp``, ``nhead`` -> ``n_heads``, ``layer_norm_eps`` ->
``eps``, the activation ``relu`` (``F.relu``, ``nn.ReLU``, ``"relu"``) or ``gelu``
(``F.gelu``, ``nn.GELU()``, ``"gelu"``: exact erf). Parts the source lacks are filled
exactly: a LayerNorm without weight or bias (``elementwise_affine=False``, ``bias=False``)
has weight 1 and bias 0, a layer built with ``bias=False`` has zero biases.

Refused, with every reason listed in one ``ValueError``:

- post-norm layers (``norm_first=False``, PyTorch's default): they normalise the
  residual stream itself after every sub-layer, ``x = norm(x + f(x))``, so no block
  writes additively into a stream that the next block reads, which is what a
  :class:`~vecinterp.HookedVectorTransformer` is (and what every decomposition of it
  assumes);
- an encoder without a final norm (``norm=None``): vecinterp's model applies
  ``ln_final`` before ``W_U`` whenever its blocks have norms, and no LayerNorm is the
  identity; a config option to drop it would touch every analysis that reads through
  ``ln_final`` (attribution, logit lens, decompositions), so such an encoder is refused
  rather than approximated (give it ``norm=nn.LayerNorm(d_model)`` and train it so);
- other activations (including ``nn.GELU(approximate="tanh")``: PyTorch's fast path
  in eval mode without gradients runs the exact gelu for every ``nn.GELU``, so such an
  encoder computes two different functions);
- ``add_bias_kv``, ``add_zero_attn``, norms that are not ``nn.LayerNorm`` or have
  different eps, and layers of different shapes.

Refused first, with what to do: an encoder with tensors on the meta device (no values),
and one in training mode with a nonzero dropout (its outputs are random; call ``.eval()``
on it first). Dropout is ignored in eval mode: the imported model computes the source in
eval mode. PyTorch's fused
eval-mode path (no gradients, ``batch_first=True``) computes the same function (the tests
compare against both paths); its nested-tensor path for padding masks is never taken by
a pre-norm encoder (PyTorch turns it off for ``norm_first=True``), and vecinterp has no
padding masks. A single
``nn.TransformerEncoderLayer`` has no final norm; wrap it in an ``nn.TransformerEncoder``
with one.
"""

from typing import Any

import torch
import torch.nn.functional as F
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
    module_device_dtype,
)

__all__ = ["from_torch_encoder", "to_torch_encoder"]


def _activation(act: object) -> str | None:
    """vecinterp's name of a TransformerEncoderLayer's activation, or ``None``."""
    if act is F.relu or type(act) is nn.ReLU:
        return "relu"
    if act is F.gelu or (type(act) is nn.GELU and act.approximate == "none"):
        return "gelu"
    return None


def _describe(act: object) -> str:
    if isinstance(act, nn.GELU):
        return f"nn.GELU(approximate={act.approximate!r})"
    return getattr(act, "__qualname__", None) or type(act).__name__


def _qkv(attn: nn.MultiheadAttention) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The query, key and value weights ``[d, d]`` (``nn.Linear`` layout) and biases."""
    if attn._qkv_same_embed_dim:
        weights = list(attn.in_proj_weight.detach().chunk(3))
    else:
        weights = [w.detach() for w in (attn.q_proj_weight, attn.k_proj_weight, attn.v_proj_weight)]
    biases: list[torch.Tensor | None] = (
        [None] * 3 if attn.in_proj_bias is None else list(attn.in_proj_bias.detach().chunk(3))
    )
    return weights, biases


def _layer_problems(i: int, layer: Any, first: Any, d: int) -> list[str]:
    name = f"layers.{i}"
    problems = []
    if not layer.norm_first:
        problems.append(
            f"{name}: norm_first=False (post-norm: x = norm(x + f(x)) normalises the residual "
            "stream itself after every sub-layer, which vecinterp's pre-norm residual-stream "
            "model cannot represent; only norm_first=True encoders convert)"
        )
    if _activation(layer.activation) is None:
        problems.append(
            f"{name}: activation {_describe(layer.activation)} (vecinterp reads F.relu, "
            "nn.ReLU(), F.gelu and nn.GELU(); nn.GELU(approximate='tanh') is refused because "
            "PyTorch's fast path runs the exact gelu for it)"
        )
    attn = layer.self_attn
    if attn.bias_k is not None or attn.bias_v is not None:
        problems.append(f"{name}.self_attn: add_bias_kv=True (a learned extra key and value)")
    if attn.add_zero_attn:
        problems.append(f"{name}.self_attn: add_zero_attn=True (an extra zero key and value)")
    if attn.embed_dim != d or (attn.kdim, attn.vdim) != (d, d):
        problems.append(f"{name}.self_attn: embed_dim/kdim/vdim are not all d_model={d}")
    if i > 0:
        if attn.num_heads != first.self_attn.num_heads:
            problems.append(
                f"{name}: {attn.num_heads} heads, layer 0 has {first.self_attn.num_heads}"
            )
        if layer.linear1.out_features != first.linear1.out_features:
            problems.append(
                f"{name}: dim_feedforward={layer.linear1.out_features}, layer 0 has "
                f"{first.linear1.out_features}"
            )
        if _activation(layer.activation) != _activation(first.activation):
            problems.append(f"{name}: a different activation from layer 0's")
    for norm in ("norm1", "norm2"):
        problems += layer_norm_parts(f"{name}.{norm}", getattr(layer, norm), d)[3]
    return problems


def from_torch_encoder(
    encoder: nn.TransformerEncoder,
    read_in: nn.Linear | tuple[torch.Tensor, ...],
    read_out: nn.Linear | tuple[torch.Tensor, ...],
    *,
    causal: bool,
    pos_embed: torch.Tensor | nn.Embedding | None = None,
    n_ctx: int | None = None,
    dtype: torch.dtype | None = None,
) -> HookedVectorTransformer:
    """A :class:`~vecinterp.HookedVectorTransformer` computing
    ``read_out(encoder(read_in(x) + pos_embed[:n], mask=..., is_causal=causal))``.

    The encoder must be pre-norm (``norm_first=True``) with a final ``norm``; see the
    module docstring for the mapping and every refusal. ``batch_first`` either way (it
    changes the layout of the source's inputs, not its weights). The new model holds
    copies (the source is not modified), on the encoder's device, in its dtype unless
    ``dtype`` says otherwise, in eval mode, without dropout; its outputs equal the
    encoder's in eval mode, the fused fast path included (to rounding).

    Args:
        encoder: an ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer`` s.
        read_in: the map from input vectors to ``d_model``: an ``nn.Linear`` or
            ``(weight [d_model, d_in], bias [d_model])`` in ``nn.Linear``'s layout (the bias
            may be left out).
        read_out: the map from the encoder's output to the outputs, likewise
            (``weight [d_out, d_model]``).
        causal: whether the source runs with a causal mask (``is_causal=True`` /
            ``mask=nn.Transformer.generate_square_subsequent_mask(n)``); ``False`` for a
            bidirectional model (no mask). An encoder does not record how it is called,
            hence no default.
        pos_embed: the positional embedding the source adds to ``read_in(x)`` before the
            encoder, ``[n_ctx, d_model]`` (a tensor, an ``nn.Parameter`` or an
            ``nn.Embedding``; a fixed sinusoidal table too): it becomes a learned
            ``W_pos``. ``None``: no positions (``positional="none"``).
        n_ctx: the longest sequence the model takes; defaults to ``pos_embed``'s rows,
            and is required without ``pos_embed``.
        dtype: the new model's dtype (default: the encoder's).

    Returns:
        The imported model.

    Raises:
        TypeError: ``encoder`` is not an ``nn.TransformerEncoder``, or an argument has the
            wrong type.
        ValueError: a feature vecinterp cannot represent (every reason is listed), or a
            shape that does not fit.

    Example:
        >>> import torch, vecinterp as vi
        >>> from torch import nn
        >>> layer = nn.TransformerEncoderLayer(
        ...     16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
        >>> encoder = nn.TransformerEncoder(
        ...     layer, 2, norm=nn.LayerNorm(16), enable_nested_tensor=False).eval()
        >>> read_in, read_out, pos = nn.Linear(3, 16), nn.Linear(16, 1), torch.randn(8, 16)
        >>> model = vi.from_torch_encoder(
        ...     encoder, read_in, read_out, causal=True, pos_embed=pos)
        >>> x = torch.randn(2, 5, 3)
        >>> mask = nn.Transformer.generate_square_subsequent_mask(5)
        >>> with torch.no_grad():
        ...     y = read_out(encoder(read_in(x) + pos[:5], mask=mask, is_causal=True))
        ...     torch.allclose(model(x), y, atol=1e-5)
        True
    """
    if not isinstance(encoder, nn.TransformerEncoder):
        hint = (
            " (a single layer has no final norm: wrap it as nn.TransformerEncoder(layer, 1, "
            "norm=nn.LayerNorm(d_model)))"
            if isinstance(encoder, nn.TransformerEncoderLayer)
            else ""
        )
        raise TypeError(f"expected an nn.TransformerEncoder, got {type(encoder).__name__}{hint}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    layers = list(encoder.layers)
    wrong = [
        f"layers.{i} is a {type(layer).__name__}, not an nn.TransformerEncoderLayer"
        for i, layer in enumerate(layers)
        if not isinstance(layer, nn.TransformerEncoderLayer)
    ]
    fail("this nn.TransformerEncoder to vecinterp", wrong or ([] if layers else ["no layers"]))
    check_source("the nn.TransformerEncoder", encoder)
    first: Any = layers[0]
    d = first.self_attn.embed_dim
    device, source_dtype = module_device_dtype(encoder)
    dtype = check_dtype(dtype, source_dtype)
    w_in = linear_parts("read_in", read_in, d_out=d)
    w_out = linear_parts("read_out", read_out, d_in=d)
    pos = _pos_embed(pos_embed, d)
    n_ctx = _n_ctx(n_ctx, pos)

    problems = [p for i, layer in enumerate(layers) for p in _layer_problems(i, layer, first, d)]
    if encoder.norm is None:
        problems.append(
            "norm=None: the encoder has no final norm, and vecinterp's model always applies "
            "ln_final before W_U (no LayerNorm is the identity); only encoders with a final "
            "nn.LayerNorm convert"
        )
    else:
        problems += layer_norm_parts("norm", encoder.norm, d)[3]
    norms = [n for layer in layers for n in (layer.norm1, layer.norm2)] + [encoder.norm]
    if not problems:
        eps = sorted({float(n.eps) for n in norms})
        if len(eps) > 1:
            problems.append(f"layer norms of different eps {eps} (vecinterp has one eps)")
    fail("this nn.TransformerEncoder to vecinterp", problems)

    n_heads = first.self_attn.num_heads
    final: Any = encoder.norm
    d_mlp: int = first.linear1.out_features
    cfg = VectorTransformerConfig(
        d_in=w_in[0].shape[1],
        d_out=w_out[0].shape[0],
        d_model=d,
        d_head=d // n_heads,
        n_heads=n_heads,
        n_layers=len(layers),
        n_ctx=n_ctx,
        d_mlp=d_mlp,
        act_fn=str(_activation(first.activation)),
        normalization="LN",
        positional="none" if pos is None else "learned",
        causal=causal,
        embed_bias=w_in[1] is not None,
        eps=float(final.eps),
    )
    params = embed_params(w_in, w_out)
    if pos is not None:
        params["pos_embed.W_pos"] = pos[:n_ctx]
    zeros_d = torch.zeros(d, dtype=torch.float64)
    for i, layer in enumerate(layers):
        p, attn = f"blocks.{i}", layer.self_attn
        weights, biases = _qkv(attn)
        for name, w, b in zip("QKV", weights, biases, strict=True):
            params[f"{p}.attn.W_{name}"] = heads_in(w.T, n_heads)
            params[f"{p}.attn.b_{name}"] = (zeros_d if b is None else b).reshape(n_heads, -1)
        params[f"{p}.attn.W_O"] = heads_out(attn.out_proj.weight.detach().T, n_heads)
        params[f"{p}.attn.b_O"] = _bias(attn.out_proj, d)
        params[f"{p}.mlp.W_in"] = layer.linear1.weight.detach().T
        params[f"{p}.mlp.b_in"] = _bias(layer.linear1, d_mlp)
        params[f"{p}.mlp.W_out"] = layer.linear2.weight.detach().T
        params[f"{p}.mlp.b_out"] = _bias(layer.linear2, d)
        params |= ln_params(f"{p}.ln1", layer.norm1.weight, layer.norm1.bias, d)
        params |= ln_params(f"{p}.ln2", layer.norm2.weight, layer.norm2.bias, d)
    params |= ln_params("ln_final", final.weight, final.bias, d)
    model = build_model(cfg, params, dtype=dtype, device=device, source="nn.TransformerEncoder")
    return model.eval()


def _bias(linear: nn.Linear, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.float64) if linear.bias is None else linear.bias.detach()


def _pos_embed(pos_embed: object, d: int) -> torch.Tensor | None:
    if pos_embed is None:
        return None
    if isinstance(pos_embed, nn.Embedding):
        pos_embed = pos_embed.weight
    if not isinstance(pos_embed, torch.Tensor):
        raise TypeError(
            "pos_embed must be a torch.Tensor [n_ctx, d_model], an nn.Parameter or an "
            f"nn.Embedding, got {type(pos_embed).__name__}"
        )
    if pos_embed.ndim != 2 or pos_embed.shape[1] != d or pos_embed.shape[0] == 0:
        raise ValueError(
            f"pos_embed must be [n_ctx, d_model={d}], got shape {tuple(pos_embed.shape)}"
        )
    if not pos_embed.is_floating_point():
        raise TypeError(f"pos_embed must be a floating-point tensor, got {pos_embed.dtype}")
    return pos_embed.detach()


def _n_ctx(n_ctx: object, pos: torch.Tensor | None) -> int:
    if n_ctx is None:
        if pos is None:
            raise ValueError(
                "n_ctx is required without pos_embed: the longest sequence the model takes"
            )
        return pos.shape[0]
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
        raise ValueError(f"n_ctx must be a positive int, got {n_ctx!r}")
    if pos is not None and n_ctx > pos.shape[0]:
        raise ValueError(f"n_ctx={n_ctx} is more than pos_embed's {pos.shape[0]} rows")
    return n_ctx


def to_torch_encoder(
    model: HookedVectorTransformer,
) -> tuple[nn.TransformerEncoder, nn.Linear, nn.Linear, torch.Tensor | None]:
    """``(encoder, read_in, read_out, pos_embed)``: a pre-norm ``nn.TransformerEncoder``
    and the maps around it computing ``model``, the inverse of :func:`from_torch_encoder`.

    ``read_out(encoder(read_in(x) + pos_embed[:n], mask=mask, is_causal=True))`` equals
    ``model(x)`` (to rounding), ``mask = nn.Transformer.generate_square_subsequent_mask(n)``
    for a causal model (``model.cfg.causal``), no mask and no ``pos_embed`` term where they
    do not apply. ``pos_embed`` is a copy of ``W_pos`` (``positional="learned"``) or
    ``None`` (``"none"``). The encoder is ``batch_first=True``, ``norm_first=True``,
    without dropout, in eval mode, on ``model``'s device and dtype; the global random state
    is left alone. Exportable: ``normalization`` ``"LN"`` or ``"LNPre"``, ``act_fn``
    ``"relu"`` or ``"gelu"``, learned or no positions, ungated MLPs, ``d_model = n_heads *
    d_head``; anything else raises a ``ValueError`` listing every reason.

    Args:
        model: the model to export.

    Returns:
        ``(nn.TransformerEncoder, read_in, read_out, pos_embed or None)``.

    Raises:
        TypeError: ``model`` is not a :class:`~vecinterp.HookedVectorTransformer`.
        ValueError: the configuration has no ``nn.TransformerEncoder`` equivalent.

    Example:
        >>> import torch, vecinterp as vi
        >>> from torch import nn
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> encoder, read_in, read_out, pos = vi.to_torch_encoder(model)
        >>> x, mask = torch.randn(2, 6, 3), nn.Transformer.generate_square_subsequent_mask(6)
        >>> with torch.no_grad():
        ...     y = read_out(encoder(read_in(x) + pos, mask=mask, is_causal=True))
        ...     torch.allclose(model(x), y, atol=1e-6)
        True
    """
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"expected a HookedVectorTransformer, got {type(model).__name__}")
    cfg = model.cfg
    problems = []
    if cfg.positional not in ("learned", "none"):
        problems.append(
            f"positional={cfg.positional!r} (exported are learned positions, as a tensor to "
            "add before the encoder, and none)"
        )
    if cfg.normalization not in ("LN", "LNPre"):
        problems.append(
            f"normalization={cfg.normalization!r} (nn.TransformerEncoder has LayerNorm)"
        )
    if cfg.attn_only:
        problems.append("attn_only=True (nn.TransformerEncoderLayer has an MLP)")
    elif cfg.gated_mlp:
        problems.append(
            "gated_mlp=True (nn.TransformerEncoderLayer's MLP has no gate: W_gate and b_gate "
            "would be dropped)"
        )
    if cfg.d_model != cfg.n_heads * cfg.d_head:
        problems.append(
            f"d_model={cfg.d_model} != n_heads * d_head = {cfg.n_heads * cfg.d_head} "
            "(nn.MultiheadAttention's heads split d_model)"
        )
    if cfg.act_fn not in ("relu", "gelu"):
        problems.append(f"act_fn={cfg.act_fn!r} (exported are 'relu' and 'gelu')")
    fail("this HookedVectorTransformer to nn.TransformerEncoder", problems)

    W_E = model.embed.W_E
    like: dict[str, Any] = {"device": W_E.device, "dtype": W_E.dtype}
    d, d_mlp = cfg.d_model, int(cfg.d_mlp or 0)
    blocks: list[Any] = list(model.blocks)
    with torch.random.fork_rng(devices=[]):  # the initialisation is overwritten below
        layer = nn.TransformerEncoderLayer(
            d, cfg.n_heads, d_mlp, dropout=0.0, activation=cfg.act_fn,
            layer_norm_eps=cfg.eps, batch_first=True, norm_first=True, **like,
        )  # fmt: skip
        encoder = nn.TransformerEncoder(
            layer, cfg.n_layers, norm=nn.LayerNorm(d, eps=cfg.eps, **like),
            enable_nested_tensor=False,
        )  # fmt: skip
    read_in, read_out = export_maps(model)

    with torch.no_grad():
        for ours, theirs in zip(blocks, encoder.layers, strict=True):
            a, sa = ours.attn, theirs.self_attn
            sa.in_proj_weight.copy_(torch.cat([merge_heads_in(W).T for W in (a.W_Q, a.W_K, a.W_V)]))
            sa.in_proj_bias.copy_(torch.cat([a.b_Q, a.b_K, a.b_V]).reshape(-1))
            sa.out_proj.weight.copy_(a.W_O.reshape(-1, d).T)
            sa.out_proj.bias.copy_(a.b_O)
            theirs.linear1.weight.copy_(ours.mlp.W_in.T)
            theirs.linear1.bias.copy_(ours.mlp.b_in)
            theirs.linear2.weight.copy_(ours.mlp.W_out.T)
            theirs.linear2.bias.copy_(ours.mlp.b_out)
            copy_norm(theirs.norm1, ours.ln1)
            copy_norm(theirs.norm2, ours.ln2)
        copy_norm(encoder.norm, model.ln_final)  # type: ignore[arg-type]  # set above
    pos = None if model.pos_embed is None else model.pos_embed.W_pos.detach().clone()
    return encoder.eval(), read_in, read_out, pos
