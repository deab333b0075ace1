"""What the figure modules of :mod:`vecinterp.plot` share: the matplotlib import guard (the
``plot`` extra), the input types, the colours, and the private helpers that turn inputs into
checked numpy arrays, make axes, and place position ticks."""

import math
from collections.abc import Sequence
from typing import Literal, SupportsFloat

import numpy as np
import torch

_NEEDS_MATPLOTLIB = (
    "vecinterp.plot needs matplotlib, which is not installed. "
    'Install the plot extra: pip install "vecinterp[plot]"'
)

try:
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import FixedFormatter, FixedLocator
except ImportError as exc:  # pragma: no cover - exercised by a test that hides matplotlib
    raise ImportError(_NEEDS_MATPLOTLIB) from exc


def _require_matplotlib() -> None:
    """Raise the ImportError that names the extra if matplotlib cannot be imported now.

    The package's ``__init__`` calls this: ``importlib.reload(vecinterp.plot)`` re-runs only
    that file (its submodules, this one included, stay loaded), and should fail as a first
    import does when matplotlib has gone."""
    try:
        import matplotlib.pyplot  # noqa: F401
    except ImportError as exc:
        raise ImportError(_NEEDS_MATPLOTLIB) from exc


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
