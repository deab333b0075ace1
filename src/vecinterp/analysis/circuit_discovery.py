"""Automated circuit discovery: ACDC (Conmy et al. 2023) on the edges of the residual stream.

The graph (:mod:`vecinterp.analysis._circuit_graph`): senders are the input embedding, each
head and each MLP; receivers are each head's query, key and value input, each MLP's input
and the output; an edge joins a sender to every receiver after it. *Removing* an edge
``(s, r)`` replaces ``s``'s output by its corrupted (or mean) value in ``r``'s input only::

    in_r = resid_r - sum_{s: (s, r) removed} (out_s - corr_s)

ACDC starts from the full graph and visits the receivers from the output back to the
embedding (reverse topological order); at each receiver it tries its incoming edges one at a
time, latest sender first, and removes an edge for good when the metric, with that edge and
every edge removed so far patched, rises by at most the threshold ``tau`` over its current
value. A node none of whose outgoing edges is left cannot change the output any more, so
its incoming edges are removed without a trial (and the passes do not compute it). With a
corrupted input, a node left with no incoming edge computes exactly its corrupted output,
so at the end its outgoing edges, which carry nothing, are dropped too (``n_pruned``): the
circuit is then made of paths from the embedding to the output. With mean ablation such a
node still computes something else than its mean output, and its edges stay.

Batching without changing the algorithm: the trials at a receiver are run speculatively,
several per pass, trial ``j`` removing the receiver's next ``j + 1`` candidate edges
(assuming the ones before it are removed, the usual case). The decisions are then read in
order; at the first edge kept, the trials after it assumed wrongly and are run again. So
the result is exactly the one-edge-at-a-time algorithm, at about one pass per kept edge
plus one per ``chunk_size`` removed edges. A pass starts at the receiver's layer from the
clean run, which everything upstream of the receiver still is (its edges are all kept).

One file because it is one search: the two public functions are its two entry points, the
result is what it returns, and half of the length is their docstrings (the graph and the
passes live in :mod:`vecinterp.analysis._circuit_graph`).
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import nn
from tqdm.auto import tqdm

from ..model import HookedVectorTransformer
from ..model.tensor_files import refuse_non_finite
from ..model.validation import check_input
from ..threads import check_threads, use_threads
from ._circuit_graph import CleanState, EdgeGraph, forward, run_clean
from ._validate import check_model, refuse_grouped_query
from .patching import Metric, _check_runs, _scalar
from .path_patching import _Node

__all__ = ["CircuitResult", "circuit_threshold_sweep", "discover_circuit"]

Node = str | tuple[Any, ...]
"""A node as users write it: ``"embed"``, ``(layer, head)``, ``("mlp", layer)``,
``"output"``; a head receiver is ``(layer, head, "q"|"k"|"v")``."""
Edge = tuple[Node, Node]
"""``(sender, receiver)``, e.g. ``((0, 1), (1, 2, "k"))``."""

_AUTO_SEQUENCES = 256  # with chunk_size=None, a pass holds at most this many sequences


@dataclass(frozen=True)
class CircuitResult:
    """The circuit ACDC kept at one threshold, and the metrics around it.

    Attributes:
        edges: the kept edges ``(sender, receiver)``, in forward order (by receiver, then
            sender). Senders: ``"embed"``, ``(layer, head)``, ``("mlp", layer)``; receivers:
            ``(layer, head, "q"|"k"|"v")``, ``("mlp", layer)``, ``"output"``.
        nodes: the nodes on a kept edge, in forward order: ``"embed"``, ``(layer, head)``,
            ``("mlp", layer)``, ``"output"``.
        metric: the metric of the circuit (every other edge removed).
        full_metric: the metric with every edge kept (the model itself).
        corrupted_metric: the metric with every edge removed.
        threshold: ``tau``.
        n_edges: the number of edges of the full graph.
        scores: for each edge tried, the change of the metric its removal caused when it
            was tried (removed if ``<= tau``; ``abs`` of it with ``abs_value``). Edges into a
            node that had lost all its outgoing edges were removed untried and are absent.
        ablation: ``"corrupted"`` (a corrupted input) or ``"mean"`` (mean outputs).
        n_layers, n_heads, has_mlps: the model's shape, for drawing the graph.
        seconds: the wall time of the search at this threshold (the shared clean and
            corrupted runs excluded).
        n_passes, n_trials: forward passes run and trials in them (batched).
        n_pruned: kept edges dropped at the end (corrupted input only) because their
            sender had lost all its incoming edges: such a node computes its corrupted
            output, so they carry nothing.
        relative_threshold: the fraction of the metric gap ``|corrupted_metric -
            full_metric|`` that ``threshold`` was made from, when the search was asked for
            a ``relative_threshold``; ``None`` when it was given ``threshold`` itself.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> result = vi.discover_circuit(model, torch.randn(8, 6, 3), torch.randn(8, 6, 3),
        ...                              threshold=1e-5, progress=False)
        >>> isinstance(result, vi.CircuitResult), result.n_edges
        (True, 46)
        >>> all(result.scores[edge] > 1e-5 for edge in result.edges)  # kept: changed > tau
        True
    """

    edges: list[Edge]
    nodes: list[Node]
    metric: float
    full_metric: float
    corrupted_metric: float
    threshold: float
    n_edges: int
    scores: dict[Edge, float] = field(repr=False)
    ablation: str
    n_layers: int
    n_heads: int
    has_mlps: bool
    seconds: float
    n_passes: int
    n_trials: int
    n_pruned: int = 0
    relative_threshold: float | None = None

    @property
    def n_kept(self) -> int:
        """The number of kept edges."""
        return len(self.edges)

    def summary(self) -> str:
        """A few lines: edges kept, the three metrics, the kept edges.

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5,
            ...     attn_only=True), seed=0)
            >>> result = vi.discover_circuit(model, torch.randn(4, 5, 3), torch.randn(4, 5, 3),
            ...                              threshold=1.0, progress=False)
            >>> print(result.summary().splitlines()[0])
            ACDC (corrupted input), tau = 1: 0 of 9 edges kept
        """
        relative = (
            ""
            if self.relative_threshold is None
            else f" ({self.relative_threshold:g} of the metric gap)"
        )
        lines = [
            f"ACDC ({self.ablation} {'input' if self.ablation == 'corrupted' else 'outputs'}), "
            f"tau = {self.threshold:g}{relative}: {self.n_kept} of {self.n_edges} edges kept",
            f"metric: circuit {self.metric:.6g}, full model {self.full_metric:.6g}, "
            f"every edge removed {self.corrupted_metric:.6g}",
        ]
        lines += [f"  {_name(s)} -> {_name(r)}" for s, r in self.edges]
        return "\n".join(lines)


def discover_circuit(
    model: HookedVectorTransformer,
    clean_x: Float[torch.Tensor, "batch pos d_in"],
    corrupted_x: Float[torch.Tensor, "_batch _pos _d_in"] | None = None,
    *,
    threshold: float | None = None,
    relative_threshold: float | None = None,
    metric: Metric | None = None,
    population: Float[torch.Tensor, "_n _pos _d_in"] | None = None,
    abs_value: bool = False,
    chunk_size: int | None = None,
    progress: bool = True,
    threads: int | str | None = None,
) -> CircuitResult:
    """Find the edges the model needs on ``clean_x``: ACDC, greedy edge pruning.

    Edges, and what removing one means, are in the module docstring: an edge ``(s, r)``
    removed gives the receiver ``r`` (a head's q, k or v input, an MLP's input, or the
    output) the input ``resid_r - (out_s - corr_s)``, with ``corr_s`` the sender's output on
    ``corrupted_x`` or, with ``corrupted_x=None``, its mean output per position over
    ``population``. Starting from every edge kept (metric ``M = M_full``), for each receiver
    from the output back to the first layer (within a layer: the MLP, then the heads' values,
    keys, queries, last head first) and each of its incoming edges, latest sender first::

        M_new = metric(output with this edge and every edge removed so far patched)
        if M_new - M <= threshold:   (|M_new - M| with abs_value)
            remove the edge;  M = M_new

    ``metric`` is a loss: it grows as the circuit departs from the model. The default is the
    mean squared difference from the full model's output on ``clean_x``,
    ``mean((y_circuit - y_model)^2)`` over batch, positions and ``d_out``, the MSE analogue
    of ACDC's KL divergence; its full-model value is 0. Every value it takes must be
    finite: a NaN or infinite value (e.g. ``log`` of an MSE that is 0 on the full model)
    would make every comparison with ``tau`` false, so the edge would be kept or removed by
    accident; it is refused, naming the trial (the edge being removed).

    The threshold comes in one of two units (give exactly one):

    - ``threshold=tau``, in the metric's units;
    - ``relative_threshold=r``, a fraction of the *metric gap*
      ``|corrupted_metric - full_metric|`` (what removing every edge costs), so that
      ``tau = r * gap``: ``r = 0.01`` removes an edge when it costs at most 1 % of what
      corrupting everything costs, whatever the metric's scale. ``CircuitResult.threshold``
      is then that ``tau`` and ``CircuitResult.relative_threshold`` is ``r``.
      ``relative_threshold=r`` and ``threshold=r * gap`` give the same circuit.

    Called with neither, it runs the two reference passes and raises a ``TypeError`` that
    gives the gap on these inputs, the scale a threshold is read against.

    The circuit's output is computed by a forward pass from the model's weights that splits
    the residual stream by sender at every receiver; with no edge removed it is the model's
    output to rounding. Hooks are not run, so a model with hooks attached is refused:
    vecinterp hooks, and PyTorch module hooks (``register_forward_hook``,
    ``register_forward_pre_hook``, ``register_full_backward_hook`` and their kin, on any
    submodule, or the global ones), which this pass would skip or call on other tensors
    than the model's forward does. So is a model with a NaN or infinite weight, named.
    See :func:`circuit_threshold_sweep` for several thresholds at once.

    Args:
        model: the model (not modified).
        clean_x: the input the circuit must reproduce ``[batch, pos, d_in]``.
        corrupted_x: the corrupted input (the shape of ``clean_x``), or ``None`` for mean
            ablation.
        threshold: ``tau >= 0``, in the metric's units (the metric gap is its scale).
        relative_threshold: ``r >= 0``, the threshold as a fraction of the metric gap
            (``tau = r * |corrupted_metric - full_metric|``); instead of ``threshold``.
            Start around ``0.01`` (a larger ``r`` keeps fewer edges).
        metric: ``metric(output [batch, pos, d_out]) -> scalar``, lower is closer to the
            model, e.g. ``lambda y: vi.masked_mse(y, targets, mask)``; ``None``: the MSE to
            the full model's output.
        population: with ``corrupted_x=None``, the inputs whose mean outputs (per sender,
            per position) stand for a removed edge ``[n, pos, d_in]``; default ``clean_x``.
        abs_value: compare ``|M_new - M|`` with the threshold (an edge whose removal
            *improves* the metric by more than ``tau`` is kept).
        chunk_size: trials per pass at most; ``None``: ``max(1, 256 // batch)``.
        progress: show a progress bar over the receivers.
        threads: CPU threads for the call (``torch.set_num_threads``, torch's setting
            restored when it returns): an int >= 1, ``"auto"`` (the idle cores, at most
            torch's setting: :func:`~vecinterp.choose_threads`), or ``None`` (default:
            torch's setting as it is).

    Returns:
        A :class:`CircuitResult`: the kept edges, their nodes, the metric of the circuit,
        of the full model and of the fully corrupted one, the score of each edge tried.

    Raises:
        ValueError: inputs of different shapes, non-finite or too long; a ``population``
            with another ``pos`` or ``d_in``, or given with ``corrupted_x``; a negative or
            non-finite threshold, or both ``threshold`` and ``relative_threshold``; a
            ``relative_threshold`` when the metric gap is 0; a model with hooks attached
            (vecinterp or PyTorch module hooks) or with a non-finite weight; a metric that
            does not return one number, or returns NaN or an infinity (on the full model,
            with every edge removed, or on a trial, which the message names).
        TypeError: a model, metric or flag of the wrong type; neither ``threshold`` nor
            ``relative_threshold`` given (the message gives the metric gap).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> clean, corrupted = torch.randn(16, 6, 3), torch.randn(16, 6, 3)
        >>> result = vi.discover_circuit(model, clean, corrupted, threshold=1e-6,
        ...                              progress=False)
        >>> result.n_edges, result.full_metric
        (46, 0.0)
        >>> result.n_kept < result.n_edges and result.metric <= result.corrupted_metric
        True
        >>> relative = vi.discover_circuit(model, clean, corrupted, relative_threshold=0.01,
        ...                                progress=False)  # tau = 1 % of the metric gap
        >>> gap = relative.corrupted_metric - relative.full_metric
        >>> bool(relative.threshold == 0.01 * gap), relative.relative_threshold
        (True, 0.01)
    """
    check_threads("threads", threads)
    with use_threads(threads):
        return _run(
            model,
            clean_x,
            corrupted_x,
            {"threshold": threshold, "relative_threshold": relative_threshold},
            single=True,
            metric=metric,
            population=population,
            abs_value=abs_value,
            chunk_size=chunk_size,
            progress=progress,
        )[0]


def circuit_threshold_sweep(
    model: HookedVectorTransformer,
    clean_x: Float[torch.Tensor, "batch pos d_in"],
    corrupted_x: Float[torch.Tensor, "_batch _pos _d_in"] | None = None,
    *,
    thresholds: Sequence[float] | None = None,
    relative_thresholds: Sequence[float] | None = None,
    metric: Metric | None = None,
    population: Float[torch.Tensor, "_n _pos _d_in"] | None = None,
    abs_value: bool = False,
    chunk_size: int | None = None,
    progress: bool = True,
    threads: int | str | None = None,
) -> list[CircuitResult]:
    """:func:`discover_circuit` at each threshold, the clean and corrupted runs shared.

    Each threshold runs the whole search (greedy decisions depend on ``tau``); a larger
    ``tau`` removes more and runs faster. The arguments are :func:`discover_circuit`'s
    (``threads`` too), with
    ``thresholds`` (a non-empty sequence of numbers ``>= 0``) for ``threshold``, or
    ``relative_thresholds`` (fractions of the metric gap) for ``relative_threshold``.

    Returns:
        One :class:`CircuitResult` per threshold, in the order given.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(16, 6, 3)
        >>> results = vi.circuit_threshold_sweep(model, x, thresholds=[0.0, 1e-6, 1.0],
        ...                                      progress=False)  # mean ablation
        >>> [r.n_kept for r in results][-1]
        0
    """
    check_threads("threads", threads)
    with use_threads(threads):
        return _run(
            model,
            clean_x,
            corrupted_x,
            {"thresholds": thresholds, "relative_thresholds": relative_thresholds},
            single=False,
            metric=metric,
            population=population,
            abs_value=abs_value,
            chunk_size=chunk_size,
            progress=progress,
        )


# -- arguments and the shared runs --------------------------------------------------------


def _run(
    model: object,
    clean_x: object,
    corrupted_x: object,
    given: dict[str, object],
    *,
    single: bool,
    metric: object,
    population: object,
    abs_value: object,
    chunk_size: object,
    progress: object,
) -> list[CircuitResult]:
    """The search at each threshold; ``given`` maps the two threshold arguments (absolute
    first, then relative) to their values, ``None`` where not passed; ``single``: each is
    one number (:func:`discover_circuit`), else a sequence."""
    absolute, relative = given
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) == 2:
        raise ValueError(
            f"pass {absolute}= (in the metric's units) or {relative}= (fractions of the "
            "metric gap), not both"
        )
    name = chosen[0] if chosen else None
    taus = [] if name is None else _check_thresholds(given[name], name, single, name == relative)
    for flag_name, flag in (("abs_value", abs_value), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{flag_name} must be True or False, got {flag!r}")
    assert isinstance(abs_value, bool) and isinstance(progress, bool)
    setup = _prepare(model, clean_x, corrupted_x, metric, population, chunk_size)
    if name is None:
        caller = "discover_circuit" if single else "circuit_threshold_sweep"
        raise TypeError(
            f"{caller} needs a threshold: " + _missing_threshold(setup, absolute, relative)
        )
    if name == absolute:
        return [_search(setup, tau, None, abs_value, progress) for tau in taus]
    gap = abs(setup.corrupted_metric - setup.full_metric)
    if gap == 0:
        raise ValueError(
            f"{relative}: the metric gap is 0 (the metric is {setup.full_metric:g} with every "
            f"edge kept and with every edge removed), so a fraction of it is no threshold; "
            f"pass {absolute}= in the metric's units"
        )
    return [_search(setup, r * gap, r, abs_value, progress) for r in taus]


def _missing_threshold(setup: "_Setup", absolute: str, relative: str) -> str:
    """What to pass when neither threshold is: the scale to read one against."""
    full, corrupted = setup.full_metric, setup.corrupted_metric
    gap = abs(corrupted - full)
    return (
        f"give {absolute}= (in the metric's units) or {relative}= (fractions of the metric "
        f"gap). On these inputs the metric is {full:.4g} with every edge kept and "
        f"{corrupted:.4g} with every edge removed: a gap of {gap:.4g}, the scale of a "
        f"threshold ({relative}=0.01 means tau = {0.01 * gap:.3g}). A larger threshold keeps "
        "fewer edges; to choose, sweep a few, e.g. vi.circuit_threshold_sweep(..., "
        "relative_thresholds=[1e-3, 1e-2, 1e-1])"
    )


def _check_thresholds(value: object, name: str, single: bool, relative: bool) -> list[float]:
    """The threshold(s) of argument ``name`` as floats, each finite and ``>= 0``."""
    if single:
        return [_check_threshold(value, name, relative)]
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of numbers, got {value!r}")
    if not value:
        raise ValueError(f"{name} is empty: give at least one threshold")
    return [_check_threshold(t, f"{name}[{i}]", relative) for i, t in enumerate(value)]


def _check_threshold(value: object, name: str, relative: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number >= 0, got {value!r}")
    if not math.isfinite(value) or value < 0:
        unit = "a fraction of the metric gap" if relative else "in the metric's units"
        raise ValueError(f"{name} must be a finite number >= 0 ({unit}), got {value}")
    return float(value)


@dataclass
class _Setup:
    model: HookedVectorTransformer
    graph: EdgeGraph
    clean: CleanState
    corr: torch.Tensor  # [n_senders, batch, pos, d_model]
    metric: Callable[[torch.Tensor], torch.Tensor]
    ablation: str
    chunk: int
    full_metric: float = 0.0
    corrupted_metric: float = 0.0


def _prepare(
    model: object,
    clean_x: object,
    corrupted_x: object,
    metric: object,
    population: object,
    chunk_size: object,
) -> _Setup:
    model = check_model(model)
    _refuse_hooks(model)
    refuse_grouped_query(
        model,
        "circuit discovery",
        "its key and value receivers are per query head, while the model computes keys "
        "and values once per key/value head",
    )
    refuse_non_finite(
        dict(model.named_parameters()), "circuit discovery refuses a model with non-finite weights"
    )
    if metric is not None and not callable(metric):
        raise TypeError(f"metric must be callable or None, got {type(metric).__name__}")
    if corrupted_x is not None:
        _check_runs(model, clean_x, corrupted_x, metric or (lambda y: y))
        if population is not None:
            raise ValueError(
                "population is for mean ablation (corrupted_x=None); with a corrupted_x the "
                "removed edges carry the corrupted run's outputs: pass one or the other"
            )
    else:
        check_input(clean_x, model.cfg, model.W_E, name="clean_x")
    assert isinstance(clean_x, torch.Tensor)
    if population is not None:
        check_input(population, model.cfg, model.W_E, name="population")
        assert isinstance(population, torch.Tensor)
        if population.shape[1:] != clean_x.shape[1:] or population.dtype != clean_x.dtype:
            raise ValueError(
                f"population must be [n, pos, d_in] with clean_x's pos, d_in and dtype "
                f"({tuple(clean_x.shape[1:])}, {clean_x.dtype}); got "
                f"{tuple(population.shape)}, {population.dtype}"
            )
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    batch = clean_x.shape[0]
    chunk = max(1, _AUTO_SEQUENCES // batch) if chunk_size is None else chunk_size
    graph = EdgeGraph(model)
    with torch.no_grad():
        clean = run_clean(model, graph, clean_x)
        if isinstance(corrupted_x, torch.Tensor):
            corr, ablation = run_clean(model, graph, corrupted_x).outs, "corrupted"
        else:
            pop = clean_x if population is None else population
            means = run_clean(model, graph, pop).outs.mean(dim=1, keepdim=True)
            corr, ablation = means.expand(-1, batch, -1, -1).contiguous(), "mean"
    reference = clean.output

    def default_metric(y: torch.Tensor) -> torch.Tensor:
        return (y - reference).pow(2).mean()

    chosen: Callable[[torch.Tensor], Any] = default_metric if metric is None else metric
    setup = _Setup(model, graph, clean, corr, chosen, ablation, chunk)
    with torch.no_grad():
        setup.full_metric = float(_scalar(chosen(clean.output), clean.output))
        _check_finite(setup.full_metric, "on the full model (every edge kept)")
        setup.corrupted_metric = _metrics(setup, 0, graph.valid[None])[0]
        _check_finite(setup.corrupted_metric, "with every edge removed")
    return setup


_KIND = {
    "_forward_hooks": "forward",
    "_forward_pre_hooks": "forward pre",
    "_backward_hooks": "backward",
    "_backward_pre_hooks": "backward pre",
}  # nn.Module's hook dicts -> the hook they hold


def _refuse_hooks(model: HookedVectorTransformer) -> None:
    """Raise if a hook is attached that the split forward pass would not honour: a
    vecinterp hook (any thread's), a PyTorch module hook on any submodule, or a global
    PyTorch module hook. The pass reads the weights and calls only some submodules, on
    tensors tiled by trial: such a hook would be skipped or see other tensors."""
    hooked = sorted(name for name, point in model.hook_dict.items() if point.has_hooks)
    if hooked:
        raise ValueError(
            f"the model has hooks attached ({', '.join(hooked[:3])}"
            f"{', ...' if len(hooked) > 3 else ''}): circuit discovery computes the circuit "
            "from the weights and would not run them; remove them (model.reset_hooks()) first"
        )
    found = [
        f"{name or 'the model'} ({_KIND[kind]} hook)"
        for name, module in model.named_modules()
        for kind in _KIND
        if getattr(module, kind, None)
    ]
    found += [
        f"a global {_KIND[kind]} hook (torch.nn.modules.module.register_module_*_hook)"
        for kind in _KIND
        if getattr(nn.modules.module, "_global" + kind)
    ]
    if found:
        where = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise ValueError(
            f"the model has PyTorch module hooks attached: {where}. Circuit discovery "
            "computes the circuit from the weights, calling only some submodules on "
            "tensors tiled by trial, so such a hook would be skipped or run on other "
            "tensors than in the model's forward; remove it (the handle's .remove()) first"
        )


def _check_finite(value: float, where: str) -> None:
    """Raise if a metric value is NaN or infinite; ``where`` says which circuit."""
    if not math.isfinite(value):
        raise ValueError(
            f"metric is {value} {where}: ACDC compares changes of the metric with the "
            "threshold, and a NaN or infinite value makes every comparison meaningless (a "
            "log of an MSE that is 0 on the full model gives -inf: add a floor, "
            "log(mse + eps), or use the MSE itself); make the metric finite on every circuit"
        )


def _metrics(setup: _Setup, group: int, removed: torch.Tensor) -> list[float]:
    """The metric of each trial of a pass starting at receiver group ``group``."""
    graph, clean = setup.graph, setup.clean
    n_prefix = graph.groups[group].n_senders
    out = forward(
        setup.model,
        graph,
        group,
        clean.resid[group],
        clean.outs[:n_prefix],
        setup.corr,
        removed,
    )
    return [float(_scalar(setup.metric(out[t]), out)) for t in range(out.shape[0])]


# -- the search ---------------------------------------------------------------------------


def _search(
    setup: _Setup, tau: float, relative: float | None, abs_value: bool, progress: bool
) -> CircuitResult:
    start_time = time.perf_counter()
    graph = setup.graph
    removed = torch.zeros_like(graph.valid)  # on the CPU, as every mask: bookkeeping
    scores: dict[tuple[int, int], float] = {}
    current = setup.full_metric
    chunk, n_passes, n_trials = 1, 0, 0
    bar = tqdm(total=len(graph.receivers), desc=f"ACDC tau={tau:g}", disable=not progress)
    with torch.no_grad(), bar:
        for r in reversed(range(len(graph.receivers))):
            bar.update()
            candidates = list(reversed(range(graph.n_before[r])))
            node = graph.sender_of(graph.receivers[r])
            if node is not None and not bool((graph.valid & ~removed)[:, node].any()):
                removed[r, candidates] = True  # nothing reads this node any more
                continue
            i = 0
            while i < len(candidates):
                k = min(chunk, len(candidates) - i)
                trials = removed[None].repeat(k, 1, 1)
                for j in range(k):  # trial j: the next j + 1 candidates removed
                    trials[j, r, candidates[i : i + j + 1]] = True
                values = _metrics(setup, graph.group_of[r], trials)
                n_passes, n_trials = n_passes + 1, n_trials + k
                for j, value in enumerate(values):
                    if not math.isfinite(value):
                        edge = (graph.senders[candidates[i + j]], graph.receivers[r])
                        _check_finite(value, _trial(edge, int(removed.sum())))
                    change = value - current
                    scores[(candidates[i + j], r)] = change
                    if (abs(change) if abs_value else change) <= tau:
                        removed[r, candidates[i + j]] = True
                        current = value
                    else:  # kept: the trials after j assumed it removed
                        i, chunk = i + j + 1, 1
                        break
                else:
                    i, chunk = i + k, min(2 * chunk, setup.chunk)
        n_pruned = _prune(graph, removed) if setup.ablation == "corrupted" else 0
        final = _metrics(setup, 0, removed[None])[0]
        _check_finite(final, f"on the circuit found at tau = {tau:g}")
    kept = (graph.valid & ~removed).nonzero().tolist()
    edges = [(_spec(graph.senders[s]), _spec(graph.receivers[r])) for r, s in kept]
    on_edges = {graph.senders[s] for r, s in kept} | {_owner(graph.receivers[r]) for r, s in kept}
    order = [*graph.senders, _Node("output", graph.n_layers)]
    return CircuitResult(
        edges=edges,
        nodes=[_spec(n) for n in order if n in on_edges],
        metric=final,
        full_metric=setup.full_metric,
        corrupted_metric=setup.corrupted_metric,
        threshold=tau,
        n_edges=graph.n_edges,
        scores={
            (_spec(graph.senders[s]), _spec(graph.receivers[r])): v
            for (s, r), v in sorted(scores.items(), key=lambda item: (item[0][1], item[0][0]))
        },
        ablation=setup.ablation,
        n_layers=graph.n_layers,
        n_heads=graph.n_heads,
        has_mlps=graph.has_mlps,
        seconds=time.perf_counter() - start_time,
        n_passes=n_passes,
        n_trials=n_trials,
        n_pruned=n_pruned,
        relative_threshold=relative,
    )


def _trial(edge: tuple[_Node, _Node], n_removed: int) -> str:
    """Which trial a metric value came from, for a message."""
    sender, receiver = (_name(_spec(node)) for node in edge)
    return (
        f"on the trial that removes the edge {sender} -> {receiver} (with the {n_removed} "
        "edges removed before it)"
    )


def _prune(graph: EdgeGraph, removed: torch.Tensor) -> int:
    """Remove (in place) the edges out of every node left with no incoming edge, in forward
    order so that the nodes this strands are pruned too; the number removed. With a
    corrupted input such a node computes exactly its corrupted output (its input is the
    corrupted residual stream), so its outgoing edges carry nothing."""
    n = 0
    for s, rows in enumerate(graph.inputs_of):
        if rows and not bool((graph.valid & ~removed)[rows].any()):
            out = graph.valid[:, s] & ~removed[:, s]
            n += int(out.sum())
            removed[:, s] |= out
    return n


def _owner(receiver: _Node) -> _Node:
    """The node a receiver belongs to: a head's q/k/v input belongs to the head."""
    return _Node(receiver.kind, receiver.layer, receiver.head)


def _spec(node: _Node) -> Node:
    """A node in the form users write it."""
    if node.kind == "head":
        return (node.layer, node.head, node.channel) if node.channel else (node.layer, node.head)
    if node.kind == "mlp":
        return ("mlp", node.layer)
    return node.kind


def _name(node: Node) -> str:
    if isinstance(node, str):
        return node
    if node[0] == "mlp":
        return f"mlp {node[1]}"
    return f"head {node[0]}.{node[1]}" + (f" {node[2]}" if len(node) == 3 else "")
