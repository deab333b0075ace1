"""Matrices and score grids: a signed matrix such as an OV or QK circuit
(:func:`plot_matrix`), a layer × head table of scores (:func:`plot_score_grid`), and
eigenvalue scores on a fixed, labelled ``[-1, 1]`` scale (:func:`plot_eigenvalue_scores`,
:data:`EIGENVALUE_SCALE_LABELS`)."""

from collections.abc import Mapping
from typing import SupportsFloat

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FixedFormatter, FixedLocator

from ..factored_matrix import FactoredMatrix
from ._common import (
    _DIVERGING_CMAP,
    _MASKED_GREY,
    _MAX_TICKS,
    ArrayLike,
    _check_ndim,
    _new_axes,
    _position_locator,
    _position_ticks,
    _to_numpy,
)

# The colour-bar labels of plot_eigenvalue_scores. Its docstring is where it is public, in
# vecinterp/plot/__init__.py: Sphinx reads a constant's docstring from the module it documents.
EIGENVALUE_SCALE_LABELS: dict[str, dict[SupportsFloat, str]] = {
    "OV": {-1.0: "−1: negates\n(OV ≈ −I)", 0.0: "0", 1.0: "+1: copies\n(OV ≈ +I)"},
    "QK": {
        -1.0: "−1: opposite\ndirection (QK ≈ −I)",
        0.0: "0",
        1.0: "+1: same\ndirection (QK ≈ +I)",
    },
}


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
