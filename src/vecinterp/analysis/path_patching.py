"""Path patching: a sender's clean output, delivered only along the path into chosen receivers.

Activation patching pastes a clean activation into the corrupted run and lets it reach
everything downstream. Path patching (Wang et al. 2022, "Interpretability in the Wild",
§3.1 and Appendix B; Goldowsky-Dill et al. 2023) asks a narrower question: what does the
sender's difference do when it reaches *only* the receivers, say the key input of one
head, through the residual stream and nothing else? The three runs are in
:func:`path_patching`'s docstring.

The model has no per-head query/key/value *input* hook (TransformerLens's
``hook_k_input`` with ``use_split_qkv_input``). None is needed: in run 2 the receiver
layer computes every head's ``q``, ``k``, ``v`` from the run-2 residual stream through its
own ``ln1`` and weights, so the receiver's run-2 ``hook_k`` is exactly
``ln1(resid_pre) W_K[h] + b_K[h]`` of the path-patched residual, and run 3 pastes that.
Likewise an MLP receiver's input is pasted as its ``hook_pre``.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from ..model import HookedVectorTransformer
from ._validate import check_head, check_layer, check_model, refuse_grouped_query
from .patching import Metric, _check_runs, _scalar

__all__ = ["path_patching"]

_QKV = ("q", "k", "v")
_AUTO_SEQUENCES = 512  # as activation_patching: a pass holds at most this many sequences
_SENDER_FORMS = "(layer, head), 'embed', ('mlp', layer), or 'heads' (every head)"
_RECEIVER_FORMS = "(layer, head, 'q'|'k'|'v'), ('mlp', layer) or 'output'"


@dataclass(frozen=True)
class _Node:
    """A sender or receiver. ``order`` places it in the forward pass: the embedding, then
    per layer its heads and its MLP, then the output; a path runs from lower to higher."""

    kind: str  # "embed", "head", "mlp" or "output"
    layer: int
    head: int = 0
    channel: str = ""  # "q", "k" or "v" for a head receiver

    @property
    def order(self) -> tuple[int, int]:
        return (self.layer, 1 if self.kind == "mlp" else 0)

    def __str__(self) -> str:
        if self.kind == "head":
            return f"({self.layer}, {self.head}{', ' + repr(self.channel) if self.channel else ''})"
        return repr(self.kind) if self.kind in ("embed", "output") else f"('mlp', {self.layer})"


def path_patching(
    model: HookedVectorTransformer,
    clean_x: Float[torch.Tensor, "batch pos d_in"],
    corrupted_x: Float[torch.Tensor, "_batch _pos _d_in"],
    metric: Metric,
    senders: str | Sequence[Any],
    receivers: str | Sequence[Any],
    *,
    freeze_mlps: bool = True,
    chunk_size: int | None = None,
    progress: bool = True,
) -> Float[torch.Tensor, "..."]:
    """Run the corrupted input with each sender's clean output reaching only ``receivers``.

    The convention is :func:`~vecinterp.analysis.patching.activation_patching`'s: the base
    run is the corrupted one, the sender is patched *from corrupted to clean*, and the
    result is the metric of the patched run itself (its effect is
    ``result - metric(model(corrupted_x))``). For the reverse direction, swap ``clean_x``
    and ``corrupted_x``. For each sender ``S`` (three runs, the last two batched over
    senders):

    1. run ``clean_x`` and ``corrupted_x``, caching every head's output ``hook_result``,
       every MLP's ``hook_mlp_out`` and the embedding ``hook_embed``;
    2. run ``corrupted_x`` with ``S``'s output set to its clean value and every other
       head's output (all layers) frozen at its corrupted value, and with
       ``freeze_mlps`` every other MLP's output too; record each receiver's input;
    3. run ``corrupted_x`` with only the receivers' inputs replaced by those of run 2,
       everything else computed as usual, and return ``metric(output)``.

    With everything else frozen, the residual stream of run 2 is
    ``resid_corr + Δ_S`` after ``S`` (``Δ_S = out_S(clean) - out_S(corr)``; with
    ``freeze_mlps=False`` plus what the MLPs after ``S`` make of it). A head receiver
    ``(L, h, "k")`` therefore gets, in run 3, the key
    ``k_h = ln1_L(resid_pre_L(corr) + Δ_S) W_K[L, h] + b_K[L, h]``
    (its own LayerNorm applied to the whole patched residual, so the path is nonlinear
    where the model is), and likewise ``"q"``/``"v"``; an MLP receiver ``("mlp", L)`` gets
    its pre-activation from ``ln2_L(resid_mid_L(corr) + Δ_S)``. The ``"output"`` receiver
    is the unembedding's read of the final residual stream, which the other receivers
    write into as well: run 3 adds ``resid_final(run 2) - resid_final(corr)`` to its own
    final residual before ``ln_final`` (alone, that is replacing it by run 2's), so the
    other receivers' effects on the output are kept. A receiver's input from run 2 holds
    only the direct path: sender → receiver A → receiver B is not part of B's patched
    input (it still reaches B's unpatched inputs and the output).

    MLPs: with ``freeze_mlps=True`` (default) a path is strictly sender → residual stream
    → receiver; with ``False`` MLPs are recomputed in run 2, so paths through MLPs count
    as part of the sender's path (the choice of Wang et al.'s experiments, which freeze
    attention heads only). Attention-only models are the same either way. Every position
    is patched. Forward hooks already attached are part of the model in every run.

    Args:
        model: the model (not modified; the hooks are removed even on errors).
        clean_x: the clean input ``[batch, pos, d_in]``.
        corrupted_x: the corrupted input, the same shape as ``clean_x``.
        metric: ``metric(output) -> scalar``, called once per sender on run 3's output
            ``[batch, pos, d_out]`` (the same batch as ``clean_x``).
        senders: one sender, a sequence of senders, or ``"heads"`` (every head before all
            the receivers). A sender is a head ``(layer, head)``, the input embedding
            ``"embed"`` (positional embeddings are the same in both runs) or an MLP
            ``("mlp", layer)``; negative indices count from the end.
        receivers: one receiver or a sequence of receivers, patched together in run 3: a
            head's query, key or value input ``(layer, head, "q" | "k" | "v")``, an MLP's
            input ``("mlp", layer)``, or ``"output"``. Each must come after every sender
            (a head reads layers before its own; an MLP also reads its own layer's heads).
        freeze_mlps: hold MLP outputs at their corrupted values in run 2 (see above).
        chunk_size: senders (copies of the batch) per forward pass; ``None`` picks
            ``max(1, 512 // batch)``.
        progress: show a progress bar over the passes.

    Returns:
        The metric per sender (float, on the model's device): a scalar for one sender,
        ``[n_senders]`` in the order given for a sequence, ``[n_layers, n_heads]`` for
        ``"heads"`` with NaN where a head is not before every receiver.

    Raises:
        ValueError: a malformed or out-of-range sender or receiver, a receiver not after a
            sender, an MLP on an attention-only model, inputs of different shapes or
            non-finite, a metric that does not return one number.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> clean, corrupted = torch.randn(4, 5, 3), torch.randn(4, 5, 3)
        >>> metric = lambda y: y[:, -1].sum()
        >>> # head 0.1 -> the key input of head 1.0; then every layer-0 head -> the output
        >>> vi.path_patching(model, clean, corrupted, metric, (0, 1), (1, 0, "k"),
        ...                  progress=False).shape
        torch.Size([])
        >>> vi.path_patching(model, clean, corrupted, metric, [(0, 0), (0, 1)], "output",
        ...                  progress=False).shape
        torch.Size([2])
    """
    model = check_model(model)
    _check_runs(model, clean_x, corrupted_x, metric)
    for name, flag in (("freeze_mlps", freeze_mlps), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    rec = _parse_receivers(model, receivers)
    cfg = model.cfg
    if isinstance(senders, str) and senders == "heads":
        every = [_Node("head", ell, h) for ell in range(cfg.n_layers) for h in range(cfg.n_heads)]
        send = [s for s in every if all(s.order < r.order for r in rec)]
        if not send:
            raise ValueError(f"senders='heads': no head comes before every receiver {_names(rec)}")
    else:
        send = _parse_senders(model, senders)
        for s in send:
            late = [r for r in rec if not s.order < r.order]
            if late:
                raise ValueError(
                    f"receiver {late[0]} does not come after sender {s}: a head reads the "
                    "residual stream of the layers before its own, an MLP that of its own "
                    "layer's heads too, the output everything"
                )
    batch = clean_x.shape[0]
    k_max = max(1, _AUTO_SEQUENCES // batch) if chunk_size is None else chunk_size
    with torch.no_grad():
        clean, corr = _cache_runs(model, clean_x, corrupted_x)
        values: list[torch.Tensor] = []
        chunks = [send[i : i + k_max] for i in range(0, len(send), k_max)]
        for chunk in tqdm(chunks, desc="path patching", disable=not progress):
            inputs = _run_2(model, corrupted_x, clean, corr, chunk, rec, freeze_mlps)
            values += _run_3(model, corrupted_x, corr, inputs, rec, len(chunk), metric)
    result = torch.stack(values)
    if isinstance(senders, str) and senders == "heads":
        grid = torch.full((cfg.n_layers, cfg.n_heads), float("nan"), dtype=result.dtype)
        grid = grid.to(result.device)
        for s, value in zip(send, result, strict=True):
            grid[s.layer, s.head] = value
        return grid
    return result[0] if _is_single(senders) else result


# -- arguments --------------------------------------------------------------------------


def _is_single(spec: object) -> bool:
    """Whether ``spec`` is one sender/receiver rather than a sequence of them."""
    if isinstance(spec, str):
        return True
    if not isinstance(spec, tuple) or not spec:
        return False
    first = spec[0]
    return _is_mlp(spec) or (isinstance(first, int) and not isinstance(first, bool))


def _is_mlp(item: object) -> bool:
    """``("mlp", layer)``."""
    return (
        isinstance(item, tuple | list)
        and len(item) == 2
        and isinstance(item[0], str)
        and item[0] == "mlp"
    )


def _as_list(spec: object, what: str, forms: str) -> list[object]:
    if _is_single(spec):
        return [spec]
    if not isinstance(spec, Sequence) or isinstance(spec, torch.Tensor):
        raise ValueError(f"{what} must be one of {forms} or a sequence of them, got {spec!r}")
    if not spec:
        raise ValueError(f"{what} is empty: give at least one of {forms}")
    return list(spec)


def _mlp_layer(model: HookedVectorTransformer, item: Any, what: str) -> int:
    if model.cfg.attn_only:
        raise ValueError(f"{what} {item!r}: this model is attention-only, it has no MLPs")
    return check_layer(model, item[1], f"in the {what} {tuple(item)!r}")


def _parse_senders(model: HookedVectorTransformer, senders: object) -> list[_Node]:
    nodes = []
    for item in _as_list(senders, "senders", _SENDER_FORMS):
        if isinstance(item, str) and item == "embed":
            nodes.append(_Node("embed", -1))
        elif _is_mlp(item):
            nodes.append(_Node("mlp", _mlp_layer(model, item, "sender")))
        elif isinstance(item, tuple | list) and len(item) == 2:
            where = f"in the sender {tuple(item)!r}"
            nodes.append(
                _Node("head", check_layer(model, item[0], where), check_head(model, item[1], where))
            )
        else:
            raise ValueError(f"each sender must be one of {_SENDER_FORMS}, got {item!r}")
    return nodes


def _parse_receivers(model: HookedVectorTransformer, receivers: object) -> list[_Node]:
    nodes: list[_Node] = []
    for item in _as_list(receivers, "receivers", _RECEIVER_FORMS):
        if isinstance(item, str) and item == "output":
            node = _Node("output", model.cfg.n_layers)
        elif _is_mlp(item):
            node = _Node("mlp", _mlp_layer(model, item, "receiver"))
            if model.cfg.gated_mlp:
                raise ValueError(
                    f"path_patching's receiver {item!r}: a gated MLP reads its input twice "
                    "(hook_pre and hook_pre_linear), and pasting one input is not supported; "
                    "take a later receiver (a head or the output)"
                )
        elif isinstance(item, tuple | list) and len(item) == 3 and item[2] in _QKV:
            where = f"in the receiver {tuple(item)!r}"
            layer, head = check_layer(model, item[0], where), check_head(model, item[1], where)
            if item[2] != "q":
                refuse_grouped_query(
                    model,
                    f"path_patching's receiver {tuple(item)!r}",
                    "a query head's keys and values are computed once for its whole group, "
                    "so they cannot be pasted per query head; take the query ('q') or the "
                    "output as the receiver",
                )
            node = _Node("head", layer, head, item[2])
        else:
            raise ValueError(f"each receiver must be one of {_RECEIVER_FORMS}, got {item!r}")
        if node not in nodes:
            nodes.append(node)
    return nodes


def _names(nodes: list[_Node]) -> str:
    return "[" + ", ".join(map(str, nodes)) + "]"


# -- the runs -----------------------------------------------------------------------------

Hook = tuple[str, Callable[[torch.Tensor, Any], torch.Tensor]]


def _cache_runs(
    model: HookedVectorTransformer, clean_x: torch.Tensor, corrupted_x: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Run 1: the clean and corrupted activations the other runs paste or freeze."""
    n = model.cfg.n_layers
    names = ["hook_embed"] + [f"blocks.{ell}.attn.hook_result" for ell in range(n)]
    names.append(f"blocks.{n - 1}.hook_resid_post")
    if not model.cfg.attn_only:
        names += [f"blocks.{ell}.hook_mlp_out" for ell in range(n)]
    runs = []
    for x in (clean_x, corrupted_x):
        _, cache = model.run_with_cache(x, names_filter=names)
        runs.append({name: cache[name] for name in names})
    return runs[0], runs[1]


def _tiled(k: int, act: torch.Tensor) -> torch.Tensor:
    """``[k * batch, ...]`` as ``[k, batch, ...]``: copy ``i`` is the ``i``-th block."""
    return act.reshape(k, act.shape[0] // k, *act.shape[1:])


def _run_2(
    model: HookedVectorTransformer,
    corrupted_x: torch.Tensor,
    clean: dict[str, torch.Tensor],
    corr: dict[str, torch.Tensor],
    senders: list[_Node],
    receivers: list[_Node],
    freeze_mlps: bool,
) -> dict[str, torch.Tensor]:
    """Copy ``i`` of the corrupted batch: sender ``i`` clean, every other head (and MLP)
    frozen corrupted. Returns the receivers' recorded inputs by hook name."""
    cfg, k, device = model.cfg, len(senders), corrupted_x.device
    heads = torch.zeros(k, cfg.n_layers, cfg.n_heads, dtype=torch.bool, device=device)
    mlps = torch.zeros(k, cfg.n_layers, dtype=torch.bool, device=device)
    embed = torch.zeros(k, dtype=torch.bool, device=device)
    for i, s in enumerate(senders):
        if s.kind == "head":
            heads[i, s.layer, s.head] = True
        elif s.kind == "mlp":
            mlps[i, s.layer] = True
        else:
            embed[i] = True

    def paste(mask: torch.Tensor, name: str, frozen: bool) -> Hook:
        def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
            tiled = _tiled(k, act)  # [k, batch, pos, ...]
            if mask.ndim == 2:  # one flag per head: [k, n_heads] -> [k, 1, 1, n_heads, 1]
                where = mask.reshape(k, 1, 1, cfg.n_heads, 1)
            else:
                where = mask.reshape(k, *[1] * (tiled.ndim - 1))
            base = corr[name].to(act)[None] if frozen else tiled
            return torch.where(where, clean[name].to(act)[None], base).reshape(act.shape)

        return (name, hook)

    recorded: dict[str, torch.Tensor] = {}

    def record(act: torch.Tensor, hook: Any) -> torch.Tensor:
        recorded[hook.name] = act.clone()  # a view of storage the pass goes on using
        return act

    start = min(0 if s.kind == "embed" else s.layer for s in senders)
    out = any(r.kind == "output" for r in receivers)
    stop = cfg.n_layers if out else max(r.layer for r in receivers) + 1
    hooks: list[Hook] = [paste(embed, "hook_embed", frozen=False)] if start == 0 else []
    for ell in range(start, stop):
        hooks.append(paste(heads[:, ell], f"blocks.{ell}.attn.hook_result", frozen=True))
        if not cfg.attn_only and (freeze_mlps or bool(mlps[:, ell].any())):
            hooks.append(paste(mlps[:, ell], f"blocks.{ell}.hook_mlp_out", frozen=freeze_mlps))
    hooks += [(name, record) for name in sorted({_input_hook(r, cfg.n_layers) for r in receivers})]
    x = corrupted_x if start == 0 else _resid(model, corrupted_x, start, corr)
    with model.hooks(fwd_hooks=hooks):
        model(x.repeat(k, 1, 1), start_at_layer=start or None, stop_at_layer=stop)
    return recorded


def _input_hook(r: _Node, n_layers: int) -> str:
    """Where a receiver's input is recorded (run 2) and pasted (run 3)."""
    if r.kind == "head":
        return f"blocks.{r.layer}.attn.hook_{r.channel}"
    if r.kind == "mlp":
        return f"blocks.{r.layer}.mlp.hook_pre"
    return f"blocks.{n_layers - 1}.hook_resid_post"


def _resid(
    model: HookedVectorTransformer, x: torch.Tensor, layer: int, corr: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The corrupted residual stream entering block ``layer``, computed once. Not the cached
    ``hook_resid_pre``, which is what leaves that hook point: a hook there would run twice."""
    key = f"start {layer}"
    if key not in corr:
        corr[key] = model(x, stop_at_layer=layer)
    return corr[key]


def _run_3(
    model: HookedVectorTransformer,
    corrupted_x: torch.Tensor,
    corr: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
    receivers: list[_Node],
    k: int,
    metric: Metric,
) -> list[torch.Tensor]:
    """Copy ``i`` of the corrupted run with the receivers' inputs from run 2's copy ``i``."""
    n = model.cfg.n_layers
    by_hook: dict[str, list[int]] = {}
    for r in receivers:
        by_hook.setdefault(_input_hook(r, n), []).append(r.head)

    def paste(name: str, heads: list[int]) -> Hook:
        new = inputs[name]

        def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
            if name.endswith("hook_resid_post"):  # the output: add the path's difference
                return (_tiled(k, act) + (_tiled(k, new) - corr[name].to(act))).reshape(act.shape)
            if name.endswith("hook_pre"):  # an MLP's whole input
                return new.to(act)
            patched = act.clone()
            patched[:, :, heads] = new[:, :, heads].to(act)
            return patched

        return (name, hook)

    start = min(min(r.layer for r in receivers), n - 1)
    x = _resid(model, corrupted_x, start, corr).repeat(k, 1, 1)
    with model.hooks(fwd_hooks=[paste(name, heads) for name, heads in by_hook.items()]):
        out = _tiled(k, model(x, start_at_layer=start))
    return [_scalar(metric(out[i]), out) for i in range(k)]
