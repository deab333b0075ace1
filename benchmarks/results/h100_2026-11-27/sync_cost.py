"""The cost of the forward's input check (one host read) on a GPU: the paper model's
forward at batch 16 with and without it. Run once on an H100 on 2026-11-27 (see
benchmarks/README.md, the GPU section)."""

import time

import torch

import vecinterp.model.transformer as T
from vecinterp.tasks import affine_recurrence as ar

m = ar.load_reference("paper", device="cuda")
x = ar.generate(16, seed=0, length=14).inputs.cuda()


def bench(fn, n=200):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e3


with torch.no_grad():
    a = bench(lambda: m(x))
    orig = T.check_input
    T.check_input = lambda *a, **k: None
    b = bench(lambda: m(x))
    T.check_input = orig
    c = bench(lambda: bool(torch.isfinite(x).all()))
print(f"forward b16 ms: with input check {a:.3f}, without {b:.3f}; the check alone {c:.3f}")
