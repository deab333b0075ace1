"""vecinterp.plot.save_figures: the same files from one process or several, a worker's
failure reported with the figures it was writing, and bad arguments."""

import multiprocessing

import pytest

pytest.importorskip("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import unchecked  # noqa: E402
from vecinterp.plot import plot_attention_grid, plot_loss, save_figures  # noqa: E402

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform"
)


def _figures():
    import torch

    gen = torch.Generator().manual_seed(0)
    return {
        "loss": plot_loss([0, 1, 2], [1.0, 0.3, 0.1], reference=0.2),
        "grid": plot_attention_grid(torch.rand(2, 3, 4, 4, generator=gen)),
        "loss2": plot_loss([0, 1], [2.0, 0.5]),
    }


@needs_fork
@pytest.mark.parametrize("processes", [2, 3, 8])
def test_several_processes_write_the_same_files_as_one(tmp_path, processes):
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir()
    many.mkdir()
    paths = save_figures(_figures(), one)
    assert [p.name for p in paths] == ["loss.png", "grid.png", "loss2.png"]
    assert [p.name for p in save_figures(_figures(), many, processes=processes)] == [
        p.name for p in paths
    ]
    for p in paths:
        assert (many / p.name).read_bytes() == p.read_bytes()
    assert plt.get_fignums() == []  # every figure closed, in the parent too


@needs_fork
def test_a_failing_worker_is_reported_with_its_figures(tmp_path):
    figures = _figures()
    figures["missing/x"] = figures.pop("loss2")  # the third figure goes to worker 3
    with pytest.raises(RuntimeError, match=r"not written: \['x.png'\]"):
        save_figures(figures, tmp_path, processes=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png", "loss.png"]
    assert plt.get_fignums() == []


def test_bad_arguments(tmp_path):
    figures = {"a": plot_loss([0, 1], [1.0, 0.5])}
    with unchecked():
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="processes must be a positive int"):
                save_figures(figures, tmp_path, processes=bad)
        with pytest.raises(ValueError, match="suffix must start with"):
            save_figures(figures, tmp_path, suffix="png")
        with pytest.raises(ValueError, match="not an existing folder"):
            save_figures(figures, tmp_path / "nope")
        with pytest.raises(TypeError, match=r"figures\['b'\] must be a matplotlib Figure"):
            save_figures({"b": "not a figure"}, tmp_path)
    plt.close("all")


@pytest.mark.parametrize("processes", [1, 2])
def test_functions_that_draw_are_called_by_the_writer(tmp_path, processes):
    if processes > 1 and "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    drawn, given = tmp_path / "drawn", tmp_path / "given"
    drawn.mkdir()
    given.mkdir()
    save_figures(_figures(), given)
    makers = {
        "loss": lambda: plot_loss([0, 1, 2], [1.0, 0.3, 0.1], reference=0.2),  # an Axes
        "grid": lambda: _figures()["grid"],  # a Figure (the others are closed below)
        "loss2": lambda: plot_loss([0, 1], [2.0, 0.5]),
    }
    save_figures(makers, drawn, processes=processes)
    plt.close("all")
    for name in ("loss", "grid", "loss2"):
        assert (drawn / f"{name}.png").read_bytes() == (given / f"{name}.png").read_bytes()


@needs_fork
def test_a_function_returning_no_figure(tmp_path):
    with pytest.raises(TypeError, match=r"figures\['x'\]\(\) must return a matplotlib Figure"):
        save_figures({"x": lambda: 3}, tmp_path)
    with pytest.raises(RuntimeError, match=r"not written: \['y.png'\]"):
        save_figures({"x": lambda: plot_loss([0, 1], [1.0, 0.5]), "y": lambda: 3}, tmp_path,
                     processes=2)  # fmt: skip
    plt.close("all")
