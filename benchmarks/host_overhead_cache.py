"""Host (Python) overhead of ``run_with_cache``: a CPU proxy for a launch-bound GPU.

On a GPU at a small batch, ``run_with_cache`` costs what the Python around the kernels
costs: the arithmetic is queued faster than the host issues it. This script measures that
host overhead on a CPU, where it is hidden by nothing: a model with the affine-recurrence
paper's layer structure (3 layers, 8 heads, its norms, attention and MLP) but tiny widths
(d_in 4, d_model 16, d_head 2, d_mlp 16), length 14, batch 1, so that a call's time is
almost all Python. It prints, for a plain PyTorch model of the same math and weights
(``vecinterp.testing.PlainTransformer``), vecinterp's forward with no hooks, and
``run_with_cache``, the median time per call and the ratios to plain and to the forward.

The same is printed for the paper's configuration at batch 16 (arithmetic included), the
figure the GPU issue quotes. Calls are interleaved round by round (plain, forward, cache,
plain, ...) so that noise on a shared machine hits all alike; times are medians over
rounds, under ``torch.no_grad``.

Run: python benchmarks/host_overhead_cache.py [--threads 1] [--rounds 5] [--calls 200]
     [--paper-calls 20] [--cpu-time]
"""

import argparse
import dataclasses
import platform
import statistics
import time
from collections.abc import Callable

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as A
from vecinterp.testing import PlainTransformer

CLOCK = time.perf_counter


def timed(fn: Callable[[], object], calls: int) -> float:
    start = CLOCK()
    for _ in range(calls):
        fn()
    return (CLOCK() - start) / calls


def measure(cfg: vi.VectorTransformerConfig, batch: int, rounds: int, calls: int) -> None:
    model = vi.HookedVectorTransformer(cfg, seed=0).eval()
    plain = PlainTransformer(cfg, model.state_dict()).eval()
    x = torch.randn(batch, 14, cfg.d_in, generator=torch.Generator().manual_seed(0))
    fns = {
        "plain": lambda: plain(x),
        "forward": lambda: model(x),
        "run_with_cache": lambda: model.run_with_cache(x),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        assert torch.allclose(plain(x), model(x), atol=1e-5), "models disagree"
        for fn in fns.values():  # warm-up
            timed(fn, max(1, calls // 10))
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(timed(fn, calls))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"d_model {cfg.d_model:>4}, batch {batch:>3}: "
        f"plain {med['plain'] * 1e6:8.0f} us, forward {med['forward'] * 1e6:8.0f} us, "
        f"run_with_cache {med['run_with_cache'] * 1e6:8.0f} us | "
        f"forward/plain {med['forward'] / med['plain']:.2f}x, "
        f"cache/plain {med['run_with_cache'] / med['plain']:.2f}x, "
        f"cache/forward {med['run_with_cache'] / med['forward']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="run_with_cache host overhead")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="calls per round (tiny config)")
    parser.add_argument("--paper-calls", type=int, default=20, help="calls per round (paper)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process CPU clock (steadier on a busy machine; use with --threads 1)",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {args.rounds} rounds, medians, "
        f"{'process CPU' if args.cpu_time else 'wall'} clock"
    )
    paper = vi.VectorTransformerConfig(**A.MODEL_CONFIG_KWARGS)
    tiny = dataclasses.replace(paper, d_in=4, d_out=4, d_model=16, d_head=2, d_mlp=16)
    measure(tiny, 1, args.rounds, args.calls)
    measure(paper, 16, args.rounds, args.paper_calls)


if __name__ == "__main__":
    main()
