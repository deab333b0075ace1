"""Ablation hooks and what they replace with: the hook factories
(:func:`zero_ablation_hook`, :func:`mean_ablation_hook`, :func:`resample_ablation_hook`),
the per-position population means (:func:`mean_activations`), and the private helpers
that turn a ``kind`` and a population into replacements and masks, shared with
:mod:`.component_ablation` and :mod:`.ablation_sweep`. The kinds are defined in
:mod:`vecinterp.analysis.ablation`."""

from collections.abc import Mapping, Sequence

import torch

from ..hooks import HookFn, HookPoint, NameFilter
from ..model import HookedVectorTransformer
from ..model.validation import check_finite, check_input, check_seed
from ._ablation_common import _axis_mask, _index_list, _pass_budget, _widest
from ._validate import check_model, check_population

__all__ = [
    "mean_ablation_hook",
    "mean_activations",
    "resample_ablation_hook",
    "zero_ablation_hook",
]


def _selection_mask(
    shape: tuple[int, ...],
    heads: list[int] | None,
    positions: list[int] | None,
    name: str,
    device: torch.device,
) -> torch.Tensor:
    """A bool mask broadcastable to ``shape``: True where the activation is replaced."""
    mask = torch.ones((), dtype=torch.bool)
    if positions is not None:
        if len(shape) < 2:
            raise ValueError(f"positions= needs an activation [batch, pos, ...]; {name!r}: {shape}")
        pos_mask = _axis_mask(positions, shape[1], "positions", name)
        mask = mask & pos_mask.view(1, -1, *[1] * (len(shape) - 2))
    if heads is not None:
        if len(shape) < 4:
            raise ValueError(
                f"heads= needs an activation with a head axis [batch, pos, n_heads, ...]; "
                f"{name!r} has shape {shape}"
            )
        head_mask = _axis_mask(heads, shape[2], "heads", name)
        mask = mask & head_mask.view(1, 1, -1, *[1] * (len(shape) - 3))
    return mask.to(device)


def _fit_replacement(
    kind: str,
    value: torch.Tensor | None,
    shape: tuple[int, ...],
    like: torch.Tensor,
    name: str,
) -> torch.Tensor:
    """The replacement for an activation of ``shape`` [batch, pos, ...], broadcastable to it
    from the right, on ``like``'s dtype and device."""
    if kind == "zero":
        return like.new_zeros(())
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{kind} ablation of {name!r} needs a tensor, got {type(value).__name__}")
    if kind == "mean":
        if value.ndim != len(shape) - 1 or tuple(value.shape[1:]) != shape[2:]:
            raise ValueError(
                f"the mean for {name!r} must have shape [pos, {', '.join(map(str, shape[2:]))}] "
                f"(the activation is {shape}), got {tuple(value.shape)}"
            )
        if value.shape[0] < shape[1]:
            raise ValueError(
                f"the mean for {name!r} covers {value.shape[0]} positions but the input has "
                f"{shape[1]}; use a population with at least as many positions"
            )
        value = value[: shape[1]]
    elif tuple(value.shape) != shape:
        raise ValueError(
            f"the resample activation for {name!r} must have the activation's shape {shape}, "
            f"got {tuple(value.shape)}"
        )
    return value.to(dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------------------- hook factories


def _ablation_hook(
    kind: str, value: torch.Tensor | None, heads: object, positions: object
) -> HookFn:
    head_idx = _index_list(heads, "heads")
    pos_idx = _index_list(positions, "positions")

    def hook_fn(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        shape = tuple(act.shape)
        repl = _fit_replacement(kind, value, shape, act, hook.name)
        mask = _selection_mask(shape, head_idx, pos_idx, hook.name, act.device)
        return torch.where(mask, repl, act)

    return hook_fn


def zero_ablation_hook(
    heads: int | Sequence[int] | None = None, positions: int | Sequence[int] | None = None
) -> HookFn:
    """A hook that sets (part of) an activation to zero: ``a[b, p, h] ← 0``.

    Args:
        heads: indices on axis 2 (the head axis of ``hook_z``, ``hook_result``, ``hook_q``
            ...); ``None``: every head (or an activation without a head axis).
        positions: indices on axis 1 (``pos``); ``None``: every position.

    Returns:
        ``fn(act, hook) -> tensor`` for ``model.hooks(fwd_hooks=[(name, fn)])``; the
        activation is not edited in place.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.ablation import zero_ablation_hook
        >>> from vecinterp.hooks import HookPoint
        >>> zero_ablation_hook(heads=1)(torch.ones(1, 1, 2, 1), HookPoint()).flatten().tolist()
        [1.0, 0.0]
    """
    return _ablation_hook("zero", None, heads, positions)


def mean_ablation_hook(
    mean: torch.Tensor,
    heads: int | Sequence[int] | None = None,
    positions: int | Sequence[int] | None = None,
) -> HookFn:
    """A hook that replaces (part of) an activation by its per-position population mean:
    ``a[b, p, h] ← mean[p, h]``.

    Args:
        mean: ``[pos_pop, ...]``, the activation averaged over a population's batch axis
            (one entry of what :func:`mean_activations` returns); an activation with
            ``pos ≤ pos_pop`` positions uses ``mean[:pos]``.
        heads: indices on axis 2 (the head axis); ``None``: all.
        positions: indices on axis 1; ``None``: all.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.ablation import mean_ablation_hook
        >>> from vecinterp.hooks import HookPoint
        >>> hook = mean_ablation_hook(torch.tensor([[5.0], [6.0], [7.0]]), positions=[1])
        >>> hook(torch.zeros(1, 2, 1), HookPoint()).flatten().tolist()
        [0.0, 6.0]
    """
    if not isinstance(mean, torch.Tensor):
        raise TypeError(f"mean must be a tensor [pos, ...], got {type(mean).__name__}")
    return _ablation_hook("mean", mean, heads, positions)


def resample_ablation_hook(
    source: torch.Tensor,
    heads: int | Sequence[int] | None = None,
    positions: int | Sequence[int] | None = None,
) -> HookFn:
    """A hook that replaces (part of) an activation by the same activation of another
    input: ``a[b, p, h] ← source[b, p, h]``.

    Args:
        source: the activation on the other input, the activation's exact shape (e.g.
            ``model.run_with_cache(other_x)[1][name]``).
        heads: indices on axis 2 (the head axis); ``None``: all.
        positions: indices on axis 1; ``None``: all.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.ablation import resample_ablation_hook
        >>> from vecinterp.hooks import HookPoint
        >>> hook = resample_ablation_hook(torch.full((1, 2, 1), 9.0), positions=0)
        >>> hook(torch.zeros(1, 2, 1), HookPoint()).flatten().tolist()
        [9.0, 0.0]
    """
    if not isinstance(source, torch.Tensor):
        raise TypeError(f"source must be a tensor, got {type(source).__name__}")
    return _ablation_hook("resample", source, heads, positions)


# ------------------------------------------------------------------------- replacements


def mean_activations(
    model: HookedVectorTransformer,
    population: torch.Tensor,
    names: NameFilter,
    chunk_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """Per-position means of activations over a population: ``mean[p] = (1/N) Σ_n a_n[p]``.

    Compute them once and pass the dict as ``population=`` to the ablation functions to
    reuse them.

    The population runs through the model in passes of ``chunk_size`` sequences, each
    pass stopping at the last requested activation (layers after it are not computed);
    the sums are accumulated in float64 and divided once: the result is the activations'
    mean rounded once to their dtype. (In float32 a sequence's activations themselves may
    differ in the last bit with the pass size, as matrix products round by shape.)

    Args:
        model: the model.
        population: inputs ``[N, pos_pop, d_in]``.
        names: hook names (a name, a list of names or a predicate, as in
            ``run_with_cache``).
        chunk_size: sequences per pass (a positive int). Default: as many as keep the
            widest activation of a pass at about 2^22 numbers on CPU (larger passes fall
            out of cache and run slower per row) or 2^27 on an accelerator.

    Returns:
        ``{name: activation.mean(dim=0)}``: ``[pos_pop, ...]`` for activations whose axis 1
        is ``pos``, in the activation's dtype.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import mean_activations
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=6), seed=0)
        >>> means = mean_activations(model, torch.randn(100, 6, 3), "blocks.0.attn.hook_z")
        >>> means["blocks.0.attn.hook_z"].shape
        torch.Size([6, 2, 4])
    """
    model = check_model(model)
    population = check_population(model, population)
    hook_names = model.hook_names(names)
    if not hook_names:
        raise ValueError(f"names={names!r} selects no hook point")
    n, n_pos = population.shape[:2]
    if chunk_size is None:
        width = _widest(model.cfg, model.W_U.shape[1], n_pos)
        chunk_size = max(1, _pass_budget(population.device) // (n_pos * width))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    seen: set[str] = set()

    def record(act: torch.Tensor, hook: HookPoint) -> None:
        total = act.sum(dim=0, dtype=torch.float64)
        sums[hook.name] = sums[hook.name] + total if hook.name in sums else total
        dtypes[hook.name] = act.dtype
        seen.add(hook.name)
        if len(seen) == len(hook_names):
            raise _Done  # the rest of this pass feeds no requested activation

    with torch.no_grad(), model.hooks(fwd_hooks=[(name, record) for name in hook_names]):
        for lo in range(0, n, chunk_size):
            seen.clear()
            try:
                model(population[lo : lo + chunk_size])
            except _Done:
                pass
    silent = [name for name in hook_names if name not in sums]
    if silent:
        raise ValueError(f"no activation reached {silent} in a forward pass of the population")
    return {name: (sums[name] / n).to(dtypes[name]) for name in hook_names}


class _Done(Exception):
    """Raised by :func:`mean_activations`'s hook once every activation is recorded."""


def _replacements(
    model: HookedVectorTransformer,
    x: torch.Tensor,
    kind: str,
    names: list[str],
    population: object,
    resample_source: object,
    seed: int,
) -> dict[str, torch.Tensor | None]:
    """What replaces each named activation: nothing (zero), the mean ``[pos_pop, ...]``
    or the resample source's activation ``[batch, pos, ...]``."""
    batch, n_pos, _ = x.shape
    seed = check_seed("seed", seed)
    if kind == "zero":
        return dict.fromkeys(names)
    if kind == "mean":
        if population is None:
            raise ValueError(
                "kind='mean' needs population: inputs [n, pos, d_in] or the dict "
                "mean_activations(model, population, names) returns"
            )
        if isinstance(population, Mapping):
            missing = [name for name in names if name not in population]
            if missing:
                raise ValueError(
                    f"the population means lack {missing}; compute them with "
                    f"mean_activations(model, population, names={names!r})"
                )
            means = {name: population[name] for name in names}
            for name, mean in means.items():
                if isinstance(mean, torch.Tensor):
                    check_finite(f"population[{name!r}]", mean)
            return means
        check_population(model, population, n_pos)
        return dict(mean_activations(model, population, names))  # type: ignore[arg-type]
    if resample_source is not None:
        if not isinstance(resample_source, torch.Tensor):
            raise TypeError(
                f"resample_source must be a tensor [batch, pos, d_in], got "
                f"{type(resample_source).__name__}"
            )
        if resample_source.shape != x.shape:
            raise ValueError(
                f"resample_source must have x's shape {tuple(x.shape)}, "
                f"got {tuple(resample_source.shape)}"
            )
        source = check_input(resample_source, model.cfg, model.W_E, name="resample_source")
    elif isinstance(population, torch.Tensor):
        if population.ndim == 3 and population.shape[0] < batch:
            raise ValueError(
                f"resampling {batch} sequences without replacement needs a population of at "
                f"least {batch}, got {population.shape[0]}"
            )
        pop = check_population(model, population, n_pos)
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(pop.shape[0], generator=gen)
        source = pop[order[:batch].to(pop.device), :n_pos]
    else:
        raise ValueError(
            "kind='resample' needs resample_source (inputs of x's shape) or population "
            "(inputs [n, pos, d_in]; precomputed means cannot be resampled)"
        )
    _, cache = model.run_with_cache(source, names_filter=names)
    return {name: cache[name] for name in names}
