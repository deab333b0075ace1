"""Ensembles: ``vi.train_ensemble`` with K members against K sequential ``vi.train`` runs of
the same models, seeds, data and recipe.

Models and data (fresh batches every step, member ``i`` seeded with ``i``):

- ``retrieval``: the retrieval task's FULL settings (``vecinterp.tasks.retrieval_claims``:
  4 attention-only layers of 4 heads, d_model 64, N = 4 chains of depth 2), batch 128, the
  recipe of ``train_model`` (AdamW lr 3e-3 with a cosine decay to lr/10, weight decay 0.1).
- ``affine``: the affine-recurrence paper's model (``MODEL_CONFIG_KWARGS``: 3 layers, 8
  heads, d_model 128, d_mlp 3072), ``PAPER_RECIPE`` (batch 16, lr 1e-4, weight decay
  0.01), sequences of length 14.
- ``affine-mixed``: the same with the task's own random lengths (3 to 14, drawn by each
  member's generator): the ensemble pads every member to the step's longest sequence.

Each figure times a whole call (set-up and ``--steps`` updates, no checkpoints, no
evaluation); the two ways alternate round by round and each figure is the best of
``--rounds``. Throughput is member-updates per second; the ratio is sequential time over
ensemble time (> 1: the ensemble is faster). Both must end with the same weights (to
rounding: float32, so the check is loose; tests/test_ensemble.py checks float64 to 1e-10).

What to expect: on a GPU, one model of these sizes leaves the device mostly idle (launch
and per-op costs dominate), so K members batched into the same number of kernel launches
cost little more than one until the device is busy (DESIGN.md's target: 64 paper-size
members in <= 2x the time of one). On a CPU the matrix products of one model already keep
a core busy: batching does the same arithmetic in fewer, larger calls, so expect a ratio
near 1 (a little above where per-op overhead matters, below with padding).

``--sync-every`` (default 50, both ways) is how often the losses are read on the host
(``vi.train``'s and ``vi.train_ensemble``'s ``sync_every``): 1 waits for the device after
every step. On a CPU it changes nothing measurable; on a GPU it lets the host queue the
next steps while the device computes.

Run: python benchmarks/ensemble.py [--device cpu|cuda] [--ks 1 4 16] [--steps 3]
     [--rounds 2] [--threads 1] [--tasks retrieval affine affine-mixed] [--sync-every 50]
(the default tasks are retrieval and affine: about 3 minutes on a loaded 2-core VM)
"""

import argparse
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar
from vecinterp.tasks import retrieval as R
from vecinterp.tasks.retrieval_claims import FULL, model_config


def task(name: str) -> tuple[vi.VectorTransformerConfig, Callable[..., Any], dict[str, Any]]:
    """``(config, make_batch, recipe)`` of one benchmarked task."""
    if name == "retrieval":
        s = FULL
        kw = dict(n_chains=s.n_chains, dim=s.dim, implicit_curriculum=True)
        recipe = dict(lr=s.lr, weight_decay=0.1, schedule="cosine", min_lr=s.lr / 10)
        return (
            model_config(s, ic=True),
            lambda step, gen: R.generate(s.batch_size, s.depth, generator=gen, **kw),
            recipe,
        )
    length = None if name == "affine-mixed" else 14
    recipe = dict(lr=ar.PAPER_RECIPE["lr"], weight_decay=ar.PAPER_RECIPE["weight_decay"])
    return (
        vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS),
        lambda step, gen: ar.generate(16, dim=40, length=length, generator=gen),
        recipe,
    )


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of ``fn()``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(
    name: str, k: int, steps: int, rounds: int, device: torch.device, sync_every: int = 50
) -> dict:
    cfg, make_batch, recipe = task(name)
    models = [vi.HookedVectorTransformer(cfg, seed=s, device=device) for s in range(k)]
    common = dict(steps=steps, progress=False, device=device, sync_every=sync_every, **recipe)

    def ensemble() -> list:
        return vi.train_ensemble(models, make_batch, seed=range(k), **common).models

    def sequential() -> list:
        return [vi.train(m, make_batch, seed=i, **common).model for i, m in enumerate(models)]

    best = {"ensemble": (float("inf"), float("inf")), "sequential": (float("inf"),) * 2}
    outputs: dict[str, list] = {}
    for _ in range(rounds):
        for label, fn in (("ensemble", ensemble), ("sequential", sequential)):
            wall, cpu, outputs[label] = timed(fn, device)
            best[label] = (min(best[label][0], wall), min(best[label][1], cpu))
    diff = max(
        float((a.W_U - b.W_U).detach().abs().max())
        for a, b in zip(outputs["ensemble"], outputs["sequential"], strict=True)
    )
    assert diff < 1e-3, f"{name}, K={k}: the ensemble's weights differ by {diff}"
    (e_wall, e_cpu), (s_wall, s_cpu) = best["ensemble"], best["sequential"]
    return dict(
        e_wall=e_wall, s_wall=s_wall, e_cpu=e_cpu, s_cpu=s_cpu, diff=diff,
        e_rate=k * steps / e_wall, s_rate=k * steps / s_wall,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="train_ensemble vs K sequential vi.train")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--tasks", nargs="+", default=["retrieval", "affine"],
        choices=["retrieval", "affine", "affine-mixed"],
    )  # fmt: skip
    parser.add_argument("--sync-every", type=int, default=50)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {args.steps} steps, best of "
        f"{args.rounds} rounds, sync_every={args.sync_every}"
    )
    # warm-up: the first optimizer built imports torch's compiler stack (seconds)
    cfg, make_batch, recipe = task("retrieval")
    vi.train(vi.HookedVectorTransformer(cfg, device=device), make_batch, steps=1,
             progress=False, device=device, **recipe)  # fmt: skip
    print(
        "| model | K | ensemble s | sequential s | ensemble CPU s | sequential CPU s "
        "| member-steps/s ensemble | sequential | ratio (wall) | ratio (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.tasks:
        for k in args.ks:
            r = measure(name, k, args.steps, args.rounds, device, args.sync_every)
            print(
                f"| {name} | {k} | {r['e_wall']:.2f} | {r['s_wall']:.2f} | {r['e_cpu']:.2f} "
                f"| {r['s_cpu']:.2f} | {r['e_rate']:.1f} | {r['s_rate']:.1f} "
                f"| {r['s_wall'] / r['e_wall']:.2f}x | {r['s_cpu'] / r['e_cpu']:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
