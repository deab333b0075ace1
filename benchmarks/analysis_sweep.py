"""Mean-ablation sweep over all heads: ``head_ablation_sweep`` (batched passes) against a
loop of single-head forward passes (one ``ablate_heads`` call per head).

Configuration: the affine-recurrence paper's model (d_in 40, d_model 128, d_head 64,
8 heads, 3 layers, d_mlp 3072, n_ctx 32), random weights (seed 0), fp32, 24 heads.
Population: 1,000 random-normal sequences of length 14; the per-position means are
computed once (``mean_activations``) and given to both, so only the sweeps are timed.
Evaluation batch: 16 sequences of length 14 (and 64). The two measurements alternate
round by round so that machine noise hits both alike; each figure is the median over
rounds. Both must give the same ``[3, 8]`` scores (allclose in fp32).

Target (DESIGN.md): the batched sweep ≥ 5× faster than the loop.

What to expect: the sweep does less arithmetic than the loop only by starting each pass
at the first layer it ablates (the layers before are the same in every copy): 3 + 48
layer-passes of the batch instead of 72, 1.4x less. Anything beyond that must come from
running larger batches, which pays where a forward pass is dominated by per-call costs
(accelerators) but hardly on a CPU, where matrix products dominate. On a busy machine,
``--threads 1`` gives steadier figures (thread contention slows small batches most).

Run: python benchmarks/analysis_sweep.py [--rounds N] [--threads T] [--batches 16 64]
"""

import argparse
import platform
import statistics
import time

import torch

import vecinterp as vi
from vecinterp.analysis.ablation import ablate_heads, head_ablation_sweep, mean_activations

PAPER = dict(d_in=40, d_model=128, d_head=64, n_heads=8, n_layers=3, d_mlp=3072, n_ctx=32)
N_POS = 14


def looped(model, x, targets, means) -> torch.Tensor:
    cfg = model.cfg
    scores = torch.empty(cfg.n_layers, cfg.n_heads)  # the sweep's layout, filled head by head
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            out = ablate_heads(model, x, (layer, head), kind="mean", population=means)
            scores[layer, head] = vi.masked_mse(out, targets)
    return scores


def batched(model, x, targets, means) -> torch.Tensor:
    return head_ablation_sweep(model, x, targets, kind="mean", population=means, progress=False)


def timed(fn, *args) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def measure(model, means, batch: int, rounds: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, N_POS, model.cfg.d_in, generator=gen)
    targets = torch.randn(batch, N_POS, model.cfg.d_out, generator=gen)
    _, ref = timed(looped, model, x, targets, means)  # warm-up, and the reference
    _, res = timed(batched, model, x, targets, means)
    assert res.shape == (model.cfg.n_layers, model.cfg.n_heads), res.shape
    assert torch.allclose(res, ref, rtol=1e-4, atol=1e-6), (res - ref).abs().max()
    loop_t, sweep_t = [], []
    for _ in range(rounds):
        loop_t.append(timed(looped, model, x, targets, means)[0])
        sweep_t.append(timed(batched, model, x, targets, means)[0])
    loop_s, sweep_s = statistics.median(loop_t), statistics.median(sweep_t)
    return {
        "loop_s": loop_s,
        "sweep_s": sweep_s,
        "ratio": loop_s / sweep_s,
        "max_diff": float((res - ref).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="batched head-ablation sweep vs a loop")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {args.rounds} rounds"
    )
    print(f"{'batch':>5} {'loop s':>8} {'sweep s':>8} {'speed-up':>9} {'max |diff|':>11}")
    cfg = vi.VectorTransformerConfig(**PAPER)
    model = vi.HookedVectorTransformer(cfg, seed=0).eval()
    pop = torch.randn(1000, N_POS, cfg.d_in, generator=torch.Generator().manual_seed(0))
    means = mean_activations(model, pop, lambda name: name.endswith("attn.hook_z"))
    for batch in args.batches:
        r = measure(model, means, batch, args.rounds)
        print(
            f"{batch:>5} {r['loop_s']:>8.3f} {r['sweep_s']:>8.3f} "
            f"{r['ratio']:>8.2f}x {r['max_diff']:>11.2e}"
        )
    print("target: sweep >= 5x faster than the loop")


if __name__ == "__main__":
    main()
