"""Subspace patching: paste only the projection of a source run's activation onto a
subspace into a base run; the orthogonal complement stays the base's.

For an orthonormal basis ``Q`` (``[d, k]``) of the subspace, the patched activation is::

    a' = a + ((s - a) Q) Q^T

(``a`` the base run's activation, ``s`` the source run's): its component in the subspace
is the source's, its component orthogonal to it the base's. With the whole space
(``Q Q^T = I``) this is ordinary activation patching, with an empty subspace the base run.
This is the interchange intervention on a subspace of Atticus Geiger, Zhengxuan Wu,
Christopher Potts, Thomas Icard and Noah Goodman, "Finding Alignments Between
Interpretable Causal Variables and Distributed Neural Representations", 2023,
arXiv:2303.02536; :func:`~vecinterp.alignment_search` learns the subspace.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from ..hooks import HookFn, HookPoint
from ..model import HookedVectorTransformer
from ._points import block_of, capture, resolve_points
from .patching import Metric, _check_runs, _scalar

__all__ = ["orthonormal_basis", "patch_subspace", "subspace_patch_hook"]

_BY = ("layer_pos", "layer")
_AUTO_SEQUENCES = 512


def orthonormal_basis(subspace: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis ``[..., d, k]`` of the span of the columns of ``subspace``.

    ``subspace`` is ``[..., d, k]`` (a ``[d]`` vector is one column). The basis comes from
    an SVD in float64 and is returned in ``subspace``'s dtype: columns of ``U`` whose
    singular value is above ``max(d, k) * eps * s_max`` are kept, the others are set to
    zero (so a rank-deficient or zero ``subspace`` patches fewer directions, and the zero
    subspace none). The shape stays ``[..., d, k]``.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.subspace import orthonormal_basis
        >>> q = orthonormal_basis(torch.tensor([[3.0, 6.0], [4.0, 8.0]]))  # rank 1
        >>> q.abs()
        tensor([[0.6000, 0.0000],
                [0.8000, 0.0000]])
    """
    if not isinstance(subspace, torch.Tensor) or not subspace.is_floating_point():
        raise TypeError(f"subspace must be a float tensor [d, k] or [d], got {subspace!r:.60}")
    if subspace.ndim == 0:
        raise ValueError(
            f"subspace must be [..., d, k] (columns spanning it) or [d] (one direction), got "
            f"a 0-d tensor {subspace.item()!r}: pass a direction such as torch.tensor([1.0, 0.0])"
        )
    if subspace.ndim == 1:
        subspace = subspace[:, None]
    if not subspace.isfinite().all():
        raise ValueError("subspace must be finite")
    if subspace.shape[-1] == 0:
        return subspace.clone()
    b = subspace.to(torch.float64)
    u, s, _ = torch.linalg.svd(b, full_matrices=False)
    tol = max(b.shape[-2:]) * torch.finfo(torch.float64).eps * s.amax(-1, keepdim=True)
    keep = (s > tol) & (s > 0)
    q = u * keep[..., None, :]
    if q.shape[-1] < subspace.shape[-1]:  # k > d: pad with zero columns
        pad = subspace.shape[-1] - q.shape[-1]
        q = torch.cat([q, q.new_zeros(*q.shape[:-1], pad)], -1)
    return q.to(subspace.dtype)


def subspace_patch_hook(
    source_activation: torch.Tensor,
    subspace: torch.Tensor,
    index: tuple[int | slice, ...] = (),
) -> HookFn:
    """A forward hook that pastes the source's component in ``subspace`` into one slice.

    On the slice ``[:, *index]`` (the batch axis taken whole; e.g. ``(3,)`` for position
    3, ``()`` for every position) the hook returns ``a + ((s - a) Q) Q^T`` with ``Q`` an
    orthonormal basis of ``subspace`` (:func:`orthonormal_basis`), ``a`` the activation
    and ``s`` ``source_activation``; elsewhere the activation is copied unchanged.

    Args:
        source_activation: the source run's activation, the shape of the activation the
            hook will see (``[batch, pos, d]``).
        subspace: ``[d, k]`` (columns spanning the subspace) or ``[d]`` (one direction).
        index: the slice after the batch axis.

    Returns:
        ``fn(activation, hook) -> patched activation``.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.subspace import subspace_patch_hook
        >>> base, source = torch.zeros(1, 2, 3), torch.ones(1, 2, 3)
        >>> hook = subspace_patch_hook(source, torch.tensor([1.0, 0.0, 0.0]), (1,))
        >>> hook(base, hook=None)[0]
        tensor([[0., 0., 0.],
                [1., 0., 0.]])
    """
    if not isinstance(source_activation, torch.Tensor):
        raise TypeError(
            f"source_activation must be a tensor, got {type(source_activation).__name__}"
        )
    q = orthonormal_basis(subspace)
    if q.ndim != 2 or q.shape[0] != source_activation.shape[-1]:
        raise ValueError(
            f"subspace must be [d, k] or [d] with d = {source_activation.shape[-1]} (the "
            f"activation's last axis), got {tuple(subspace.shape)}"
        )
    if not isinstance(index, tuple) or not all(
        isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool)) for i in index
    ):
        raise TypeError(f"index must be a tuple of ints and slices, got {index!r}")
    _check_index(index, tuple(source_activation.shape))
    where = (slice(None), *index)

    def hook(activation: torch.Tensor, hook: HookPoint | None) -> torch.Tensor:
        if activation.shape != source_activation.shape:
            name = getattr(hook, "name", "?")
            raise ValueError(
                f"subspace_patch_hook at {name!r}: the source activation has shape "
                f"{tuple(source_activation.shape)} but the activation has "
                f"{tuple(activation.shape)}"
            )
        patched = activation.clone()
        patched[where] = _project_in(
            activation[where], source_activation[where].to(activation), q.to(activation)
        )
        return patched

    return hook


def _check_index(index: tuple[int | slice, ...], shape: tuple[int, ...]) -> None:
    """``index`` addresses the axes between the batch and the features of an activation of
    ``shape`` (``ValueError`` naming the entry and the axis otherwise)."""
    between = shape[1:-1]
    if len(index) > len(between):
        raise ValueError(
            f"index {index!r} has {len(index)} entries, but the source activation "
            f"{shape} has {len(between)} axes between the batch and the features (the last "
            "axis is the one the subspace lives in); e.g. (3,) for position 3"
        )
    for axis, (i, size) in enumerate(zip(index, between, strict=False), start=1):
        if isinstance(i, int) and not -size <= i < size:
            raise ValueError(
                f"index {index!r} is out of range: entry {i} indexes axis {axis} of the source "
                f"activation {shape}, which has {size} entries"
            )


def patch_subspace(
    model: HookedVectorTransformer,
    source_x: Float[torch.Tensor, "batch pos d_in"],
    base_x: Float[torch.Tensor, "_batch _pos _d_in"],
    metric: Metric,
    hook_name: str,
    subspace: torch.Tensor,
    *,
    by: str = "layer_pos",
    chunk_size: int | None = None,
    progress: bool = True,
) -> Float[torch.Tensor, "..."]:
    """Run the base input with the source run's component in a subspace patched in, cell
    by cell; measure each.

    The arguments and the layout of the result are those of
    :func:`~vecinterp.activation_patching` (``source_x`` in the place of ``clean_x``,
    ``base_x`` in that of ``corrupted_x``), for hook points laid out ``[batch, pos, d]``
    (residual points, ``attn_out``, ``mlp_out``, ``pre``/``post``, the embeddings). In
    each cell only the projection onto the subspace is patched: ``a' = a + ((s - a) Q)
    Q^T`` (:func:`subspace_patch_hook`); the rest stays the base run's. With the whole
    space as subspace the result is :func:`~vecinterp.activation_patching`'s (to
    rounding), with a zero subspace every cell is the base run.

    ===============  ==========================  =================================
    ``by``           cell                        result (short name: ``n_layers``
                                                 axis first)
    ===============  ==========================  =================================
    ``"layer_pos"``  one position                ``[pos]``
    ``"layer"``      every position              ``[]``
    ===============  ==========================  =================================

    Args:
        model: the model (not modified).
        source_x: the input whose component in the subspace is pasted ``[batch, pos,
            d_in]``.
        base_x: the input that is run, the same shape.
        metric: ``metric(output [batch, pos, d_out]) -> scalar``, once per cell.
        hook_name: a short name (every layer) or a full hook name.
        subspace: the subspace, as columns spanning it: ``[d]`` (one direction, e.g. a
            probe's weight), ``[d, k]`` (the same subspace in every cell), or ``[*cells,
            d, k]`` with ``cells`` the result's shape (one subspace per cell, e.g. a
            probe's ``weight[i:j]`` ``[n_layers, pos, d, k]``). Columns need not be
            orthonormal: they are orthonormalised (:func:`orthonormal_basis`).
        by: ``"layer_pos"`` (default) or ``"layer"``.
        chunk_size: cells per forward pass; ``None`` picks ``max(1, 512 // batch)``.
        progress: show a progress bar over the forward passes.

    Returns:
        The metric per cell (float, on the model's device).

    Raises:
        ValueError: inputs of different shapes or not valid for the model; an unknown hook
            name or one not laid out ``[batch, pos, d]``; a subspace of the wrong shape or
            not finite; an unknown ``by``; a metric that does not return a scalar.
        TypeError: a metric that is not callable; a subspace that is not a float tensor.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> source, base = torch.randn(4, 5, 3), torch.randn(4, 5, 3)
        >>> metric = lambda y: y[:, -1].sum()
        >>> direction = torch.randn(8)
        >>> vi.patch_subspace(model, source, base, metric, "resid_pre", direction,
        ...                   progress=False).shape
        torch.Size([2, 5])
    """
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"model: expected a HookedVectorTransformer, got {type(model).__name__}")
    _check_runs(model, source_x, base_x, metric, names=("source_x", "base_x"))
    if by not in _BY:
        raise ValueError(f"by must be one of {_BY}, got {by!r}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if not isinstance(hook_name, str):
        raise TypeError(f"hook_name must be a str, got {type(hook_name).__name__}")
    names = resolve_points(model, hook_name, "hook_name")
    layered = not ("." in hook_name or hook_name.startswith("hook_"))
    batch, n_pos = source_x.shape[0], source_x.shape[1]
    cells: list[tuple[int | slice, ...]] = (
        [(p,) for p in range(n_pos)] if by == "layer_pos" else [()]
    )
    cell_shape = ((len(names),) if layered else ()) + ((n_pos,) if by == "layer_pos" else ())
    with torch.no_grad():
        source = capture(
            model, source_x, names, range(n_pos), chunk_size=batch, progress=False, desc=""
        )
        d = source[names[0]].shape[-1]
        bases = _per_cell(subspace, cell_shape, d).reshape(len(names), len(cells), d, -1)
        k_max = max(1, _AUTO_SEQUENCES // batch) if chunk_size is None else chunk_size
        passes = [(i, start) for i in range(len(names)) for start in range(0, len(cells), k_max)]
        values: list[torch.Tensor] = []
        resid: dict[int, torch.Tensor] = {}
        for i, start in tqdm(passes, desc="subspace patching", disable=not progress):
            name = names[i]
            layer = _start(model, name)
            if layer not in resid:
                resid[layer] = model(base_x, stop_at_layer=layer) if layer else base_x
            chunk = list(range(start, min(start + k_max, len(cells))))
            values += _pass(
                model,
                resid[layer],
                layer,
                metric,
                name,
                source[name],
                [cells[c] for c in chunk],
                bases[i, chunk],
            )
    result = torch.stack(values).reshape(cell_shape)
    return result


def _start(model: HookedVectorTransformer, name: str) -> int:
    block = block_of(name)
    return 0 if block is None else model.cfg.n_layers if block == -1 else block


def _per_cell(subspace: object, cell_shape: tuple[int, ...], d: int) -> torch.Tensor:
    """``[*cell_shape, d, k]`` orthonormal bases from the ``subspace`` argument."""
    if not isinstance(subspace, torch.Tensor) or not subspace.is_floating_point():
        raise TypeError(f"subspace must be a float tensor, got {type(subspace).__name__}")
    s = subspace.detach()
    if s.ndim == 1:
        s = s[:, None]
    shared = s.ndim == 2
    if not shared and tuple(s.shape[:-2]) != cell_shape:
        raise ValueError(
            f"subspace must be [d={d}], [d={d}, k] or [*cells, d={d}, k] with cells = "
            f"{cell_shape} (the result's shape), got {tuple(subspace.shape)}"
        )
    if s.shape[-2] != d:
        raise ValueError(
            f"subspace has d = {s.shape[-2]} but the activation at the hook point has "
            f"{d} features (shape {tuple(subspace.shape)})"
        )
    q = orthonormal_basis(s)
    return q.expand(*cell_shape, *q.shape[-2:]) if shared else q


def _project_in(base: torch.Tensor, source: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``base + ((source - base) q) q^T``: the source's component in span(q)."""
    return base + ((source - base) @ q) @ q.mT


def _pass(
    model: HookedVectorTransformer,
    base: torch.Tensor,
    start: int,
    metric: Metric,
    name: str,
    source: torch.Tensor,
    chunk: Sequence[tuple[int | slice, ...]],
    bases: torch.Tensor,
) -> list[torch.Tensor]:
    """One forward pass over ``len(chunk)`` copies of the base batch, copy ``i`` patched
    in the subspace ``bases[i]`` at cell ``chunk[i]``; the metric of each copy."""
    k, batch = len(chunk), base.shape[0]

    def hook(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        tiled = act.reshape(k, batch, *act.shape[1:])
        patched = tiled.clone()
        src = source.to(act)
        for i, cell in enumerate(chunk):
            where = (slice(None), *cell)
            patched[i][where] = _project_in(tiled[i][where], src[where], bases[i].to(act))
        return patched.reshape(act.shape)

    x = base.repeat(k, 1, 1)
    with model.hooks(fwd_hooks=[(name, hook)]):
        out = model(x, start_at_layer=start) if start else model(x)
    out = out.reshape(k, batch, *out.shape[1:])
    return [_scalar(metric(out[i]), out) for i in range(k)]
