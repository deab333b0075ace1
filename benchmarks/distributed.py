"""Data-parallel training on CPU processes: steps/s of ``vi.train`` with 1 and 2 gloo ranks.

Configuration: the affine-recurrence paper's model (``affine_recurrence.MODEL_CONFIG_KWARGS``,
3.18 M parameters), fp32, AdamW, sequences of 14 positions, global batches of 16 and 128
(each rank trains on half the rows when there are two). Every rank is a process forked
from a fork server, with one torch intra-op thread; the one-process run is also timed with
two threads, the other way to use two cores. Each run trains ``--warmup`` steps, then
``--steps`` timed ones; steps/s is read from the callback's clock on rank 0 and the best
of ``--repeats`` runs is kept (the least disturbed by other work on the machine).

The gloo all-reduce's latency (one float) and its time on a gradient-sized buffer are
measured too: they bound what a second rank can gain per step.

Run: python benchmarks/distributed.py [--steps 30] [--warmup 5] [--batches 16 128]
     [--repeats 2]
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _ranks import launch, set_torchrun_env

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

LENGTH = 14


def train_worker(rank: int, world: int, port: int, batch: int, args, threads: int, out: Path):
    torch.set_num_threads(threads)
    if world > 1:  # what torchrun sets: vi.train initialises the group and destroys it
        set_torchrun_env(rank, world, port)
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS))
    stamps: list[float] = []

    def make_batch(step: int, gen: torch.Generator):
        return ar.generate(batch, length=LENGTH, generator=gen)

    vi.train(model, make_batch, steps=args.warmup + args.steps, lr=1e-4, progress=False,
             device="cpu", callback=lambda s, m: stamps.append(time.perf_counter()))  # fmt: skip
    if rank == 0:
        timed = stamps[args.warmup - 1 :]
        (out / "rate").write_text(str((len(timed) - 1) / (timed[-1] - timed[0])))


def comm_worker(rank: int, world: int, port: int, numel: int, out: Path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    times = {}
    for name, size, reps in (("1 float", 1, 200), ("gradient", numel, 10)):
        buf = torch.ones(size)
        dist.all_reduce(buf)
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(buf)
        times[name] = (time.perf_counter() - start) / reps
    dist.destroy_process_group()
    if rank == 0:
        (out / "comm").write_text(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS))
    numel = sum(p.numel() for p in model.parameters())
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}, params: {numel:,}")
    comm = json.loads((launch(comm_worker, 2, numel) / "comm").read_text())
    timings = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in comm.items())
    print(f"gloo all_reduce, 2 ranks: {timings}")
    print(f"{'batch':>6} {'1 rank 1 thread':>16} {'1 rank 2 threads':>17} {'2 ranks':>9}"
          f" {'speed-up':>9}")  # fmt: skip
    for batch in args.batches:
        rates = {}
        for label, world, threads in (("1x1", 1, 1), ("1x2", 1, 2), ("2x1", 2, 1)):
            best = 0.0
            for _ in range(args.repeats):
                out = launch(train_worker, world, batch, args, threads)
                best = max(best, float((out / "rate").read_text()))
            rates[label] = best
        speedup = rates["2x1"] / rates["1x1"]
        print(f"{batch:>6} {rates['1x1']:>12.1f} /s {rates['1x2']:>13.1f} /s "
              f"{rates['2x1']:>6.1f} /s {speedup:>8.2f}x")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
