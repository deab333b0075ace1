"""Does the library give the same numbers on a GPU as on the CPU?

Runs the shipped paper-recipe affine model on the CPU and on CUDA and compares, with a
tolerance that states the expected rounding (float32, different kernels: relative error a
few 1e-6 on outputs, larger where a quantity is a difference of near-equal numbers):

- the forward and every activation that ``run_with_cache`` caches;
- ``process_weights`` (done on the GPU) against the CPU's processed model;
- ``eigenvalue_scores(full_ov_circuit(...))``;
- ``head_ablation_sweep`` (mean ablation) on one eval batch;
- ``measure_claims`` with its default sizes: every number it records, and every verdict;
- ``vi.train`` on CUDA: a 40-step run against 20 steps, a checkpoint, and a resume to 40
  (bitwise, same kernels on the same data: a cuBLAS or SDPA kernel that is not
  deterministic would show here).

Each check prints one row and a failing check does not stop the others. Needs CUDA
(``--device cpu`` is a dry run of the script itself)::

    python benchmarks/gpu_agreement.py
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

import vecinterp as vi
from vecinterp.tasks import affine_claims as ac
from vecinterp.tasks import affine_recurrence as ar

ROWS: list[tuple[str, str, str]] = []


def check(name: str, fn: Callable[[], tuple[bool, str]]) -> None:
    t0 = time.perf_counter()
    try:
        ok, detail = fn()
        verdict = "ok" if ok else "DIFFERS"
    except Exception as exc:  # report, go on
        traceback.print_exc()
        verdict, detail = "ERROR", f"{type(exc).__name__}: {exc}"[:200]
    detail += f" ({time.perf_counter() - t0:.1f} s)"
    ROWS.append((name, verdict, detail))
    print(f"| {name} | {verdict} | {detail} |", flush=True)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Largest |a - b| over the largest |b| (so a tensor of small entries beside large
    ones is judged on its scale), and the largest |a - b|."""
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    diff = (a - b).abs()
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite):
        return math.inf, math.inf
    scale = b[finite].abs().max().item() if finite.any() else 1.0
    d = diff[finite].max().item() if finite.any() else 0.0
    return d / max(scale, 1e-30), d


def compare_values(a: Any, b: Any, path: str, out: list[tuple[str, float]]) -> None:
    """Walk two JSON-like values; record the relative error of every number."""
    if isinstance(a, dict):
        for k in b:
            compare_values(a.get(k), b[k], f"{path}.{k}", out)
    elif isinstance(a, list | tuple):
        if not isinstance(b, list | tuple) or len(a) != len(b):
            out.append((path, math.inf))
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            compare_values(x, y, f"{path}[{i}]", out)
    elif isinstance(a, bool) or isinstance(b, bool):
        out.append((path, 0.0 if a == b else math.inf))
    elif isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) and math.isnan(b):
            out.append((path, 0.0))
        else:
            out.append((path, abs(a - b) / max(abs(b), 1e-3)))
    elif a != b:
        out.append((path, math.inf))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="paper")
    parser.add_argument("--tol", type=float, default=1e-4, help="relative tolerance")
    parser.add_argument(
        "--device", default="cuda", help="the device compared with the CPU (cpu: a dry run)"
    )
    args = parser.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    print(torch.__version__, name, "model:", args.model)
    print("tf32 matmul:", torch.backends.cuda.matmul.allow_tf32)
    cpu = ar.load_reference(args.model)
    gpu = ar.load_reference(args.model, device=dev)
    batch = ar.generate(256, seed=123, length=14)
    x_cpu = batch.inputs
    x_gpu = x_cpu.to(dev)
    tol = args.tol
    print("| check | verdict | detail |\n|---|---|---|")

    def forward() -> tuple[bool, str]:
        r, d = rel_err(gpu(x_gpu), cpu(x_cpu))
        return r < tol, f"max rel {r:.2e} (abs {d:.2e})"

    check("forward", forward)

    def cache() -> tuple[bool, str]:
        _, c_gpu = gpu.run_with_cache(x_gpu)
        _, c_cpu = cpu.run_with_cache(x_cpu)
        if set(c_gpu.keys()) != set(c_cpu.keys()):
            return False, "different hook names cached"
        worst = max((rel_err(c_gpu[k], c_cpu[k])[0], k) for k in c_cpu.keys())
        return worst[
            0
        ] < tol, f"{len(list(c_cpu.keys()))} activations, worst {worst[1]} rel {worst[0]:.2e}"

    check("run_with_cache, every activation", cache)

    def processed() -> tuple[bool, str]:
        p_gpu = vi.process_weights(gpu)
        p_cpu = vi.process_weights(cpu)
        r_out, _ = rel_err(p_gpu(x_gpu), cpu(x_cpu))
        worst = max(
            (rel_err(p_gpu.state_dict()[k], v)[0], k) for k, v in p_cpu.state_dict().items()
        )
        return max(r_out, worst[0]) < tol, (
            f"processed-on-GPU outputs vs CPU unprocessed rel {r_out:.2e}; "
            f"weights worst {worst[1]} rel {worst[0]:.2e}"
        )

    check("process_weights", processed)

    def eigen() -> tuple[bool, str]:
        e_gpu = vi.eigenvalue_scores(vi.full_ov_circuit(gpu))
        e_cpu = vi.eigenvalue_scores(vi.full_ov_circuit(cpu))
        d = (e_gpu.detach().cpu().double() - e_cpu.double()).abs().max().item()
        return d < 1e-3, f"max abs diff {d:.2e} (scores in [-1, 1])"

    check("eigenvalue_scores(full_ov_circuit)", eigen)

    def ablation() -> tuple[bool, str]:
        pop = ar.generate(512, seed=7, length=14).inputs
        kw = dict(kind="mean", loss_mask=batch.loss_mask, progress=False)
        s_gpu = vi.head_ablation_sweep(
            gpu,
            x_gpu,
            batch.targets.to(dev),
            population=pop.to(dev),
            **{**kw, "loss_mask": batch.loss_mask.to(dev)},
        )
        s_cpu = vi.head_ablation_sweep(cpu, x_cpu, batch.targets, population=pop, **kw)
        r, d = rel_err(s_gpu, s_cpu)
        return r < 1e-3, f"max rel {r:.2e} of the largest head's loss (abs {d:.2e})"

    check("head_ablation_sweep (mean)", ablation)

    def claims() -> tuple[bool, str]:
        t0 = time.perf_counter()
        r_gpu = ac.measure_claims(gpu)
        t_gpu = time.perf_counter() - t0
        t0 = time.perf_counter()
        r_cpu = ac.measure_claims(cpu)
        t_cpu = time.perf_counter() - t0
        diffs: list[tuple[str, float]] = []
        compare_values(r_gpu.values, r_cpu.values, "values", diffs)
        verdicts = [(c.label, c.verdict) for c in r_cpu.claims]
        verdicts_gpu = [(c.label, c.verdict) for c in r_gpu.claims]
        same_verdicts = verdicts == verdicts_gpu
        big = sorted((d for d in diffs if d[1] > 1e-3), key=lambda t: -t[1])
        for path, d in big[:15]:
            print(f"    values differ: {path} rel {d:.2e}")
        return same_verdicts and not big, (
            f"{len(diffs)} numbers, {len(big)} differ by > 1e-3 relative; verdicts "
            f"{'identical' if same_verdicts else 'DIFFER'}; GPU {t_gpu:.1f} s, CPU {t_cpu:.1f} s"
        )

    check("measure_claims (every number and verdict)", claims)

    def train_resume() -> tuple[bool, str]:
        cfg = cpu.cfg
        kw = dict(lr=1e-3, progress=False, device=dev, seed=3, sync_every=5)

        def data(step: int, g: torch.Generator) -> Any:
            b = ar.generate(64, generator=g)
            return b.inputs, b.targets, b.loss_mask

        with tempfile.TemporaryDirectory() as tmp:
            m1 = vi.HookedVectorTransformer(cfg, seed=1)
            vi.train(m1, data, steps=40, **kw)
            m2 = vi.HookedVectorTransformer(cfg, seed=1)
            vi.train(m2, data, steps=20, checkpoint_dir=tmp, checkpoint_every=20, **kw)
            m3 = vi.HookedVectorTransformer(cfg, seed=1)
            vi.train(m3, data, steps=40, checkpoint_dir=tmp, resume=True, **kw)
            s1, s3 = m1.state_dict(), m3.state_dict()
            same = all(torch.equal(s1[k].cpu(), s3[k].cpu()) for k in s1)
            worst = max(rel_err(s3[k], s1[k])[0] for k in s1)
        return (
            same,
            f"40 steps vs 20 + resume to 40: {'bitwise equal' if same else f'max rel {worst:.2e}'}",
        )

    check("vi.train on CUDA, run vs resume", train_resume)

    n_bad = sum(v != "ok" for _, v, _ in ROWS)
    print(f"\n{len(ROWS) - n_bad}/{len(ROWS)} checks agree")


if __name__ == "__main__":
    main()
