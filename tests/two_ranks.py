"""What the 2-rank test files (``test_distributed.py``, ``test_ensemble_distributed.py``)
share: launching a worker on ``WORLD`` gloo ranks with a deadline, the worker's process
group, torchrun's variables for a run that initialises its own group, a free port, and
how a rank records what it raised."""

import datetime
import faulthandler
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vecinterp.training import distributed

WORLD = 2
LIMIT = 300  # seconds for one launch of the ranks (they take about 5-50 on a loaded VM)
START = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"

needs_gloo = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, out: Path, tag: object) -> None:
    """One torch thread, a traceback if the rank hangs, and a gloo group on a file store
    (``out/store-{tag}``: one store per launch)."""
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(LIMIT - 10, exit=True)  # a hung rank shows where
    store = dist.FileStore(str(out / f"store-{tag}"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=LIMIT))  # fmt: skip


def leave_group_for_torchrun(rank: int, run: Callable[[], Any]) -> Any:
    """Run ``run()`` on the group, agree on a port (chosen by rank 0 just before use:
    another program could take a port chosen earlier), destroy the group, and set
    torchrun's variables, so that the next run initialises a group itself."""
    try:
        result = run()
        port = distributed.Ranks(torch.device("cpu"), created=False).share(
            free_port() if rank == 0 else None
        )
    finally:
        dist.destroy_process_group()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))  # fmt: skip
    return result


def launch(
    worker: Callable[..., None], out: Path, kill: str | None = None, *, preload: list[str]
) -> list[dict]:
    """Run ``worker(rank, out, kill)`` on ``WORLD`` ranks (``preload``: modules the fork
    server imports once) and return what each saved in ``out/rank{r}.pt``; fail (rather
    than hang) if they take over ``LIMIT`` seconds."""
    out.mkdir(exist_ok=True)
    if START == "forkserver":
        mp.get_context(START).set_forkserver_preload(preload)
    context = mp.start_processes(worker, args=(out, kill), nprocs=WORLD, join=False,
                                 start_method=START)  # fmt: skip
    deadline = time.monotonic() + LIMIT
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish in {LIMIT} s")
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def failure(err: Exception) -> dict:
    return {
        "type": type(err).__name__,
        "message": str(err),
        "notes": list(getattr(err, "__notes__", [])),
        "rank": getattr(err, "rank", None),
    }


def attempt(fn: Callable[[], Any]) -> dict:
    try:
        return {"ok": fn()}
    except Exception as err:  # the tests read what each rank raised
        return {"error": failure(err)}


def assert_rank_1_failure_stopped_every_rank(ranks: list[dict], caller: str, step: int) -> None:
    """Rank 1's data raised ``KeyError('no batch {step} here')`` at ``step``: rank 1
    re-raises it with a note naming itself, rank 0 raises RankFailedError naming rank 1."""
    own = ranks[1]["failed"]["error"]
    assert own["type"] == "KeyError" and f"no batch {step} here" in own["message"]
    if sys.version_info >= (3, 11):  # exceptions carry notes
        note = f"{caller}: raised on rank 1 of 2 at step {step}; every rank stopped"
        assert own["notes"] == [note]
    other = ranks[0]["failed"]["error"]
    assert other["type"] == "RankFailedError" and other["rank"] == 1
    assert other["message"] == (
        f"rank 1 of 2 failed at step {step} (KeyError: 'no batch {step} here'); every rank stopped"
    )
