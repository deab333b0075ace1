"""Attribution patching: the first-order estimate of activation patching, every cell at once.

:func:`~vecinterp.analysis.patching.activation_patching` runs the corrupted input once per
cell with the clean activation pasted in there. Attribution patching (Nanda, 2023, as in
TransformerLens's ``patching`` demos) replaces each of those runs by the first term of its
Taylor expansion around the corrupted run: with ``a`` the activation at the hook point,
``metric(patched at c) - metric(corrupted) ≈ Σ_{i in c} (a_clean - a_corr)_i ∂metric/∂a_i``,
the gradient taken at the corrupted run. One clean forward (none with
``clean_cache``), one corrupted forward that keeps the graph and one backward pass give
every cell of every hook point swept.
"""

import threading
from collections.abc import Mapping

import torch
from jaxtyping import Float

from ..hooks import HookPoint
from ..model import HookedVectorTransformer
from ._clean import clean_activations
from ._validate import check_model
from .patching import (
    Metric,
    _check_patching_args,
    _layout,
    _resolve_hook_names,
    check_layout,
)

__all__ = ["attribution_patching"]

_KEPT_AXES = {
    # layout -> by -> the axes of the activation a cell's result keeps, in result order
    # ("position": [batch, pos, ...]; "head": [batch, pos, n_heads, ...];
    #  "dest": [batch, n_heads, dest_pos, src_pos])
    "position": {"layer": (), "layer_pos": (1,), "feature": (2,), "feature_pos": (2, 1)},
    "head": {"layer": (), "layer_pos": (1,), "head": (2,), "head_pos": (2, 1)},
    "dest": {"layer": (), "layer_pos": (2,), "head": (1,), "head_pos": (1, 2)},
}


def attribution_patching(
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
    """Estimate, for every cell, how much patching in the clean activation changes the metric.

    For a cell ``c`` (a slice of the activation ``a`` at ``hook_name``, see ``by``), the
    estimate is the first-order Taylor term of the patched run around the corrupted run::

        attribution[c] = Σ_{i in c} (a_clean - a_corr)_i · ∂metric/∂a_i |_(corrupted run)

    summed over the batch, every feature, and (for a cell that spans them) every head and
    position. It estimates the *change* of the metric from the corrupted run's value,
    whereas :func:`~vecinterp.analysis.patching.activation_patching` returns the patched
    metric itself; compare them as::

        exact = activation_patching(model, clean_x, corrupted_x, metric, hook_name, by=by)
        exact - metric(model(corrupted_x))  # ≈ attribution_patching(... same arguments ...)

    The estimate is exact (up to rounding) when the metric, as a function of the activation
    at the hook point, is affine: e.g. a metric linear in the output and a hook point after
    which only linear maps follow (a last block's ``hook_z``, ``hook_v``, ``hook_pattern``,
    ``hook_result``, ``hook_attn_out``, ``hook_resid_post`` or an MLP's ``hook_post`` in a
    model with ``normalization=None``). Otherwise it is off by the second-order terms, so it
    is good where ``a_clean - a_corr`` is small and can be far off across a saturated
    softmax or a normalization.

    Arguments, hook names, cells and the layout of the result are
    :func:`~vecinterp.analysis.patching.activation_patching`'s (see its table): ``[pos]``
    for ``by="layer_pos"``, ``[]`` for ``"layer"``, ``[n_heads]`` for ``"head"``,
    ``[n_heads, pos]`` for ``"head_pos"``, ``[n_features]`` for ``"feature"``,
    ``[n_features, pos]`` for ``"feature_pos"`` (a ``[batch, pos, features]`` point such
    as a spliced dictionary's ``<point>.hook_sae_acts_post``), with an ``n_layers`` axis
    first for a short ``hook_name``. Forward hooks active during the call are part of the
    model in all runs, as in activation patching (the gradient flows through what they return); the
    estimate is taken with respect to what flows out of the hook point after them.

    Cost: one forward pass on ``clean_x`` (none when ``clean_cache`` is given), one on
    ``corrupted_x`` that keeps the graph, and one backward pass from the metric to the
    swept activations only (no weight gradient is formed), whatever the number of cells
    and hook points.

    Args:
        model: the model (not modified: no weight, no ``.grad`` and no hook is left
            changed, also when something raises).
        clean_x: the clean input ``[batch, pos, d_in]``.
        corrupted_x: the corrupted input, the same shape as ``clean_x``.
        metric: ``metric(output) -> scalar``, called once, on the corrupted run's output
            ``[batch, pos, d_out]``; it must return a one-element tensor computed from the
            output with differentiable torch operations (e.g.
            ``lambda y: vi.masked_mse(y, targets)``).
        hook_name: a short activation name (all layers) or a full hook name (one hook).
        by: ``"layer_pos"`` (default), ``"layer"``, ``"head"``, ``"head_pos"``,
            ``"feature"`` or ``"feature_pos"``.
        clean_cache: the clean run's activations (an :class:`~vecinterp.ActivationCache`
            or a dict keyed by full hook name); computed from ``clean_x`` when ``None``.
            When it holds ``hook_embed``, that must be the model's embedding of
            ``clean_x`` (a cache of another input is refused).
        chunk_size: accepted (and checked) so that a call written for
            ``activation_patching`` runs unchanged; every cell comes from the same two
            runs, so there is nothing to chunk.
        progress: likewise accepted and unused (three passes need no progress bar).

    Returns:
        The estimated change of the metric per cell (float, on the model's device), shaped
        as ``activation_patching``'s result.

    Raises:
        ValueError: as ``activation_patching`` (shapes, hook names, ``by``, the cache,
            a cache not made from ``clean_x``); also when the metric is not a one-element
            tensor attached to the output, when a backward hook is attached (it could
            replace the gradient the estimate is made of), or when ``a_clean - a_corr`` is
            not finite (the message says which run holds the NaN or inf).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6,
        ...     normalization=None), seed=0)
        >>> clean, corrupted = torch.randn(4, 5, 3), torch.randn(4, 5, 3)
        >>> metric = lambda y: y[:, -1].sum()
        >>> vi.attribution_patching(model, clean, corrupted, metric, "z", by="head_pos").shape
        torch.Size([2, 2, 5])
        >>> # only linear maps follow the last block's z here: the estimate is exact
        >>> name = "blocks.1.attn.hook_z"
        >>> estimate = vi.attribution_patching(model, clean, corrupted, metric, name, by="head")
        >>> patched = vi.activation_patching(model, clean, corrupted, metric, name, by="head",
        ...                                  progress=False)
        >>> torch.allclose(estimate, patched - metric(model(corrupted)), atol=1e-5)
        True
    """
    model = check_model(model)
    _check_patching_args(model, clean_x, corrupted_x, metric, by, chunk_size)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    names, layered = _resolve_hook_names(model, hook_name)
    layout = _layout(names[0])
    check_layout(by, layout, hook_name)
    _refuse_backward_hooks(model)
    with torch.no_grad():
        clean_acts = clean_activations(model, clean_x, names, clean_cache)
    corrupted_acts, grads = _corrupted_run_and_gradients(model, corrupted_x, metric, names)
    values = []
    with torch.no_grad():
        for name in names:
            clean, corrupted = clean_acts[name], corrupted_acts[name]
            if clean.shape != corrupted.shape:
                raise ValueError(
                    f"the clean activation at {name!r} has shape {tuple(clean.shape)}, "
                    f"expected {tuple(corrupted.shape)} like the corrupted run's"
                )
            clean = clean.to(corrupted)
            # equal entries contribute nothing, also where both are -inf (masked scores)
            diff = torch.where(clean == corrupted, 0.0, clean - corrupted)
            if not bool(diff.isfinite().all()):
                raise ValueError(_non_finite(name, diff, clean, corrupted, clean_cache is None))
            values.append(_cell_sums(diff * grads[name], _KEPT_AXES[layout][by]))
    result = torch.stack(values)
    return result if layered else result[0]


def _non_finite(
    name: str, diff: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor, computed: bool
) -> str:
    """The message for a non-finite ``a_clean - a_corr`` at ``name``: which run it comes
    from (``computed``: the clean activation came from a run on ``clean_x``, not from a
    ``clean_cache``)."""
    bad = ~diff.isfinite()
    n_clean = int((bad & ~clean.isfinite()).sum())
    n_corrupted = int((bad & ~corrupted.isfinite()).sum())
    source = "the clean run on clean_x" if computed else "clean_cache"
    parts = [f"{source} holds NaN or inf in {n_clean} of those entries"] if n_clean else []
    if n_corrupted:
        parts.append(f"the corrupted run on corrupted_x in {n_corrupted}")
    cause = (
        "; ".join(parts)
        if parts
        else "both activations are finite there, but their difference overflows"
    )
    hint = (
        "the inputs are finite, so the model overflows on them (check the scale of the "
        "inputs and of the weights)"
        if n_corrupted or computed
        else "pass the cache of model.run_with_cache(clean_x), or clean_cache=None"
    )
    return (
        f"the clean activation minus the corrupted one at {name!r} contains NaN or inf in "
        f"{int(bad.sum())} entries: {cause}; {hint}"
    )


def _refuse_backward_hooks(model: HookedVectorTransformer) -> None:
    """Raise if a backward hook this thread's passes would call is attached: it fires
    during the backward pass and may replace the gradient the estimate is made of."""
    me = threading.current_thread()
    points = [
        name
        for name, point in model.hook_dict.items()
        if any(h.owner is None or h.owner is me for h in point._bwd)
    ]
    if points:
        raise ValueError(
            f"attribution_patching takes gradients, and a backward hook is attached at "
            f"{points[:5]}{' ...' if len(points) > 5 else ''}: it could replace the "
            "gradient the estimate is made of; remove it first (handle.remove(), "
            "model.reset_hooks(), or leave its hooks() context)"
        )


def _corrupted_run_and_gradients(
    model: HookedVectorTransformer,
    corrupted_x: torch.Tensor,
    metric: Metric,
    names: list[str],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward pass on ``corrupted_x`` and one backward pass: the activation at each
    of ``names`` (as it leaves the point, after any other hook there) and the gradient of
    ``metric(output)`` with respect to it.

    Each hook returns ``act + zero`` with ``zero`` a leaf that requires grad: adding an
    exact zero changes no value, and the gradient with respect to ``zero`` is the gradient
    with respect to the activation, taken even when the weights are frozen and reaching
    nothing upstream (``torch.autograd.grad`` differentiates only towards the leaves)."""
    acts: dict[str, torch.Tensor] = {}
    zeros: dict[str, torch.Tensor] = {}

    def hook(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        zero = torch.zeros(act.shape, dtype=act.dtype, device=act.device, requires_grad=True)
        acts[hook.name], zeros[hook.name] = act.detach(), zero
        return act + zero

    # under a caller's inference_mode no graph is kept: leave it for these two passes
    with torch.inference_mode(False), torch.enable_grad():
        x = corrupted_x.clone() if corrupted_x.is_inference() else corrupted_x
        with model.hooks(fwd_hooks=[(name, hook) for name in names]):
            value = metric(model(x))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            got = (
                f"a tensor of shape {tuple(value.shape)}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise ValueError(
                f"metric must return a scalar (a one-element tensor computed from the "
                f"output, to be differentiated), got {got}"
            )
        if not value.requires_grad:
            raise ValueError(
                "metric's value does not depend on the output through autograd (did it "
                "call .item(), .detach() or numpy, or return a constant?): attribution "
                "patching needs its gradient"
            )
        missing = [name for name in names if name not in zeros]
        if missing:  # a point the forward pass skips: nothing to differentiate
            raise ValueError(f"the corrupted run never reached the hook points {missing}")
        grads = torch.autograd.grad(
            value.reshape(()), [zeros[name] for name in names], allow_unused=True
        )
    return acts, {
        name: torch.zeros_like(zeros[name]) if g is None else g
        for name, g in zip(names, grads, strict=True)
    }


def _cell_sums(products: torch.Tensor, kept: tuple[int, ...]) -> torch.Tensor:
    """``products`` summed over every axis but ``kept``, which come out in that order."""
    summed = tuple(axis for axis in range(products.ndim) if axis not in kept)
    out = products.sum(dim=summed) if summed else products
    # the kept axes are in increasing order after the sum; put them in the asked order
    order = sorted(kept)
    return out.permute(*[order.index(axis) for axis in kept]) if len(kept) > 1 else out
