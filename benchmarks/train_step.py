"""Milliseconds per training step of ``vi.train`` on the affine-recurrence paper's model,
with the losses read on the host every step (``sync_every=1``) or every
``sync_every`` steps (the default, 50).

Configuration: the paper's model (``affine_recurrence.MODEL_CONFIG_KWARGS``, 3.18 M
parameters), fp32, the paper's recipe (AdamW lr 1e-4, weight decay 0.01, batch 16), batches
from ``affine_recurrence.generate`` with a fixed ``--length`` (14, the longest; 0: the
task's random lengths 3-14), no evaluation, no checkpoint, no progress bar. Each figure is
the wall time of a whole ``vi.train`` call of ``--steps`` steps (its set-up included, on a
GPU up to a ``torch.cuda.synchronize()`` after it) divided by the steps; the variants
alternate in ``--rounds`` rounds after one untimed warm-up call each, and the table gives
the median and the best round. ``--cpu-time`` times with the process's CPU clock instead
(on a CPU shared with other work, with ``--threads 1``).

``--sync-every plain`` adds a plain PyTorch loop as the floor: ``PlainTransformer`` with
the same weights, the same batches, masked MSE, ``torch.optim.AdamW`` (its default
``foreach`` update), no checks. ``--widths tiny`` keeps the paper's 3 layers x 8 heads
but shrinks every width (d_model 16, d_head 2, d_mlp 16, d_in = d_out = 4): the arithmetic
is then negligible and a step's time is its host cost, which is what a step of the paper's
model costs on a GPU, where it is launch-bound.

On a CPU, reading a loss on the host costs nothing but the read: the step has finished
when the next line of Python runs. On a GPU every read waits for every kernel queued so
far, so the CPU can no longer queue the next step while the GPU computes this one; that is
what ``sync_every`` removes (the model's input check and the batch's copy to the device
no longer wait either).

Run: python benchmarks/train_step.py [--device cpu|cuda] [--threads 2] [--steps 30]
     [--rounds 5] [--sync-every 1 default plain] [--widths paper|tiny] [--cpu-time]
     [--json out.json]
"""

import argparse
import inspect
import json
import platform
import statistics
import time

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar
from vecinterp.testing import PlainTransformer

TINY = dict(d_in=4, d_out=4, d_model=16, d_head=2, d_mlp=16)


def plain_run(args: argparse.Namespace, model: vi.HookedVectorTransformer, steps: int) -> float:
    """Seconds per step of a plain PyTorch loop on the same model, batches and recipe."""
    device = torch.device(args.device)
    plain = PlainTransformer(model.cfg, model.state_dict()).to(device)
    recipe = ar.PAPER_RECIPE
    opt = torch.optim.AdamW(
        plain.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"]
    )
    gen = torch.Generator().manual_seed(0)
    dim = model.cfg.d_in
    if device.type == "cuda":
        torch.cuda.synchronize()
    clock = time.process_time if args.cpu_time else time.perf_counter
    start = clock()
    for _ in range(steps):
        batch = ar.generate(
            recipe["batch_size"], length=args.length or None, dim=dim, generator=gen
        )
        x, t = batch.inputs.to(device), batch.targets.to(device)
        mask = batch.loss_mask.to(device)
        err = (plain(x) - t).pow(2).mean(-1)
        loss = (err * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (clock() - start) / steps


def one_run(args: argparse.Namespace, sync_every: str, steps: int, seed: int) -> float:
    """Seconds per step of one ``vi.train`` call of ``steps`` steps (or of the plain loop)."""
    kwargs_cfg = dict(ar.MODEL_CONFIG_KWARGS, **(TINY if args.widths == "tiny" else {}))
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**kwargs_cfg), seed=seed)
    if sync_every == "plain":
        return plain_run(args, model, steps)
    dim = model.cfg.d_in
    length = args.length or None
    kwargs = {} if sync_every == "default" else {"sync_every": int(sync_every)}
    recipe = ar.PAPER_RECIPE
    if args.device == "cuda":
        torch.cuda.synchronize()
    clock = time.process_time if args.cpu_time else time.perf_counter
    start = clock()
    vi.train(
        model,
        lambda s, g: ar.generate(recipe["batch_size"], length=length, dim=dim, generator=g),
        steps=steps,
        lr=recipe["lr"],
        weight_decay=recipe["weight_decay"],
        seed=seed,
        device=args.device,
        progress=False,
        **kwargs,
    )
    if args.device == "cuda":
        torch.cuda.synchronize()
    return (clock() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--length", type=int, default=14)
    parser.add_argument("--sync-every", nargs="+", default=["1", "default"])
    parser.add_argument("--widths", choices=("paper", "tiny"), default="paper")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process's CPU clock (on a shared CPU machine)",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.cpu_time and args.device == "cuda":
        raise SystemExit("--cpu-time measures CPU work, not a GPU's: use wall time on cuda")
    torch.set_num_threads(args.threads)
    if "sync_every" not in inspect.signature(vi.train).parameters and args.sync_every != [
        "default"
    ]:
        raise SystemExit("this vecinterp's train() has no sync_every: pass --sync-every default")
    times: dict[str, list[float]] = {v: [] for v in args.sync_every}
    for variant in args.sync_every:  # first-call costs (allocator, kernels, lazy imports)
        one_run(args, variant, args.warmup, seed=0)
    for r in range(args.rounds):
        for variant in args.sync_every:
            times[variant].append(one_run(args, variant, args.steps, seed=r + 1))
        print(f"round {r}: " + ", ".join(f"{v}: {t[-1] * 1e3:.2f} ms" for v, t in times.items()))
    clock = "process CPU time" if args.cpu_time else "wall time"
    print(f"\n{args.device}, {torch.get_num_threads()} threads, {args.widths} widths, batch 16, "
          f"length {args.length}, {clock}")  # fmt: skip
    print("| sync_every | ms/step (median) | ms/step (best) |\n|---|---|---|")
    for variant, values in times.items():
        print(f"| {variant} | {statistics.median(values) * 1e3:.2f} | {min(values) * 1e3:.2f} |")
    if args.json:
        figures = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": platform.machine(),
            "device": args.device
            if args.device == "cpu"
            else torch.cuda.get_device_name(),  # fmt: skip
            "threads": torch.get_num_threads(),
            "clock": "process" if args.cpu_time else "wall",
            "torch": torch.__version__,
            "steps": args.steps,
            "widths": args.widths,
            "length": args.length,
            "seconds_per_step": times,
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
