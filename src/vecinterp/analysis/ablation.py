"""Ablation: replace activations of heads, MLPs, layers or positions, or attention patterns,
and see what the outputs do.

Three kinds of replacement ``r`` for an activation ``a`` of input ``x`` (shape
``[batch, pos, ...]``):

- ``"zero"``: ``r = 0``.
- ``"mean"``: ``r[b, p] = (1/N) Σ_n a(population_n)[p]``, the mean over a population of
  ``N`` input sequences, **per position** ``p`` (position 3 gets the mean of position 3;
  positions are never pooled). An input with fewer positions than the population uses
  the first ``pos`` positions of the mean; for a causal model that is exactly the mean a
  population cut to ``pos`` positions would give, for a non-causal one the population's
  later positions also shaped it. An input with more positions than the population is
  an error.
- ``"resample"``: ``r[b, p] = a(x'_b)[p]``, the activation of another input ``x'`` of the
  same shape as ``x``: ``resample_source`` if given, else ``batch`` sequences drawn from
  the population without replacement (the first ``batch`` items of a random
  permutation seeded by ``seed``, cut to ``pos`` positions).

What can be ablated: heads (a head's slice of ``attn.hook_z``, the default, or of
``attn.hook_result``: :func:`ablate_heads`); any activation whose axis 1 is ``pos``, at
every position or only at some (an MLP: ``("mlp_out", layer)``; a whole layer:
``[("attn_out", layer), ("mlp_out", layer)]``; the residual stream at positions 2 and 3:
``("resid_pre", layer)`` with ``positions=[2, 3]``: :func:`ablate`); attention patterns
(uniform, identity, previous-position or a given map, as in Musat (2024), the retrieval
paper: :func:`ablate_patterns`). The hook factories (:func:`zero_ablation_hook`,
:func:`mean_ablation_hook`, :func:`resample_ablation_hook`, :func:`pattern_ablation_hook`)
return hooks for ``model.hooks(...)`` / ``run_with_hooks`` to combine with other
interventions.

:func:`head_ablation_sweep` ablates every head alone and returns a metric per head, in
batched passes (see its docstring). Every function here leaves the model as it found it
(no weight edited, no hook left, also when something raises) and runs under
``torch.no_grad()``.
"""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float
from tqdm.auto import tqdm

from ..cache import act_name
from ..hooks import HookFn, HookPoint, NameFilter
from ..loss import loss_positions, masked_mse
from ..model import HookedVectorTransformer
from ..model.validation import check_finite, check_input, check_seed
from ._validate import check_head, check_heads, check_layer, check_model, check_population

__all__ = [
    "ablate",
    "ablate_heads",
    "ablate_patterns",
    "head_ablation_sweep",
    "mean_ablation_hook",
    "mean_activations",
    "pattern_ablation_hook",
    "resample_ablation_hook",
    "zero_ablation_hook",
]

KINDS = ("zero", "mean", "resample")
PATTERN_KINDS = ("uniform", "identity", "previous")
_HEAD_HOOKS = ("z", "result")
_ROW_SUM_TOL = 1e-5  # how far a given attention map's rows may sum from 1
# default sweep chunk: the widest activation of a pass holds about this many numbers. On CPU
# larger passes fall out of cache and run slower per row; accelerators like them large.
_SWEEP_ELEMENTS = {"cpu": 2**22}
_SWEEP_ELEMENTS_ACCELERATOR = 2**27

Population = torch.Tensor | Mapping[str, torch.Tensor]
"""A population batch of inputs ``[n, pos, d_in]``, or the means
:func:`mean_activations` computed from one (hook name to ``[pos, ...]``)."""

Metric = Callable[[torch.Tensor, torch.Tensor], Any]
"""``metric(output [batch, pos, d_out], targets [batch, pos, d_out]) -> scalar``."""


# ------------------------------------------------------------------------ argument checks


def _check_choice(value: object, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, one of {allowed}, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")
    return value


def _index_list(value: object, what: str) -> list[int] | None:
    """``None``, an int or an iterable of ints (a 0/1-D integer tensor too) as a list."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.ndim <= 1 and not value.is_floating_point():
        value = value.reshape(-1).tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = list(value)
        if all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            if not items:
                raise ValueError(f"{what} is empty: select at least one index")
            return items
    raise TypeError(f"{what} must be None, an int or a sequence of ints, got {value!r}")


def _axis_mask(indices: list[int], size: int, what: str, name: str) -> torch.Tensor:
    bad = [i for i in indices if not -size <= i < size]
    if bad:
        raise ValueError(f"{what} {bad} out of range for {name!r}, which has {size} {what}")
    mask = torch.zeros(size, dtype=torch.bool)
    mask[[i % size for i in indices]] = True
    return mask


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
    model: HookedVectorTransformer, population: torch.Tensor, names: NameFilter
) -> dict[str, torch.Tensor]:
    """Per-position means of activations over a population: ``mean[p] = (1/N) Σ_n a_n[p]``.

    Compute them once and pass the dict as ``population=`` to the ablation functions to
    reuse them (the whole population runs through the model in one pass).

    Args:
        model: the model.
        population: inputs ``[N, pos_pop, d_in]``.
        names: hook names (a name, a list of names or a predicate, as in
            ``run_with_cache``).

    Returns:
        ``{name: activation.mean(dim=0)}``: ``[pos_pop, ...]`` for activations whose axis 1
        is ``pos``.

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
    with torch.no_grad():
        _, cache = model.run_with_cache(population, names_filter=hook_names)
    return {name: cache[name].mean(dim=0) for name in hook_names}


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


# ------------------------------------------------------------------------------ ablations


def ablate_heads(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    heads: object,
    kind: str = "zero",
    population: Population | None = None,
    hook: str = "z",
    resample_source: torch.Tensor | None = None,
    seed: int = 0,
    positions: int | Sequence[int] | None = None,
) -> Float[torch.Tensor, "batch pos d_out"]:
    """The model's outputs with attention heads ablated.

    Head ``h`` of layer ``l`` is replaced in ``blocks.l.attn.hook_z`` (its mixed values
    ``z[:, :, h]``, before ``W_O``; the default) or ``blocks.l.attn.hook_result`` (its
    output ``z_h W_O[h]``); the layer then writes ``Σ_h z_h W_O[h] + b_O`` as usual. So
    zero-ablating every head of a layer leaves ``attn_out = b_O``.

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        heads: ``"all"``, ``(layer, head)``, a list of pairs, or ``{layer: [heads]}``.
        kind: ``"zero"``, ``"mean"`` or ``"resample"`` (module docstring).
        population: for ``"mean"``: inputs ``[n, pos_pop ≥ pos, d_in]``, or the dict of
            :func:`mean_activations` (to compute the means once); for ``"resample"``
            without ``resample_source``: inputs to draw the ``batch`` sources from.
            Ignored by ``"zero"``.
        hook: ``"z"`` or ``"result"``.
        resample_source: for ``"resample"``: inputs of ``x``'s shape.
        seed: seeds the draw from the population for ``"resample"``.
        positions: ablate only at these positions (default all).

    Returns:
        Outputs ``[batch, pos, d_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import ablate_heads
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x, pop = torch.randn(4, 6, 3), torch.randn(50, 6, 3)
        >>> ablate_heads(model, x, {1: [0, 1]}, kind="mean", population=pop).shape
        torch.Size([4, 6, 3])
    """
    model = check_model(model)
    pairs = check_heads(model, heads)
    kind = _check_choice(kind, KINDS, "kind")
    hook = _check_choice(hook, _HEAD_HOOKS, "hook")
    check_input(x, model.cfg, model.W_E)
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    names = {layer: f"blocks.{layer}.attn.hook_{hook}" for layer in by_layer}
    with torch.no_grad():
        repl = _replacements(
            model, x, kind, list(names.values()), population, resample_source, seed
        )
        fwd_hooks = [
            (names[layer], _ablation_hook(kind, repl[names[layer]], hs, positions))
            for layer, hs in by_layer.items()
        ]
        return model.run_with_hooks(x, fwd_hooks=fwd_hooks)


def _component_names(model: HookedVectorTransformer, components: object) -> list[str]:
    single = isinstance(components, str) or (
        isinstance(components, tuple) and len(components) == 2 and isinstance(components[1], int)
    )
    if single:
        items: list[object] = [components]
    elif isinstance(components, Iterable) and not isinstance(components, bytes | torch.Tensor):
        items = list(components)
    else:
        raise TypeError(
            "components must be a hook name, a (short name, layer) pair or a list of them, "
            f"got {type(components).__name__}"
        )
    if not items:
        raise ValueError("components is empty: name at least one activation")
    names = []
    for item in items:
        if isinstance(item, str):
            name = act_name(item) if item in ("embed", "pos_embed") else item
        elif isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str):
            name = act_name(item[0], check_layer(model, item[1], f"in {tuple(item)!r}"))
        else:
            raise TypeError(
                f"each component must be a hook name or a (short name, layer) pair such as "
                f"('mlp_out', 1), got {item!r}"
            )
        model.hook_point(name)  # unknown names fail here, listing close matches
        if name.endswith(("hook_pattern", "hook_attn_scores")):
            raise ValueError(
                f"{name!r} is [batch, n_heads, dest_pos, src_pos], not [batch, pos, ...]; "
                "ablate attention patterns with ablate_patterns"
            )
        names.append(name)
    return list(dict.fromkeys(names))


def ablate(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    components: object,
    kind: str = "zero",
    population: Population | None = None,
    positions: int | Sequence[int] | None = None,
    resample_source: torch.Tensor | None = None,
    seed: int = 0,
) -> Float[torch.Tensor, "batch pos d_out"]:
    """The model's outputs with whole activations ablated (at every position or some).

    ``components`` names activations whose axis 1 is ``pos``: MLP ``l`` is
    ``("mlp_out", l)``, the attention layer ``("attn_out", l)``, a whole layer both; the
    residual stream ``("resid_pre", l)`` etc.; full hook names work too
    (``"blocks.1.hook_mlp_out"``). Each is replaced as ``kind`` says (module docstring)
    at ``positions`` (default all). For heads use :func:`ablate_heads`, for attention
    patterns :func:`ablate_patterns`.

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        components: a hook name, a ``(short name, layer)`` pair, or a list of them.
        kind: ``"zero"``, ``"mean"`` or ``"resample"``.
        population: as in :func:`ablate_heads`.
        positions: positions to ablate (default all).
        resample_source: as in :func:`ablate_heads`.
        seed: as in :func:`ablate_heads`.

    Returns:
        Outputs ``[batch, pos, d_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import ablate
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(4, 6, 3)
        >>> y = ablate(model, x, [("attn_out", 1), ("mlp_out", 1)])  # all of layer 1
        >>> torch.equal(y, model.unembed(model.ln_final(model(x, stop_at_layer=1))))
        True
    """
    model = check_model(model)
    kind = _check_choice(kind, KINDS, "kind")
    names = _component_names(model, components)
    check_input(x, model.cfg, model.W_E)
    with torch.no_grad():
        repl = _replacements(model, x, kind, names, population, resample_source, seed)
        fwd_hooks = [(name, _ablation_hook(kind, repl[name], None, positions)) for name in names]
        return model.run_with_hooks(x, fwd_hooks=fwd_hooks)


# ------------------------------------------------------------------- attention patterns


def _check_pattern_kind(kind: object) -> str | torch.Tensor:
    if isinstance(kind, str):
        return _check_choice(kind, PATTERN_KINDS, "pattern kind")
    if not isinstance(kind, torch.Tensor):
        raise TypeError(
            f"a pattern must be one of {PATTERN_KINDS} or a tensor [dest_pos, src_pos], "
            f"got {type(kind).__name__}"
        )
    if kind.ndim not in (2, 3) or kind.shape[-1] != kind.shape[-2]:
        raise ValueError(
            "a given attention map must have shape [dest_pos, src_pos] or "
            f"[batch, dest_pos, src_pos] with dest_pos == src_pos, got {tuple(kind.shape)}"
        )
    if not kind.is_floating_point():
        raise TypeError(f"a given attention map must be floating point, got {kind.dtype}")
    if not bool(torch.isfinite(kind).all()) or bool((kind < 0).any()):
        raise ValueError("a given attention map must be finite and non-negative")
    worst = float((kind.double().sum(-1) - 1).abs().max())
    if worst > _ROW_SUM_TOL:
        raise ValueError(
            f"each row (dest position) of a given attention map must sum to 1; "
            f"the worst is off by {worst:.3g}"
        )
    return kind


def _pattern_matrix(
    kind: str | torch.Tensor, batch: int, n_pos: int, causal: bool, like: torch.Tensor
) -> torch.Tensor:
    """``[1 or batch, dest_pos, src_pos]`` on ``like``'s dtype and device."""
    if isinstance(kind, torch.Tensor):
        if kind.shape[-1] != n_pos or (kind.ndim == 3 and kind.shape[0] != batch):
            want = f"[{n_pos}, {n_pos}] or [{batch}, {n_pos}, {n_pos}]"
            raise ValueError(f"the given attention map must be {want}, got {tuple(kind.shape)}")
        matrix = kind
    elif kind == "identity":
        matrix = torch.eye(n_pos)
    elif kind == "previous":
        matrix = torch.zeros(n_pos, n_pos)
        matrix[torch.arange(n_pos), (torch.arange(n_pos) - 1).clamp(min=0)] = 1.0
    elif causal:
        ones = torch.ones(n_pos, n_pos, dtype=torch.float64).tril()
        matrix = ones / torch.arange(1, n_pos + 1, dtype=torch.float64)[:, None]
    else:
        matrix = torch.full((n_pos, n_pos), 1.0 / n_pos, dtype=torch.float64)
    matrix = matrix.to(dtype=like.dtype, device=like.device)
    return matrix if matrix.ndim == 3 else matrix.unsqueeze(0)


def pattern_ablation_hook(
    kind: str | torch.Tensor, heads: int | Sequence[int], causal: bool = True
) -> HookFn:
    """A hook for ``blocks.l.attn.hook_pattern`` that replaces the selected heads' patterns.

    ``pattern[b, h, d, s] ← A[d, s]`` (or ``A[b, d, s]``) for each selected head, with

    - ``"uniform"``: ``A[d, s] = 1/(d+1)`` for ``s ≤ d``, else 0 (``causal``); ``1/pos``
      everywhere for a non-causal model;
    - ``"identity"``: ``A[d, s] = 1`` iff ``s = d`` (attend to self);
    - ``"previous"``: ``A[d, s] = 1`` iff ``s = d - 1``; position 0, which has no previous
      position, attends to itself;
    - a tensor ``[dest_pos, src_pos]`` or ``[batch, dest_pos, src_pos]``: any row-stochastic
      map (non-negative, each row summing to 1 within 1e-5), e.g. one-hot rows that point
      each destination at the position a head is expected to read. It is used as given:
      a map that attends to later positions makes a causal model look ahead.

    Args:
        kind: one of the above.
        heads: head indices within the hooked layer.
        causal: whether the model's attention is causal (``model.cfg.causal``); used by
            ``"uniform"``.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.ablation import pattern_ablation_hook
        >>> from vecinterp.hooks import HookPoint
        >>> hook = pattern_ablation_hook("previous", heads=0)
        >>> hook(torch.zeros(1, 1, 3, 3), HookPoint())[0, 0].tolist()
        [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    given = _check_pattern_kind(kind)
    head_idx = _index_list(heads, "heads")
    if head_idx is None:
        raise ValueError("heads must name at least one head")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")

    def hook_fn(pattern: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
            raise ValueError(
                f"pattern_ablation_hook belongs on hook_pattern [batch, n_heads, dest_pos, "
                f"src_pos]; {hook.name!r} has shape {tuple(pattern.shape)}"
            )
        batch, n_heads, n_pos, _ = pattern.shape
        selected = _axis_mask(head_idx, n_heads, "heads", hook.name).nonzero().flatten()
        matrix = _pattern_matrix(given, batch, n_pos, causal, pattern)
        out = pattern.clone()
        out[:, selected.to(pattern.device)] = matrix.unsqueeze(1)
        return out

    return hook_fn


def ablate_patterns(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    patterns: Mapping[tuple[int, int], str | torch.Tensor],
) -> Float[torch.Tensor, "batch pos d_out"]:
    """The model's outputs with attention patterns replaced (Musat 2024, §E).

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        patterns: ``{(layer, head): kind}``, ``kind`` as in :func:`pattern_ablation_hook`
            (``"uniform"``, ``"identity"``, ``"previous"`` or a map ``[pos, pos]`` /
            ``[batch, pos, pos]``).

    Returns:
        Outputs ``[batch, pos, d_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import ablate_patterns
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(4, 6, 3)
        >>> ablate_patterns(model, x, {(0, 1): "previous", (1, 0): torch.eye(6)}).shape
        torch.Size([4, 6, 3])
    """
    model = check_model(model)
    check_input(x, model.cfg, model.W_E)
    if not isinstance(patterns, Mapping):
        raise TypeError(f"patterns must be a dict {{(layer, head): kind}}, got {patterns!r}")
    if not patterns:
        raise ValueError("patterns is empty: give at least one {(layer, head): kind}")
    batch, n_pos, _ = x.shape
    fwd_hooks = []
    for key, kind in patterns.items():
        if not isinstance(key, tuple | list) or len(key) != 2:
            raise TypeError(f"each key of patterns must be a (layer, head) pair, got {key!r}")
        where = f"in the key {tuple(key)!r} of patterns"
        layer, head = check_layer(model, key[0], where), check_head(model, key[1], where)
        given = _check_pattern_kind(kind)
        if isinstance(given, torch.Tensor):
            _pattern_matrix(given, batch, n_pos, model.cfg.causal, x)  # shape check, early
        fwd_hooks.append(
            (
                f"blocks.{layer}.attn.hook_pattern",
                pattern_ablation_hook(given, head, causal=model.cfg.causal),
            )
        )
    with torch.no_grad():
        return model.run_with_hooks(x, fwd_hooks=fwd_hooks)


# ---------------------------------------------------------------------------------- sweep


def _sweep_hook(mask: torch.Tensor, repl: torch.Tensor) -> HookFn:
    """Replace head ``h`` in copy ``c`` where ``mask[c, h]``; activations are the batch
    tiled ``k = mask.shape[0]`` times, ``[k * batch, pos, n_heads, d]``."""

    def hook_fn(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        tiled = act.reshape(mask.shape[0], -1, *act.shape[1:])
        return torch.where(mask[:, None, None, :, None], repl, tiled).reshape(act.shape)

    return hook_fn


def _scalar(value: object) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric must return a scalar, got a tensor of shape {value.shape}")
        return float(value.item())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"metric must return a scalar tensor or a float, got {type(value).__name__}")


def head_ablation_sweep(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    targets: Float[torch.Tensor, "batch pos d_out"],
    kind: str = "mean",
    population: Population | None = None,
    metric: Metric | None = None,
    loss_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None,
    heads: object = "all",
    chunk_size: int | None = None,
    progress: bool = True,
    hook: str = "z",
    resample_source: torch.Tensor | None = None,
    seed: int = 0,
    return_baseline: bool = False,
) -> (
    Float[torch.Tensor, "n_layers n_heads"]
    | tuple[Float[torch.Tensor, "n_layers n_heads"], Float[torch.Tensor, ""]]
):
    """A metric with each head ablated alone, ``score[l, h] = metric(y^{-(l,h)}, targets)``,
    computed in batched passes.

    ``y^{-(l,h)}`` is ``ablate_heads(model, x, (l, h), kind, ...)``. Instead of one forward
    pass per head, ``k ≤ chunk_size`` heads share a pass: the batch is tiled ``k`` times
    (copy ``c`` ablates head ``(l_c, h_c)``) and each ablated layer's hook on ``hook_z``
    replaces head ``h_c``'s slice in copy ``c`` only (a per-copy mask ``[k, n_heads]`` per
    layer). Heads are packed in (layer, head) order, the heads of one layer kept in one
    pass when they fit. A pass starts at the first layer it ablates, from the residual
    stream of one unablated pass (which also gives the baseline), since every copy is the
    same before it. The result equals the loop over :func:`ablate_heads` up to rounding:
    each copy's arithmetic is the same, but a matrix product over ``k·batch`` rows may
    round differently in the last bit than one over ``batch`` rows (in float64 the two
    agree to about 1e-15, usually exactly).

    Cost: a head of layer ``l`` costs ``n_layers - l`` layers of the batch (from its
    pass's first layer), not ``n_layers``; the rest of the gain is from larger batches,
    which helps most where a forward pass is dominated by per-call costs (accelerators,
    small models) and little where matrix products dominate (large models on a CPU).

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        targets: ``[batch, pos, d_out]``.
        kind: ``"zero"``, ``"mean"`` (default) or ``"resample"``.
        population: as in :func:`ablate_heads` (needed for ``"mean"``).
        metric: ``metric(output, targets) -> scalar`` with ``output`` one copy's outputs
            ``[batch, pos, d_out]`` and ``targets`` as given; it returns a one-element
            tensor or a float. Default: ``masked_mse(output, targets, loss_mask)``.
        loss_mask: ``[batch, pos]`` or ``[pos]`` for the default metric only.
        heads: which heads to sweep (as in :func:`ablate_heads`); others score NaN.
        chunk_size: copies per pass (≥ 1; the number of heads or more: one pass).
            Default: as many as keep the widest activation of a pass (e.g. the
            MLP's ``[k·batch, pos, d_mlp]``) at about 2^22 numbers on CPU (16 MiB in
            float32: larger passes fall out of cache and run slower per row) or 2^27 on an
            accelerator; at least 1, at most the number of heads swept.
        progress: show a progress bar over the passes.
        hook: ``"z"`` or ``"result"``, as in :func:`ablate_heads`.
        resample_source: as in :func:`ablate_heads`.
        seed: as in :func:`ablate_heads`.
        return_baseline: also return the metric of the unablated model.

    Returns:
        ``scores [n_layers, n_heads]`` in the model's dtype, or ``(scores, baseline)``
        with ``return_baseline``; ``baseline`` is a 0-dim tensor.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import head_ablation_sweep
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x, t, pop = torch.randn(4, 6, 3), torch.randn(4, 6, 3), torch.randn(50, 6, 3)
        >>> scores, base = head_ablation_sweep(model, x, t, population=pop, progress=False,
        ...                                    return_baseline=True)
        >>> scores.shape, base.shape
        (torch.Size([2, 2]), torch.Size([]))
    """
    model = check_model(model)
    pairs = check_heads(model, heads)
    kind = _check_choice(kind, KINDS, "kind")
    hook = _check_choice(hook, _HEAD_HOOKS, "hook")
    check_input(x, model.cfg, model.W_E)
    batch, n_pos, _ = x.shape
    d_out = model.W_U.shape[1]
    if not isinstance(targets, torch.Tensor) or targets.shape != (batch, n_pos, d_out):
        got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ValueError(f"targets must be [batch, pos, d_out]={(batch, n_pos, d_out)}, got {got}")
    if metric is None:
        # the positions the loss uses must have finite targets (as in direct_attribution;
        # masked-out ones may hold NaN, as masked_mse allows)
        used = loss_positions(loss_mask, (batch, n_pos), x.device)
        check_finite("targets", targets, where=used)

        def metric(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return masked_mse(output, target, loss_mask)

    elif loss_mask is not None:
        raise ValueError("loss_mask is used by the default metric only; apply it in your metric")
    elif not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}")
    if chunk_size is None:
        chunk_size = _default_chunk_size(model, batch, n_pos, hook, x.device, len(pairs))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    names = {layer: f"blocks.{layer}.attn.hook_{hook}" for layer in by_layer}
    cfg = model.cfg
    scores = torch.full((cfg.n_layers, cfg.n_heads), float("nan"), dtype=model.W_E.dtype)
    with torch.no_grad():
        values = _replacements(
            model, x, kind, list(names.values()), population, resample_source, seed
        )
        width = cfg.d_model if hook == "result" else cfg.d_head
        act_shape = (batch, n_pos, cfg.n_heads, width)
        repl = {
            layer: _fit_replacement(kind, values[name], act_shape, x, name)
            for layer, name in names.items()
        }
        chunks = _pack_heads(by_layer, chunk_size)
        starts = sorted({chunk[0][0] for chunk in chunks})
        resid_names = {layer: f"blocks.{layer}.hook_resid_pre" for layer in starts}
        clean, cache = model.run_with_cache(x, names_filter=list(resid_names.values()))
        baseline = _scalar(metric(clean, targets))
        if not math.isfinite(baseline):
            raise ValueError(
                f"the metric of the unablated model is {baseline}, so every score would be "
                "meaningless; check that targets (and what your metric reads) are finite and "
                "that the model's weights are"
            )
        for chunk in tqdm(chunks, desc="head ablation sweep", disable=not progress):
            k, start = len(chunk), chunk[0][0]
            masks: dict[int, torch.Tensor] = {}
            for c, (layer, head) in enumerate(chunk):
                if layer not in masks:
                    masks[layer] = torch.zeros(k, cfg.n_heads, dtype=torch.bool)
                masks[layer][c, head] = True
            fwd_hooks = [
                (names[layer], _sweep_hook(mask.to(x.device), repl[layer]))
                for layer, mask in masks.items()
            ]
            resid = cache[resid_names[start]].repeat(k, 1, 1)
            with model.hooks(fwd_hooks=fwd_hooks):
                out = model(resid, start_at_layer=start)
            out = out.reshape(k, batch, n_pos, d_out)
            for c, (layer, head) in enumerate(chunk):
                scores[layer, head] = _scalar(metric(out[c], targets))
    scores = scores.to(x.device)
    if return_baseline:
        return scores, torch.tensor(baseline, dtype=scores.dtype, device=x.device)
    return scores


def _pack_heads(by_layer: dict[int, list[int]], chunk_size: int) -> list[list[tuple[int, int]]]:
    """Chunks of at most ``chunk_size`` heads in (layer, head) order; a layer's heads join
    the current chunk only if all fit (else they start a new one, split if too many)."""
    chunks: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    for layer, heads in by_layer.items():
        pending = [(layer, head) for head in heads]
        if current and len(current) + len(pending) > chunk_size:
            chunks.append(current)
            current = []
        while len(current) + len(pending) > chunk_size:
            chunks.append(pending[:chunk_size])
            pending = pending[chunk_size:]
        current += pending
    return [*chunks, current] if current else chunks


def _default_chunk_size(
    model: HookedVectorTransformer,
    batch: int,
    n_pos: int,
    hook: str,
    device: torch.device,
    n_heads: int,
) -> int:
    cfg = model.cfg
    width = max(
        cfg.d_model,
        model.W_U.shape[1],
        cfg.n_heads * cfg.d_head,
        cfg.n_heads * n_pos,  # attention scores and pattern
        0 if cfg.attn_only or cfg.d_mlp is None else cfg.d_mlp,
        cfg.n_heads * cfg.d_model if hook == "result" else 0,
    )
    budget = _SWEEP_ELEMENTS.get(device.type, _SWEEP_ELEMENTS_ACCELERATOR)
    return max(1, min(n_heads, budget // (batch * n_pos * width)))
