"""Pictures of a sparse dictionary's features: how often they fire
(:func:`plot_feature_density`), how the decoder rows line up with given directions
(:func:`plot_decoder_similarity`), and one feature's activation against a variable
(:func:`plot_feature_activation`). The numbers come from :mod:`vecinterp.dictionary`
(``feature_density``, ``decoder_similarity``)."""

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes

from ._common import (
    _DIVERGING_CMAP,
    _REFERENCE,
    ArrayLike,
    _check_ndim,
    _new_axes,
    _to_numpy,
)


def plot_feature_density(
    density: ArrayLike,
    *,
    bins: int = 30,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Histogram of ``log10`` firing frequency (``density [d_sae]``, a fraction of rows per
    feature, as :func:`vecinterp.dictionary.feature_density` gives). Dead features (density
    0) have no logarithm: they are one grey bar left of the rest, labelled with their count.

    Example:
        >>> import vecinterp.plot as vp
        >>> ax = vp.plot_feature_density([0.0, 0.001, 0.01, 0.01, 0.5])
        >>> dead = ax.containers[-1]  # the histogram's bars are ax.containers[0]
        >>> dead.get_label(), dead.datavalues.tolist()
        ('dead', [1])
    """
    d = _to_numpy(density, "density")
    _check_ndim(d, (1,), "density", "[d_sae]")
    if (d < 0).any() or (d > 1).any():
        raise ValueError("density must be fractions in [0, 1]")
    ax = _new_axes(ax, (5.0, 3.2))
    live = np.log10(d[d > 0])
    n_dead = int((d == 0).sum())
    lo, hi = (float(live.min()), float(live.max())) if live.size else (-1.0, 0.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    width = edges[1] - edges[0]
    ax.hist(live, bins=edges.tolist(), color="tab:blue", label="live")
    dead_x = lo - 1.5 * width
    ax.bar([dead_x], [n_dead], width=width, color="0.6", label="dead")
    ax.annotate(
        f"dead: {n_dead}",
        (dead_x, n_dead),
        xytext=(0, 3),
        textcoords="offset points",
        ha="center",
        fontsize=8,
    )
    ax.set_xlabel("log10 firing frequency")
    ax.set_ylabel("features")
    ax.set_title(title or f"feature density ({d.size} features)")
    return ax


def plot_decoder_similarity(
    similarity: ArrayLike,
    *,
    labels: Sequence[str] | None = None,
    top: int | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Heatmap of cosines ``similarity [n_directions, d_sae]`` (given directions × decoder
    rows, as :func:`vecinterp.dictionary.decoder_similarity` gives), colour from −1 to 1.
    ``top`` keeps the features with the largest ``|cosine|`` with any direction (sorted by
    it, their indices on the x axis); each direction's label ends with its best
    ``|cosine|``.

    Example:
        >>> import vecinterp.plot as vp
        >>> ax = vp.plot_decoder_similarity([[0.1, -0.9, 0.3]], labels=["c"], top=2)
        >>> ax.images[0].get_array().tolist(), [t.get_text() for t in ax.get_xticklabels()]
        ([[-0.9, 0.3]], ['1', '2'])
    """
    s = _to_numpy(similarity, "similarity")
    _check_ndim(s, (2,), "similarity", "[n_directions, d_sae]")
    if labels is not None and len(labels) != s.shape[0]:
        raise ValueError(f"labels has {len(labels)} names for {s.shape[0]} directions")
    best = np.nan_to_num(np.abs(s), nan=0.0).max(0)
    order = np.arange(s.shape[1])
    if top is not None:
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        order = np.argsort(-best, kind="stable")[:top]
    shown = s[:, order]
    ax = _new_axes(ax, (max(4.0, 0.25 * len(order) + 2), 0.35 * s.shape[0] + 1.5))
    im = ax.imshow(shown, vmin=-1, vmax=1, cmap=_DIVERGING_CMAP, aspect="auto")
    ax.figure.colorbar(im, ax=ax, label="cosine")
    names = list(labels) if labels is not None else [str(i) for i in range(s.shape[0])]
    per_dir = np.nan_to_num(np.abs(s), nan=0.0).max(1)
    ax.set_yticks(
        range(s.shape[0]), [f"{n} ({b:.2f})" for n, b in zip(names, per_dir, strict=True)]
    )
    if len(order) <= 40:
        ax.set_xticks(range(len(order)), [str(int(i)) for i in order])
        if len(order) > 12:
            ax.tick_params(axis="x", labelrotation=90)
    ax.set_xlabel("feature" + (f" (top {len(order)} by |cosine|)" if top else ""))
    ax.set_title(title or "decoder rows vs given directions (best |cos| per row label)")
    return ax


def plot_feature_activation(
    variable: ArrayLike,
    activation: ArrayLike,
    *,
    bins: int = 20,
    max_points: int = 5000,
    ax: Axes | None = None,
    xlabel: str = "variable",
    title: str | None = None,
) -> Axes:
    """One feature's ``activation [n]`` against a task ``variable [n]``: a scatter (at most
    ``max_points``, evenly spaced in the data) and the mean activation in ``bins``
    equal-width bins of the variable (a line, the second of ``ax.lines``; empty bins are
    skipped).

    Example:
        >>> import vecinterp.plot as vp
        >>> ax = vp.plot_feature_activation([0, 1, 2, 3], [0, 0, 1, 3], bins=2)
        >>> ax.lines[-1].get_ydata().tolist()
        [0.0, 2.0]
    """
    v = _to_numpy(variable, "variable")
    a = _to_numpy(activation, "activation")
    _check_ndim(v, (1,), "variable", "[n]")
    _check_ndim(a, (1,), "activation", "[n]")
    if v.shape != a.shape:
        raise ValueError(f"variable {v.shape} and activation {a.shape} differ in length")
    ax = _new_axes(ax, (4.5, 3.2))
    step = max(1, -(-v.size // max_points))
    ax.plot(v[::step], a[::step], ".", ms=2, alpha=0.3, color="tab:blue", label="rows")
    lo, hi = float(v.min()), float(v.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    which = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, bins - 1)
    counts = np.bincount(which, minlength=bins)
    sums = np.bincount(which, weights=a, minlength=bins)
    keep = counts > 0
    centres = (edges[:-1] + edges[1:]) / 2
    ax.plot(centres[keep], sums[keep] / counts[keep], "-o", ms=3, color=_REFERENCE, label="mean")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("activation")
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title)
    return ax
