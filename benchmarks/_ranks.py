"""What the multi-process benchmarks (``distributed.py``, ``ensemble_distributed.py``)
share: a free port, torchrun's variables for a worker, and the launch of workers forked
from a clean server."""

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_torchrun_env(rank: int, world: int, port: int) -> None:
    """What torchrun sets: vi.train and train_ensemble then initialise the process group
    themselves (and destroy it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))  # fmt: skip


def launch(fn: Callable[..., None], world: int, *args: object) -> Path:
    """Run ``fn(rank, world, port, *args, out)`` on ``world`` processes forked from a
    clean server that imported torch, torch._dynamo (DDP's and AdamW's constructors import
    it) and the running script once (not from this process, whose OpenMP threads a fork
    would inherit locked); returns ``out``, a fresh folder for their results."""
    out = Path(tempfile.mkdtemp())
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch._dynamo", "__main__"])
    mp.start_processes(fn, args=(world, free_port(), *args, out), nprocs=world,
                       start_method="forkserver")  # fmt: skip
    return out
