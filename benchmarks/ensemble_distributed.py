"""Ensembles across ranks: member-updates/s of ``vi.train_ensemble`` with K members on one
process (1 or 2 intra-op threads) and split over 2 gloo processes of one thread each.

Configuration: the retrieval task's FULL model (``vecinterp.tasks.retrieval_claims``: 4
attention-only layers of 4 heads, d_model 64), batch 128, the recipe of ``train_model``
(AdamW lr 3e-3, cosine decay to lr/10, weight decay 0.1); member ``i`` seeded with ``i``.
K = 8 splits 4 + 4 over the two ranks, K = 5 splits 3 + 2 (the slower rank sets the
pace: at most 5/3 = 1.67x). Every process is forked from a fork server; each run trains
``--warmup`` steps, then ``--steps`` timed ones, clocked on rank 0 when it draws a step's
data (the ranks move in lock step); the best of ``--repeats`` runs is kept (the least
disturbed by other work on the machine). The CPU time per member-update, summed over the
ranks (each process's, all its threads), shows what splitting costs whatever the load:
equal CPU per member-update means a second free core gives up to 2x. The gloo all-reduce
of one step's check (a failure flag per rank and 7 numbers per member) is timed too.

Run: python benchmarks/ensemble_distributed.py [--ks 8 5] [--steps 10] [--warmup 2]
     [--repeats 2]

Measured 2026-11-23 on the shared 2-core VM (``--steps 10 --warmup 2 --repeats 3``, about
5 minutes), while another job kept one core busy (load average 1.5 before, 3.0 after):

===  =========  ===============  ================  =========  ==========  ==========
K    check      1 proc 1 thread  1 proc 2 threads  2 procs    2p / 1x1    2p / 1x2
===  =========  ===============  ================  =========  ==========  ==========
8    0.95 ms    15.7 /s          3.1 /s            16.1 /s    1.02x       5.24x
5    1.32 ms    18.7 /s          2.0 /s            17.9 /s    0.96x       9.03x
===  =========  ===============  ================  =========  ==========  ==========

(member-updates/s). CPU ms per member-update, summed over the ranks: K = 8: 63.5 on one
process, 62.3 on two; K = 5: 52.7 and 57.2 (runs of one process vary by about 10% on this
VM). Splitting thus costs no measurable CPU: the per-step check is about 1 ms of latency
per step, shared by the rank's members. With one core free, the two ranks, which move in
lock step, got one core between them, hence no speed-up; two threads in one process were
5-9x slower than one (OpenMP's threads wait on each other when a core is taken). An
earlier run under a load of 3-5 gave 0.70x (K = 8) and 0.95x (K = 5). The speed-up on free
cores or GPUs (up to 2x here, 5/3 for K = 5) is not measured on this VM.
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
from vecinterp.tasks import retrieval as R
from vecinterp.tasks.retrieval_claims import FULL, model_config


def train_worker(rank: int, world: int, port: int, k: int, args, threads: int, out: Path):
    torch.set_num_threads(threads)
    if world > 1:  # what torchrun sets: train_ensemble initialises the group and destroys it
        set_torchrun_env(rank, world, port)
    s = FULL
    cfg = model_config(s, ic=True)
    models = [vi.HookedVectorTransformer(cfg, seed=i) for i in range(k)]
    kw = dict(n_chains=s.n_chains, dim=s.dim, implicit_curriculum=True)
    stamps: dict[int, tuple[float, float]] = {}  # step -> (wall, CPU) when its data are drawn

    def make_batch(step: int, gen: torch.Generator):
        if step not in stamps:  # this rank's first member of the step
            stamps[step] = (time.perf_counter(), time.process_time())
        return R.generate(s.batch_size, s.depth, generator=gen, **kw)

    first, last = args.warmup, args.warmup + args.steps  # timed: steps first .. last - 1
    vi.train_ensemble(models, make_batch, steps=last + 1, lr=s.lr, weight_decay=0.1,
                      schedule="cosine", min_lr=s.lr / 10, seed=range(k), progress=False,
                      device="cpu")  # fmt: skip
    wall = stamps[last][0] - stamps[first][0]
    cpu = stamps[last][1] - stamps[first][1]
    (out / f"rank{rank}").write_text(json.dumps({"wall": wall, "cpu": cpu}))


def comm_worker(rank: int, world: int, port: int, k: int, out: Path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    buf = torch.zeros(world + 7 * k, dtype=torch.float64)
    dist.all_reduce(buf)
    start = time.perf_counter()
    for _ in range(200):
        dist.all_reduce(buf)
    elapsed = (time.perf_counter() - start) / 200
    dist.destroy_process_group()
    if rank == 0:
        (out / "comm").write_text(json.dumps(elapsed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[8, 5])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    print(f"{'K':>3} {'check':>9} {'1 proc 1 thread':>16} {'1 proc 2 threads':>17} "
          f"{'2 procs':>10} {'2 procs / 1x1':>14} {'2 procs / 1x2':>14}")  # fmt: skip
    for k in args.ks:
        check = json.loads((launch(comm_worker, 2, k) / "comm").read_text())
        rates, cpu = {}, {}
        for label, world, threads in (("1x1", 1, 1), ("1x2", 1, 2), ("2x1", 2, 1)):
            rates[label], cpu[label] = 0.0, float("inf")
            for _ in range(args.repeats):
                out = launch(train_worker, world, k, args, threads)
                ranks = [json.loads((out / f"rank{r}").read_text()) for r in range(world)]
                rates[label] = max(rates[label], k * args.steps / ranks[0]["wall"])
                used = sum(r["cpu"] for r in ranks) / (k * args.steps)
                cpu[label] = min(cpu[label], used)
        print(f"{k:>3} {check * 1e3:>6.2f} ms {rates['1x1']:>12.1f} /s {rates['1x2']:>13.1f} /s "
              f"{rates['2x1']:>7.1f} /s {rates['2x1'] / rates['1x1']:>13.2f}x "
              f"{rates['2x1'] / rates['1x2']:>13.2f}x", flush=True)  # fmt: skip
        print("    CPU ms per member-update: " + ", ".join(
            f"{label} {value * 1e3:.1f}" for label, value in cpu.items()), flush=True)  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
