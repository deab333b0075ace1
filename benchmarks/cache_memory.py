"""What ``run_with_cache`` costs in time and memory, by what it stores.

Configuration: the affine-recurrence paper's model (``MODEL_CONFIG_KWARGS``: d_in 40,
d_model 128, d_head 64, 8 heads, 3 layers, d_mlp 3072, relu), length 14, batch 16 and
256, fp32, inference mode. Three ways of caching every activation:

- ``default``: ``names_filter=None``. Everything is stored as it flowed, except a relu
  MLP's ``hook_post``, recomputed bit for bit from ``hook_pre`` on first access.
- ``all stored``: ``names_filter=lambda name: True`` (``hook_post`` stored too).
- ``z/pre only``: neither ``attn.hook_result`` nor ``mlp.hook_post`` stored (what
  ``names_filter=None`` stored before the cache was made exact, when both were recomputed
  from ``hook_z``/``hook_pre`` with the model's current weights).

For each: the time of one ``run_with_cache`` (interleaved rounds, best and median), the
bytes the cache holds (distinct storages), the time to then read every derived entry,
and the peak resident memory of a fresh process that builds the model, runs the cache
``--runs`` times and reads every entry of the last one (the rise over the process after
one plain forward pass; Linux only), before and after reading every entry (which
computes the derived ones).

Last, what the cache's record of the weights costs: taking it at each ``run_with_cache``
(reused when nothing changed since the model's last run; a new one otherwise) and
checking it in each analysis that reads the weights.

Run: python benchmarks/cache_memory.py [--rounds N] [--threads T]
"""

import argparse
import ctypes
import json
import platform
import statistics
import subprocess
import sys
import time

import torch

import vecinterp as vi
from vecinterp.cache import _changed_weights, _record_weights, _walk_weights
from vecinterp.tasks.affine_recurrence import MODEL_CONFIG_KWARGS

LENGTH = 14
CLOCK = time.perf_counter  # --cpu-time: time.process_time, steadier on a busy machine
MODES = ("default", "all stored", "z/pre only")


def names_filter(mode: str):  # noqa: ANN201 - a NameFilter
    if mode == "default":
        return None
    if mode == "all stored":
        return lambda name: True
    return lambda name: not name.endswith((".attn.hook_result", ".mlp.hook_post"))


def setup(batch: int) -> tuple[vi.HookedVectorTransformer, torch.Tensor]:
    cfg = vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)
    model = vi.HookedVectorTransformer(cfg, seed=0).eval()
    x = torch.randn(batch, LENGTH, cfg.d_in, generator=torch.Generator().manual_seed(0))
    return model, x


def cached_bytes(cache: vi.ActivationCache) -> int:
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in cache.cache_dict.values()
    }
    return sum(storages.values())


def read_all(model: vi.HookedVectorTransformer, cache: vi.ActivationCache) -> None:
    """Index every hook the cache says it has (``in``, which also answers for entries an
    older cache derived but did not list), so derived entries are computed."""
    for name in model.hook_dict:
        if name in cache:
            cache[name]


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def peak_rss_mib(batch: int, mode: str, runs: int) -> tuple[float, float]:
    """In a fresh process: the peak resident memory of ``runs`` caches (each released
    before the next), then also of reading every entry of the last, over the memory after
    one plain forward pass. Linux: the peak (VmHWM) is reset through /proc/self/clear_refs after
    returning freed memory to the system (malloc_trim)."""
    model, x = setup(batch)
    with torch.inference_mode():
        model(x)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_mib("VmRSS")
        cache = None
        for _ in range(runs):
            cache = None  # the previous cache is released before the next run
            _, cache = model.run_with_cache(x, names_filter=names_filter(mode))
        assert cache is not None
        run_peak = _status_mib("VmHWM") - base
        read_all(model, cache)
        return run_peak, _status_mib("VmHWM") - base


def measure(batch: int, rounds: int) -> dict[str, dict[str, float]]:
    model, x = setup(batch)
    reps = max(1, 160 // batch)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    out: dict[str, dict[str, float]] = {m: {} for m in MODES}
    with torch.inference_mode():
        for mode in MODES:  # warm-up, bytes held, time to read the derived entries
            _, cache = model.run_with_cache(x, names_filter=names_filter(mode))
            out[mode]["cached_mib"] = cached_bytes(cache) / 2**20
            start = CLOCK()
            read_all(model, cache)
            out[mode]["read_all_ms"] = (CLOCK() - start) * 1e3
            del cache
        for _ in range(rounds):
            for mode in MODES:
                nf = names_filter(mode)
                start = CLOCK()
                for _ in range(reps):
                    model.run_with_cache(x, names_filter=nf)
                times[mode].append((CLOCK() - start) / reps)
    for mode in MODES:
        out[mode]["best_ms"] = min(times[mode]) * 1e3
        out[mode]["median_ms"] = statistics.median(times[mode]) * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="run_with_cache: time and memory by mode")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5, help="caches per peak-memory process")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process CPU clock (steadier on a busy machine; use with --threads 1)",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument(
        "--peak", nargs=3, metavar=("BATCH", "MODE", "RUNS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    if args.peak:  # child process: one peak-memory measure
        batch, mode, runs = int(args.peak[0]), args.peak[1], int(args.peak[2])
        print(json.dumps(peak_rss_mib(batch, mode, runs)))
        return
    print(
        f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads, "
        f"vecinterp {vi.__version__}, {'CPU' if args.cpu_time else 'wall'} time"
    )
    print(
        f"{'batch':>5} {'mode':<11} {'best ms':>8} {'median ms':>9} {'cached MiB':>10} "
        f"{'read derived ms':>15} {'peak MiB run':>12} {'+ read all':>10}"
    )
    for batch in args.batches:
        results = measure(batch, args.rounds)
        for mode in MODES:
            cmd = [sys.executable, __file__, "--peak", str(batch), mode, str(args.runs)]
            if args.threads is not None:
                cmd += ["--threads", str(args.threads)]
            run_peak, read_peak = json.loads(
                subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            )
            r = results[mode]
            print(
                f"{batch:>5} {mode:<11} {r['best_ms']:>8.2f} {r['median_ms']:>9.2f} "
                f"{r['cached_mib']:>10.2f} {r['read_all_ms']:>15.2f} {run_peak:>12.1f} "
                f"{read_peak:>10.1f}"
            )
    model, _ = setup(16)
    record = _record_weights(model)
    reused = _us(lambda: _record_weights(model))
    new = _us(lambda: _walk_weights(model))
    check = _us(lambda: _changed_weights(record))
    print(
        f"weights record: {reused:.1f} us per run_with_cache ({new:.1f} us when new), "
        f"check: {check:.1f} us per analysis"
    )


def _us(fn, n: int = 2000, rounds: int = 7) -> float:  # noqa: ANN001 - a callable
    """Best time of one call of ``fn``, in microseconds."""
    best = float("inf")
    for _ in range(rounds):
        start = CLOCK()
        for _ in range(n):
            fn()
        best = min(best, (CLOCK() - start) / n)
    return best * 1e6


if __name__ == "__main__":
    main()
