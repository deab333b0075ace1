"""Attributions and fits: one bar per component (:func:`plot_attribution`), a scatter with
its fitted line (:func:`plot_fit`), and an estimate against its target, component by
component (:func:`plot_residual_vs_target`); the first two can draw a paper's reference."""

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from ._common import (
    _NEGATIVE,
    _POSITIVE,
    _REFERENCE,
    ArrayLike,
    Scalar,
    _check_ndim,
    _new_axes,
    _reference_value,
    _scalar,
    _to_numpy,
)


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
