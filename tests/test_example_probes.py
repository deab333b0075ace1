"""examples/affine_probes.py runs end to end (``--fast``) and its numbers are the library's;
the snippets of docs/howto_probes.rst run."""

import contextlib
import importlib.util
import io
import json
import math
import re
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "affine_probes.py"


def _example():
    spec = importlib.util.spec_from_file_location("affine_probes_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fast_run(tmp_path):
    pytest.importorskip("matplotlib")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = _example().main(["--fast", "--no-progress", "--out", str(tmp_path)])
    text = out.getvalue()
    assert (tmp_path / "probe_map.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "results.json").read_text())
    assert set(summary["variables"]) == {"c", "d", "a_prev"}
    probes, swaps, das = result["probes"], result["swaps"], result["das"]
    # the printed and saved best cell is the probe result's own
    best = summary["variables"]["a_prev"]["best"]
    i = probes["a_prev"].hook_names.index(best["point"])
    assert best["r2"] == float(probes["a_prev"].r2[i, best["pos"]])
    assert f"R² {best['r2']:.3f}" in text
    # a_{t-1} at position 0 is undefined; the swaps cover the positions asked for only
    assert probes["a_prev"].r2[:, 0].isnan().all()
    assert swaps["c"].shape == (7, 14)
    assert not swaps["d"][:, [2, 8, 13]].isnan().any() and swaps["d"][:, 3].isnan().all()
    for found in das.values():
        assert math.isfinite(found.fraction_explained)
        assert math.isfinite(found.control_fraction_explained)
    assert das["d"].basis.shape == (128, 40)


def _python_blocks(page: str) -> list[str]:
    text = (ROOT / "docs" / f"{page}.rst").read_text()
    pattern = re.compile(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)")
    return [textwrap.dedent(m.group(1)) for m in pattern.finditer(text)]


def test_howto_probes_snippets_run():
    blocks = _python_blocks("howto_probes")
    assert len(blocks) == 4
    ns: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/howto_probes.rst[{i}]", "exec"), ns)
    p = ns["probes"]["prev"]
    assert p.r2.shape == (4, 10) and p.weight.shape == (4, 10, 32, 4)
    assert p.r2[:, 0].isnan().all()
    assert ns["per_cell"].shape == (2, 10) and ns["per_probe"].shape == (2, 10)
    assert ns["found"].basis.shape == (32, 4)
    # swapping the last input's embedding subspace is the counterfactual: found exactly
    assert ns["found"].fraction_explained > 0.99
    assert isinstance(ns["y"], torch.Tensor)


def test_not_computed_cells_do_not_look_like_zero():
    """probe_map.png drew NaN cells (not computed) transparent, i.e. white: the colour of
    0 in the diverging maps. They are hatched grey now, unlike any value's colour."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(2, 2), dpi=50)
    values = torch.tensor([[math.nan, 0.0], [1.0, -1.0]], dtype=torch.float64)
    _example().draw_map(ax, values, -1, 1, "RdBu_r")
    ax.set_axis_off()
    fig.subplots_adjust(0, 0, 1, 1)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    plt.close(fig)
    h, w = pixels.shape[:2]
    nan_cell = pixels[: h // 2, : w // 2].reshape(-1, 3)
    zero_cell = pixels[: h // 2, w // 2 :].reshape(-1, 3)
    assert (zero_cell > 240).all()  # 0 is white in RdBu_r
    assert (nan_cell < 240).all(1).mean() > 0.9  # grey and its hatching: never white
    assert len({tuple(p) for p in nan_cell}) >= 2  # hatched: more than one colour
