"""Activation patching: paste a clean run's activation into a corrupted run, cell by cell.

Activation patching asks *where* a difference between two inputs lives: run the model on
the corrupted input, paste in the clean run's activation at one place (a "cell": a layer
and position, a head, a head at one position, ...), and measure the output. Cells are
swept in batches: the corrupted input is tiled once per cell and one forward pass patches
a different cell in each copy, so a sweep over ``c`` cells costs ``ceil(c / chunk_size)``
passes per hook point rather than ``c``.

Unlike TransformerLens's patching helpers, the number of positions is read from
``clean_x.shape[1]``, never from the last axis of the input (which is ``d_in`` here).

The pseudoinverse QK patch, a weight edit rather than an activation patch, lives in
:mod:`vecinterp.analysis.qk_patch`; :func:`patch_qk_identity` is re-exported here.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from ..cache import act_name
from ..hooks import HookFn, HookPoint
from ..model import HookedVectorTransformer
from ..model.validation import check_input
from ._clean import clean_activations
from ._validate import check_model
from .qk_patch import patch_qk_identity

__all__ = ["activation_patching", "patch_hook", "patch_qk_identity"]

_HEAD_LEAVES = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_z", "hook_result")
"""Hook points laid out ``[batch, pos, n_heads, ...]``."""
_KV_LEAVES = ("hook_k", "hook_v", "hook_rot_k")  # of those, one head per key/value head
_DEST_LEAVES = ("hook_pattern", "hook_attn_scores")
"""Hook points laid out ``[batch, n_heads, dest_pos, src_pos]``."""
_BY = ("layer_pos", "layer", "head", "head_pos", "feature", "feature_pos")
_AUTO_SEQUENCES = 512
"""With ``chunk_size=None``, a pass holds at most this many sequences (at least one copy)."""

Metric = Callable[[torch.Tensor], Any]
"""``metric(output [batch, pos, d_out]) -> scalar tensor`` (or a Python number)."""


def patch_hook(clean_activation: torch.Tensor, index: tuple[int | slice, ...] = ()) -> HookFn:
    """A forward hook that pastes ``clean_activation`` into one slice of an activation.

    The hook returns a copy of the activation ``a`` with
    ``a[:, *index] = clean_activation[:, *index]`` (the batch axis is always taken
    whole); everything else is left as it was. Use it for single, hand-picked patches;
    :func:`activation_patching` sweeps many cells in batched passes.

    Args:
        clean_activation: the clean run's activation, the same shape as the activation
            the hook will see (e.g. ``cache["z", 1]`` ``[batch, pos, n_heads, d_head]``).
        index: the slice after the batch axis, e.g. ``(3,)`` for position 3 of a
            residual activation, ``(slice(None), 2)`` for head 2 of ``hook_z`` at every
            position, ``(2, 3)`` for head 2's destination row 3 of ``hook_pattern``.

    Returns:
        ``fn(activation, hook) -> patched activation``.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.patching import patch_hook
        >>> clean, act = torch.ones(2, 3, 4), torch.zeros(2, 3, 4)
        >>> patch_hook(clean, (1,))(act, hook=None)[0, :, 0]
        tensor([0., 1., 0.])
    """
    if not isinstance(clean_activation, torch.Tensor):
        raise TypeError(f"clean_activation must be a tensor, got {type(clean_activation).__name__}")
    where = (slice(None), *_as_index(index))
    _check_index_in_range(index, tuple(clean_activation.shape))

    def hook(activation: torch.Tensor, hook: HookPoint | None) -> torch.Tensor:
        if activation.shape != clean_activation.shape:
            name = getattr(hook, "name", "?")
            raise ValueError(
                f"patch_hook at {name!r}: the clean activation has shape "
                f"{tuple(clean_activation.shape)} but the activation has {tuple(activation.shape)}"
            )
        patched = activation.clone()
        patched[where] = clean_activation[where].to(activation)
        return patched

    return hook


def activation_patching(
    model: HookedVectorTransformer,
    clean_x: Float[torch.Tensor, "batch pos d_in"],
    corrupted_x: Float[torch.Tensor, "_batch _pos _d_in"],
    metric: Metric,
    hook_name: str,
    *,
    by: str = "layer_pos",
    clean_cache: Mapping[str, torch.Tensor] | None = None,
    chunk_size: int | None = None,
    progress: bool = True,
) -> Float[torch.Tensor, "..."]:
    """Run the corrupted input with one clean activation patched in per cell; measure each.

    For every cell ``c`` (see ``by``), the patched run replaces, in the activation at
    ``hook_name``, the slice that ``c`` names by the clean run's activation there, on the
    whole batch, and records ``metric(patched output)``. Nothing else is changed, so
    patching the entire ``resid_pre`` of a layer gives back exactly the clean output.

    Cells (``pos`` is ``clean_x.shape[1]``; for ``pattern``/``attn_scores`` a position is
    a destination position, i.e. one row of the pattern):

    =================  ========================================  ======================
    ``by``             cell                                      result per hook point
    =================  ========================================  ======================
    ``"layer_pos"``    one position (all heads, all features)    ``[pos]``
    ``"layer"``        the whole activation                      ``[]``
    ``"head"``         one head at every position                ``[n_heads]``
    ``"head_pos"``     one head at one position                  ``[n_heads, pos]``
    ``"feature"``      one feature (last axis), every position   ``[n_features]``
    ``"feature_pos"``  one feature at one position               ``[n_features, pos]``
    =================  ========================================  ======================

    ``"head"`` and ``"head_pos"`` need a per-head hook point: ``q``, ``k``, ``v``,
    ``rot_q``, ``rot_k``, ``z``, ``result`` (``[batch, pos, n_heads, ...]``) or
    ``pattern``, ``attn_scores`` (``[batch, n_heads, dest_pos, src_pos]``).
    ``"feature"`` and ``"feature_pos"`` need a point laid out ``[batch, pos, features]``
    (``n_features`` its last axis): a spliced dictionary's feature point
    ``<point>.hook_sae_acts_post`` (``[batch, pos, d_sae]``, one cell per feature; see
    :func:`vecinterp.dictionary.splice`), an MLP's ``hook_post`` (one neuron), a residual
    point (one coordinate). A dictionary's hook points (``<point>.hook_sae_acts_post``,
    ``.hook_sae_error``, ...) are swept like any other full hook name; with the error term
    the error is computed from the run's own input, so a patched feature moves the point by
    ``(clean - corrupted act) * W_dec[i]`` and nothing else.

    A short ``hook_name`` (``"resid_pre"``, ``"resid_mid"``, ``"resid_post"``,
    ``"attn_out"``, ``"mlp_out"``, ``"pre"``, ``"post"``, ``"z"``, ``"pattern"``, ...)
    sweeps that hook point in every layer and prepends an ``n_layers`` axis: e.g.
    ``[n_layers, pos]`` for ``by="layer_pos"``, ``[n_layers, n_heads]`` for ``"head"``,
    ``[n_layers, n_heads, pos]`` for ``"head_pos"``, ``[n_layers]`` for ``"layer"``. A full
    name (``"blocks.1.attn.hook_z"``, ``"hook_embed"``) sweeps that one hook point and has
    no layer axis. Grouped-query ``k``, ``v``, ``rot_k`` have ``n_key_value_heads`` heads.

    Batching: for each hook point, the corrupted batch is tiled ``k`` times (``k =
    chunk_size`` cells per pass) and copy ``i`` patches cell ``i`` only, with a boolean
    mask (``torch.where``, so unpatched values are copied bit for bit). Each copy's
    output is then exactly what a single-cell run would give, up to the BLAS kernels'
    summation order for different batch sizes (bit-identical in our float64 tests).
    A pass never mixes hook points, and for a hook point in block ``L`` it starts at block
    ``L`` from the corrupted residual stream, computed once (``start_at_layer``): the
    blocks before ``L`` are the same in every copy.

    Args:
        model: the model (not modified; the hooks are removed even on errors).
        clean_x: the clean input ``[batch, pos, d_in]``.
        corrupted_x: the corrupted input, the same shape as ``clean_x``.
        metric: ``metric(output) -> scalar``, called once per cell on the patched output
            ``[batch, pos, d_out]`` of that cell's copy (the same batch as ``clean_x``),
            e.g. ``lambda y: vi.masked_mse(y, targets)``. It must return a tensor with one
            element or a Python number.
        hook_name: a short activation name (all layers) or a full hook name (one hook).
        by: ``"layer_pos"`` (default), ``"layer"``, ``"head"``, ``"head_pos"``,
            ``"feature"`` or ``"feature_pos"``.
        clean_cache: the clean run's activations (an :class:`~vecinterp.ActivationCache`
            or a dict keyed by full hook name); computed from ``clean_x`` when ``None``.
            When it holds ``hook_embed`` (``run_with_cache`` without a ``names_filter``
            keeps it), that must be the model's embedding of ``clean_x``: a cache of
            another input (e.g. of ``corrupted_x``) is refused. A cache without it is
            taken as given (a dict of one's own activations is a legitimate what-if).
        chunk_size: cells (copies of the batch) per forward pass, to bound memory;
            ``None`` picks ``max(1, 512 // batch)``.
        progress: show a progress bar over the forward passes.

    Returns:
        The metric per cell, shaped as in the table above (float, on the model's device).

    Raises:
        ValueError: inputs of different shapes or not valid for the model; an unknown
            hook name or ``by``; a ``clean_cache`` missing a swept hook point, of another
            batch, or not made from ``clean_x``; clean activations holding NaN or inf (in
            ``clean_cache`` or from the run on ``clean_x``: every cell would be NaN); a
            metric that does not return a scalar.
        TypeError: a metric that is not callable, a ``clean_cache`` that is no mapping.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.patching import activation_patching
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> clean, corrupted = torch.randn(4, 5, 3), torch.randn(4, 5, 3)
        >>> metric = lambda y: y[:, -1].sum()
        >>> activation_patching(model, clean, corrupted, metric, "resid_pre",
        ...                     progress=False).shape
        torch.Size([2, 5])
        >>> activation_patching(model, clean, corrupted, metric, "z", by="head_pos",
        ...                     progress=False).shape
        torch.Size([2, 2, 5])
    """
    model = check_model(model)
    _check_patching_args(model, clean_x, corrupted_x, metric, by, chunk_size)
    names, layered = _resolve_hook_names(model, hook_name)
    layout = _layout(names[0])
    check_layout(by, layout, hook_name)
    batch, n_pos = clean_x.shape[0], clean_x.shape[1]
    n_heads = model.cfg.n_kv_heads if names[0].endswith(_KV_LEAVES) else model.cfg.n_heads
    k_max = max(1, _AUTO_SEQUENCES // batch) if chunk_size is None else chunk_size
    with torch.no_grad():
        clean_acts = clean_activations(model, clean_x, names, clean_cache, finite=True)
        n_features = clean_acts[names[0]].shape[-1]  # the last axis: by="feature*" cells
        cells, cell_shape = _cells(layout, by, n_pos, n_heads, n_features)
        passes = [
            (name, cells[start : start + k_max])
            for name in names
            for start in range(0, len(cells), k_max)
        ]
        # Blocks before the patched one see the same corrupted input in every copy: run them
        # once per hook point and start each patched pass at the patched block.
        starts = {name: _start_layer(name) for name in names}
        resid = {
            layer: model(corrupted_x, stop_at_layer=layer) if layer else corrupted_x
            for layer in set(starts.values())
        }
        values: list[torch.Tensor] = []
        for name, chunk in tqdm(passes, desc="activation patching", disable=not progress):
            values += _patched_pass(
                model, resid[starts[name]], starts[name], metric, name, clean_acts[name], chunk
            )
    result = torch.stack(values).reshape(len(names), *cell_shape)
    return result if layered else result[0]


def _as_index(index: object) -> tuple[int | slice, ...]:
    if not isinstance(index, tuple) or not all(
        isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool)) for i in index
    ):
        raise TypeError(f"index must be a tuple of ints and slices, got {index!r}")
    return index


def _check_index_in_range(index: tuple[int | slice, ...], shape: tuple[int, ...]) -> None:
    """Each int of ``index`` (the axes after the batch) within its axis of ``shape``."""
    if len(index) > len(shape) - 1:
        raise ValueError(
            f"patch_hook: index {index!r} has {len(index)} entries but the activation "
            f"{shape} has only {len(shape) - 1} axes after the batch"
        )
    for axis, (i, size) in enumerate(zip(index, shape[1:], strict=False), start=1):
        if isinstance(i, int) and not -size <= i < size:
            raise ValueError(
                f"patch_hook: index {index!r} is out of range: entry {i} indexes axis {axis} "
                f"of the activation {shape}, which has {size} entries (a position, a head, "
                f"... in [{-size}, {size - 1}])"
            )


def _resolve_hook_names(
    model: HookedVectorTransformer, hook_name: object
) -> tuple[list[str], bool]:
    """The full hook names to sweep, and whether there is one per layer."""
    if not isinstance(hook_name, str):
        raise TypeError(f"hook_name must be a str, got {type(hook_name).__name__}")
    if "." in hook_name or hook_name.startswith("hook_"):
        return [model.hook_point(hook_name).name], False
    try:
        names = [act_name(hook_name, layer) for layer in range(model.cfg.n_layers)]
    except KeyError:
        try:
            return [model.hook_point(act_name(hook_name)).name], False
        except KeyError:
            raise ValueError(
                f"unknown hook name {hook_name!r}: expected a short name such as 'resid_pre', "
                "'resid_mid', 'resid_post', 'attn_out', 'mlp_out', 'q', 'k', 'v', 'z', "
                "'result', 'pattern', 'attn_scores', or a full hook name such as "
                "'blocks.0.hook_resid_pre'"
            ) from None
    return [model.hook_point(name).name for name in names], True


def _layout(name: str) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _HEAD_LEAVES:
        return "head"
    if leaf in _DEST_LEAVES:
        return "dest"
    return "position"


def check_layout(by: str, layout: str, hook_name: str) -> None:
    """Refuse a ``by`` the layout of the hook point has no axis for (shared with
    attribution patching)."""
    if by in ("head", "head_pos") and layout == "position":
        raise ValueError(
            f"by={by!r} needs a per-head hook point (one of q, k, v, rot_q, rot_k, z, result, "
            f"pattern, attn_scores), got {hook_name!r}; use by='layer_pos', 'layer', "
            "'feature' or 'feature_pos'"
        )
    if by in ("feature", "feature_pos") and layout != "position":
        raise ValueError(
            f"by={by!r} needs a hook point laid out [batch, pos, features] (e.g. a spliced "
            f"dictionary's '<point>.hook_sae_acts_post', an MLP's hook_post), got {hook_name!r} "
            "with per-head axes; use by='head', 'head_pos', 'layer_pos' or 'layer'"
        )


def _cells(
    layout: str, by: str, n_pos: int, n_heads: int, n_features: int = 0
) -> tuple[list[tuple[int | slice, ...]], tuple[int, ...]]:
    """Each cell as an index after the batch axis, in result order, and the result shape."""
    every = slice(None)
    if by == "feature":
        return [(every, f) for f in range(n_features)], (n_features,)
    if by == "feature_pos":
        cells_f: list[tuple[int | slice, ...]] = [
            (p, f) for f in range(n_features) for p in range(n_pos)
        ]
        return cells_f, (n_features, n_pos)
    if by == "layer":
        return [()], ()
    if by == "layer_pos":
        # a position is axis 0 after the batch, except in [batch, n_heads, dest, src]
        return [(every, p) if layout == "dest" else (p,) for p in range(n_pos)], (n_pos,)
    if by == "head":
        return [(h,) if layout == "dest" else (every, h) for h in range(n_heads)], (n_heads,)
    cells: list[tuple[int | slice, ...]] = [
        (h, p) if layout == "dest" else (p, h) for h in range(n_heads) for p in range(n_pos)
    ]
    return cells, (n_heads, n_pos)


def _start_layer(name: str) -> int:
    """The block a pass patching hook point ``name`` can start at: its own block for
    ``blocks.L.*`` (0 for the embedding hooks, which come before every block)."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blocks" else 0


def _patched_pass(
    model: HookedVectorTransformer,
    corrupted_x: torch.Tensor,
    start: int,
    metric: Metric,
    name: str,
    clean: torch.Tensor,
    chunk: Sequence[tuple[int | slice, ...]],
) -> list[torch.Tensor]:
    """One forward pass over ``len(chunk)`` copies of the corrupted batch, copy ``i``
    patched at cell ``chunk[i]``; the metric of each copy. ``corrupted_x`` is the corrupted
    input (``start == 0``) or its residual stream entering block ``start``."""
    k, batch = len(chunk), corrupted_x.shape[0]
    n_indexed = 1 if _layout(name) == "position" else 2
    n_indexed = max([n_indexed, *(len(cell) for cell in chunk)])  # a feature cell: (pos, f)

    def hook(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        rest = act.shape[1:]
        if clean.shape != (batch, *rest):
            raise ValueError(
                f"the clean activation at {name!r} has shape {tuple(clean.shape)}, expected "
                f"{(batch, *rest)} like the corrupted run's"
            )
        mask = torch.zeros(k, *rest[:n_indexed], dtype=torch.bool, device=act.device)
        for i, cell in enumerate(chunk):
            mask[i][cell] = True
        mask = mask.reshape(k, 1, *rest[:n_indexed], *[1] * (len(rest) - n_indexed))
        tiled = act.reshape(k, batch, *rest)
        return torch.where(mask, clean.to(act)[None], tiled).reshape(act.shape)

    x = corrupted_x.repeat(k, 1, 1)
    with model.hooks(fwd_hooks=[(name, hook)]):
        out = model(x, start_at_layer=start) if start else model(x)
    out = out.reshape(k, batch, *out.shape[1:])
    return [_scalar(metric(out[i]), out) for i in range(k)]


def _scalar(value: object, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=like.dtype, device=like.device)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        got = (
            f"a tensor of shape {tuple(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ValueError(f"metric must return a scalar (one-element tensor or number), got {got}")
    return value.detach().reshape(()).to(like.device)


def _check_patching_args(
    model: HookedVectorTransformer,
    clean_x: object,
    corrupted_x: object,
    metric: object,
    by: object,
    chunk_size: object,
) -> None:
    """The argument checks ``activation_patching`` and ``attribution_patching`` share."""
    _check_runs(model, clean_x, corrupted_x, metric)
    if by not in _BY:
        raise ValueError(f"by must be one of {_BY}, got {by!r}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")


def _check_runs(
    model: HookedVectorTransformer,
    clean_x: object,
    corrupted_x: object,
    metric: object,
    names: tuple[str, str] = ("clean_x", "corrupted_x"),
) -> None:
    """Two inputs of one shape, each valid for ``model``, and a callable metric; errors
    call the inputs ``names`` (the caller's own argument names)."""
    first, second = names
    check_input(clean_x, model.cfg, model.W_E, name=first)
    assert isinstance(clean_x, torch.Tensor)
    if not isinstance(corrupted_x, torch.Tensor) or corrupted_x.shape != clean_x.shape:
        got = (
            tuple(corrupted_x.shape)
            if isinstance(corrupted_x, torch.Tensor)
            else type(corrupted_x).__name__
        )
        raise ValueError(
            f"{first} and {second} must have the same shape [batch, pos, d_in]; "
            f"{first} is {tuple(clean_x.shape)}, {second} is {got}"
        )
    check_input(corrupted_x, model.cfg, model.W_E, name=second)
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}")
