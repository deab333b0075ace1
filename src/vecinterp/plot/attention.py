"""Attention figures: one pattern as a heatmap (:func:`plot_attention`) and a grid of
patterns, layers by heads, on one colour scale (:func:`plot_attention_grid`)."""

from collections.abc import Sequence
from typing import SupportsFloat

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ._common import (
    _ATTENTION_CMAP,
    _GRID_TICKS,
    _MASKED_GREY,
    _NEGATIVE,
    ArrayLike,
    _check_ndim,
    _font_inches,
    _new_axes,
    _position_locator,
    _position_ticks,
    _to_numpy,
)


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
