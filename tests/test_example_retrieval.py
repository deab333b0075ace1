"""The retrieval-problem example runs end to end (``--fast``) and its report is consistent.

The library it calls, :mod:`vecinterp.tasks.retrieval_claims`, is tested in
``tests/test_retrieval_claims.py``.
"""

import csv
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from vecinterp.tasks import retrieval_claims as rc

pytest.importorskip("matplotlib")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "retrieval_problem.py"
FIGURES = (
    "loss.png",
    "partial_losses.png",
    "emergence.png",
    "role_attention.png",
    "carrying_heads.png",
)
VERDICTS = ("holds", "partly", "does not hold")
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def _example():
    spec = importlib.util.spec_from_file_location("retrieval_problem_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("retrieval_fast")
    rows = _example().main(["--fast", "--no-progress", "--out", str(out)])
    return out, rows


def _table_lines(report: str) -> list[list[str]]:
    lines = [line for line in report.splitlines() if re.match(r"\| \d+ \|", line)]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_report_has_the_six_claims_with_numbers_and_verdicts(fast_run):
    out, rows = fast_run
    report = (out / "report.md").read_text()
    table = _table_lines(report)
    assert [int(cells[0]) for cells in table] == [1, 2, 3, 4, 5, 6]
    for cells, row in zip(table, rows, strict=True):
        assert len(cells) == 5, cells
        assert NUMBER.search(cells[3]), cells
        assert "nan" not in cells[3].lower(), cells
        assert cells[4] in VERDICTS and cells[4] == row["verdict"], cells
        assert math.isfinite(row["value"]), row
    for name in FIGURES:
        assert f"]({name})" in report, f"report.md does not link {name}"
    assert "scaled down" in report.lower()


def test_every_figure_is_a_png(fast_run):
    out, _ = fast_run
    for name in FIGURES:
        path = out / name
        assert path.is_file(), f"{name} missing"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"


def test_report_numbers_are_consistent(fast_run):
    out, rows = fast_run
    report = (out / "report.md").read_text()
    table = _table_lines(report)
    # claim 1: the IC loss is the mean of the partial losses (equal-size blocks)
    ic = float(re.search(r"final IC loss ([\d.]+)", table[0][3]).group(1))
    parts = [float(v) for v in re.findall(r"x_\d+ ([\d.]+)", table[0][3])]
    assert len(parts) == rc.FAST.depth
    assert abs(sum(parts) / len(parts) - ic) <= 1e-4
    assert math.isclose(rows[0]["value"], ic, abs_tol=5e-5)
    t = rc.THRESHOLDS
    expected = "holds" if ic <= t["ic_holds"] else "partly" if ic <= t["ic_partly"] else None
    assert rows[0]["verdict"] == (expected or "does not hold")
    # claim 2: the non-IC loss, and its verdict against the paper's 0.7
    non_ic = float(re.search(r"non-IC loss ([\d.]+)", table[1][3]).group(1))
    assert math.isclose(rows[1]["value"], non_ic, abs_tol=5e-5)
    if non_ic <= t["non_ic_fails"]:
        assert rows[1]["verdict"] == "does not hold"
    # claim 5: base and combined losses match the ablation section
    base, combined = (float(v) for v in re.search(r"([\d.]+) -> ([\d.]+)", table[4][3]).groups())
    assert f"Validation loss {base:.4f}; combined ablation {combined:.4f}" in report
    assert abs(base - ic) <= 1e-4  # both on the same validation batch


def test_partial_loss_crossings_match_the_emergence_csv(fast_run):
    out, rows = fast_run
    from vecinterp.analysis.emergence import EmergenceTable

    with (out / "emergence.csv").open() as handle:
        records = list(csv.DictReader(handle))
    table = EmergenceTable(tuple((int(r["step"]), r["name"], float(r["value"])) for r in records))
    s = rc.FAST
    assert table.steps == list(range(0, s.steps + 1, s.checkpoint_every))  # 0: initial model
    assert {f"x_{j + 1}" for j in range(s.depth)} | {"loss"} <= set(table.names)
    claim3 = _table_lines((out / "report.md").read_text())[2][3]
    for j in range(s.depth):
        step = table.crossing_step(f"x_{j + 1}", rc.THRESHOLDS["partial"], above=False)
        shown = re.search(rf"x_{j + 1}: (never|\d+)", claim3).group(1)
        assert shown == ("never" if step is None else f"{step:.0f}")
    assert rows[2]["value"] == sum(
        table.crossing_step(f"x_{j + 1}", 0.5, above=False) is not None for j in range(s.depth)
    )


def test_saved_values_rejudge_to_the_printed_verdicts(fast_run):
    """values.json holds every number the verdicts read: re-judging it gives the rows."""
    out, rows = fast_run
    values = json.loads((out / "values.json").read_text())
    assert [c.as_dict() for c in rc.judge_claims(values)] == rows
    # and the report's table is the library's table of those claims
    assert rc.claims_table(rc.judge_claims(values)) in (out / "report.md").read_text()


def test_command_line_overrides_the_steps(tmp_path, capsys):
    """--steps and --non-ic-steps reach the training and the report."""
    rows = _example().main(
        ["--fast", "--no-progress", "--steps", "30", "--non-ic-steps", "5", "--seed", "1",
         "--out", str(tmp_path)]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "30 IC / 5 non-IC steps" in printed
    assert "non-IC loss" in rows[1]["ours"] and "after 5 steps" in rows[1]["ours"]
    assert rc.claims_table([rc.Claim(**row) for row in rows]) in printed
    with (tmp_path / "emergence.csv").open() as handle:
        steps = {int(r["step"]) for r in csv.DictReader(handle)}
    assert steps == {0, 30}
