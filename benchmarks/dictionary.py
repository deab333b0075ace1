"""Sparse dictionaries (issue 35): training throughput and harvesting, as ratios in one run.

1. ``train_dictionary`` vs a plain PyTorch loop of the same SAE (same weights, same Adam,
   same TopK or ReLU + L1 loss, the same decoder-norm constraint and parallel-gradient
   removal, the same rows drawn by the same generator) on the same buffered activations:
   seconds per step, interleaved rounds, best-of-rounds and median ratio. Target <= 1.15x.
2. Harvesting (``ActivationBuffer.next_batch`` over a ``make_batch`` source, refills
   included, per model batch) vs a bare forward of the model on the same batches (the
   whole forward, and the forward stopped after the needed block).

    python benchmarks/dictionary.py [--rounds 5] [--steps 100] [--threads 1]
"""

import argparse
import statistics
import time

import torch

import vecinterp as vi
from vecinterp.dictionary import (
    ActivationBuffer,
    DictionaryConfig,
    SparseAutoencoder,
    train_dictionary,
)


def plain_loop(sae: SparseAutoencoder, data: torch.Tensor, steps: int, batch_size: int,
               lr: float, l1: float) -> None:  # fmt: skip
    """The same training, written as a plain loop (no checks, no history, no hooks)."""
    W_enc, b_enc, W_dec, b_dec = sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec
    opt = torch.optim.Adam([W_dec, W_enc, b_enc, b_dec], lr=lr, betas=(0.9, 0.999), foreach=True)
    gen = torch.Generator().manual_seed(0)
    k = sae.cfg.k
    for _ in range(steps):
        x = data[torch.randint(data.shape[0], (batch_size,), generator=gen)]
        pre = (x - b_dec) @ W_enc + b_enc
        if k is None:
            acts = torch.relu(pre)
        else:
            v, i = pre.topk(k, dim=-1)
            acts = torch.zeros_like(pre).scatter(-1, i, torch.relu(v))
        recons = acts @ W_dec + b_dec
        loss = (x - recons).pow(2).sum(-1).mean()
        if k is None:
            loss = loss + l1 * acts.abs().sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            g = W_dec.grad
            g.sub_((g * W_dec).sum(1, keepdim=True) * W_dec)
        opt.step()
        with torch.no_grad():
            W_dec.div_(W_dec.norm(dim=1, keepdim=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {' '.join(load)}")

    cfg = vi.VectorTransformerConfig(
        d_in=8, d_model=args.d_model, d_head=16, n_heads=4, n_layers=3, n_ctx=16
    )
    model = vi.HookedVectorTransformer(cfg, seed=0)
    name = "blocks.0.hook_resid_post"

    def make_batch(step: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(64, 16, 8, generator=gen)

    buffer = ActivationBuffer(model, [name], make_batch, capacity=32768, seed=0)
    data = torch.cat([buffer.next_batch(4096)[name] for _ in range(8)])

    print(f"\n1. training, d {args.d_model}, d_sae {args.d_sae}, batch {args.batch}, "
          f"{args.steps} steps per round")  # fmt: skip
    for activation, k in (("topk", 32), ("relu", None)):
        ours, plain = [], []
        for _ in range(args.rounds):
            dcfg = DictionaryConfig(d_in=args.d_model, d_sae=args.d_sae, activation=activation, k=k)
            a, b = SparseAutoencoder(dcfg, seed=0), SparseAutoencoder(dcfg, seed=0)
            t = time.perf_counter()
            train_dictionary(a, data, steps=args.steps, batch_size=args.batch, lr=1e-3,
                             l1_coeff=1e-3, b_dec="learn", threads=None)  # fmt: skip
            ours.append((time.perf_counter() - t) / args.steps)
            t = time.perf_counter()
            plain_loop(b, data, args.steps, args.batch, 1e-3, 1e-3)
            plain.append((time.perf_counter() - t) / args.steps)
        ratios = [o / p for o, p in zip(ours, plain, strict=True)]
        print(f"  {activation:5s} ours {1e3 * min(ours):.2f} ms/step, plain "
              f"{1e3 * min(plain):.2f} ms/step: ratio per round median "
              f"{statistics.median(ratios):.3f}x, range {min(ratios):.3f}-{max(ratios):.3f}x, "
              f"best-of-rounds {min(ours) / min(plain):.3f}x (target <= 1.15x)")  # fmt: skip

    print("\n2. harvesting 16 model batches of 64 x 16 positions at blocks.0.hook_resid_post")
    harvest, full, stopped = [], [], []
    for _ in range(args.rounds):
        buf = ActivationBuffer(model, [name], make_batch, capacity=64 * 16 * 4, seed=0)
        t = time.perf_counter()
        for _ in range(16):
            buf.next_batch(64 * 16)
        harvest.append((time.perf_counter() - t) / buf.source.step)  # per model batch
        for times, stop in ((full, None), (stopped, 1)):
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                t = time.perf_counter()
                for i in range(16):  # the batches are made inside, as the buffer makes them
                    model(make_batch(i, gen), stop_at_layer=stop)
                times.append((time.perf_counter() - t) / 16)
    print(
        f"  harvest {1e3 * min(harvest):.2f} ms per model batch (refills, shuffles "
        f"included); bare full forward {1e3 * min(full):.2f} ms "
        f"({min(harvest) / min(full):.3f}x); bare forward to block 1 "
        f"{1e3 * min(stopped):.2f} ms ({min(harvest) / min(stopped):.3f}x)"
    )


if __name__ == "__main__":
    main()
