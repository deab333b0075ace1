"""Finishing a figure: a statement written into an axes (:func:`add_note`) and writing a
figure to a file, then closing it (:func:`save_figure`)."""

import math
import os
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

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
