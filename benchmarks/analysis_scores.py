"""Analysis scores: the cost of computing them from factored circuits versus dense matrices.

Eigenvalue (copying) scores
---------------------------
Every head's OV circuit ``W_V W_O`` of an attention-only model with 3 layers, 8 heads and
d_head 64, at d_model 1024 and 4096 (24 heads each), float64:

- factored: ``eigenvalue_scores(ov_circuit(model))``, i.e. per head the eigenvalues of the
  64 x 64 matrix ``B A = W_O W_V`` (all 24 heads in one batched call);
- dense: per head, form the d_model x d_model product ``W_V W_O`` and run
  ``torch.linalg.eigvals`` on it, then take the same ratio ``Re(Σλ) / Σ|λ|``.

A dense eig costs O(d_model³) per head (tens of seconds at 1024, minutes at 4096 on two
cores), so the dense path is timed on only a few heads (``--dense-heads``) and the time
for all 24 heads is extrapolated linearly per head; the output says how many heads were
measured. The scores of the measured heads are compared with the factored ones.

Target (DESIGN.md): eigenvalue scores from factored matrices cost independently of
d_model³. With the defaults the whole run takes about 3 minutes on 2 idle cores (most of
it the one dense 4096 x 4096 eig); longer on a busy machine.

Run: python benchmarks/analysis_scores.py [--threads T] [--dense-heads N1024 N4096]
"""

import argparse
import platform
import statistics
import time

import torch

import vecinterp as vi
from vecinterp.analysis.circuits import ov_circuit
from vecinterp.analysis.scores import eigenvalue_scores

EIGEN_MODEL = dict(d_in=40, d_head=64, n_heads=8, n_layers=3, n_ctx=32, attn_only=True)
EIGEN_D_MODELS = (1024, 4096)


def dense_score(matrix: torch.Tensor) -> float:
    eig = torch.linalg.eigvals(matrix)
    return (eig.real.sum() / eig.abs().sum()).item()


def eigenvalue_benchmark(d_model: int, dense_heads: int, reps: int) -> dict[str, float]:
    cfg = vi.VectorTransformerConfig(d_model=d_model, **EIGEN_MODEL)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    n_heads = cfg.n_layers * cfg.n_heads
    with torch.no_grad():
        ov = ov_circuit(model)
        eigenvalue_scores(ov)  # warm-up
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            factored = eigenvalue_scores(ov)
            times.append(time.perf_counter() - start)
        heads = [(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
        dense_times, diffs = [], []
        for layer, head in heads[:dense_heads]:
            start = time.perf_counter()
            score = dense_score(ov[layer, head].AB)  # the product is formed inside the timing
            dense_times.append(time.perf_counter() - start)
            diffs.append(abs(score - factored[layer, head].item()))
    result = {
        "heads": n_heads,
        "factored_s": statistics.median(times),
        "dense_heads": len(dense_times),
        "score_min": factored.min().item(),
        "score_max": factored.max().item(),
    }
    if dense_times:
        per_head = sum(dense_times) / len(dense_times)
        result.update(
            dense_per_head_s=per_head,
            dense_all_s=per_head * n_heads,
            speedup=per_head * n_heads / result["factored_s"],
            max_abs_diff=max(diffs),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="analysis scores: factored vs dense")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--dense-heads",
        type=int,
        nargs=2,
        default=(2, 1),
        metavar=("N1024", "N4096"),
        help="heads timed on the dense path at d_model 1024 and 4096 (0 skips; default 2 1)",
    )
    parser.add_argument("--reps", type=int, default=20, help="repetitions of the factored path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, float64"
    )
    print(
        "\nEigenvalue scores of every OV circuit (3 layers x 8 heads = 24 heads, d_head 64):\n"
        "factored = eig of each head's 64 x 64 BA, all heads batched (median of "
        f"{args.reps});\n"
        "dense = eigvals of each head's d_model x d_model W_V W_O, timed on the first N "
        "heads,\n        then extrapolated linearly to all 24 heads."
    )
    header = (
        f"{'d_model':>7} {'factored, 24 heads':>19} {'dense / head':>13} {'N':>2} "
        f"{'dense, 24 heads (extrap.)':>26} {'speed-up':>10} {'max |score diff|':>17}"
    )
    print(header)
    for d_model, n_dense in zip(EIGEN_D_MODELS, args.dense_heads, strict=True):
        r = eigenvalue_benchmark(d_model, n_dense, args.reps)
        line = f"{d_model:>7} {r['factored_s'] * 1e3:>16.2f} ms"
        if r["dense_heads"]:
            line += (
                f" {r['dense_per_head_s']:>11.2f} s {r['dense_heads']:>2} "
                f"{r['dense_all_s']:>24.1f} s {r['speedup']:>9.0f}x {r['max_abs_diff']:>17.1e}"
            )
        else:
            line += f" {'(dense path skipped)':>29}"
        print(line, flush=True)
        print(f"{'':>7} scores of the 24 heads in [{r['score_min']:.3f}, {r['score_max']:.3f}]")


if __name__ == "__main__":
    main()
