"""Training curves and emergence: loss against step (:func:`plot_loss`, which also takes a
:class:`~vecinterp.training.TrainHistory`, see :class:`LossHistory`) and the quantities of
an emergence table against step (:func:`plot_emergence`)."""

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from matplotlib.axes import Axes

from ._common import (
    _REFERENCE,
    ArrayLike,
    Scalar,
    _check_ndim,
    _new_axes,
    _reference_value,
    _scalar,
    _to_numpy,
)


@runtime_checkable
class LossHistory(Protocol):
    """Anything shaped like :class:`vecinterp.training.TrainHistory` (duck-typed)."""

    steps: Any
    train_loss: Any
    eval_steps: Any
    eval_loss: Any


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
