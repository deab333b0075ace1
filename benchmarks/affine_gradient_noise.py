"""Gradient signal vs noise of the affine-recurrence model at the end of training.

Why a faster training recipe hits a wall on this task: near the target eval MSE the
mean gradient is a small fraction of the per-batch gradient noise, so progress is bought
with sequences (averaging the noise away), not with larger steps. For every length L in
3..14 this draws ``--batches`` batches of ``--batch-size`` sequences of length L (the
generator draws one length per batch), takes the gradient of the masked MSE on each, and
reports:

- ``|mean gradient|^2``: the squared norm of the gradient averaged over lengths and
  batches (the signal an update follows);
- ``within``: the variance of one batch's gradient about its length's mean, averaged over
  lengths (the noise of a fixed-length batch);
- ``between``: the variance of the per-length means about their average (the extra noise
  of drawing the length per batch, which mixing lengths within a step could remove).

Run: python benchmarks/affine_gradient_noise.py [--checkpoint PATH]  (default: the shipped
reference model, ``affine_recurrence.reference_path("fast")``)
"""

import argparse
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

CHECKPOINT = ar.reference_path("fast")


def flat_gradient(model: vi.HookedVectorTransformer, batch: ar.AffineBatch) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    vi.masked_mse(model(batch.inputs), batch.targets, batch.loss_mask).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    return torch.cat([p.grad.flatten() for p in params]).double()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=12, help="per length")
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = vi.load(args.checkpoint)
    model.train()
    gen = torch.Generator().manual_seed(args.seed)
    means, within = [], []
    print(f"{'length':>6}{'|length mean|^2':>18}{'within variance':>18}")
    for length in range(ar.DEFAULT_MIN_LEN, ar.DEFAULT_MAX_LEN + 1):
        grads = torch.stack(
            [
                flat_gradient(model, ar.generate(args.batch_size, length=length, generator=gen))
                for _ in range(args.batches)
            ]
        )
        mean = grads.mean(0)
        var = ((grads - mean) ** 2).sum(1).sum() / (args.batches - 1)
        means.append(mean)
        within.append(var.item())
        print(f"{length:>6}{(mean**2).sum().item():>18.3e}{var.item():>18.3e}")
    stacked = torch.stack(means)
    overall = stacked.mean(0)
    between = ((stacked - overall) ** 2).sum(1).mean().item()
    signal = (overall**2).sum().item()
    noise = sum(within) / len(within)
    print(f"\ncheckpoint {args.checkpoint.name}, batch {args.batch_size}, ", end="")
    print(f"{args.batches} batches per length")
    print(f"|mean gradient|^2       {signal:.3e}")
    print(f"within-length variance  {noise:.3e}")
    print(f"between-length variance {between:.3e}")
    print(
        f"signal / noise of one batch of {args.batch_size}: {signal / (noise + between):.4f}; "
        f"the length draw is {between / (noise + between):.0%} of the noise"
    )


if __name__ == "__main__":
    main()
