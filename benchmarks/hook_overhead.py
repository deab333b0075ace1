"""Hook overhead: vecinterp's forward (hook points, no hooks) and ``run_with_cache``, each
as a ratio to a plain PyTorch model of the same math and the same weights.

Configuration: the affine-recurrence paper's (``affine_recurrence.MODEL_CONFIG_KWARGS``:
d_in 40, d_model 128, d_head 64, d_mlp 3072, 8 heads, 3 layers), length 14, batch 16 and
256, fp32, inference mode. The calls are interleaved round by round (plain, ours, cache,
plain, ...) so that machine noise hits all alike. Each time is the best round (the least
disturbed by other work on the machine); the ratios of the medians are printed beside them.

With ``--other-thread`` a fourth call is timed: the forward with no hooks of its own while
another thread holds a ``model.hooks()`` context with a hook on every hook point. Scoped
hooks are seen only by the thread that added them, so this forward computes the plain
output; it pays for skipping the other thread's hooks at every hook point.

Targets (DESIGN.md): forward ≤ 1.05×, run_with_cache ≤ 1.15×.

Run: python benchmarks/hook_overhead.py [--rounds N] [--threads T] [--batches 16 256]
     [--cpu-time] [--other-thread]
"""

import argparse
import contextlib
import platform
import statistics
import threading
import time
from collections.abc import Iterator

import torch

import vecinterp as vi
from vecinterp.tasks.affine_recurrence import MODEL_CONFIG_KWARGS
from vecinterp.testing import PlainTransformer

CLOCK = time.perf_counter


def timed(fn, reps: int) -> float:
    start = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - start) / reps


@contextlib.contextmanager
def hooked_in_another_thread(model: vi.HookedVectorTransformer) -> Iterator[None]:
    """Another thread holds a ``hooks()`` context (a hook on every point) meanwhile."""
    opened, done = threading.Event(), threading.Event()

    def hold() -> None:
        with model.hooks(fwd_hooks=[(lambda name: True, lambda act, hook: 0 * act)]):
            opened.set()
            done.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    opened.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()


def measure(batch: int, rounds: int, other_thread: bool = False) -> dict[str, float]:
    cfg = vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)
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
    if other_thread:
        times["other"] = []
    with torch.inference_mode():
        want = plain(x)
        assert torch.allclose(want, model(x), atol=1e-5), "models disagree"
        for fn in calls.values():  # warm-up
            timed(fn, reps)
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name].append(timed(fn, reps))
            if other_thread:
                with hooked_in_another_thread(model):
                    assert torch.allclose(model(x), want, atol=1e-5), "saw another's hooks"
                    times["other"].append(timed(calls["forward"], reps))
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "plain_ms": best["plain"] * 1e3,
        "forward_ms": best["forward"] * 1e3,
        "cache_ms": best["run_with_cache"] * 1e3,
        "forward_ratio": best["forward"] / best["plain"],
        "cache_ratio": best["run_with_cache"] / best["plain"],
        "forward_ratio_median": med["forward"] / med["plain"],
        "cache_ratio_median": med["run_with_cache"] / med["plain"],
    }
    if other_thread:
        result["other_ratio"] = best["other"] / best["plain"]
        result["other_ratio_median"] = med["other"] / med["plain"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="hook overhead vs plain PyTorch")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument(
        "--other-thread",
        action="store_true",
        help="also time the forward while another thread holds a hooks() context",
    )
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
    header = (
        f"{'batch':>5} {'plain ms':>9} {'ours ms':>8} {'forward':>17} {'cache ms':>9} {'cache':>17}"
    )
    print(header + (f" {'other thread hooked':>19}" if args.other_thread else ""))
    for batch in args.batches:
        r = measure(batch, args.rounds, args.other_thread)
        line = (
            f"{batch:>5} {r['plain_ms']:>9.2f} {r['forward_ms']:>8.2f} "
            f"{r['forward_ratio']:>7.3f}x ({r['forward_ratio_median']:.3f}x) "
            f"{r['cache_ms']:>9.2f} {r['cache_ratio']:>7.3f}x ({r['cache_ratio_median']:.3f}x)"
        )
        if args.other_thread:
            line += f" {r['other_ratio']:>9.3f}x ({r['other_ratio_median']:.3f}x)"
        print(line)
    print("targets: forward <= 1.05x, run_with_cache <= 1.15x")


if __name__ == "__main__":
    main()
