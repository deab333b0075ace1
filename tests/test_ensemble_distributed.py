"""Ensembles across ranks: 2 gloo processes on the CPU split an ensemble of 5 members (3
and 2), each member bit-identical to the one-process ensemble's; every rank returns all 5;
a failure on one rank stops both naming it; checkpoints resume bit for bit on 2 ranks after
a rank is killed, and on 1 process from 2 ranks and on 2 ranks from 1.

As in ``test_distributed.py``, the ranks are forked from a fork server (a fork of the test
process could inherit locks held by its threads), run every scenario in turn on one process
group and write what they saw to a file that the tests below read.
"""

import io
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vecinterp as vi
from helpers import random_model, tiny_cfg
from two_ranks import (
    assert_rank_1_failure_stopped_every_rank,
    attempt,
    init_group,
    launch,
    leave_group_for_torchrun,
    needs_gloo,
)
from vecinterp.training import _ensemble_checkpoint, distributed, ensemble

F64 = torch.float64
K = 5  # rank 0 trains members 0-2, rank 1 members 3-4
CFG = tiny_cfg()  # d_in=3, d_out=5, n_ctx=7, 2 layers
MAP = torch.linspace(-1.0, 1.0, 15, dtype=F64).reshape(3, 5)
# torch.optim.AdamW's constructor imports torch._dynamo (hundreds of modules, seconds): once
PRELOAD = ["torch._dynamo", __name__]
FIELDS = ("steps", "train_loss", "lr", "grad_norm", "eval_steps", "eval_loss")
pytestmark = needs_gloo


def make_batch(step: int, gen: torch.Generator):
    """targets = inputs @ MAP, scored from position 1 on."""
    x = torch.randn(4, 5, 3, generator=gen, dtype=F64)
    return x, x @ MAP, torch.arange(5).ge(1).expand(4, 5)


def failing_at(step: int, kill: bool = False):
    """make_batch, but it raises (or kills its process) at ``step``."""

    def data(s: int, gen: torch.Generator):
        if s == step:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise KeyError(f"no batch {s} here")
        return make_batch(s, gen)

    return data


def blows_up_at(bad_step: int):
    """make_batch whose targets at ``bad_step`` are finite but make the loss inf."""

    def data(s: int, gen: torch.Generator):
        x, t, mask = make_batch(s, gen)
        return x, (t + 1e200 if s == bad_step else t), mask

    return data


def bad_targets(s: int, gen: torch.Generator):
    x, t, mask = make_batch(s, gen)
    return x, t[..., :4], mask


def member(i: int, data) -> list:
    """``make_batch`` for every member but member ``i``, which draws from ``data``."""
    return [data if j == i else make_batch for j in range(K)]


class Crash(Exception):
    """Stands for the process being killed."""


def crash_at(step: int):
    def callback(s: int, metrics: list) -> None:
        if s == step:
            raise Crash

    return callback


EVAL = [make_batch(1, torch.Generator().manual_seed(99)) for _ in range(2)]
KW = dict(steps=8, lr=[1e-2, 3e-2, 1e-2, 2e-2, 3e-2], seed=[0, 1, 2, 3, 4], warmup_steps=1,
          schedule="cosine", grad_clip=0.5, ema_decay=0.8, ema_start=2, eval_data=EVAL,
          eval_every=3, progress=False, device="cpu")  # fmt: skip
CK = dict(checkpoint_every=3, keep_last=1)


def start_models() -> list[vi.HookedVectorTransformer]:
    return [random_model(CFG, seed=s, scale=0.3) for s in range(K)]


def train(data=make_batch, **kw) -> vi.EnsembleResult:
    """The ensemble of KW (and ``kw``), on one intra-op thread as each rank runs (the
    root conftest.py sets one thread for the whole test run)."""
    return vi.train_ensemble(start_models(), data, **dict(KW, **kw))


def outcome(out: vi.EnsembleResult) -> dict:
    return {
        "members": [
            {
                "model": r.model.state_dict(),
                "raw": r.raw_model.state_dict(),
                "optimizer": r.optimizer.state_dict(),
                "history": {f: getattr(r.history, f) for f in FIELDS},
                "checkpoint": None if r.checkpoint is None else r.checkpoint.name,
                "averaged": r.model is not r.raw_model,
                "device": str(r.model.W_E.device),
            }
            for r in out
        ],
        "diverged": [None if e is None else (str(e), e.step, e.quantity) for e in out.diverged],
        "device": str(out.device),
    }


def scenarios(rank: int, out: Path) -> dict:
    """Everything the ranks run on one process group (initialised by the worker)."""
    seen: dict = {}
    seen["split"] = attempt(lambda: outcome(train()))

    calls: dict = {"lock": 0, "marker": [], "written": [], "callback": []}
    lock, marker = ensemble.own_directory, _ensemble_checkpoint.write_marker
    write = _ensemble_checkpoint.write_checkpoint

    def locking(*args, **kwargs):
        calls["lock"] += 1
        return lock(*args, **kwargs)

    def marking(directory, step, members):
        calls["marker"].append(step)
        return marker(directory, step, members)

    def writing(directory, step, *args, **kwargs):
        calls["written"].append((directory.name, step))
        return write(directory, step, *args, **kwargs)

    ensemble.own_directory, _ensemble_checkpoint.write_marker = locking, marking
    _ensemble_checkpoint.write_checkpoint = writing
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        seen["whole"] = attempt(lambda: outcome(train(
            checkpoint_dir=out / "whole", **CK, progress=True,
            callback=lambda s, m: calls["callback"].append((s, m)))))  # fmt: skip
        seen["progress"] = sys.stderr.getvalue()
    finally:
        sys.stderr = stderr
        ensemble.own_directory, _ensemble_checkpoint.write_marker = lock, marker
        _ensemble_checkpoint.write_checkpoint = write
    seen["calls"] = calls

    crash = dict(checkpoint_dir=out / "crash", **CK)
    seen["failed"] = attempt(lambda: train(member(3, failing_at(5)), **crash))
    seen["resumed"] = attempt(lambda: outcome(train(**crash, resume=True)))
    seen["from_one"] = attempt(lambda: outcome(train(checkpoint_dir=out / "from_one", **CK,
                                                     resume=True)))  # fmt: skip
    seen["frozen"] = attempt(lambda: outcome(train(member(4, blows_up_at(2)))))
    seen["raise"] = attempt(lambda: train(member(4, blows_up_at(2)), on_divergence="raise"))
    seen["all_diverged"] = attempt(lambda: train(blows_up_at(2)))
    seen["bad_batch"] = attempt(lambda: train(member(4, bad_targets)))
    seen["config"] = attempt(lambda: train(steps=8 + rank))
    seen["too_few"] = attempt(lambda: vi.train_ensemble(start_models()[:1], make_batch,
                                                        **dict(KW, lr=1e-2, seed=0)))  # fmt: skip
    with distributed.one_process():
        seen["one_process"] = attempt(lambda: outcome(train(steps=3)))
    return seen


def worker(rank: int, out: Path, kill: str | None) -> None:
    init_group(rank, out, kill)
    if kill:  # the killed run and its resume, on the group initialised here
        data = member(3, failing_at(5, kill=True)) if kill == "kill" else make_batch
        seen = attempt(lambda: outcome(train(data, checkpoint_dir=out / "killed", **CK,
                                             resume=True)))  # fmt: skip
        dist.destroy_process_group()
        torch.save(seen, out / f"rank{rank}.pt")
        return
    seen = leave_group_for_torchrun(rank, lambda: scenarios(rank, out))
    # torchrun's variables: train_ensemble initialises the process group, and destroys it
    seen["env"] = attempt(lambda: outcome(train()))
    seen["env_left_initialised"] = dist.is_initialized()
    torch.save(seen, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """Where the ranks run; it holds a one-process checkpoint (step 3; a crash at step 4) for
    them to resume on 2 ranks."""
    out = tmp_path_factory.mktemp("ensemble_ddp")
    with pytest.raises(Crash):
        train(checkpoint_dir=out / "from_one", **CK, callback=crash_at(4))
    assert json.loads((out / "from_one" / "ensemble.json").read_text())["step"] == 3
    return out


@pytest.fixture(scope="module")
def ranks(workdir) -> list[dict]:
    return launch(worker, workdir, preload=PRELOAD)


@pytest.fixture(scope="module")
def single() -> dict:
    return outcome(train())


def ok(seen: dict) -> dict:
    assert "error" not in seen, seen.get("error")
    return seen["ok"]


def assert_identical(a: dict, b: dict, checkpoints: bool = True) -> None:
    """Bit for bit: weights, weight averages, AdamW states, histories (not wall times)."""
    assert len(a["members"]) == len(b["members"]) == K
    for i, (x, y) in enumerate(zip(a["members"], b["members"], strict=True)):
        for part in ("model", "raw"):
            assert x[part].keys() == y[part].keys()
            for name, tensor in x[part].items():
                assert torch.equal(tensor, y[part][name]), (i, part, name)
        ox, oy = x["optimizer"], y["optimizer"]
        assert ox["param_groups"] == oy["param_groups"], i
        assert ox["state"].keys() == oy["state"].keys()
        for p, per_param in ox["state"].items():
            for key, tensor in per_param.items():
                assert torch.equal(tensor, oy["state"][p][key]), (i, p, key)
        assert x["history"] == y["history"], i
        assert x["averaged"] == y["averaged"] and x["device"] == y["device"]
        if checkpoints:
            assert x["checkpoint"] == y["checkpoint"], i
    assert a["diverged"] == b["diverged"]


# --- the same members whatever the number of ranks ----------------------------------------


def test_each_member_is_bit_identical_to_the_one_process_ensembles(ranks, single):
    """Members 0-2 on rank 0, 3-4 on rank 1 (5 members, uneven), each with its own seed
    and learning rate, warm-up, cosine decay, clipping, a weight average and evaluation:
    every rank returns all 5, equal bit for bit to one process's."""
    assert max(g for m in single["members"] for g in m["history"]["grad_norm"]) > 0.5
    for seen in ranks:
        assert_identical(ok(seen["split"]), single)
    # and the members differ from each other (their seeds, rates and data differ)
    a, b = single["members"][0]["model"], single["members"][3]["model"]
    assert not torch.equal(a["embed.W_E"], b["embed.W_E"])


def test_the_group_is_initialised_and_destroyed_under_torchrun_variables(ranks, single):
    for seen in ranks:
        assert_identical(ok(seen["env"]), single)
        assert seen["env_left_initialised"] is False


def test_one_process_trains_the_whole_ensemble_on_each_rank(ranks):
    alone = outcome(train(steps=3))
    for seen in ranks:
        assert_identical(ok(seen["one_process"]), alone)


def test_a_frozen_member_is_frozen_on_every_rank(ranks):
    """Member 4 (rank 1) diverges at step 2: every rank returns its divergence and its
    state before that step, as one process does."""
    alone = outcome(train(member(4, blows_up_at(2))))
    assert alone["diverged"][4] is not None and alone["diverged"][4][1] == 2
    assert alone["diverged"][4][0].startswith("ensemble member 4: training diverged")
    for seen in ranks:
        assert_identical(ok(seen["frozen"]), alone)


# --- rank 0's duties and each rank's checkpoints ------------------------------------------


def test_each_rank_writes_its_members_and_rank_0_the_record(ranks, workdir, single):
    zero, one = ranks[0]["calls"], ranks[1]["calls"]
    steps = [3, 6, 8]
    assert zero["written"] == [(f"member_00{i}", s) for s in steps for i in (0, 1, 2)]
    assert one["written"] == [(f"member_00{i}", s) for s in steps for i in (3, 4)]
    assert (zero["lock"], zero["marker"]) == (1, steps)
    assert (one["lock"], one["marker"]) == (0, [])
    run = workdir / "whole"
    assert json.loads((run / "ensemble.json").read_text()) == {
        "format": "vecinterp-ensemble", "members": K, "step": 8,
    }  # fmt: skip
    for i in range(K):  # keep_last=1, pruned by each member's rank
        assert [p.name for p in (run / f"member_00{i}").iterdir()] == ["step_00000008"]
        trainer = json.loads((run / f"member_00{i}" / "step_00000008" / "trainer.json").read_text())
        assert trainer["ensemble"] == {"member": i, "members": K, "diverged": None}
    assert not (run / ".vecinterp-train.lock").exists()
    for seen in ranks:
        result = ok(seen["whole"])
        assert [m["checkpoint"] for m in result["members"]] == ["step_00000008"] * K
        assert_identical(result, single, checkpoints=False)


def test_rank_0_alone_shows_progress_and_calls_back_with_every_member(ranks):
    zero, one = ranks[0]["calls"]["callback"], ranks[1]["calls"]["callback"]
    assert one == [] and [s for s, _ in zero] == list(range(8))
    members = ok(ranks[0]["whole"])["members"]
    for step, metrics in zero:
        assert len(metrics) == K
        for i, m in enumerate(metrics):  # exactly the members' histories
            h = members[i]["history"]
            expected = {"loss": h["train_loss"][step], "lr": h["lr"][step],
                        "grad_norm": h["grad_norm"][step]}  # fmt: skip
            if step + 1 in h["eval_steps"]:
                expected["eval_loss"] = h["eval_loss"][h["eval_steps"].index(step + 1)]
            assert m == expected, (step, i)
    assert "train x5" in ranks[0]["progress"] and "8/8" in ranks[0]["progress"]
    assert ranks[1]["progress"] == ""


# --- failures -----------------------------------------------------------------------------


def test_a_failure_on_one_rank_stops_every_rank_naming_it(ranks):
    """Member 3's data raise at step 5 on rank 1; rank 0 stops at the same step."""
    assert_rank_1_failure_stopped_every_rank(ranks, "vecinterp.train_ensemble", step=5)


def test_errors_name_the_member_by_its_index_in_the_ensemble(ranks):
    """Member 4 is rank 1's second member: its bad batch and its divergence name it 4."""
    own = ranks[1]["bad_batch"]["error"]
    assert own["type"] == "ValueError"
    assert own["message"].startswith("member 4: make_batch(0, ...): targets have shape")
    assert ranks[0]["bad_batch"]["error"]["type"] == "RankFailedError"
    raised = ranks[1]["raise"]["error"]
    assert raised["type"] == "TrainingDivergedError"
    assert raised["message"].startswith("ensemble member 4: training diverged")
    assert "member 4" in ranks[0]["raise"]["error"]["message"]


def test_when_every_member_diverged_every_rank_raises_what_one_process_raises(ranks):
    with pytest.raises(vi.TrainingDivergedError) as alone:
        train(blows_up_at(2))
    assert "every member of the ensemble diverged (member 0 at step 2, " in str(alone.value)
    for seen in ranks:
        error = seen["all_diverged"]["error"]
        assert error["type"] == "TrainingDivergedError"
        assert error["message"] == str(alone.value)


def test_ranks_given_different_arguments_or_too_few_members_are_stopped(ranks):
    for seen in ranks:
        error = seen["config"]["error"]
        assert error["type"] == "ValueError"
        assert "must call vecinterp.train_ensemble with the same arguments" in error["message"]
        assert "rank 1: steps=9, rank 0: steps=8" in error["message"]
        error = seen["too_few"]["error"]
        assert error["type"] == "ValueError"
        assert error["message"].startswith("an ensemble of 1 member cannot be split across 2")


# --- resume -------------------------------------------------------------------------------


def test_resume_on_two_ranks_after_a_failure_is_bit_identical(ranks):
    for seen in ranks:
        assert_identical(ok(seen["resumed"]), ok(ranks[0]["whole"]))


def test_two_ranks_resume_what_one_process_wrote(ranks):
    for seen in ranks:
        assert_identical(ok(seen["from_one"]), ok(ranks[0]["whole"]))


def test_resume_after_a_rank_is_killed_is_bit_identical_on_two_ranks_or_one(ranks, tmp_path):
    """Rank 1 is SIGKILLed in member 3's data at step 5 (after the checkpoint of step 3);
    one process resumes a copy of the directory, two fresh ranks the directory itself:
    both end where the uninterrupted run did."""
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        launch(worker, tmp_path, kill="kill", preload=PRELOAD)
    assert json.loads((tmp_path / "killed" / "ensemble.json").read_text())["step"] == 3
    shutil.copytree(tmp_path / "killed", tmp_path / "copy")
    whole = ok(ranks[0]["whole"])
    for seen in launch(worker, tmp_path, kill="resume", preload=PRELOAD):
        assert_identical(ok(seen), whole)
    alone = outcome(train(checkpoint_dir=tmp_path / "copy", **CK, resume=True))
    assert_identical(alone, whole)
