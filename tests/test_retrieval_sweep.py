"""vecinterp.tasks.retrieval_claims' seed sweeps (run_sweep and the functions around it).

Equivalence: an ensemble member of seed s is the single model train_model trains with
seed s (weights, losses, checkpoints), and its sweep row is what measure_claims says of
that single model. Exact values: emergence orders, summaries, tables and CSV rows of
hand-made numbers. Bad input. The example's --sweep mode end to end.
"""

import csv
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from vecinterp.tasks import retrieval_claims as rc

HOLDS, PARTLY, NO = rc.HOLDS, rc.PARTLY, rc.NO
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "retrieval_problem.py"


def tiny(**kw) -> rc.Settings:
    base = dict(steps=12, non_ic_steps=6, checkpoint_every=4, eval_size=32, analysis_size=16)
    return dataclasses.replace(rc.FAST, **{**base, **kw})


def values(loss_crossing, path_crossing, every=25, **changes) -> dict:
    """A values dict as measure_claims writes it (16 heads, D = 2), with the given
    crossings; the circuit is the paths of ``path_crossing``."""
    roles = {"L0": 0, "R0": 1, "L1": 2, "R1": 3, "Q": 4}
    kept = []
    for name in path_crossing:
        head, link = name.split(" ")
        dest, src = link.split("->")
        layer, h = int(head[1]), int(head[3])
        kept.append(rc.ChainPath(layer=layer, head=h, dest=roles[dest], src=roles[src],
                                 value=0.9, name=name))  # fmt: skip
    carrying = sorted({name.split(" ")[0] for name in path_crossing})
    v = {
        "ic_loss": 0.01, "partial": [0.005, 0.015], "non_ic_loss": 0.74, "non_ic_steps": 600,
        "checkpoint_every": every, "n_heads_total": 16, "paths": kept,
        "loss_crossing": loss_crossing, "path_crossing": path_crossing,
        "validation": {
            "base": 0.01, "full": 0.03, "combined": 0.04, "limit": 0.05, "all_uniform": 1.0,
            "kept": kept, "dropped": [], "carrying": carrying, "positional": [],
            "found_heads": carrying, "without": dict.fromkeys(path_crossing, 0.5),
        },
    }  # fmt: skip
    v.update(changes)
    return v


PAPER = values(
    {"x_1": 96.0, "x_2": 152.0},
    {"L1H0 R0->L0": 110.0, "L2H1 Q->R0": 108.0, "L1H3 R1->L1": 139.0, "L3H0 Q->R1": 158.0},
)


# ------------------------------------------------------------------- emergence orders


@pytest.mark.parametrize(
    "loss_crossing, path_crossing, order",
    [
        # the paper's order; a path counts at its first head, later copies are redundant
        (
            {"x_1": 96.0, "x_2": 152.0},
            {"L1H0 R0->L0": 110.0, "L2H1 Q->R0": 108.0, "L2H3 Q->R0": 170.0,
             "L1H3 R1->L1": 139.0, "L3H0 Q->R1": 158.0, "L3H1 Q->R1": 400.0,
             "L3H2 Q->R0": None},
            "x_1: Q->R0, R0->L0 | x_2: Q->R1, R1->L1",
        ),
        # the first head of a path: the earliest, wherever it is listed
        ({"x_1": 50.0}, {"L3H1 Q->R0": 300.0, "L2H0 Q->R0": 60.0}, "x_1: Q->R0"),
        # x_2 first; a fall with no new path
        (
            {"x_1": 200.0, "x_2": 100.0},
            {"L1H0 R0->L0": 90.0},
            "x_2: R0->L0 | x_1: -",
        ),
        # one loss never falls, a path emerges late, another never
        (
            {"x_1": 50.0, "x_2": None},
            {"L1H0 R0->L0": 60.0, "L3H0 Q->R1": 400.0, "L3H1 Q->R0": None},
            "x_1: R0->L0 | x_2: never | later: Q->R1 | never: Q->R0",
        ),
        # a path up to one checkpoint interval after the fall belongs to it
        ({"x_1": 50.0}, {"L1H0 R0->L0": 75.0, "L2H0 Q->R0": 75.5}, "x_1: R0->L0 | later: Q->R0"),
        ({"x_1": None, "x_2": None}, {}, "x_1: never | x_2: never"),
    ],
)  # fmt: skip
def test_emergence_order_hand_worked(loss_crossing, path_crossing, order):
    assert rc.emergence_order(values(loss_crossing, path_crossing)) == order


def test_emergence_order_follows_the_checkpoint_interval():
    v = values({"x_1": 50.0}, {"L1H0 R0->L0": 75.0})
    assert rc.emergence_order(v) == "x_1: R0->L0"
    assert rc.emergence_order({**v, "checkpoint_every": 10}) == "x_1: - | later: R0->L0"


def test_emergence_order_refuses_what_is_not_a_values_dict():
    with pytest.raises(ValueError, match="lacks 'path_crossing'"):
        rc.emergence_order({"loss_crossing": {}, "checkpoint_every": 25})


# -------------------------------------------------------------------- rows and summaries


def test_sweep_row_of_the_paper_s_order():
    row = rc.sweep_row(3, PAPER)
    assert row.seed == 3 and row.ic_loss == 0.01 and row.non_ic_loss == 0.74
    assert row.partial == (0.005, 0.015)
    assert row.verdicts == (HOLDS,) * 6
    assert row.carrying == ("L1H0", "L1H3", "L2H1", "L3H0")
    assert row.order == "x_1: Q->R0, R0->L0 | x_2: Q->R1, R1->L1"
    assert (row.ic_learned, row.non_ic_learned, row.chain_order, row.paper_order) == (
        True, False, True, True,
    )  # fmt: skip
    assert row.values == PAPER and row.values is not PAPER


def test_sweep_row_paper_order_needs_claims_3_and_6():
    # claim 3 fails: x_2 falls first
    swapped = rc.sweep_row(0, {**PAPER, "loss_crossing": {"x_1": 152.0, "x_2": 96.0}})
    assert swapped.verdicts[2] == NO and not swapped.chain_order and not swapped.paper_order
    # claim 6 partly: x_2's fall brings no new path (all emerged with x_1)
    early = dict.fromkeys(PAPER["path_crossing"], 100.0)
    together = rc.sweep_row(0, {**PAPER, "path_crossing": early})
    assert together.chain_order and together.verdicts[5] == PARTLY
    assert not together.paper_order
    assert together.order == "x_1: Q->R0, Q->R1, R0->L0, R1->L1 | x_2: -"


def row(seed, order="A", ic=0.01, non_ic=0.8, verdicts=(HOLDS,) * 6, diverged=None):
    return rc.SweepRow(seed, ic, non_ic, (ic,), {"x_1": 90.0}, {}, (), order, verdicts,
                       diverged)  # fmt: skip


def test_summarize_sweep_hand_worked():
    no6 = (HOLDS,) * 5 + (PARTLY,)
    no3 = (HOLDS, HOLDS, NO, HOLDS, HOLDS, HOLDS)
    rows = [
        row(0, "B", ic=0.01, non_ic=0.75),
        row(1, "A", ic=0.2, non_ic=0.01, verdicts=no6),  # IC does not learn; non-IC does
        row(2, "A", ic=0.04, non_ic=0.9, verdicts=no3),
        row(5, "B", ic=0.03, non_ic=0.6, diverged="IC: loss nan"),
        row(6, "C", ic=0.05, non_ic=0.71, verdicts=no6),
    ]
    s = rc.summarize_sweep(rows)
    assert s["n"] == 5
    assert s["ic_learned"] == {"count": 4, "of": 5, "fraction": 0.8}  # 0.05 is at the bound
    assert s["non_ic_learned"] == {"count": 1, "of": 5, "fraction": 0.2}
    assert s["non_ic_fails"] == {"count": 3, "of": 5, "fraction": 0.6}  # 0.75, 0.9, 0.71
    assert s["chain_order"] == {"count": 4, "of": 5, "fraction": 0.8}
    assert s["paper_order"] == {"count": 2, "of": 5, "fraction": 0.4}  # seeds 0 and 5
    assert s["paper_order_learned"] == {"count": 2, "of": 4, "fraction": 0.5}
    assert s["orders"] == [("B", 2), ("A", 2), ("C", 1)]  # ties: first seen first
    assert s["modal"] == "B" and s["modal_order"] == {"count": 2, "of": 5, "fraction": 0.4}
    assert s["verdicts"][3] == {HOLDS: 4, PARTLY: 0, NO: 1}
    assert s["verdicts"][6] == {HOLDS: 3, PARTLY: 2, NO: 0}
    assert s["ic_loss"] == {"median": 0.04, "min": 0.01, "max": 0.2}
    assert s["diverged"] == [5]
    even = rc.summarize_sweep(rows[:4])
    assert even["non_ic_loss"] == {"median": pytest.approx(0.675), "min": 0.01, "max": 0.9}
    json.dumps(s)  # JSON-ready


def test_summarize_sweep_without_a_learner():
    s = rc.summarize_sweep([row(0, ic=0.5, verdicts=(NO,) * 6)])
    assert s["ic_learned"]["count"] == 0
    assert s["paper_order_learned"] == {"count": 0, "of": 0, "fraction": None}
    assert "| ... among the seeds whose IC model learns | n/a (0 seeds) |" in rc.sweep_table(s)


@pytest.mark.parametrize(
    "rows, match",
    [([], "non-empty"), ([row(1), row(1)], "twice"), (["x"], "SweepRow")],
)
def test_summarize_sweep_refuses_bad_rows(rows, match):
    with unchecked(), pytest.raises(ValueError, match=match):
        rc.summarize_sweep(rows)


def test_sweep_table_hand_worked():
    rows = [
        rc.sweep_row(0, PAPER),
        rc.sweep_row(4, {**PAPER, "ic_loss": 0.3, "loss_crossing": {"x_1": 96.0, "x_2": None}}),
    ]
    result = rc.SweepResult(rows, rc.summarize_sweep(rows), {})
    lines = rc.sweep_table(result).splitlines()
    assert lines[:12] == [
        "| 2 seeds | measured |",
        "|---|---|",
        "| IC model learns (loss <= 0.05) | 1/2 (50 %) |",
        "| non-IC model learns (same bound) | 0/2 (0 %) |",
        "| non-IC loss > 0.7 (paper: 100 %) | 2/2 (100 %) |",
        "| IC loss, median (min - max) | 0.1550 (0.0100 - 0.3000) |",
        "| non-IC loss, median (min - max) | 0.7400 (0.7400 - 0.7400) |",
        "| partial losses fall in chain order (claim 3; paper: 100 %) | 1/2 (50 %) |",
        "| paper's order: claims 3 and 6 hold | 1/2 (50 %) |",
        "| ... among the seeds whose IC model learns | 1/1 (100 %) |",
        "| modal emergence order `x_1: Q->R0, R0->L0 \\| x_2: Q->R1, R1->L1` | 1/2 (50 %) |",
        "",
    ]
    assert "| `x_1: Q->R0, R0->L0 \\| x_2: never \\| later: Q->R1, R1->L1` | 1 |" in lines
    assert "| 1 | 1 | 1 | 0 |" in lines  # claim 1: 0.01 holds, 0.3 partly
    assert lines[-1] == (
        "| 4 | 0.3000 | 0.7400 | x_1 96, x_2 never | 4 | "
        "`x_1: Q->R0, R0->L0 \\| x_2: never \\| later: Q->R1, R1->L1` | P H P H H P |"
    )
    # without rows: the same, less the per-seed table
    assert rc.sweep_table(result.summary) == "\n".join(lines).split("\n\n| seed |")[0]
    with unchecked(), pytest.raises(TypeError, match="SweepResult"):
        rc.sweep_table(rows)


def test_write_sweep_csv_round_trips(tmp_path):
    rows = [rc.sweep_row(0, PAPER), rc.sweep_row(1, PAPER, diverged="non-IC: loss nan")]
    rc.write_sweep_csv(rows, tmp_path / "sweep.csv")
    with open(tmp_path / "sweep.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [r["seed"] for r in read] == ["0", "1"]
    first = read[0]
    assert float(first["ic_loss"]) == 0.01 and float(first["loss_x_2"]) == 0.015
    assert float(first["step_x_1"]) == 96.0 and first["paper_order"] == "True"
    assert first["claim_6"] == HOLDS and first["carrying"] == "L1H0 L1H3 L2H1 L3H0"
    assert first["order"] == rows[0].order and first["diverged"] == ""
    assert read[1]["diverged"] == "non-IC: loss nan"
    with pytest.raises(ValueError, match="empty"):
        rc.write_sweep_csv([], tmp_path / "empty.csv")


# -------------------------------------------------------- ensemble vs the single-model path


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    s, seeds = tiny(), [3, 5]
    ck = tmp_path_factory.mktemp("sweep") / "ic"
    result = rc.run_sweep(s, seeds, checkpoint_dir=ck)
    return s, seeds, ck, result


def test_ensemble_member_is_the_single_model_of_its_seed(swept, tmp_path):
    s, seeds, ck, _ = swept
    ensemble = rc.train_sweep(s, seeds, ic=True, checkpoint_dir=tmp_path / "again")
    for i, seed in enumerate(seeds):
        alone = rc.train_model(s, ic=True, seed=seed, checkpoint_dir=tmp_path / f"alone{seed}")
        member = ensemble[i]
        for (name, a), b in zip(alone.model.named_parameters(), member.model.parameters(),
                                strict=True):  # fmt: skip
            # b_K's gradient is zero but for rounding (softmax ignores a shift shared by
            # all keys) and Adam scales that noise up: it differs, to no effect on outputs
            if not name.endswith("b_K"):
                assert torch.allclose(a, b, atol=2e-5, rtol=1e-4), name
        batch = rc.eval_batch(s, 8, seed=0)
        with torch.no_grad():
            assert torch.allclose(alone.model(batch.inputs), member.model(batch.inputs),
                                  atol=1e-5)  # fmt: skip
        assert member.history.train_loss == pytest.approx(alone.history.train_loss, rel=1e-4)
        mine = sorted(p.name for p in (ck / f"member_{i:03d}").glob("step_*"))
        theirs = sorted(p.name for p in (tmp_path / f"alone{seed}").glob("step_*"))
        assert mine == theirs == [f"step_{k:08d}" for k in (4, 8, 12)]
        kept = vi.load(ck / f"member_{i:03d}" / "step_00000004" / "model")
        again = vi.load(tmp_path / f"alone{seed}" / "step_00000004" / "model")
        assert torch.allclose(kept.W_Q, again.W_Q, atol=1e-5)
    non_ic = rc.train_sweep(s, seeds, ic=False)
    alone = rc.train_model(s, ic=False, seed=seeds[1])
    assert torch.allclose(non_ic.models[1].W_U, alone.model.W_U, atol=2e-5)
    assert len(non_ic.histories[1].train_loss) == s.non_ic_steps


def test_sweep_row_is_what_measure_claims_says_of_the_single_models(swept, tmp_path):
    s, seeds, _, result = swept
    assert [r.seed for r in result.rows] == seeds
    assert result.info["seeds"] == seeds and result.info["train_ic_s"] > 0
    assert sorted(result.tables) == seeds
    for r in result.rows:
        ck = tmp_path / f"ic{r.seed}"
        ic = rc.train_model(s, ic=True, seed=r.seed, checkpoint_dir=ck)
        non_ic = rc.train_model(s, ic=False, seed=r.seed)
        initial = vi.HookedVectorTransformer(rc.model_config(s), seed=r.seed)
        alone = rc.measure_claims(ic.model, non_ic.model, s, [(0, initial), *sorted(ck.glob(
            "step_*"))])  # fmt: skip
        v = alone.values
        assert r.ic_loss == pytest.approx(v["ic_loss"], rel=1e-4)
        assert r.non_ic_loss == pytest.approx(v["non_ic_loss"], rel=1e-4)
        assert r.partial == pytest.approx(v["partial"], rel=1e-4)
        assert r.verdicts == tuple(c.verdict for c in alone.claims)
        assert r.order == rc.emergence_order(v)
        assert r.diverged is None
        steps = [step for step, _, _ in result.tables[r.seed].rows]
        assert sorted(set(steps)) == [0, 4, 8, 12]
    assert result.summary == rc.summarize_sweep(result.rows)


def test_run_sweep_logs_and_needs_an_empty_checkpoint_dir(swept):
    s, seeds, ck, _ = swept
    with pytest.raises(FileExistsError):
        rc.run_sweep(s, seeds, checkpoint_dir=ck)
    lines: list[str] = []
    rc.run_sweep(tiny(steps=2, non_ic_steps=1, checkpoint_every=1), [0], log=lines.append)
    assert lines[0].startswith("IC ensemble of 1 trained in ")
    assert lines[1].startswith("non-IC ensemble of 1 trained in ")
    assert lines[2].startswith("seed 0: IC ")


@pytest.mark.parametrize(
    "seeds, error, match",
    [
        ([], ValueError, "empty"),
        ([1, 1], ValueError, "distinct"),
        ([-1], ValueError, ">= 0"),
        ([True], ValueError, ">= 0"),
        ([1.0], ValueError, ">= 0"),
        ("01", TypeError, "sequence"),
        (3, TypeError, "sequence"),
    ],
)
def test_bad_seeds(seeds, error, match):
    with unchecked(), pytest.raises(error, match=match):
        rc.run_sweep(tiny(), seeds)


def test_bad_settings_and_flags():
    with unchecked():
        with pytest.raises(TypeError, match="Settings"):
            rc.run_sweep(dataclasses.asdict(tiny()), [0])
        with pytest.raises(TypeError, match="ic must be a bool"):
            rc.train_sweep(tiny(), [0], ic=1)
        with pytest.raises(TypeError, match="seed must be an int"):
            rc.sweep_row("0", PAPER)
    with pytest.raises(ValueError, match="lacks"):
        rc.sweep_row(0, {"ic_loss": 0.1})


# ---------------------------------------------------------------------------- the example


def test_example_sweep_mode(tmp_path):
    spec = importlib.util.spec_from_file_location("retrieval_problem_sweep", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--fast", "--sweep", "2", "--seed", "4", "--steps", "8", "--non-ic-steps", "4",
            "--out", str(tmp_path), "--no-progress"]  # fmt: skip
    rows = module.main(argv)
    assert [r["seed"] for r in rows] == [4, 5]
    with open(tmp_path / "sweep.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [float(r["ic_loss"]) for r in read] == [r["ic_loss"] for r in rows]
    dump = json.loads((tmp_path / "sweep.json").read_text())
    assert dump["info"]["seeds"] == [4, 5] and dump["summary"]["n"] == 2
    assert [v["ic_loss"] for v in dump["values"]] == [r["ic_loss"] for r in rows]
    # the saved values re-judge to the verdicts of the CSV
    for v, r in zip(dump["values"], read, strict=True):
        assert [c.verdict for c in rc.judge_claims(v)] == [r[f"claim_{k}"] for k in range(1, 7)]
    report = (tmp_path / "sweep.md").read_text()
    assert report.startswith("# Retrieval problem: a sweep over 2 seeds")
    assert rc.sweep_table(dump["summary"]).splitlines()[0] in report
    assert sorted(p.name for p in (tmp_path / "emergence").iterdir()) == [
        "seed_4.csv", "seed_5.csv",
    ]  # fmt: skip
    assert not (tmp_path / "checkpoints").exists()
