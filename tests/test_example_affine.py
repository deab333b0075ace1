"""The affine-recurrence example runs end to end (``--fast``) and explains a missing checkpoint."""

import importlib.util
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "affine_recurrence.py"
FIGURES = (
    "attention_alternating.png",
    "attention_non_alternating.png",
    "attribution.png",
    "mlp_attribution.png",
    "ov_linearity.png",
    "eigenvalue_scores.png",
    "residual_vs_target.png",
    "loss.png",
)
VERDICTS = ("holds", "partly", "does not hold")
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def _example():
    spec = importlib.util.spec_from_file_location("affine_recurrence_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("affine_fast")
    rows = _example().main(["--fast", "--train", "--no-progress", "--out", str(out)])
    return out, rows


def test_fast_run_writes_a_13_row_report(fast_run):
    out, _ = fast_run
    report = (out / "report.md").read_text()
    table = [line for line in report.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(line.split("|")[1]) for line in table] == list(range(1, 14))
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 5, line
        ours, verdict = cells[3], cells[4]
        assert NUMBER.search(ours), f"no number in the 'ours' cell: {line}"
        assert "nan" not in ours.lower() and "inf" not in ours.lower(), line
        assert verdict in VERDICTS, line
    for name in FIGURES:
        assert f"]({name})" in report, f"report.md does not link {name}"


def test_fast_run_writes_every_figure(fast_run):
    out, _ = fast_run
    for name in FIGURES:
        path = out / name
        assert path.is_file(), f"{name} missing"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"


def test_fast_run_values_are_finite_and_verdicts_follow_thresholds(fast_run):
    _, rows = fast_run
    assert len(rows) == 13
    for row in rows:
        assert math.isfinite(row["value"]), row
    # claim 1 is decided by the eval MSE against the explicit thresholds
    mse, limits = rows[0]["value"], _example().THRESHOLDS
    expected = (
        "holds"
        if mse <= limits["eval_mse_holds"]
        else "partly"
        if mse <= limits["eval_mse_partly"]
        else "does not hold"
    )
    assert rows[0]["verdict"] == expected


def test_missing_checkpoint_says_how_to_get_one(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    with pytest.raises(SystemExit) as info:
        _example().main(["--checkpoint", str(missing), "--out", str(tmp_path / "out")])
    message = str(info.value.code)
    assert str(missing) in message
    assert "examples/train_affine.py" in message
    assert "--train" in message
    assert not (tmp_path / "out").exists()


def test_checkerboard_contrast_hand_worked():
    torch = pytest.importorskip("torch")
    ex = _example()
    n = 5
    # every row d >= 2 puts all its weight on d - 2 (same parity): a perfect checkerboard
    perfect = torch.zeros(1, 1, n, n)
    perfect[0, 0, 0, 0] = perfect[0, 0, 1, 0] = 1
    for d in range(2, n):
        perfect[0, 0, d, d - 2] = 1
    assert ex.checkerboard_contrast(perfect).tolist() == [1.0]
    # previous position only: all weight on the other parity
    prev = torch.zeros(1, 1, n, n)
    prev[0, 0, 0, 0] = 1
    for d in range(1, n):
        prev[0, 0, d, d - 1] = 1
    assert ex.checkerboard_contrast(prev).tolist() == [-1.0]
    # uniform over earlier positions: no parity preference
    uniform = torch.zeros(1, 1, n, n)
    for d in range(n):
        uniform[0, 0, d, : max(d, 1)] = 1 / max(d, 1)
    assert ex.checkerboard_contrast(uniform).abs().max().item() < 1e-7
