"""The induction-heads example runs end to end (``--fast``) and its outputs agree."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from vecinterp.tasks import induction_claims as ic

pytest.importorskip("matplotlib")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "induction_heads.py"
FIGURES = (
    "loss.png",
    "patterns.png",
    "attention_all_heads.png",
    "head_scores.png",
    "composition.png",
)
VERDICTS = ("holds", "partly", "does not hold")
N_ROWS = 7


def _example():
    spec = importlib.util.spec_from_file_location("induction_heads_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return _example()


@pytest.fixture(scope="module")
def fast_run(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("induction_fast")
    rows = example.main(["--fast", "--no-progress", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    return out, rows, results


def _table_lines(report: str) -> list[str]:
    return [line for line in report.splitlines() if re.match(r"\| \d+ \|", line)]


def test_report_has_the_results_table_and_links_every_figure(fast_run):
    out, rows, _ = fast_run
    report = (out / "report.md").read_text()
    table = _table_lines(report)
    assert [int(line.split("|")[1]) for line in table] == list(range(1, N_ROWS + 1))
    for line, row in zip(table, rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 4, line
        assert cells[2] == row["ours"] and cells[3] == row["verdict"] in VERDICTS, line
        assert re.search(r"\d", cells[2]), f"no number in the 'ours' cell: {line}"
        assert "nan" not in cells[2].lower() and "inf" not in cells[2].lower(), line
    for name in FIGURES:
        assert f"]({name})" in report, f"report.md does not link {name}"


def test_every_figure_is_a_png(fast_run):
    out, _, _ = fast_run
    for name in FIGURES:
        path = out / name
        assert path.is_file(), f"{name} missing"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"


def test_json_rows_match_the_returned_rows(fast_run):
    _, rows, results = fast_run
    assert len(rows) == N_ROWS
    assert [r["ours"] for r in results["rows"]] == [r["ours"] for r in rows]
    for row in rows:
        assert math.isfinite(row["value"]), row


def test_heads_found_are_the_best_scoring_ones(fast_run, example):
    _, rows, results = fast_run
    h = results["heads"]
    prev, ind = h["prev_scores"], h["induction_scores"]
    assert h["prev_head"] == [0, max(range(len(prev[0])), key=prev[0].__getitem__)]
    assert h["induction_head"] == [1, max(range(len(ind[1])), key=ind[1].__getitem__)]
    assert h["prev_score"] == prev[0][h["prev_head"][1]]
    assert h["induction_score"] == ind[1][h["induction_head"][1]]
    thr = example.THRESHOLDS["head_score"]
    assert h["prev_heads"] == [[0, j] for j, v in enumerate(prev[0]) if v >= thr]
    assert h["induction_heads"] == [[1, j] for j, v in enumerate(ind[1]) if v >= thr]
    assert f"L0H{h['prev_head'][1]}: score {h['prev_score']:.3f}" in rows[1]["ours"]
    assert f"L1H{h['induction_head'][1]}: score {h['induction_score']:.3f}" in rows[2]["ours"]


def test_composition_numbers_are_consistent(fast_run):
    _, rows, results = fast_run
    c, h = results["composition"], results["heads"]
    k_grid = c["k_grid"]
    h0, h1 = h["prev_head"][1], h["induction_head"][1]
    assert c["pair"]["K"] == pytest.approx(k_grid[h0][h1], rel=1e-6)
    assert c["pair"]["Q"] == pytest.approx(c["q_grid"][h0][h1], rel=1e-6)
    for kind in ("K", "Q", "V"):
        z = (c["pair"][kind] - c["baseline_mean"]) / c["baseline_std"]
        assert c["z"][kind] == pytest.approx(z, rel=1e-9)
    assert rows[3]["value"] == c["z"]["K"]
    assert f"K {c['pair']['K']:.3f} vs random {c['baseline_mean']:.3f}" in rows[3]["ours"]
    column = [row[h1] for row in k_grid]
    assert c["rank_in_column"] == 1 + sum(v > column[h0] for v in column)
    # a composition score is a ratio of Frobenius norms: in [0, 1]
    for grid in (k_grid, c["q_grid"], c["v_grid"]):
        assert all(0 <= v <= 1 for row in grid for v in row)


def test_verdicts_follow_the_thresholds(fast_run, example):
    _, rows, results = fast_run
    t = example.THRESHOLDS

    def level(holds, partly):
        return "holds" if holds else "partly" if partly else "does not hold"

    mse = results["rel_mse"]
    assert rows[0]["value"] == mse
    assert rows[0]["verdict"] == level(mse <= t["rel_mse_holds"], mse <= t["rel_mse_partly"])
    c = results["composition"]
    zk = c["z"]["K"]
    expected = level(zk >= t["z_holds"] and c["rank_in_column"] == 1, zk >= t["z_partly"])
    assert rows[3]["verdict"] == expected
    a = results["ablation"]
    after, rise = a["rel_mse_after"], a["rel_mse_after"] / a["rel_mse_before"]
    assert rows[6]["verdict"] == level(
        after >= t["ablated_mse_holds"] and rise >= t["ablated_mse_rise_holds"],
        after >= t["ablated_mse_partly"] and rise >= t["ablated_mse_rise_partly"],
    )


def test_ablation_numbers_are_consistent(fast_run):
    _, rows, results = fast_run
    a, h = results["ablation"], results["heads"]
    assert a["score_before"] == h["induction_score"]
    assert rows[5]["value"] == pytest.approx(a["score_after"] / a["score_before"])
    # the ablated heads are the detected ones, or the best head when none was detected
    assert a["prev_heads"] == (h["prev_heads"] or [h["prev_head"]])
    assert a["induction_heads"] == (h["induction_heads"] or [h["induction_head"]])
    assert a["population"] == results["meta"]["settings"]["population"]


def test_scores_are_computed_on_the_settings_of_fast_mode(fast_run, example):
    _, _, results = fast_run
    settings = results["meta"]["settings"]
    assert settings == example.asdict(example.FAST)
    m_keys = {int(k) for k in results["heads"]["induction_score_by_m"]}
    assert m_keys == {example.FAST.min_m, example.FAST.max_m}


def test_saved_results_are_rejudged_to_the_returned_rows(fast_run, example):
    # The verdicts are the library's, from the saved numbers and the library's thresholds.
    _, rows, results = fast_run
    assert example.THRESHOLDS is ic.THRESHOLDS and results["thresholds"] == ic.THRESHOLDS
    rejudged = ic.judge_claims(results)
    assert [(c.number, c.ours, c.value, c.verdict) for c in rejudged] == [
        (r["number"], r["ours"], r["value"], r["verdict"]) for r in rows
    ]


def test_the_example_stays_short():
    # Issue 13: the reusable parts live in vecinterp.tasks.induction_claims.
    assert len(EXAMPLE.read_text().splitlines()) <= 200
