"""Hook overhead: vecinterp's forward (hook points, no hooks) and ``run_with_cache``, each
as a ratio to a plain PyTorch model of the same math and the same weights.

Configuration: the affine-recurrence paper's (``affine_recurrence.MODEL_CONFIG_KWARGS``:
d_in 40, d_model 128, d_head 64, d_mlp 3072, 8 heads, 3 layers), length 14, batch 16 and
256, fp32, inference mode. The calls are interleaved round by round (plain, ours, cache,
plain, ...) so that machine noise hits all alike. Each time is the best round (the least
disturbed by other work on the machine); the ratios of the medians are printed beside them.

``--widths tiny`` keeps the paper's layers and heads (3 x 8) but shrinks every width
(d_model 16, d_head 2, d_mlp 16, d_in = d_out = 4): the arithmetic is then negligible and
each time is the host's cost of issuing the call's kernels, which is what a forward of the
paper's model costs on a GPU, where it is launch-bound (on an H100 the paper-width
forward at batch 16 and at 256 cost the same). The table also gives, for each call, the
kernels it issues (ATen operators other than views) and its host syncs (reads of a
device value), counted once with a dispatch mode: that count does not depend on the
machine.

``--device cuda`` times on the GPU (each timing ends with ``torch.cuda.synchronize()``).

With ``--other-thread`` a fourth call is timed: the forward with no hooks of its own while
another thread holds a ``model.hooks()`` context with a hook on every hook point. Scoped
hooks are seen only by the thread that added them, so this forward computes the plain
output; it pays for skipping the other thread's hooks at every hook point.

Targets: DESIGN.md, on the CPU at the paper's widths: forward <= 1.05x, run_with_cache
<= 1.15x; issue 14, on a GPU at batch 16: forward <= 1.2x, run_with_cache <= 1.5x.

``--keep-freed-memory`` measures everything twice in one run: with glibc's malloc defaults,
then after :func:`vecinterp.keep_freed_memory` (a full cache's pages are otherwise returned
to the OS when it is dropped and faulted back by the next call: see :mod:`vecinterp.memory`).

``--threads 1 2`` measures each thread count in turn in the same run (one table row per
batch and thread count), so that the ratios at one and two threads come from the same
machine state; issue 34 asked for run_with_cache <= 1.15x at both.

Run: python benchmarks/hook_overhead.py [--rounds N] [--threads T ...] [--batches 16 256]
     [--widths paper|tiny] [--device cpu|cuda] [--cpu-time] [--other-thread]
"""

import argparse
import contextlib
import platform
import statistics
import threading
import time
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vecinterp as vi
from vecinterp.tasks.affine_recurrence import MODEL_CONFIG_KWARGS
from vecinterp.testing import PlainTransformer

CLOCK = time.perf_counter
CPU = torch.device("cpu")
TINY = dict(d_in=4, d_out=4, d_model=16, d_head=2, d_mlp=16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, reps: int, device: torch.device = CPU) -> float:
    _sync(device)
    start = CLOCK()
    for _ in range(reps):
        fn()
    _sync(device)
    return (CLOCK() - start) / reps


_SYNCS = (
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.item.default,
)


class _Counter(TorchDispatchMode):
    """Counts the ATen operators a call runs: kernels (not views) and host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _SYNCS:
            self.syncs += 1
        elif not func.is_view and func is not torch.ops.aten._unsafe_view.default:
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> tuple[int, int]:
    """``(kernels, host syncs)`` of one call of ``fn``."""
    with _Counter() as counter:
        fn()
    return counter.kernels, counter.syncs


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


def measure(
    batch: int,
    rounds: int,
    other_thread: bool = False,
    widths: str = "paper",
    device: torch.device = CPU,
) -> dict[str, float]:
    kwargs = dict(MODEL_CONFIG_KWARGS, **(TINY if widths == "tiny" else {}))
    cfg = vi.VectorTransformerConfig(**kwargs)
    model = vi.HookedVectorTransformer(cfg, seed=0, device=device).eval()
    plain = PlainTransformer(cfg, model.state_dict()).to(device).eval()
    x = torch.randn(batch, 14, cfg.d_in, generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    reps = max(1, 160 // batch) if device.type == "cpu" else 50
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
            timed(fn, reps, device)
        ops = {name: count_ops(fn) for name, fn in calls.items()}
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name].append(timed(fn, reps, device))
            if other_thread:
                with hooked_in_another_thread(model):
                    assert torch.allclose(model(x), want, atol=1e-5), "saw another's hooks"
                    times["other"].append(timed(calls["forward"], reps, device))
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
        **{f"{name}_kernels": float(ops[name][0]) for name in calls},
        **{f"{name}_syncs": float(ops[name][1]) for name in calls},
    }
    if other_thread:
        result["other_ratio"] = best["other"] / best["plain"]
        result["other_ratio_median"] = med["other"] / med["plain"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="hook overhead vs plain PyTorch")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, nargs="+", default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--widths", choices=("paper", "tiny"), default="paper")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
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
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="after the table with glibc's malloc defaults, call vi.keep_freed_memory() and "
        "measure again (the setting is one-way: the second table is the kept one)",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    thread_counts = args.threads or [torch.get_num_threads()]
    default_threads = torch.get_num_threads()
    device = torch.device(args.device)
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine()
    )
    print(
        f"torch {torch.__version__}, threads {thread_counts}, {where}, "
        f"{args.widths} widths, {args.rounds} rounds, "
        f"{'process CPU' if args.cpu_time else 'wall'} clock"
    )
    print("best-of-rounds times; ratios of the best (of the medians in brackets)")
    header = (
        f"{'thr':>3} {'batch':>5} {'plain ms':>9} {'ours ms':>8} {'forward':>17} "
        f"{'cache ms':>9} {'cache':>17}"
    )
    print(header + (f" {'other thread hooked':>19}" if args.other_thread else ""))
    rounds_of = ["default malloc"] + (
        ["kept (vi.keep_freed_memory())"] if args.keep_freed_memory else []
    )
    for label in rounds_of:
        if label != rounds_of[0]:
            applied = vi.keep_freed_memory()
            print(f"-- vi.keep_freed_memory() {'applied' if applied else 'not glibc: unchanged'}")
        r = _table(args, thread_counts, default_threads, device)
    print(
        "kernels (host syncs) per call: "
        + ", ".join(
            f"{name} {r[name + '_kernels']:.0f} ({r[name + '_syncs']:.0f})"
            for name in ("plain", "forward", "run_with_cache")
        )
    )
    print(
        "targets: CPU, paper widths: forward <= 1.05x, run_with_cache <= 1.15x; "
        "GPU, batch 16: forward <= 1.2x, run_with_cache <= 1.5x"
    )


def _table(args, thread_counts, default_threads, device):  # one row per threads x batch
    r: dict[str, float] = {}
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for batch in args.batches:
                r = measure(batch, args.rounds, args.other_thread, args.widths, device)
                line = (
                    f"{threads:>3} {batch:>5} {r['plain_ms']:>9.2f} {r['forward_ms']:>8.2f} "
                    f"{r['forward_ratio']:>7.3f}x ({r['forward_ratio_median']:.3f}x) "
                    f"{r['cache_ms']:>9.2f} {r['cache_ratio']:>7.3f}x "
                    f"({r['cache_ratio_median']:.3f}x)"
                )
                if args.other_thread:
                    line += f" {r['other_ratio']:>9.3f}x ({r['other_ratio_median']:.3f}x)"
                print(line, flush=True)
    finally:
        torch.set_num_threads(default_threads)
    return r


if __name__ == "__main__":
    main()
