"""Milliseconds of the affine-recurrence paper's model, eager vs ``torch.compile``-d, beside
plain PyTorch eager and compiled: the hook-free forward (batch 1, 16, 256, length 14),
``run_with_cache`` (eager, as a compiled model runs it: hooks leave the graph), and one
training step (forward, masked MSE, backward, clipping to 1.0, fused AdamW: what
``vi.train`` runs per step, ``compile=True`` compiling its forward, loss and backward),
plus the time of each compilation.

Configuration: the paper's model (``affine_recurrence.MODEL_CONFIG_KWARGS``), fp32,
inputs from ``affine_recurrence.generate`` at length 14. Plain PyTorch is
``vecinterp.testing.PlainTransformer`` with the same weights (no hook points, no
checks); its training step uses the same loss, clipping and fused AdamW. The forward runs
under ``torch.no_grad()``. Each variant is warmed up (its compile then timed apart), then
the variants alternate in ``--rounds`` rounds of ``--reps`` calls each, and the table
gives each one's median round: alternating keeps the ratios fair on a machine that other
work loads unevenly.

``--mode``: the ``torch.compile`` mode (``default``; on a GPU ``reduce-overhead``
captures CUDA graphs, which is what closes a launch-bound forward's gap).

Run: python benchmarks/compiled.py [--device cpu|cuda] [--threads 1] [--mode default]
     [--rounds 5] [--reps 10] [--batches 1 16 256] [--json out.json]
"""

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar
from vecinterp.testing import PlainTransformer
from vecinterp.training.compiled import compiled_step_loss
from vecinterp.training.data import step_loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    """Seconds per call of ``fn``, over ``reps`` calls."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / reps


def _first_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of the first call (the compilation, for a compiled ``fn``) and a second."""
    start = time.perf_counter()
    fn()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _plain_loss(plain: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, mask: torch.Tensor):
    err = (plain(x) - t).pow(2).mean(-1)
    return (err * mask).sum() / mask.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", default="default")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--no-train", action="store_true", help="skip the training step")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    mode = None if args.mode == "default" else args.mode
    cfg = vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
    model = vi.HookedVectorTransformer(cfg, seed=0, device=device)
    plain = PlainTransformer(cfg, model.state_dict()).to(device)
    gen = torch.Generator().manual_seed(0)

    def data(batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = ar.generate(batch, length=14, dim=cfg.d_in, generator=gen)
        return b.inputs.to(device), b.targets.to(device), b.loss_mask.to(device)

    variants: dict[str, Callable[[], object]] = {}
    compile_s: dict[str, float] = {}
    for batch in args.batches:
        x = data(batch)[0]
        c_model = torch.compile(model, mode=mode)
        c_plain = torch.compile(plain, mode=mode)
        with torch.no_grad():
            compile_s[f"forward b{batch}"] = _first_call(lambda c=c_model, x=x: c(x), device)
            compile_s[f"plain forward b{batch}"] = _first_call(lambda c=c_plain, x=x: c(x), device)

        def nograd(fn: Callable[[], object]) -> Callable[[], object]:
            def run() -> object:
                with torch.no_grad():
                    return fn()

            return run

        variants[f"forward b{batch}: eager"] = nograd(lambda x=x: model(x))
        variants[f"forward b{batch}: compiled"] = nograd(lambda c=c_model, x=x: c(x))
        variants[f"forward b{batch}: plain"] = nograd(lambda x=x: plain(x))
        variants[f"forward b{batch}: compiled plain"] = nograd(lambda c=c_plain, x=x: c(x))
    x16 = data(16)[0]
    variants["run_with_cache b16: eager"] = lambda: model.run_with_cache(x16)
    if not args.no_train:
        x, t, mask = data(16)
        nets = {
            "eager": vi.HookedVectorTransformer(cfg, seed=0, device=device),
            "compiled": vi.HookedVectorTransformer(cfg, seed=0, device=device),
        }
        plains = {
            "plain": PlainTransformer(cfg, model.state_dict()).to(device),
            "compiled plain": PlainTransformer(cfg, model.state_dict()).to(device),
        }
        losses: dict[str, Callable[[], torch.Tensor]] = {}
        compiled_loss = compiled_step_loss()
        losses["eager"] = lambda: step_loss(nets["eager"], (x, t, mask))[0]
        losses["compiled"] = lambda: compiled_loss(nets["compiled"], (x, t, mask), "batch")[0]
        plain_c = torch.compile(_plain_loss, mode=mode)
        losses["plain"] = lambda: _plain_loss(plains["plain"], x, t, mask)
        losses["compiled plain"] = lambda: plain_c(plains["compiled plain"], x, t, mask)
        recipe = ar.PAPER_RECIPE
        for name in losses:
            net = nets.get(name) or plains[name]
            opt = torch.optim.AdamW(
                net.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"],
                fused=True,
            )  # fmt: skip

            def step(net=net, opt=opt, loss_of=losses[name]) -> None:
                opt.zero_grad(set_to_none=True)
                loss_of().backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                opt.step()

            variants[f"train step b16: {name}"] = step
            if "compiled" in name:
                compile_s[f"train step ({name})"] = _first_call(step, device)
    for fn in variants.values():  # warm-up
        fn()
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            rounds[name].append(_timed(fn, args.reps, device))
    med = {name: statistics.median(v) * 1e3 for name, v in rounds.items()}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device {device} ({where}), threads {args.threads}, torch {torch.__version__}, "
          f"mode {args.mode}")  # fmt: skip
    print(f"{'variant':40s} {'median ms':>10s}")
    for name, ms in med.items():
        print(f"{name:40s} {ms:10.3f}")
    for batch in args.batches:
        k = f"forward b{batch}"
        c = med[k + ": compiled"]
        print(f"{k}: compiled / eager {c / med[k + ': eager']:.2f}, "
              f"compiled / plain {c / med[k + ': plain']:.2f}, "
              f"compiled / compiled plain {c / med[k + ': compiled plain']:.2f}")  # fmt: skip
    if not args.no_train:
        k = "train step b16"
        print(f"{k}: eager / compiled {med[k + ': eager'] / med[k + ': compiled']:.2f}, "
              f"compiled / plain {med[k + ': compiled'] / med[k + ': plain']:.2f}")  # fmt: skip
    print("compile seconds (first two calls):")
    for name, s in compile_s.items():
        print(f"  {name:38s} {s:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median_ms": med, "compile_s": compile_s, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
