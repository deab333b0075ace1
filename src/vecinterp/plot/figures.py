"""Finishing a figure: a statement written into an axes (:func:`add_note`) and writing a
figure to a file, then closing it (:func:`save_figure`; several at once, on several cores:
:func:`save_figures`)."""

import math
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Mapping
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


def save_figures(
    figures: Mapping[str, Figure | Axes | Callable[[], Figure | Axes]],
    directory: str | os.PathLike[str],
    *,
    dpi: int | float = 100,
    suffix: str = ".png",
    processes: int = 1,
) -> list[Path]:
    """Write each figure to ``directory / (name + suffix)`` and close them all.

    Rendering is single-threaded Python (text layout, mostly), so on a machine with idle
    cores ``processes > 1`` writes the figures in that many processes at once: forked
    copies of this one (each renders its share of the figures it inherits, nothing is
    pickled), the figures dealt out in turn. A value may also be a function of no
    arguments that draws the figure: it is then called in the process that writes it, so
    drawing is shared out too (``affine_claims.claim_figures(..., lazy=True)`` returns
    such functions). Where ``fork`` is not available (Windows, or macOS's default) they
    are written here, one after another. The files are the same either way.

    Args:
        figures: ``{name: figure, axes, or a function returning one}``.
        directory: an existing folder.
        dpi: dots per inch (see :func:`save_figure`).
        suffix: the file suffix, which picks the format.
        processes: how many processes write (a positive int; at most one per figure is
            used).

    Returns:
        The paths written, in the order of ``figures``.

    Raises:
        TypeError: a value is neither a Figure, an Axes nor callable, or a function
            returned something else (from a worker: the ``RuntimeError`` below).
        ValueError: ``processes`` is not a positive int, ``suffix`` does not start with
            ``"."``, or ``directory`` is not a folder.
        RuntimeError: a worker process failed (its traceback is on stderr); the message
            names the figures it was writing.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import tempfile
        >>> from vecinterp.plot import plot_loss, save_figures
        >>> with tempfile.TemporaryDirectory() as d:
        ...     paths = save_figures({"a": plot_loss([0, 1], [1.0, 0.5]),
        ...                           "b": plot_loss([0, 1], [2.0, 0.1])}, d, processes=2)
        ...     [p.name for p in paths]
        ['a.png', 'b.png']
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive int, got {processes!r}")
    if not isinstance(suffix, str) or not suffix.startswith("."):
        raise ValueError(f"suffix must start with '.', e.g. '.png', got {suffix!r}")
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"directory {str(folder)!r} is not an existing folder")
    items: list[tuple[str, Figure | Callable[[], Figure | Axes], Path]] = []
    for name, fig in figures.items():
        figure = fig.figure if isinstance(fig, Axes) else fig
        if not isinstance(figure, Figure) and not callable(figure):
            raise TypeError(
                f"figures[{name!r}] must be a matplotlib Figure, an Axes or a function "
                f"drawing one, got {type(fig).__name__}"
            )
        items.append((name, figure, folder / f"{name}{suffix}"))
    n = min(processes, len(items))
    if n > 1 and "fork" not in multiprocessing.get_all_start_methods():
        n = 1
    shares = [items[i::n] for i in range(n)] if items else [[]]
    workers = []
    try:
        if n > 1:
            context = multiprocessing.get_context("fork")
            for share in shares[1:]:
                worker = context.Process(target=_write_share, args=(share, dpi), daemon=True)
                worker.start()
                workers.append((worker, share))
        for name, figure, path in shares[0]:
            drawn = _drawn(name, figure)
            save_figure(drawn, path, dpi=dpi, close=drawn is not figure)
        failed = []
        for worker, share in workers:
            worker.join()
            if worker.exitcode != 0:
                failed += [path.name for _, _, path in share]
        if failed:
            raise RuntimeError(
                f"a process writing figures failed (traceback above); not written: {failed}"
            )
    finally:
        for worker, _ in workers:  # on an error here, let them finish their files
            worker.join()
        for _, figure, _ in items:
            if isinstance(figure, Figure):
                plt.close(figure)
    return [path for _, _, path in items]


def _drawn(name: str, figure: Figure | Callable[[], Figure | Axes]) -> Figure:
    """``figure``, or what the function ``figure`` draws (checked)."""
    if isinstance(figure, Figure):
        return figure
    made: object = figure()
    drawn = made.figure if isinstance(made, Axes) else made
    if not isinstance(drawn, Figure):
        raise TypeError(
            f"figures[{name!r}]() must return a matplotlib Figure or Axes, "
            f"got {type(made).__name__}"
        )
    return drawn


def _write_share(
    share: list[tuple[str, Figure | Callable[[], Figure | Axes], Path]], dpi: int | float
) -> None:
    """A forked worker of :func:`save_figures`: write its figures, exit 1 on any error."""
    try:
        for name, figure, path in share:
            _drawn(name, figure).savefig(path, dpi=dpi)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
