"""Plots of analysis results: attention patterns, circuit matrices, score grids, attributions,
linear fits, loss curves (matplotlib; the optional ``plot`` extra).

Every function takes plain results (torch tensors, numpy arrays or, for 1-D inputs, lists),
draws on the ``ax`` it is given or on a new figure, and returns the ``Axes`` (or ``Figure``)
so the caller can restyle or save it. None calls ``plt.show()`` or changes ``rcParams``.
Shapes are checked up front with a ``ValueError`` that names the expected axes. Inputs are
annotated as plain array types rather than jaxtyping shapes on purpose: the functions accept
several ranks and report a wrong one as a ``ValueError`` of their own.

Figures that state a claim: :func:`plot_fit`, :func:`plot_attribution` and :func:`plot_loss`
draw a ``reference`` (the value a paper reports) beside the data, :func:`plot_attention_grid`
outlines a source position (``highlight_source``), :func:`add_note` writes a sentence into
an axes, and :func:`plot_eigenvalue_scores` labels the ends of its colour scale with what
they mean (−1 negates, +1 copies).

Speed and legibility: tick marks are set through fixed locators (no tick objects are built
until a draw needs them), :func:`plot_attention_grid` places its panels itself instead of
running a layout engine over dozens of axes, and :func:`save_figure` writes and closes a
figure. Text is sized in points, so it is legible from 100 dpi (the default of
:func:`save_figure`; 8-pt text is then 11 px tall): for a smaller image, shrink the figure,
not the dpi.

Nothing else in vecinterp imports this module, so vecinterp works without matplotlib.
"""

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, SupportsFloat, runtime_checkable

import numpy as np
import torch

try:
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.patches import Rectangle
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FixedLocator, MaxNLocator
except ImportError as exc:  # pragma: no cover - exercised by a test that hides matplotlib
    raise ImportError(
        "vecinterp.plot needs matplotlib, which is not installed. "
        'Install the plot extra: pip install "vecinterp[plot]"'
    ) from exc

from ..factored_matrix import FactoredMatrix

__all__ = [
    "add_note",
    "plot_attention",
    "plot_attention_grid",
    "plot_attribution",
    "plot_eigenvalue_scores",
    "plot_emergence",
    "plot_fit",
    "plot_loss",
    "plot_matrix",
    "plot_residual_vs_target",
    "plot_score_grid",
    "save_figure",
]

# numbers as a tensor, an array, or a (nested, for matrices) list
ArrayLike = torch.Tensor | np.ndarray | Sequence[SupportsFloat] | Sequence[Sequence[SupportsFloat]]
Scalar = SupportsFloat | torch.Tensor | np.ndarray

_ATTENTION_CMAP = "Blues"
_DIVERGING_CMAP = "RdBu_r"  # red positive, blue negative
_MASKED_GREY = "0.85"
_POSITIVE, _NEGATIVE = "tab:blue", "tab:red"
_REFERENCE = "0.35"  # the colour of a claim's reference line: dark grey, dashed
_MAX_TICKS = 16  # label every position up to this many; beyond, every 2nd, 5th, 10th, ...
_GRID_TICKS = 4  # at most this many position ticks per axis of a grid panel

EIGENVALUE_SCALE_LABELS: dict[str, dict[SupportsFloat, str]] = {
    "OV": {-1.0: "−1: negates\n(OV ≈ −I)", 0.0: "0", 1.0: "+1: copies\n(OV ≈ +I)"},
    "QK": {
        -1.0: "−1: opposite\ndirection (QK ≈ −I)",
        0.0: "0",
        1.0: "+1: same\ndirection (QK ≈ +I)",
    },
}
"""What the ends of an eigenvalue-score scale mean, per circuit: the colour-bar labels of
:func:`plot_eigenvalue_scores`. An OV circuit ``W_V W_O = −I`` scores exactly −1 (the head
writes the negative of what it reads), ``+I`` scores +1 (it copies); a QK circuit
``W_Q W_K^T = ±I`` makes a query attend most to keys in the same (+1) or the opposite (−1)
direction."""


@runtime_checkable
class LossHistory(Protocol):
    """Anything shaped like :class:`vecinterp.training.TrainHistory` (duck-typed)."""

    steps: Any
    train_loss: Any
    eval_steps: Any
    eval_loss: Any


# ------------------------------------------------------------------------------ helpers


def _to_numpy(value: object, name: str) -> np.ndarray:
    """``value`` as a float64 numpy array (tensors are detached and moved to the CPU)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.is_complex():
            raise TypeError(f"{name} must be real, got a {value.dtype} tensor")
        value = value.to(torch.float64).numpy()
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} must be a rectangular array: {exc}") from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    return array.astype(np.float64)


def _check_ndim(array: np.ndarray, ndims: tuple[int, ...], name: str, axes: str) -> None:
    if array.ndim not in ndims or array.size == 0:
        raise ValueError(f"{name} must be a non-empty array {axes}, got shape {array.shape}")


def _scalar(value: Scalar, name: str) -> float:
    array = _to_numpy(value, name)
    if array.size != 1:
        raise ValueError(f"{name} must be a single number, got shape {array.shape}")
    return float(array.reshape(()))


def _new_axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _position_locator(n: int, max_ticks: int) -> FixedLocator:
    """Ticks at positions ``0, k, 2k, ... < n`` with the smallest ``k`` in 1, 2, 5, 10,
    20, 50, ... that gives at most ``max_ticks`` of them."""
    step = 1
    while math.ceil(n / step) > max_ticks:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return FixedLocator(range(0, n, step))


def _position_ticks(
    ax: Axes, n_x: int, n_y: int, labels: Sequence[str] | None, max_ticks: int = _MAX_TICKS
) -> None:
    """Integer position ticks; every position is labelled when there are few or when
    ``labels`` are given (the last ``n_y`` labels go on the y axis).

    Locators, not ``set_ticks``: ``set_ticks`` builds every tick object (two lines and two
    texts each) at once, and again whenever the ticks change; a locator defers that to the
    draw, which then builds only the ticks it shows."""
    for axis, n in ((ax.xaxis, n_x), (ax.yaxis, n_y)):
        if labels is not None:
            axis.set_major_locator(FixedLocator(range(n)))
            axis.set_major_formatter(FixedFormatter(list(labels)[len(labels) - n :]))
        else:
            axis.set_major_locator(_position_locator(n, max_ticks))
    if labels is not None and n_x > 8:
        ax.tick_params(axis="x", labelrotation=90)


def _font_inches(key: Literal["axes.labelsize", "xtick.labelsize", "font.size"]) -> float:
    """The height of rcParams ``key``'s font size, in inches (rcParams are only read)."""
    return FontProperties(size=plt.rcParams[key]).get_size_in_points() / 72.0


def _reference_value(value: object, name: str) -> float:
    number = _scalar(value, name)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {number}")
    return number


# ---------------------------------------------------------------------------- attention


def _causal_zeros(pattern: np.ndarray) -> np.ndarray | None:
    """Boolean mask of the causal (future) triangle if it is non-empty and all zeros.

    Query ``i`` of ``dest_pos`` sits at source position ``i + src_pos - dest_pos`` (the
    queries are the last positions when ``dest_pos < src_pos``)."""
    n_dest, n_src = pattern.shape
    offset = n_src - n_dest
    future = np.arange(n_src)[None, :] > np.arange(n_dest)[:, None] + offset
    if not future.any() or not np.all(pattern[future] == 0):
        return None
    return future


def plot_attention(
    pattern: ArrayLike,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    labels: Sequence[str] | None = None,
    vmax: SupportsFloat | None = None,
    colorbar: bool = True,
) -> Axes:
    """Heatmap of one attention pattern, destination (query) position down, source across.

    Entry ``[i, j]`` is ``A[i, j] = softmax_j(q_i · k_j / sqrt(d_head))``, the share of
    destination ``i``'s attention on source ``j``. When the future (upper) triangle
    ``j > i`` is entirely zero, as in a causal model, it is drawn grey so that it reads as
    "masked" rather than as "no attention".

    Args:
        pattern: ``[dest_pos, src_pos]``, e.g. ``cache["pattern", layer][batch, head]``.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        labels: one label per position (``src_pos`` of them; the y axis takes the last
            ``dest_pos``); integer positions when ``None``.
        vmax: top of the colour scale. Default: 1 if every entry lies in ``[0, 1]`` (a
            probability, comparable across heads), else the largest entry.
        colorbar: draw a colour bar beside ``ax``.

    Returns:
        The axes, holding one image whose extent is the pattern's shape.

    Raises:
        ValueError: ``pattern`` is not 2-D, or ``labels`` has the wrong length.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, torch
        >>> from vecinterp.plot import plot_attention
        >>> ax = plot_attention(torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None])
        >>> ax.get_xlabel(), ax.images[0].get_array().shape
        ('source position', (4, 4))
        >>> plt.close(ax.figure)
    """
    values = _to_numpy(pattern, "pattern")
    _check_ndim(values, (2,), "pattern", "[dest_pos, src_pos]")
    n_dest, n_src = values.shape
    if labels is not None and len(labels) != n_src:
        raise ValueError(
            f"labels must have one entry per source position ({n_src}), got {len(labels)}"
        )
    vmin = min(0.0, float(np.nanmin(values))) if np.isfinite(values).any() else 0.0
    if vmax is None:
        top = float(np.nanmax(values)) if np.isfinite(values).any() else 1.0
        vmax = 1.0 if vmin >= 0 and top <= 1 else top
    cmap = plt.get_cmap(_ATTENTION_CMAP).with_extremes(bad=_MASKED_GREY)
    future = _causal_zeros(values)
    shown = values if future is None else np.ma.masked_array(values, mask=future)
    ax = _new_axes(ax, (4.2, 3.6))
    image = ax.imshow(
        shown, cmap=cmap, vmin=vmin, vmax=float(vmax), interpolation="nearest", aspect="equal"
    )
    _position_ticks(ax, n_src, n_dest, labels)
    ax.set_xlabel("source position")
    ax.set_ylabel("destination position")
    if title is not None:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label="attention", shrink=0.85)
    return ax


def plot_attention_grid(
    patterns: ArrayLike,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    vmax: SupportsFloat | None = None,
    highlight_source: int | None = None,
    highlight_rows: Sequence[int] | None = None,
    panel_size: int | float = 1.6,
) -> Figure:
    """A grid of attention patterns (one subplot each) sharing one colour scale and bar.

    The panels are placed by a fixed layout computed from the font sizes (in inches, so it
    does not depend on the dpi) rather than by a layout engine, which would measure every
    tick label of every panel on each draw: a 3 × 8 grid saves in a fraction of a second.
    Only the outer panels carry tick labels, at most four positions per axis.

    Args:
        patterns: ``[n_rows, n_cols, dest_pos, src_pos]`` (e.g. ``[n_layers, n_heads, ...]``,
            rows labelled ``layer i`` and columns ``head j`` by default) or
            ``[n_cols, dest_pos, src_pos]`` (one row; e.g. ``cache["pattern", l][batch]``).
        row_labels: ``n_rows`` labels, shown left of each row.
        col_labels: ``n_cols`` labels, shown above each column.
        title: figure title.
        vmax: top of the shared colour scale (see :func:`plot_attention`).
        highlight_source: a source position to outline (a rectangle around its column) in
            the panels of ``highlight_rows``, e.g. 1 for "layer 1's heads attend to
            position 1" (Bhargav & Gu 2024, §4.2).
        highlight_rows: the rows whose panels get the outline; default: every row.
        panel_size: the width of one panel in inches (its height follows the pattern's
            shape).

    Returns:
        The figure; ``fig.axes`` lists the ``n_rows * n_cols`` pattern axes row by row,
        then the colour bar. An outline is a ``Rectangle`` in its panel's ``patches``.

    Raises:
        ValueError: ``patterns`` is not 3-D or 4-D, a label list has the wrong length, or
            ``highlight_source``/``highlight_rows``/``panel_size`` is out of range.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, torch
        >>> from vecinterp.plot import plot_attention_grid
        >>> fig = plot_attention_grid(torch.softmax(torch.randn(2, 3, 5, 5), dim=-1),
        ...                           highlight_source=1, highlight_rows=[1])
        >>> len(fig.axes), fig.axes[0].get_title(), len(fig.axes[3].patches)
        (7, 'head 0', 1)
        >>> plt.close(fig)
    """
    values = _to_numpy(patterns, "patterns")
    _check_ndim(
        values,
        (3, 4),
        "patterns",
        "[n_rows, n_cols, dest_pos, src_pos] or [n_cols, dest_pos, src_pos]",
    )
    if values.ndim == 3:
        values = values[None]
    n_rows, n_cols, n_dest, n_src = values.shape
    if row_labels is None:
        row_labels = [f"layer {i}" for i in range(n_rows)] if n_rows > 1 else [""]
    if col_labels is None:
        col_labels = [f"head {j}" for j in range(n_cols)]
    for name, given, n in (("row_labels", row_labels, n_rows), ("col_labels", col_labels, n_cols)):
        if len(given) != n:
            raise ValueError(f"{name} must have {n} entries, got {len(given)}")
    if highlight_source is not None and not (
        isinstance(highlight_source, int | np.integer) and 0 <= highlight_source < n_src
    ):
        raise ValueError(
            f"highlight_source must be a source position in 0..{n_src - 1}, "
            f"got {highlight_source!r}"
        )
    rows = range(n_rows) if highlight_rows is None else list(highlight_rows)
    if any(not isinstance(r, int | np.integer) or not 0 <= r < n_rows for r in rows):
        raise ValueError(f"highlight_rows must be row indices in 0..{n_rows - 1}, got {rows!r}")
    if not (isinstance(panel_size, int | float) and 0.3 <= panel_size <= 20):
        raise ValueError(f"panel_size must be a width in inches in [0.3, 20], got {panel_size!r}")
    finite = values[np.isfinite(values)]
    if vmax is None:
        top = float(finite.max()) if finite.size else 1.0
        vmax = 1.0 if finite.size and finite.min() >= 0 and top <= 1 else top

    # The layout, in inches: text heights come from the rcParams font sizes.
    label, tick, big = (_font_inches(k) for k in ("axes.labelsize", "xtick.labelsize", "font.size"))
    width, height = panel_size, panel_size * n_dest / n_src
    n_lines = max(f"{r}\ndestination".strip().count("\n") + 1 for r in row_labels)
    left = 0.2 + 2.4 * tick + 1.25 * label * n_lines
    bottom = 0.15 + 1.5 * tick + 1.4 * label
    top = 0.1 + 1.6 * label + (2.0 * big if title else 0.0)
    gap_x, gap_y = 0.12, 0.12
    bar_gap, bar_width = 0.15, 0.12
    right = bar_gap + bar_width + 0.15 + 3.0 * tick + 1.5 * label
    fig_w = left + n_cols * width + (n_cols - 1) * gap_x + right
    fig_h = bottom + n_rows * height + (n_rows - 1) * gap_y + top
    fig = plt.figure(figsize=(fig_w, fig_h))
    for i in range(n_rows):
        for j in range(n_cols):
            x0 = left + j * (width + gap_x)
            y0 = fig_h - top - (i + 1) * height - i * gap_y
            ax = fig.add_axes((x0 / fig_w, y0 / fig_h, width / fig_w, height / fig_h))
            plot_attention(values[i, j], ax=ax, vmax=vmax, colorbar=False)
            for axis, n in ((ax.xaxis, n_src), (ax.yaxis, n_dest)):  # small panels
                axis.set_major_locator(_position_locator(n, _GRID_TICKS))
            ax.tick_params(labelbottom=i == n_rows - 1, labelleft=j == 0)
            ax.set_title(col_labels[j] if i == 0 else "")
            ax.set_xlabel("source" if i == n_rows - 1 else "")
            ax.set_ylabel(f"{row_labels[i]}\ndestination".strip() if j == 0 else "")
            if highlight_source is not None and i in rows:
                ax.add_patch(
                    Rectangle(
                        (highlight_source - 0.5, -0.5),
                        1.0,
                        n_dest,
                        fill=False,
                        edgecolor=_NEGATIVE,
                        linewidth=1.5,
                        clip_on=False,
                    )
                )
    grid_h = n_rows * height + (n_rows - 1) * gap_y
    bar_x = left + n_cols * width + (n_cols - 1) * gap_x + bar_gap
    bar_y = bottom + 0.1 * grid_h
    cax = fig.add_axes((bar_x / fig_w, bar_y / fig_h, bar_width / fig_w, 0.8 * grid_h / fig_h))
    fig.colorbar(fig.axes[0].images[0], cax=cax, label="attention")
    if title is not None:
        fig.suptitle(title, y=1.0 - 0.1 / fig_h, va="top")
    return fig


# ------------------------------------------------------------------- matrices and scores


def plot_matrix(
    matrix: ArrayLike | FactoredMatrix,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    cmap: str = _DIVERGING_CMAP,
) -> Axes:
    """Heatmap of a real matrix on a diverging colour scale centred at 0.

    The scale runs over ``[-m, m]`` with ``m = max |M_ij|``, so white means 0 and the two
    hues are comparable: made for OV (``W_V W_O``) and QK (``W_Q W_K^T``) circuits, where
    a signed diagonal (copying, or its negative) is what the eye should find.

    Args:
        matrix: ``[rows, cols]`` tensor or array, or a 2-D :class:`~vecinterp.FactoredMatrix`
            (its product ``AB`` is formed), e.g. ``model.OV[layer, head]``.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        xlabel: x-axis (column) label.
        ylabel: y-axis (row) label.
        cmap: a diverging colour map name.

    Returns:
        The axes, holding one image with ``vmin == -vmax``.

    Raises:
        ValueError: ``matrix`` is not 2-D.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, torch
        >>> from vecinterp.plot import plot_matrix
        >>> ax = plot_matrix(-2 * torch.eye(3), title="OV = -2I")
        >>> ax.images[0].get_clim()
        (-2.0, 2.0)
        >>> plt.close(ax.figure)
    """
    if isinstance(matrix, FactoredMatrix):
        matrix = matrix.AB
    values = _to_numpy(matrix, "matrix")
    _check_ndim(values, (2,), "matrix", "[rows, cols]")
    finite = np.abs(values[np.isfinite(values)])
    limit = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    n_rows, n_cols = values.shape
    ax = _new_axes(ax, (4.6, 3.8))
    image = ax.imshow(values, cmap=cmap, vmin=-limit, vmax=limit, interpolation="nearest")
    _position_ticks(ax, n_cols, n_rows, None)
    ax.set_xlabel(xlabel or "")
    ax.set_ylabel(ylabel or "")
    if title is not None:
        ax.set_title(title)
    ax.figure.colorbar(image, ax=ax, shrink=0.85)
    return ax


def plot_score_grid(
    scores: ArrayLike,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    fmt: str = ".2f",
    cmap: str | None = None,
    center: SupportsFloat | None = None,
    limit: SupportsFloat | None = None,
    annotate: bool = True,
    colorbar_label: str | None = None,
    scale_labels: Mapping[SupportsFloat, str] | None = None,
) -> Axes:
    """A layer × head table of scores, each cell coloured and annotated with its value.

    NaN cells (heads without a score) are left blank: light grey (distinct from the white
    centre of a diverging scale), no text.

    Args:
        scores: ``[n_layers, n_heads]``, e.g. :func:`~vecinterp.eigenvalue_scores` of a model.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        fmt: format spec of the annotations (``format(value, fmt)``).
        cmap: colour map; default ``"viridis"``, or ``"RdBu_r"`` when ``center`` is given.
        center: if given, a diverging scale symmetric about it
            (``[center - d, center + d]``, ``d = max |score - center|``); e.g. ``center=0``
            for eigenvalue scores in ``[-1, 1]``. Default: the scores' range.
        limit: with ``center``, the half-width ``d`` of the scale instead of the largest
            deviation, so that figures share one scale (``limit=1`` for scores in
            ``[-1, 1]``).
        annotate: write each value in its cell.
        colorbar_label: the colour bar's label (e.g. ``"OV eigenvalue score"``).
        scale_labels: colour-bar ticks ``{value: text}`` that say what a value means, e.g.
            ``{-1: "negates", 1: "copies"}`` (:data:`EIGENVALUE_SCALE_LABELS`); values
            outside the scale are refused.

    Returns:
        The axes: x label ``"head"``, y label ``"layer"``, layer 0 at the top; the colour
        bar is ``ax.images[0].colorbar``.

    Raises:
        ValueError: ``scores`` is not 2-D or holds ±inf, or a ``scale_labels`` value lies
            outside the colour scale.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> from vecinterp.plot import plot_score_grid
        >>> ax = plot_score_grid([[0.5, -1.0], [float("nan"), 0.25]], center=0)
        >>> [t.get_text() for t in ax.texts]
        ['0.50', '-1.00', '0.25']
        >>> plt.close(ax.figure)
    """
    values = _to_numpy(scores, "scores")
    _check_ndim(values, (2,), "scores", "[n_layers, n_heads]")
    if np.isinf(values).any():
        raise ValueError("scores must not hold ±inf (use NaN for cells without a score)")
    missing = np.isnan(values)
    finite = values[~missing]
    if center is None and limit is not None:
        raise ValueError("limit needs center (it is the half-width of a scale about center)")
    if center is None:
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        cmap = cmap or "viridis"
    else:
        c = float(center)
        if limit is not None:
            half = float(limit)
            if not half > 0 or not np.isfinite(half):
                raise ValueError(f"limit must be a positive finite number, got {limit!r}")
        else:
            half = float(np.abs(finite - c).max()) if finite.size else 1.0
            half = half if half > 0 else 1.0
        vmin, vmax = c - half, c + half
        cmap = cmap or _DIVERGING_CMAP
    if vmin == vmax:
        vmin, vmax = vmin - 0.5, vmax + 0.5
    colormap = plt.get_cmap(cmap).with_extremes(bad=_MASKED_GREY)
    n_layers, n_heads = values.shape
    ax = _new_axes(ax, (1.0 + 0.75 * n_heads + 1.2, 0.6 + 0.55 * n_layers + 0.6))
    image = ax.imshow(
        np.ma.masked_array(values, mask=missing),
        cmap=colormap,
        vmin=vmin,
        vmax=vmax,
        interpolation="nearest",
        aspect="auto",
    )
    if annotate:
        rgba = image.to_rgba(np.ma.masked_array(values, mask=missing))
        for i, j in zip(*np.nonzero(~missing), strict=True):
            red, green, blue = rgba[i, j, :3]
            luminance = 0.299 * red + 0.587 * green + 0.114 * blue
            ax.text(
                j,
                i,
                format(values[i, j], fmt),
                ha="center",
                va="center",
                fontsize=8,
                color="black" if luminance > 0.5 else "white",
            )
    ax.xaxis.set_major_locator(_position_locator(n_heads, _MAX_TICKS))
    ax.yaxis.set_major_locator(_position_locator(n_layers, _MAX_TICKS))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if title is not None:
        ax.set_title(title)
    bar = ax.figure.colorbar(image, ax=ax, shrink=0.85, label=colorbar_label)
    if scale_labels is not None:
        ticks = sorted((float(v), str(text)) for v, text in scale_labels.items())
        outside = [v for v, _ in ticks if not vmin <= v <= vmax]
        if outside:
            raise ValueError(
                f"scale_labels has values outside the colour scale [{vmin:g}, {vmax:g}]: {outside}"
            )
        bar.ax.yaxis.set_major_locator(FixedLocator([v for v, _ in ticks]))
        bar.ax.yaxis.set_major_formatter(FixedFormatter([text for _, text in ticks]))
    return ax


def plot_eigenvalue_scores(
    scores: ArrayLike,
    *,
    circuit: str = "OV",
    ax: Axes | None = None,
    title: str | None = None,
    fmt: str = ".2f",
    annotate: bool = True,
) -> Axes:
    """Eigenvalue (copying) scores per layer and head on a fixed ``[-1, 1]`` scale whose
    ends say what they mean: for OV, −1 "negates (OV ≈ −I)" and +1 "copies (OV ≈ +I)".

    The score ``Re(Σλ) / Σ|λ|`` (:func:`~vecinterp.eigenvalue_scores`) lies in ``[-1, 1]``;
    a fixed scale keeps figures of different models comparable. This is
    :func:`plot_score_grid` with ``center=0, limit=1`` and the colour-bar labels of
    :data:`EIGENVALUE_SCALE_LABELS`.

    Args:
        scores: ``[n_layers, n_heads]`` in ``[-1, 1]`` (NaN: no score).
        circuit: ``"OV"`` or ``"QK"``, which circuit the scores are of (the labels).
        ax: axes to draw on; a new figure when ``None``.
        title: axes title; default ``"<circuit> eigenvalue scores"``.
        fmt: format spec of the cell annotations.
        annotate: write each value in its cell.

    Returns:
        The axes; the colour bar, ``ax.images[0].colorbar``, has ticks at −1, 0 and +1.

    Raises:
        ValueError: ``circuit`` is not ``"OV"`` or ``"QK"``, or as :func:`plot_score_grid`.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> from vecinterp.plot import plot_eigenvalue_scores
        >>> ax = plot_eigenvalue_scores([[-0.9, 0.1], [0.5, 1.0]])
        >>> bar = ax.images[0].colorbar
        >>> [t.get_text().replace("\\n", " ") for t in bar.ax.get_yticklabels()]
        ['−1: negates (OV ≈ −I)', '0', '+1: copies (OV ≈ +I)']
        >>> ax.images[0].get_clim()
        (-1.0, 1.0)
        >>> plt.close(ax.figure)
    """
    if circuit not in EIGENVALUE_SCALE_LABELS:
        raise ValueError(
            f"circuit must be one of {sorted(EIGENVALUE_SCALE_LABELS)}, got {circuit!r}"
        )
    return plot_score_grid(
        scores,
        ax=ax,
        title=f"{circuit} eigenvalue scores" if title is None else title,
        fmt=fmt,
        center=0.0,
        limit=1.0,
        annotate=annotate,
        colorbar_label=f"{circuit} eigenvalue score",
        scale_labels=EIGENVALUE_SCALE_LABELS[circuit],
    )


# --------------------------------------------------------------- attributions and fits


def plot_attribution(
    values: ArrayLike,
    labels: Sequence[object],
    *,
    ax: Axes | None = None,
    title: str | None = None,
    ylabel: str = "direct attribution",
    reference: Scalar | ArrayLike | None = None,
    reference_label: str = "reference",
) -> Axes:
    """One bar per component (positive blue, negative red) with a line at zero.

    Args:
        values: ``[component]``, e.g. a direct attribution averaged over batch and position.
        labels: ``component`` names (``str()`` of each is shown), e.g. ``"L0H1"``, ``"mlp_1"``.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        ylabel: y-axis label.
        reference: the value a claim states, drawn beside the bars: one number (a dashed
            horizontal line across the axes, e.g. a paper's threshold) or ``[component]``
            numbers (a dark tick over each bar; NaN: none for that component).
        reference_label: the reference's legend entry.

    Returns:
        The axes; ``ax.patches`` are the bars, in component order. A one-number reference
        is ``ax.lines[-1]``; per-component ones are ``ax.collections[-1]``, one horizontal
        segment per finite value.

    Raises:
        ValueError: ``values`` is not 1-D, ``labels`` or ``reference`` has another
            length, or a one-number ``reference`` is not finite.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> from vecinterp.plot import plot_attribution
        >>> ax = plot_attribution([0.3, -0.1, 0.05], ["embed", "L0H0", "L0H1"])
        >>> [round(float(bar.get_height()), 2) for bar in ax.patches]
        [0.3, -0.1, 0.05]
        >>> plt.close(ax.figure)
    """
    heights = _to_numpy(values, "values")
    _check_ndim(heights, (1,), "values", "[component]")
    if len(labels) != heights.size:
        raise ValueError(
            f"labels must have one entry per component ({heights.size}), got {len(labels)}"
        )
    positions = np.arange(heights.size)
    ax = _new_axes(ax, (max(4.0, 0.4 * heights.size + 1.5), 3.6))
    colors = [_NEGATIVE if h < 0 else _POSITIVE for h in heights]
    ax.bar(positions, heights, color=colors)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(
        positions,
        labels=[str(label) for label in labels],
        rotation=60,
        ha="right",
        rotation_mode="anchor",
    )
    ax.set_xlim(-0.6, heights.size - 0.4)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    if reference is not None:
        ref = _to_numpy(reference, "reference")
        if ref.size == 1 and ref.ndim <= 1:
            level = _reference_value(ref, "reference")
            ax.axhline(
                level, color=_REFERENCE, linestyle="--", linewidth=1.2,
                label=f"{reference_label}: {level:.3g}",
            )  # fmt: skip
        else:
            if ref.shape != heights.shape:
                raise ValueError(
                    f"reference must be one number or one per component ({heights.size}), "
                    f"got shape {ref.shape}"
                )
            shown = np.isfinite(ref)
            ax.hlines(
                ref[shown],
                positions[shown] - 0.4,
                positions[shown] + 0.4,
                color="black",
                linewidth=2.0,
                label=reference_label,
            )
        ax.legend(loc="best", fontsize="small")
    return ax


def plot_fit(
    x: ArrayLike,
    y: ArrayLike,
    *,
    slope: Scalar | None = None,
    intercept: Scalar | None = None,
    r2: Scalar | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "x",
    ylabel: str = "y",
    max_points: int = 5000,
    reference: Scalar | tuple[Scalar, Scalar] | None = None,
    reference_label: str = "reference",
) -> Axes:
    """Scatter of ``(x, y)`` pairs with a fitted line ``y ≈ slope · x + intercept``.

    Without ``slope``/``intercept``, the least-squares line is fitted (``np.polyfit``,
    degree 1) on all points. ``R² = 1 − Σ(y − ŷ)² / Σ(y − ȳ)²`` of the drawn line is computed
    when not given, and shown in the legend with the line's equation. Bhargav & Gu (2024,
    §4.4) use this for ``(x_d, (x OV)_d)``; :func:`vecinterp.analysis.geometry.fit_line`
    gives the numbers.

    Args:
        x: pairs' first coordinates, any shape (flattened).
        y: second coordinates, the same shape as ``x``.
        slope: the line's slope (a number or 0-d tensor); give with ``intercept``.
        intercept: the line's intercept; give with ``slope``.
        r2: the R² to show; computed from the line when ``None``.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        xlabel: x-axis label.
        ylabel: y-axis label.
        max_points: at most this many points are drawn (a fixed random subset; the fit
            still uses all of them).
        reference: the slope a claim states, as a dashed line ``y = reference · x``
            through the origin, or a ``(low, high)`` range of slopes, as two dashed lines
            with the wedge between them shaded (e.g. ``(2.1, 2.5)``, Bhargav & Gu 2024,
            §4.4). The axes widen to show it.
        reference_label: the reference's legend entry (its slope is appended).

    Returns:
        The axes: ``ax.collections[0]`` the scatter, ``ax.lines[0]`` the line; with a
        reference, ``ax.lines[1]`` (and ``ax.lines[2]`` for a range) its line(s).

    Raises:
        ValueError: shapes differ, values are not finite, only one of ``slope`` and
            ``intercept`` is given, the line cannot be fitted (fewer than 2 distinct x),
            or ``reference`` is not one or two finite numbers.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, torch
        >>> from vecinterp.plot import plot_fit
        >>> x = torch.linspace(-1, 1, 50)
        >>> ax = plot_fit(x, -x + 0.5)
        >>> ax.get_legend().get_texts()[1].get_text()
        'fit: y = -1 x + 0.5 (R² = 1.0000)'
        >>> plt.close(ax.figure)
    """
    xs, ys = _to_numpy(x, "x"), _to_numpy(y, "y")
    if xs.shape != ys.shape or xs.size == 0:
        raise ValueError(
            f"x and y must be non-empty with the same shape, got {xs.shape} and {ys.shape}"
        )
    xs, ys = xs.ravel(), ys.ravel()
    if not (np.isfinite(xs).all() and np.isfinite(ys).all()):
        raise ValueError("x and y must be finite (no NaN or inf)")
    if max_points < 1:
        raise ValueError(f"max_points must be positive, got {max_points}")
    if (slope is None) != (intercept is None):
        raise ValueError("give both slope and intercept, or neither (to fit them)")
    if slope is None:
        if np.ptp(xs) == 0:
            raise ValueError("cannot fit a line: x needs at least 2 distinct values")
        fit_slope, fit_intercept = (float(v) for v in np.polyfit(xs, ys, 1))
    else:
        assert intercept is not None  # checked above; for the type checker
        fit_slope, fit_intercept = _scalar(slope, "slope"), _scalar(intercept, "intercept")
    r2_value = None if r2 is None else _scalar(r2, "r2")
    if r2_value is None:
        total = float(np.sum((ys - ys.mean()) ** 2))
        residual = float(np.sum((ys - (fit_slope * xs + fit_intercept)) ** 2))
        r2_value = 1.0 - residual / total if total > 0 else None
    shown = np.arange(xs.size)
    if xs.size > max_points:
        shown = np.sort(np.random.default_rng(0).choice(xs.size, max_points, replace=False))
    ax = _new_axes(ax, (4.6, 4.0))
    subset = f", {shown.size} of {xs.size} shown" if shown.size < xs.size else ""
    ax.scatter(
        xs[shown], ys[shown], s=8, alpha=0.5, linewidths=0, label=f"data (n={xs.size}{subset})"
    )
    ends = np.array([xs.min(), xs.max()])
    label = (
        f"fit: y = {fit_slope:.3g} x {'-' if fit_intercept < 0 else '+'} {abs(fit_intercept):.3g}"
    )
    if r2_value is not None:
        label += f" (R² = {r2_value:.4f})"
    ax.plot(ends, fit_slope * ends + fit_intercept, color="black", linewidth=1.5, label=label)
    if reference is not None:
        slopes = _to_numpy(reference, "reference").ravel()
        if slopes.size not in (1, 2) or not np.isfinite(slopes).all():
            raise ValueError(
                f"reference must be a slope or a (low, high) pair of finite slopes, got "
                f"{reference!r}"
            )
        lo, hi = float(slopes.min()), float(slopes.max())
        text = f"{lo:.3g}" if slopes.size == 1 else f"{lo:.3g}–{hi:.3g}"
        style: dict[str, Any] = dict(color=_REFERENCE, linestyle="--", linewidth=1.2)
        ax.plot(ends, slopes[0] * ends, label=f"{reference_label}: slope {text}", **style)
        if slopes.size == 2:
            ax.plot(ends, slopes[1] * ends, **style)
            ax.fill_between(ends, lo * ends, hi * ends, color=_REFERENCE, alpha=0.12, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return ax


# ------------------------------------------------------------------ loss and residuals


def plot_loss(
    steps: ArrayLike | LossHistory,
    losses: ArrayLike | None = None,
    *,
    eval_steps: ArrayLike | None = None,
    eval_losses: ArrayLike | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    log: bool = True,
    reference: Scalar | None = None,
    reference_label: str = "reference",
) -> Axes:
    """Training (and evaluation) loss against step, on a log y scale by default.

    Args:
        steps: ``[n_steps]`` step numbers, or a :class:`~vecinterp.training.TrainHistory`
            (anything with ``.steps``, ``.train_loss``, ``.eval_steps``, ``.eval_loss``), in
            which case ``losses`` and the ``eval_*`` arguments must be left ``None``.
        losses: ``[n_steps]`` training losses.
        eval_steps: ``[n_evals]`` steps at which the evaluation loss was measured.
        eval_losses: ``[n_evals]`` evaluation losses; give with ``eval_steps``.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        log: log-scale y axis (non-positive losses are then not drawn).
        reference: a loss a claim states (e.g. the paper's MSE, 1e-4), drawn as a dashed
            horizontal line.
        reference_label: the reference's legend entry (its value is appended).

    Returns:
        The axes: ``ax.lines[0]`` the training curve, ``ax.lines[1]`` the evaluation curve
        (if any), then the reference line (if any).

    Raises:
        ValueError: lengths differ, an array is not 1-D, a history is combined with
            explicit losses, or ``reference`` is not a finite number (positive on a log
            scale).

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> from vecinterp.plot import plot_loss
        >>> ax = plot_loss([0, 1, 2], [1.0, 0.1, 0.01], eval_steps=[0, 3], eval_losses=[1.2, 0.02])
        >>> ax.get_yscale(), [line.get_label() for line in ax.lines]
        ('log', ['train', 'eval'])
        >>> plt.close(ax.figure)
    """
    if isinstance(steps, LossHistory):
        if losses is not None or eval_steps is not None or eval_losses is not None:
            raise ValueError("pass either a TrainHistory alone or steps and losses, not both")
        history = steps
        steps, losses = history.steps, history.train_loss
        eval_steps, eval_losses = history.eval_steps, history.eval_loss
    if losses is None:
        raise ValueError("losses is required when steps is not a TrainHistory")
    if (eval_steps is None) != (eval_losses is None):
        raise ValueError("give both eval_steps and eval_losses, or neither")
    ax = _new_axes(ax, (5.0, 3.6))
    curves: list[tuple[str, object, object, dict[str, Any]]] = [
        ("train", steps, losses, dict(color="tab:blue", linewidth=1.0))
    ]
    if eval_steps is not None and len(eval_steps) > 0:
        eval_style = dict(color="tab:orange", marker="o", markersize=3, linewidth=1.5)
        curves.append(("eval", eval_steps, eval_losses, eval_style))
    for name, xs, ys, style in curves:
        x_values = _to_numpy(xs, f"{name} steps")
        y_values = _to_numpy(ys, f"{name} losses")
        _check_ndim(x_values, (1,), f"{name} steps", "[n_steps]")
        if y_values.shape != x_values.shape:
            raise ValueError(
                f"{name} steps and losses must have the same length, "
                f"got shapes {x_values.shape} and {y_values.shape}"
            )
        ax.plot(x_values, y_values, label=name, **style)
    if reference is not None:
        level = _reference_value(reference, "reference")
        if log and level <= 0:
            raise ValueError(f"reference must be positive on a log scale, got {level}")
        ax.axhline(
            level, color=_REFERENCE, linestyle="--", linewidth=1.2,
            label=f"{reference_label}: {level:.3g}",
        )  # fmt: skip
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (MSE)")
    if title is not None:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    return ax


def plot_residual_vs_target(
    estimate: ArrayLike,
    target: ArrayLike,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    labels: Sequence[str] = ("residual through W_U", "target"),
) -> Axes:
    """An estimate and its target as two line plots over their components.

    As in Bhargav & Gu (2024), Figures 14 and 17: how well, e.g., the residual stream read
    through ``ln_final`` and ``W_U`` after some layer already matches the next vector.

    Args:
        estimate: ``[d_out]`` vector, e.g. one position of
            :func:`~vecinterp.analysis.geometry.logit_lens`.
        target: ``[d_out]`` vector.
        ax: axes to draw on; a new figure when ``None``.
        title: axes title.
        labels: legend entries for ``estimate`` and ``target``.

    Returns:
        The axes: ``ax.lines[0]`` the estimate, ``ax.lines[1]`` the target, both against
        the component index ``0 .. d_out - 1``.

    Raises:
        ValueError: either vector is not 1-D, their lengths differ, or ``labels`` is not
            two strings.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, torch
        >>> from vecinterp.plot import plot_residual_vs_target
        >>> ax = plot_residual_vs_target(torch.tensor([0.9, 2.1, 2.9]), torch.tensor([1., 2, 3]))
        >>> [line.get_label() for line in ax.lines[:2]]
        ['residual through W_U', 'target']
        >>> plt.close(ax.figure)
    """
    est, tgt = _to_numpy(estimate, "estimate"), _to_numpy(target, "target")
    _check_ndim(est, (1,), "estimate", "[d_out]")
    _check_ndim(tgt, (1,), "target", "[d_out]")
    if est.shape != tgt.shape:
        raise ValueError(
            f"estimate and target must have the same length, got {est.size} and {tgt.size}"
        )
    if isinstance(labels, str) or len(labels) != 2:
        raise ValueError(f"labels must be two strings (estimate, target), got {labels!r}")
    index = np.arange(est.size)
    ax = _new_axes(ax, (max(4.5, 0.12 * est.size + 2.0), 3.4))
    ax.plot(index, est, color="tab:blue", marker="o", markersize=3, label=labels[0])
    ax.plot(index, tgt, color="black", linestyle="--", marker="x", markersize=4, label=labels[1])
    ax.axhline(0.0, color="0.6", linewidth=0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("component")
    ax.set_ylabel("value")
    if title is not None:
        ax.set_title(title)
    # below the axes: a legend inside would cover the data (every component carries some)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return ax


# ---------------------------------------------------------------------------- emergence


def plot_emergence(
    table: Any,
    names: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    log: bool = False,
    threshold: float | None = None,
    title: str | None = None,
    ylabel: str = "value",
) -> Axes:
    """Quantities of an emergence table against the training step (Musat 2024, Figure 6
    and Appendix D): average attention along circuit paths, partial losses, ...

    Args:
        table: an :class:`~vecinterp.analysis.emergence.EmergenceTable` (anything with a
            ``to_dict()``) or its ``to_dict()`` form, ``{"step": [...], "name": [...],
            "value": [...]}`` (e.g. read back from its CSV).
        names: the quantities to draw, in this order; ``None`` draws every quantity.
        ax: axes to draw on; a new figure when ``None``.
        log: log-scale y axis (for losses; non-positive values are then not drawn).
        threshold: draw a dashed horizontal line there (e.g. 0.5, the paper's "emerged").
        title: axes title.
        ylabel: y-axis label.

    Returns:
        The axes: ``ax.lines[i]`` is quantity ``names[i]`` (x: steps ascending, y: its
        values), then the threshold line if any.

    Raises:
        TypeError: ``table`` is neither an emergence table nor its dict form.
        ValueError: ``names`` is a string or empty, or the dict's columns differ in length.
        KeyError: a name that the table does not hold.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> from vecinterp.analysis.emergence import EmergenceTable
        >>> from vecinterp.plot import plot_emergence
        >>> t = EmergenceTable(((0, "L1H0 Q->R0", 0.1), (50, "L1H0 Q->R0", 0.8)))
        >>> ax = plot_emergence(t, threshold=0.5)
        >>> [line.get_label() for line in ax.lines][0], ax.get_xlabel()
        ('L1H0 Q->R0', 'step')
        >>> plt.close(ax.figure)
    """
    columns = table.to_dict() if hasattr(table, "to_dict") else table
    if not isinstance(columns, dict) or not {"step", "name", "value"} <= set(columns):
        raise TypeError(
            "table must be an EmergenceTable or a dict with 'step', 'name' and 'value' lists, "
            f"got {type(table).__name__}"
        )
    steps, labels, values = columns["step"], columns["name"], columns["value"]
    if not len(steps) == len(labels) == len(values):
        raise ValueError(
            f"the table's columns differ in length: step {len(steps)}, name {len(labels)}, "
            f"value {len(values)}"
        )
    known = list(dict.fromkeys(labels))
    if names is None:
        names = known
    if isinstance(names, str) or len(names) == 0:
        raise ValueError(f"names must be a non-empty list of quantity names, got {names!r}")
    ax = _new_axes(ax, (6.0, 3.6))
    for name in names:
        if name not in known:
            raise KeyError(f"no quantity {name!r} in the table; it has {known}")
        pairs = sorted(
            (float(s), float(v)) for s, n, v in zip(steps, labels, values, strict=True) if n == name
        )
        ax.plot([s for s, _ in pairs], [v for _, v in pairs], marker="o", markersize=3, label=name)
    if threshold is not None:
        line = _scalar(threshold, "threshold")
        ax.axhline(line, color="0.5", linestyle="--", linewidth=1.0, label=f"{line:g}")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    return ax


# ------------------------------------------------------------------ notes and saving

_NOTE_PLACES = {
    "upper left": (0.02, 0.98, "left", "top"),
    "upper center": (0.5, 0.98, "center", "top"),
    "upper right": (0.98, 0.98, "right", "top"),
    "lower left": (0.02, 0.02, "left", "bottom"),
    "lower center": (0.5, 0.02, "center", "bottom"),
    "lower right": (0.98, 0.02, "right", "bottom"),
}


def add_note(
    ax: Axes, text: str, *, loc: str = "upper left", fontsize: int | float | str = "small"
) -> Text:
    """Write a short statement into a corner of ``ax``, in a light box: what the paper
    claims beside what the figure shows (e.g. ``"paper: slope 2.1–2.5\\nours: 0.42"``).

    The box sits in axes coordinates, so it stays put when the data limits change, and
    above the data (a white, slightly transparent background).

    Args:
        ax: the axes to write in.
        text: the note; ``"\\n"`` breaks lines.
        loc: ``"upper left"``, ``"upper center"``, ``"upper right"``, ``"lower left"``,
            ``"lower center"`` or ``"lower right"``.
        fontsize: a size in points or a relative name (``"small"``: 0.83 of the font size).

    Returns:
        The ``Text``, also the last of ``ax.texts``.

    Raises:
        TypeError: ``ax`` is not an Axes or ``text`` not a string.
        ValueError: ``loc`` is not one of the places above.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> from vecinterp.plot import add_note, plot_loss
        >>> ax = plot_loss([0, 1, 2], [1.0, 0.1, 0.01], reference=1e-4, reference_label="paper")
        >>> note = add_note(ax, "paper: 1e-4\\nours: 9.2e-5", loc="upper right")
        >>> note.get_text().splitlines(), note.get_position()
        (['paper: 1e-4', 'ours: 9.2e-5'], (0.98, 0.98))
        >>> plt.close(ax.figure)
    """
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    if loc not in _NOTE_PLACES:
        raise ValueError(f"loc must be one of {list(_NOTE_PLACES)}, got {loc!r}")
    x, y, ha, va = _NOTE_PLACES[loc]
    box = dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor="0.6", alpha=0.85)
    return ax.text(
        x,
        y,
        text,
        transform=ax.transAxes,
        ha=ha,
        va=va,
        multialignment="left",
        fontsize=fontsize,
        bbox=box,
        zorder=5,
    )


def save_figure(
    fig: Figure | Axes, path: str | os.PathLike[str], *, dpi: int | float = 100, close: bool = True
) -> Path:
    """Write a figure to ``path`` (the format from its suffix, e.g. ``.png``) and close it.

    Closing matters in scripts that draw many figures: pyplot keeps every open figure
    alive, and each one slows the next. The default of 100 dpi keeps the text legible:
    vecinterp's figures size text in points (8 pt and up, 11 px at 100 dpi; at 60 dpi it
    would be 7 px). For a smaller image, make the figure smaller (``figsize``,
    ``panel_size``) rather than the dpi lower; rendering at 100 dpi costs about as much as
    at 60 (the time goes into laying out text, not into pixels).

    Args:
        fig: the figure, or an axes of it (as the ``plot_*`` functions return).
        path: the file to write; its folder must exist.
        dpi: dots per inch.
        close: close the figure afterwards (``plt.close``).

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        TypeError: ``fig`` is neither a Figure nor an Axes.
        ValueError: ``dpi`` is not a positive finite number.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import tempfile
        >>> from vecinterp.plot import plot_loss, save_figure
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = save_figure(plot_loss([0, 1], [1.0, 0.5]), f"{d}/loss.png")
        ...     path.name, path.stat().st_size > 0
        ('loss.png', True)
    """
    figure = fig.figure if isinstance(fig, Axes) else fig
    if not isinstance(figure, Figure):
        raise TypeError(f"fig must be a matplotlib Figure or Axes, got {type(fig).__name__}")
    if isinstance(dpi, bool) or not isinstance(dpi, int | float) or not 0 < dpi < math.inf:
        raise ValueError(f"dpi must be a positive finite number, got {dpi!r}")
    target = Path(path)
    figure.savefig(target, dpi=dpi)
    if close:
        plt.close(figure)
    return target
