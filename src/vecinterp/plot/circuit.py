"""The graph of a discovered circuit (:func:`plot_circuit`): the nodes of the model as boxes
in rows (the embedding at the bottom, each layer's heads and then its MLP, the output at the
top), the kept edges as arrows into each receiver's input (a head's query, key and value
inputs are three ports on its box, coloured apart). Matplotlib patches only, no graph
library."""

import math
from typing import Any

from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ._common import _new_axes

_CHANNEL_COLOURS = {"q": "tab:blue", "k": "tab:red", "v": "tab:green", "": "0.25"}
_CHANNEL_NAMES = {"q": "query", "k": "key", "v": "value", "": "MLP / output"}
_PORTS = {"q": -0.28, "k": 0.0, "v": 0.28, "": 0.0}  # a port's x offset, in box widths
_UNUSED = "0.8"
_BOX_W, _BOX_H, _WIDE_W = 0.72, 0.42, 1.8  # heads; embed, MLP and output are wide


def plot_circuit(
    result: Any,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    show_unused: bool = True,
    widths_by_score: bool = True,
) -> Axes:
    """Draw the circuit of a :class:`~vecinterp.CircuitResult` as a graph.

    Rows from the bottom: ``embed``, then for each layer its heads (``L.h``) and its MLP,
    then ``output``. Each kept edge is an arrow from the sender's box into the receiver's
    input: a head has three ports, query (left, blue), key (middle, red) and value (right,
    green); MLPs and the output have one (grey). An arrow that skips rows bends so as not
    to run through the boxes between. Nodes on no kept edge are drawn light grey, or left
    out with ``show_unused=False``.

    Args:
        result: what :func:`~vecinterp.discover_circuit` returned.
        ax: axes to draw on; a new figure (sized to the model) when ``None``.
        title: axes title; default: edges kept, threshold and metrics.
        show_unused: draw the nodes that are not in the circuit, in light grey.
        widths_by_score: arrow widths grow with the log of the metric change measured when
            the edge was tried (its ``result.scores`` entry), from 0.7 to 3 points.

    Returns:
        The axes: ``ax.patches`` holds the boxes, then the arrows (one per kept edge, in
        ``result.edges`` order); the legend names the ports' colours.

    Raises:
        TypeError: ``result`` is not a circuit result (no ``edges``, ``n_layers``, ...).

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> import torch, vecinterp as vi
        >>> from vecinterp.plot import plot_circuit
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> result = vi.discover_circuit(model, torch.randn(8, 6, 3), torch.randn(8, 6, 3),
        ...                              threshold=1e-4, progress=False)
        >>> ax = plot_circuit(result)
        >>> arrows = [p for p in ax.patches if p.get_label() == "edge"]
        >>> len(arrows) == result.n_kept
        True
        >>> plt.close(ax.figure)
    """
    needed = ("edges", "nodes", "scores", "n_layers", "n_heads", "has_mlps", "threshold")
    missing = [name for name in needed if not hasattr(result, name)]
    if missing:
        raise TypeError(
            f"result must be a CircuitResult (from vi.discover_circuit), got "
            f"{type(result).__name__} without {', '.join(missing)}"
        )
    n_layers, n_heads, has_mlps = result.n_layers, result.n_heads, result.has_mlps
    rows_per_layer = 2 if has_mlps else 1
    n_rows = 2 + n_layers * rows_per_layer
    ax = _new_axes(ax, (max(5.0, 0.95 * n_heads + 1.5), 0.85 * n_rows + 0.9))
    places = _places(n_layers, n_heads, has_mlps)
    used = {_key(node) for node in result.nodes}
    for key, (x, y) in places.items():
        if key in used or show_unused:
            _box(ax, key, x, y, in_circuit=key in used)
    widths = _widths(result) if widths_by_score else {}
    for edge in result.edges:
        sender, receiver = edge
        channel = receiver[2] if isinstance(receiver, tuple) and len(receiver) == 3 else ""
        target = receiver[:2] if channel else receiver
        sx, sy = places[_key(sender)]
        rx, ry = places[_key(target)]
        # a wide box (embed, MLP, output) sends and receives at the point nearest the
        # other end, so arrows between rows stay short and apart
        start_x = _clamp(rx, sx, _wide(sender))
        end_x = rx + _PORTS[channel] * _BOX_W if channel else _clamp(sx, rx, _wide(target))
        start, end = (start_x, sy + _BOX_H / 2), (end_x, ry - _BOX_H / 2)
        skips = ry - sy > 1
        bend = 0.0 if not skips else (0.25 if end[0] >= start[0] else -0.25)
        arrow = FancyArrowPatch(
            start,
            end,
            connectionstyle=f"arc3,rad={bend}",
            arrowstyle="-|>",
            mutation_scale=8,
            color=_CHANNEL_COLOURS[channel],
            linewidth=widths.get(edge, 1.4),
            alpha=0.85,
            zorder=1,
            label="edge",
        )
        ax.add_patch(arrow)
    handles = [
        Line2D([], [], color=_CHANNEL_COLOURS[c], label=_CHANNEL_NAMES[c], linewidth=2)
        for c in ("q", "k", "v", "")
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=4,
        fontsize="small",
        frameon=False,
    )
    half = max((n_heads - 1) / 2 + _BOX_W / 2, _WIDE_W / 2) + 0.2
    ax.set_xlim(-half - 0.1, half + 0.1)
    ax.set_ylim(-0.6, n_rows - 0.4)
    ax.set_axis_off()
    if title is None:
        title = (
            f"ACDC circuit: {len(result.edges)} of {result.n_edges} edges (τ = "
            f"{result.threshold:.3g})\nmetric: circuit {result.metric:.3g}, model "
            f"{result.full_metric:.3g}, all edges removed {result.corrupted_metric:.3g}"
        )
    ax.set_title(title, fontsize="medium")
    return ax


def _key(node: Any) -> Any:
    """A node as a hashable key: lists become tuples."""
    return tuple(node) if isinstance(node, list) else node


def _wide(key: Any) -> bool:
    """Whether a node is drawn as a wide box: the embedding, an MLP, the output."""
    return not (isinstance(key, tuple) and key[0] != "mlp")


def _clamp(x: float, centre: float, wide: bool) -> float:
    """``x`` moved into the middle 80% of a box at ``centre`` (the centre for a head)."""
    if not wide:
        return centre
    half = 0.4 * _WIDE_W
    return min(max(x, centre - half), centre + half)


def _places(n_layers: int, n_heads: int, has_mlps: bool) -> dict[Any, tuple[float, float]]:
    """Each node's box centre: row ``y`` from the bottom, heads spread about ``x = 0``."""
    places: dict[Any, tuple[float, float]] = {"embed": (0.0, 0.0)}
    y = 1.0
    for layer in range(n_layers):
        for h in range(n_heads):
            places[(layer, h)] = (h - (n_heads - 1) / 2, y)
        y += 1
        if has_mlps:
            places[("mlp", layer)] = (0.0, y)
            y += 1
    places["output"] = (0.0, y)
    return places


def _box(ax: Axes, key: Any, x: float, y: float, in_circuit: bool) -> None:
    width = _WIDE_W if _wide(key) else _BOX_W
    if isinstance(key, str):
        text = key
    elif key[0] == "mlp":
        text = f"MLP {key[1]}"
    else:
        text = f"{key[0]}.{key[1]}"
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - _BOX_H / 2),
            width,
            _BOX_H,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor="white" if in_circuit else "0.96",
            edgecolor="0.15" if in_circuit else _UNUSED,
            linewidth=1.2 if in_circuit else 0.8,
            zorder=2,
            label="node",
        )
    )
    ax.text(
        x,
        y,
        text,
        ha="center",
        va="center",
        fontsize="small",
        color="black" if in_circuit else "0.6",
        zorder=3,
    )


def _widths(result: Any) -> dict[Any, float]:
    """Arrow widths from 0.7 to 3 points, by the log of each kept edge's |score|."""
    scores = {e: abs(result.scores[e]) for e in result.edges if e in result.scores}
    positive = [v for v in scores.values() if v > 0 and math.isfinite(v)]
    if not positive:
        return {}
    low, high = math.log10(min(positive)), math.log10(max(positive))
    span = high - low
    return {
        e: 0.7 + 2.3 * ((math.log10(v) - low) / span if span > 0 else 1.0)
        for e, v in scores.items()
        if v > 0 and math.isfinite(v)
    }
