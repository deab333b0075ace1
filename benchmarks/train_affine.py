"""Training time to eval MSE <= 1e-4 on the affine-recurrence paper's model: the faster
recipe (``affine_recurrence.FAST_RECIPE``) against the paper's (``PAPER_RECIPE``: 100k
steps, batch 16, AdamW lr 1e-4), both run by ``vecinterp.train`` on the same machine.

Neither recipe is run to the end by default (the paper's would take hours on 2 cores).
Two modes:

``--mode steps`` (default, a few minutes): the time per step of each recipe is measured in
interleaved rounds (``--rounds``; each round times ``--probe-steps`` steps of the paper's
recipe, then ``--probe-steps // 4`` of the fast one, each from a fresh model, so a busy
machine slows both alike), and the figures are **extrapolated**: the paper's recipe to its
100k steps, the fast one to the number of steps it needed to reach the target in its full
training run, read from that run's history (``--history``, default the shipped
checkpoint's ``history.json``: the first evaluation at or below 1e-4). The time per step
does not depend on how far training has got (same shapes, same lengths distribution).

``--mode full``: the fast recipe is trained in full here; its figure is the wall time
until the first evaluation (every ``--eval-every`` steps, on ``fixed_eval_set(24, 64,
seed=10_000)``) at or below the target, evaluations included, with probes of the paper's
recipe spread over the run (every ``--probe-every`` fast steps) whose time is subtracted
from the fast run's clock. About 30 minutes on an idle 2-core machine. ``--steps``,
``--batch-size``, ``--lr``, ``--warmup-steps``, ``--schedule``, ``--min-lr``,
``--ema-decay`` and ``--ema-start`` override the recipe, which is how the
recipe trials in ``benchmarks/README.md`` were run; ``--probe-every 0`` times the paper's
recipe once, before training.

Whether the paper's recipe itself reaches 1e-4 in 100k steps is the paper's claim, not
measured here.

Run: python benchmarks/train_affine.py [--mode steps|full] [--threads 2] [--json out.json]
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

TARGET = 1e-4
OVERRIDES = (("batch_size", int), ("lr", float), ("warmup_steps", int), ("schedule", str),
             ("min_lr", float), ("ema_decay", float), ("ema_start", int))  # fmt: skip
"""Recipe keys that full mode's command line can override, with their types."""
HISTORY = ar.reference_path("fast") / "history.json"


def train_kwargs(recipe: dict) -> dict:
    """A recipe dict of the task module as keyword arguments of ``vecinterp.train``."""
    keys = ("lr", "weight_decay", "warmup_steps", "schedule", "min_lr", "grad_clip",
            "ema_decay", "ema_start")  # fmt: skip
    return {k: recipe[k] for k in keys if k in recipe}


def probe(cfg: vi.VectorTransformerConfig, recipe: dict, steps: int, seed: int) -> float:
    """Seconds for ``steps`` steps of ``recipe`` on a fresh model."""
    bs = recipe["batch_size"]
    kwargs = train_kwargs(recipe)
    kwargs["warmup_steps"] = min(kwargs.get("warmup_steps", 0), steps)
    model = vi.HookedVectorTransformer(cfg, seed=seed)
    start = time.perf_counter()
    vi.train(
        model,
        lambda s, g: ar.generate(bs, generator=g),
        steps=steps,
        seed=seed,
        progress=False,
        **kwargs,
    )
    return time.perf_counter() - start


def steps_to_target(history: Path) -> int | None:
    """The first evaluated step with an eval MSE <= TARGET in a ``history.json``."""
    h = json.loads(history.read_text())
    pairs = zip(h["eval_steps"], h["eval_loss"], strict=True)
    return next((s for s, v in pairs if v <= TARGET), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("steps", "full"), default="steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--history", type=Path, default=HISTORY)
    parser.add_argument("--steps", type=int, help="full mode: override FAST_RECIPE's steps")
    for key, kind in OVERRIDES:
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind, help=f"full mode: {key}")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--probe-every", type=int, default=1000)
    parser.add_argument("--probe-steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
    figures = steps_mode(cfg, args) if args.mode == "steps" else full_mode(cfg, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


def machine() -> dict:
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
    }


def steps_mode(cfg: vi.VectorTransformerConfig, args: argparse.Namespace) -> dict:
    hit = steps_to_target(args.history)
    if hit is None:
        raise SystemExit(f"{args.history} never reaches eval MSE <= {TARGET:g}")
    paper, fast = ar.PAPER_RECIPE, ar.FAST_RECIPE
    n_paper, n_fast = args.probe_steps, max(1, args.probe_steps // 4)
    probe(cfg, paper, 5, seed=0)  # warm-up: first-call costs (imports, allocator)
    t_paper, t_fast = [], []
    for r in range(args.rounds):
        t_paper.append(probe(cfg, paper, n_paper, seed=r + 1) / n_paper)
        t_fast.append(probe(cfg, fast, n_fast, seed=r + 1) / n_fast)
        print(f"round {r}: paper {t_paper[-1]:.4f} s/step, fast {t_fast[-1]:.4f} s/step")
    med_p, med_f = statistics.median(t_paper), statistics.median(t_fast)
    paper_total = med_p * paper["steps"]
    fast_total = med_f * hit
    ratios = [p * paper["steps"] / (f * hit) for p, f in zip(t_paper, t_fast, strict=True)]
    figures = {
        **machine(),
        "mode": "steps",
        "history": str(args.history),
        "fast_steps_to_target": hit,
        "paper_seconds_per_step": t_paper,
        "fast_seconds_per_step": t_fast,
        "paper_extrapolated_seconds": paper_total,
        "fast_extrapolated_seconds_to_target": fast_total,
        "speedup_median": paper_total / fast_total,
        "speedup_per_round": ratios,
    }
    print(f"\nmachine: {figures['machine']}, torch {torch.__version__}")
    print(f"{'recipe':<30}{'steps':>8}{'batch':>7}{'s/step (median)':>17}{'wall (s)':>10}")
    print(f"{'paper, 100k steps':<30}{paper['steps']:>8}{paper['batch_size']:>7}"
          f"{med_p:>17.4f}{paper_total:>10.0f}")  # fmt: skip
    print(f"{'fast, steps to eval <= 1e-4':<30}{hit:>8}{fast['batch_size']:>7}"
          f"{med_f:>17.4f}{fast_total:>10.0f}")  # fmt: skip
    print(
        f"speed-up {figures['speedup_median']:.2f}x (per round: "
        + ", ".join(f"{x:.2f}" for x in ratios)
        + "); both extrapolated from the measured time per step"
    )
    return figures


def full_mode(cfg: vi.VectorTransformerConfig, args: argparse.Namespace) -> dict:
    fast = dict(ar.FAST_RECIPE)
    if args.steps is not None:
        fast["steps"] = args.steps
        fast["warmup_steps"] = min(fast["warmup_steps"], args.steps // 10)
    for key, _ in OVERRIDES:
        if getattr(args, key) is not None:
            fast[key] = getattr(args, key)
    eval_set = ar.fixed_eval_set(24, 64, seed=10_000)
    bs = fast["batch_size"]

    paper = ar.PAPER_RECIPE
    probes: list[tuple[int, float]] = []  # (fast step after which it ran, seconds)
    probe(cfg, paper, 5, seed=0)  # warm-up: first-call costs (imports, allocator)
    probes.append((-1, probe(cfg, paper, args.probe_steps, seed=1)))

    def callback(step: int, metrics: dict) -> None:
        if args.probe_every and (step + 1) % args.probe_every == 0:
            probes.append((step, probe(cfg, paper, args.probe_steps, seed=len(probes) + 1)))

    result = vi.train(
        vi.HookedVectorTransformer(cfg, seed=args.seed),
        lambda s, g: ar.generate(bs, generator=g),
        steps=fast["steps"],
        eval_data=eval_set,
        eval_every=args.eval_every,
        seed=args.seed,
        callback=callback,
        **train_kwargs(fast),
    )
    hist = result.history

    def fast_clock(done: int) -> float:
        """The fast run's wall time after ``done`` updates, probes excluded."""
        if done == 0:
            return 0.0
        spent = sum(sec for step, sec in probes if 0 <= step < done - 1)
        return hist.wall_time[done - 1] - spent

    hit = next(
        (s for s, v in zip(hist.eval_steps, hist.eval_loss, strict=True) if v <= TARGET), None
    )
    per_step = sum(sec for _, sec in probes) / (len(probes) * args.probe_steps)
    paper_total = per_step * ar.PAPER_RECIPE["steps"]
    fast_total = fast_clock(fast["steps"])
    to_target = fast_clock(hit) if hit is not None else None
    figures = {
        **machine(),
        "mode": "full",
        "fast_recipe": fast,
        "paper_recipe": ar.PAPER_RECIPE,
        "paper_seconds_per_step": per_step,
        "paper_probe_seconds_per_step": [sec / args.probe_steps for _, sec in probes],
        "paper_extrapolated_seconds": paper_total,
        "fast_seconds_total": fast_total,
        "fast_first_eval_at_target_step": hit,
        "fast_seconds_to_target": to_target,
        "fast_final_eval_mse": hist.eval_loss[-1],
        "eval_steps": hist.eval_steps,
        "eval_loss": hist.eval_loss,
        "speedup_to_target": paper_total / to_target if to_target else None,
        "speedup_full_run": paper_total / fast_total,
    }
    print(f"\nmachine: {figures['machine']}, torch {torch.__version__}")
    print(f"{'recipe':<34}{'steps':>8}{'batch':>7}{'s/step':>9}{'wall (s)':>11}")
    print(
        f"{'paper (extrapolated)':<34}{ar.PAPER_RECIPE['steps']:>8}"
        f"{ar.PAPER_RECIPE['batch_size']:>7}{per_step:>9.4f}{paper_total:>11.0f}"
    )
    print(
        f"{'fast, full run':<34}{fast['steps']:>8}{bs:>7}"
        f"{fast_total / fast['steps']:>9.4f}{fast_total:>11.0f}"
    )
    if hit is None:
        print(f"fast recipe did NOT reach eval MSE <= {TARGET:g} (final {hist.eval_loss[-1]:.3g})")
    else:
        print(
            f"{'fast, to eval MSE <= 1e-4':<34}{hit:>8}{bs:>7}{'':>9}{to_target:>11.0f}"
            f"\nfinal eval MSE {hist.eval_loss[-1]:.3g}; speed-up to target "
            f"{figures['speedup_to_target']:.2f}x (full run {figures['speedup_full_run']:.2f}x)"
        )
    per = figures["paper_probe_seconds_per_step"]
    print(f"paper s/step over {len(per)} probes: min {min(per):.4f}, max {max(per):.4f}")
    return figures


if __name__ == "__main__":
    main()
