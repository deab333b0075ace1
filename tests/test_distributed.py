"""Data-parallel training: 2 gloo processes on the CPU train what one process trains on the
same global batch (to rounding), stop together naming a failed rank, resume bit for bit,
and leave checkpoints, the lock, the progress bar and the callback to rank 0.

The ranks are forked from a fork server that imported torch, DDP's dependencies and this
module once (a fork of the test process itself could inherit locks held by its threads and
hang); each rank runs every scenario in turn on one process group and writes what it saw
to a file that the tests below read.
"""

import io
import os
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
from vecinterp.training import distributed, loop, train

F64 = torch.float64
CFG = tiny_cfg()  # d_in=3, d_out=5, n_ctx=7
MAP = torch.linspace(-1.0, 1.0, 15, dtype=F64).reshape(3, 5)
# DDP's constructor imports torch._dynamo (hundreds of modules, seconds): once in the server
PRELOAD = ["torch._dynamo", __name__]
pytestmark = needs_gloo


def make_batch(step: int, gen: torch.Generator):
    """5 sequences: rank 0 trains on rows 0-2, rank 1 on rows 3-4. Row i scores positions
    >= i, so the shards use 15 and 5 positions (a mean of the two shards' means is not the
    batch's mean); at even steps rows 3-4 score none (rank 1's share uses no position).
    Targets are NaN where unscored."""
    x = torch.randn(5, 6, 3, generator=gen, dtype=F64)
    mask = torch.arange(6).expand(5, 6) >= torch.arange(5)[:, None]
    if step % 2 == 0:
        mask[3:] = False
    targets = torch.where(mask[..., None], x @ MAP, torch.nan)
    return x, targets, mask


EVAL = [make_batch(1, torch.Generator().manual_seed(99)) for _ in range(2)]
FROZEN = ["unembed.b_U", "blocks.0.attn.W_Q"]
KW = dict(steps=10, lr=3e-2, grad_clip=0.5, ema_decay=0.8, ema_start=2, eval_data=EVAL,
          eval_every=4, progress=False, device="cpu")  # fmt: skip


def start_model() -> vi.HookedVectorTransformer:
    return random_model(CFG, scale=0.1)


def failing_at(step: int, rank: int, kill: bool = False):
    """make_batch, but it raises (or kills its process) at ``step`` on ``rank``."""

    def data(s: int, gen: torch.Generator):
        if s == step and dist.get_rank() == rank:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise KeyError(f"no batch {s} here")
        return make_batch(s, gen)

    return data


def outcome(result: vi.training.TrainResult) -> dict:
    history = {f: getattr(result.history, f) for f in ("train_loss", "grad_norm", "eval_loss")}
    return {
        "model": result.model.state_dict(),
        "raw": result.raw_model.state_dict(),
        "history": history,
        "checkpoint": None if result.checkpoint is None else result.checkpoint.name,
    }


def scenarios(rank: int, out: Path) -> dict:
    """Everything the ranks run on one process group (initialised by the test)."""
    seen: dict = {}
    seen["ddp"] = attempt(lambda: outcome(train(start_model(), make_batch, **KW)))
    seen["frozen"] = attempt(lambda: outcome(train(start_model(), make_batch, **KW,
                                                   frozen=FROZEN)))  # fmt: skip

    calls = {"write": 0, "lock": 0, "callback": []}
    write, lock = loop.write_checkpoint, loop.own_directory

    def counting(original, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return original(*args, **kwargs)

        return wrapper

    loop.write_checkpoint = counting(write, "write")
    loop.own_directory = counting(lock, "lock")
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        ck = dict(KW, checkpoint_dir=out / "ck", checkpoint_every=4)
        seen["whole"] = attempt(lambda: outcome(train(
            start_model(), make_batch, **dict(ck, progress=True),
            callback=lambda s, m: calls["callback"].append(s))))  # fmt: skip
        seen["progress"] = sys.stderr.getvalue()
    finally:
        sys.stderr = stderr
        loop.write_checkpoint, loop.own_directory = write, lock
    seen["calls"] = calls

    crash = dict(KW, checkpoint_dir=out / "crash", checkpoint_every=4)
    seen["failed"] = attempt(lambda: train(start_model(), failing_at(6, 1), **crash))
    seen["resumed"] = attempt(lambda: outcome(train(start_model(), make_batch, **crash,
                                                     resume=True)))  # fmt: skip

    def per_rank(step: int, gen: torch.Generator):
        x, t, m = make_batch(step, gen)
        return x + dist.get_rank(), t, m

    seen["mismatch"] = attempt(lambda: train(start_model(), per_rank, **KW))
    seen["config"] = attempt(lambda: train(start_model(), make_batch, **dict(KW, steps=9 + rank)))
    with distributed.one_process():
        kw = dict(KW, seed=rank)
        seen["one_process"] = attempt(lambda: outcome(train(start_model(), make_batch, **kw)))
    return seen


def worker(rank: int, out: Path, kill: str | None) -> None:
    init_group(rank, out, kill)
    if kill:  # the killed run and its resume, on the group initialised here
        kw = dict(KW, checkpoint_dir=out / "killed", checkpoint_every=4)
        data = failing_at(6, 1, kill=True) if kill == "kill" else make_batch
        seen = attempt(lambda: outcome(train(start_model(), data, **kw, resume=True)))
        dist.destroy_process_group()
        torch.save(seen, out / f"rank{rank}.pt")
        return
    seen = leave_group_for_torchrun(rank, lambda: scenarios(rank, out))
    # torchrun's variables: train initialises the process group itself, and destroys it
    seen["env"] = attempt(lambda: outcome(train(start_model(), make_batch, **KW)))
    seen["env_left_initialised"] = dist.is_initialized()
    torch.save(seen, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return launch(worker, tmp_path_factory.mktemp("ddp"), preload=PRELOAD)


@pytest.fixture(scope="module")
def single() -> dict:
    return outcome(train(start_model(), make_batch, **KW))


def ok(seen: dict) -> dict:
    assert "error" not in seen, seen.get("error")
    return seen["ok"]


def assert_same(a: dict, b: dict, exact: bool) -> None:
    for part in ("model", "raw"):
        for name, p in a[part].items():
            if exact:
                assert torch.equal(p, b[part][name]), (part, name)
            elif not name.endswith("b_K"):
                # b_K's true gradient is 0 (softmax ignores a constant per row): it receives
                # rounding noise, which Adam's g / sqrt(v) turns into lr-sized steps, so only
                # the other parameters agree to rounding (the outputs too, checked below)
                torch.testing.assert_close(p, b[part][name], rtol=1e-9, atol=1e-12, msg=name)
    for field, values in a["history"].items():
        if exact:
            assert values == b["history"][field], field
        else:
            torch.testing.assert_close(
                torch.tensor(values), torch.tensor(b["history"][field]), rtol=1e-9, atol=0
            )


def as_model(state: dict) -> vi.HookedVectorTransformer:
    model = vi.HookedVectorTransformer(CFG, dtype=F64)
    model.load_state_dict(state)
    return model


# --- equality with one process ------------------------------------------------------------


def test_two_ranks_train_what_one_process_trains_on_the_global_batch(ranks, single):
    """Unequal shards (3 and 2 rows), unequal and zero mask counts per shard, clipping,
    a weight average and evaluation: the same model, losses and gradient norms to rounding."""
    first, second = ok(ranks[0]["ddp"]), ok(ranks[1]["ddp"])
    assert_same(first, second, exact=True)  # every rank ends with the same model
    assert_same(first, single, exact=False)
    assert max(single["history"]["grad_norm"]) > KW["grad_clip"]  # clipping was exercised
    x = make_batch(0, torch.Generator().manual_seed(7))[0]
    torch.testing.assert_close(as_model(first["model"])(x), as_model(single["model"])(x),
                               rtol=1e-9, atol=1e-12)  # fmt: skip


def test_two_ranks_keep_frozen_parameters_as_one_process_does(ranks):
    """train(frozen=...) under DDP: the frozen parameters keep their bits on every rank
    (DDP's reducer skips parameters that take no gradient), the others train as one
    process trains them."""
    first, second = ok(ranks[0]["frozen"]), ok(ranks[1]["frozen"])
    assert_same(first, second, exact=True)
    assert_same(first, outcome(train(start_model(), make_batch, **KW, frozen=FROZEN)), exact=False)
    start = start_model().state_dict()
    for part in ("model", "raw"):
        for name, p in first[part].items():
            assert torch.equal(p, start[name]) == (name in FROZEN), (part, name)


def test_a_mean_of_the_shards_means_would_differ(single):
    """The invariant the loss scaling keeps: the shards' masks use 15 and 5 positions, so
    averaging the two shards' losses (what plain DDP on mean losses computes) is not the
    batch's loss."""
    model = as_model(start_model().state_dict()).requires_grad_(False)
    x, t, mask = make_batch(1, torch.Generator().manual_seed(0))
    whole = vi.masked_mse(model(x), t, mask)
    shards = [vi.masked_mse(model(x[a:b]), t[a:b], mask[a:b]) for a, b in ((0, 3), (3, 5))]
    assert abs(float(sum(shards) / 2 - whole)) > 1e-3 * float(whole)
    counts = [int(mask[a:b].sum()) for a, b in ((0, 3), (3, 5))]
    weighted = sum(s * c for s, c in zip(shards, counts)) / sum(counts)
    torch.testing.assert_close(weighted, whole, rtol=1e-12, atol=0)


def test_train_initialises_and_destroys_the_group_under_torchrun_variables(ranks):
    for seen in ranks:
        assert_same(ok(seen["env"]), ok(ranks[0]["ddp"]), exact=True)
        assert seen["env_left_initialised"] is False


def test_one_process_trains_each_rank_on_its_own(ranks):
    for rank, seen in enumerate(ranks):
        alone = outcome(train(start_model(), make_batch, **dict(KW, seed=rank)))
        assert_same(ok(seen["one_process"]), alone, exact=True)
    first, second = ok(ranks[0]["one_process"]), ok(ranks[1]["one_process"])
    assert not torch.equal(first["model"]["embed.W_E"], second["model"]["embed.W_E"])


# --- rank 0's duties ----------------------------------------------------------------------


def test_rank_0_alone_locks_writes_checkpoints_shows_progress_and_calls_back(ranks, tmp_path):
    zero, one = ranks[0]["calls"], ranks[1]["calls"]
    assert (zero["lock"], zero["write"]) == (1, 3)  # steps 4, 8 and the last, 10
    assert (one["lock"], one["write"]) == (0, 0)
    assert zero["callback"] == list(range(10)) and one["callback"] == []
    assert "train" in ranks[0]["progress"] and "10/10" in ranks[0]["progress"]
    assert ranks[1]["progress"] == ""
    # both ranks name the same newest checkpoint; it holds every rank's RNG state
    assert ok(ranks[0]["whole"])["checkpoint"] == ok(ranks[1]["whole"])["checkpoint"]
    assert_same(ok(ranks[0]["whole"]), ok(ranks[0]["ddp"]), exact=True)


# --- failures and resume ------------------------------------------------------------------


def test_a_failure_on_one_rank_stops_every_rank_naming_it(ranks):
    assert_rank_1_failure_stopped_every_rank(ranks, "vecinterp.train", step=6)


def test_resume_on_two_ranks_after_a_failure_is_bit_identical(ranks):
    for seen in ranks:
        assert_same(ok(seen["resumed"]), ok(ranks[0]["whole"]), exact=True)


def test_resume_after_a_rank_is_killed_is_bit_identical(ranks, tmp_path):
    """Rank 1 is SIGKILLed at step 6 (after the checkpoint of step 4); two fresh ranks
    resume from it and end where the uninterrupted run did."""
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        launch(worker, tmp_path, kill="kill", preload=PRELOAD)
    for seen in launch(worker, tmp_path, kill="resume", preload=PRELOAD):
        assert_same(ok(seen), ok(ranks[0]["whole"]), exact=True)


def test_ranks_that_draw_different_batches_are_stopped(ranks):
    for seen in ranks:
        error = seen["mismatch"]["error"]
        assert error["type"] == "ValueError"
        assert "make_batch(0, ...): the ranks drew different global batches" in error["message"]


def test_ranks_given_different_arguments_are_stopped(ranks):
    for seen in ranks:
        error = seen["config"]["error"]
        assert error["type"] == "ValueError"
        assert "rank 1: steps=10, rank 0: steps=9" in error["message"]
