"""Hook overhead: vecinterp's forward (hook points, no hooks) and ``run_with_cache``, each
as a ratio to a plain PyTorch model of the same math and the same weights.

Configuration: the affine-recurrence paper's (d_in 40, d_model 128, d_head 64, d_mlp 3072,
8 heads, 3 layers), length 14, batch 16 and 256, fp32, inference mode. The calls are
interleaved round by round (plain, ours, cache, plain, ...) so that machine noise hits
all three alike. Each time is the best round (the least disturbed by other work on the
machine); the ratios of the medians are printed beside them.

Targets (DESIGN.md): forward ≤ 1.05×, run_with_cache ≤ 1.15×.

Run: python benchmarks/hook_overhead.py [--rounds N] [--threads T]
"""

import argparse
import platform
import statistics
import time

import torch

import vecinterp as vi
from vecinterp.testing import PlainTransformer

PAPER = dict(d_in=40, d_model=128, d_head=64, n_heads=8, n_layers=3, d_mlp=3072, n_ctx=32)


CLOCK = time.perf_counter


def timed(fn, reps: int) -> float:
    start = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - start) / reps


def measure(batch: int, rounds: int) -> dict[str, float]:
    cfg = vi.VectorTransformerConfig(**PAPER)
    model = vi.HookedVectorTransformer(cfg, seed=0).eval()
    plain = PlainTransformer(cfg, model.state_dict()).eval()
    x = torch.randn(batch, 14, cfg.d_in, generator=torch.Generator().manual_seed(0))
    reps = max(1, 160 // batch)
    calls = {
        "plain": lambda: plain(x),
        "forward": lambda: model(x),
        "run_with_cache": lambda: model.run_with_cache(x),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    with torch.inference_mode():
        assert torch.allclose(plain(x), model(x), atol=1e-5), "models disagree"
        for fn in calls.values():  # warm-up
            timed(fn, reps)
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name].append(timed(fn, reps))
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "plain_ms": best["plain"] * 1e3,
        "forward_ms": best["forward"] * 1e3,
        "cache_ms": best["run_with_cache"] * 1e3,
        "forward_ratio": best["forward"] / best["plain"],
        "cache_ratio": best["run_with_cache"] / best["plain"],
        "forward_ratio_median": med["forward"] / med["plain"],
        "cache_ratio_median": med["run_with_cache"] / med["plain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="hook overhead vs plain PyTorch")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process CPU clock (steadier on a busy machine; use with --threads 1)",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {args.rounds} rounds, "
        f"{'process CPU' if args.cpu_time else 'wall'} clock"
    )
    print("best-of-rounds times; ratios of the best (of the medians in brackets)")
    print(
        f"{'batch':>5} {'plain ms':>9} {'ours ms':>8} {'forward':>17} {'cache ms':>9} {'cache':>17}"
    )
    for batch in (16, 256):
        r = measure(batch, args.rounds)
        print(
            f"{batch:>5} {r['plain_ms']:>9.2f} {r['forward_ms']:>8.2f} "
            f"{r['forward_ratio']:>7.3f}x ({r['forward_ratio_median']:.3f}x) "
            f"{r['cache_ms']:>9.2f} {r['cache_ratio']:>7.3f}x ({r['cache_ratio_median']:.3f}x)"
        )
    print("targets: forward <= 1.05x, run_with_cache <= 1.15x")


if __name__ == "__main__":
    main()
