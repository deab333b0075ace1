"""Attribution patching against activation patching on the trained affine-recurrence model:
how closely the first-order estimate follows the patched runs, hook point by hook point,
and how much faster it is over every head x position cell.

Model: the shipped reference model (``affine_recurrence.load_reference("fast")``: the
paper's config, d_in 40, d_model 128, 8 heads, 3 layers, d_mlp 3072), fp32.
Clean batch: 8 sequences of length 14 (``generate(8, length=14, seed=1)``). Metrics:

- ``mse``: the masked MSE of the output against the clean sequences' targets
  (``vi.masked_mse``), so a patch that restores the clean computation lowers it. It is
  quadratic in the output and near its minimum at the clean run, the case where a
  first-order estimate is least reliable (a patch that restored the clean output entirely
  would be estimated at about twice its effect);
- ``toward``: how far the output has moved from the corrupted run's towards the clean
  run's, ``<y - y_corr, y_clean - y_corr> / |y_clean - y_corr|^2`` over the scored
  positions (0 at the corrupted run, 1 at the clean run), linear in the output (like a
  logit difference), so only the model's own nonlinearity separates the two.

Corruptions:

- ``other``: 8 other sequences (``seed=2``): every input differs, by a lot;
- ``last``: the clean sequences with the last input vector taken from ``other``: one
  position differs, so only the cells at that position (and after it) can matter;
- ``noise``: the clean inputs plus 0.01 x standard-normal noise: the regime where a
  first-order estimate should be close.

For each corruption, metric and hook point, both functions sweep every cell of every layer;
the figures are the Pearson correlation between the estimate and the exact change
``activation_patching(...) - metric(corrupted run)`` over those cells, the relative error
``|estimate - exact| / |exact|`` (Euclidean norms over the cells) and the slope of the
least-squares line through the origin (1: right on average).

Speed (target, issue 15: >= 20x): attribution patching against activation patching over
every ``hook_z`` head x position cell (3 x 8 x 14 = 336 cells) of a batch of 16 (clean
``seed=1``, corrupted ``seed=2``), default chunk size, the two alternating round by round;
each figure is the median over rounds (5 attribution runs per round). Also in
forward-equivalents: attribution patching's time over that of one plain forward pass on
the batch (no grad), the two alternating 20 times, medians, against the issue's budget
of 3 (a clean pass, a corrupted pass that keeps the graph, a backward pass).

``--task induction``: the same comparison on the trained vector induction model
(``vecinterp.tasks.induction``'s preset: 2 layers, attention only, LayerNorm, rotary,
d_model 64, 4 heads of 16), trained on the CPU with ``induction.RECIPE`` (2,000 steps of
batch 32, about 2 minutes on one thread), seed 0; ``--load DIR`` reads a model saved with
``--save DIR`` instead of training. Clean batch: 8 sequences ``r_1..r_m r_1..r_m`` with
``m = 10`` (``induction.generate(8, m=10, seed=1)``). Metrics as above, over the scored
repeated half (``mse``: against the next vectors, the targets). Hook points: those of an
attention-only model (no ``mlp_out``). Corruptions:

- ``other``, ``last``, ``noise``: as above (``other``: ``generate(8, m=10, seed=2)``);
  ``noise`` is small against the unit vectors' components (about 0.25 each in 16
  dimensions);
- ``even``: the first half's even positions ``0, 2, .., m-2`` taken from ``other``, the
  corruption of ``benchmarks/path_patching_induction.py``: the repeated half is unchanged,
  but half of its vectors no longer occur earlier and the other half are followed there by
  the wrong vector, so induction fails at every scored position.

The speed measurement is made on the affine model only.

Run: python benchmarks/attribution_patching.py [--rounds N] [--threads T]
     python benchmarks/attribution_patching.py --task induction [--save DIR | --load DIR]
"""

import argparse
import platform
import statistics
import time

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar
from vecinterp.tasks import induction

BATCH, TIMED_BATCH, LENGTH = 8, 16, 14
PERIOD = 10  # induction: m, so 2 m = 20 positions
HOOKS = [
    ("resid_pre", "layer_pos"),
    ("attn_out", "layer_pos"),
    ("mlp_out", "layer_pos"),
    ("z", "head"),
    ("z", "head_pos"),
]
ATTN_ONLY_HOOKS = [hook for hook in HOOKS if hook[0] != "mlp_out"]


def corruptions(clean: torch.Tensor) -> dict[str, torch.Tensor]:
    other = ar.generate(clean.shape[0], length=LENGTH, seed=2).inputs
    last = clean.clone()
    last[:, -1] = other[:, -1]
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(3))
    return {"other": other, "last": last, "noise": clean + 0.01 * noise}


def induction_corruptions(clean: torch.Tensor) -> dict[str, torch.Tensor]:
    other = induction.generate(clean.shape[0], m=PERIOD, seed=2).inputs
    last = clean.clone()
    last[:, -1] = other[:, -1]
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(3))
    even = clean.clone()
    even[:, 0:PERIOD:2] = other[:, 0:PERIOD:2]
    return {"other": other, "last": last, "noise": clean + 0.01 * noise, "even": even}


def train_induction(steps: int, seed: int) -> vi.HookedVectorTransformer:
    start = time.perf_counter()
    model = induction.train_preset(seed=seed, steps=steps).model
    print(f"trained the induction model, {steps} steps, in {time.perf_counter() - start:.0f} s")
    return model


def compare(model, clean, targets, mask, corrupted_inputs, hooks) -> None:
    """Print, for each corruption, metric and hook point, how the estimate agrees."""

    def metric(y: torch.Tensor) -> torch.Tensor:
        return vi.masked_mse(y, targets, mask)

    with torch.no_grad():
        print(f"mse on the clean run: {float(metric(model(clean))):.3e}", flush=True)
    print(f"{'corruption':<10} {'metric':<7} {'hook':<10} {'by':<10} {'cells':>5} {'r':>7} "
          f"{'rel err':>8} {'slope':>6}  metric(corrupted)")  # fmt: skip
    for kind, corrupted in corrupted_inputs.items():
        metrics = {"mse": metric, "toward": toward(model, clean, corrupted, mask)}
        for metric_name, m in metrics.items():
            with torch.no_grad():
                base = float(m(model(corrupted)))
            for hook_name, by in hooks:
                exact = vi.activation_patching(
                    model, clean, corrupted, m, hook_name, by=by, progress=False
                )
                estimate = vi.attribution_patching(model, clean, corrupted, m, hook_name, by=by)
                r, rel, slope = agreement(estimate, exact - base)
                print(
                    f"{kind:<10} {metric_name:<7} {hook_name:<10} {by:<10} {exact.numel():>5} "
                    f"{r:>7.4f} {rel:>8.3f} {slope:>6.3f}  {base:.3e}",
                    flush=True,
                )


def induction_main(args: argparse.Namespace) -> None:
    model = vi.load(args.load) if args.load else train_induction(args.steps, args.seed)
    if args.save:
        vi.save(model, args.save)
    model.eval()
    data = induction.generate(BATCH, m=PERIOD, seed=1)
    corrupted = induction_corruptions(data.inputs)
    compare(model, data.inputs, data.targets, data.loss_mask, corrupted, ATTN_ONLY_HOOKS)


def toward(model, clean: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor):
    """The ``toward`` metric: 0 at the corrupted run's output, 1 at the clean run's."""
    with torch.no_grad():
        y_clean, y_corr = model(clean), model(corrupted)
    direction = (y_clean - y_corr) * mask[..., None]
    scale = (direction**2).sum()
    return lambda y: ((y - y_corr) * direction).sum() / scale


def agreement(estimate: torch.Tensor, exact: torch.Tensor) -> tuple[float, float, float]:
    a, b = estimate.flatten().double(), exact.flatten().double()
    r = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    rel = float((a - b).norm() / b.norm())
    slope = float(a @ b / (b @ b))
    return r, rel, slope


def timed(fn, *args, **kwargs) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description="attribution vs activation patching")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="induction: default 1")
    parser.add_argument("--task", choices=["affine", "induction"], default="affine")
    parser.add_argument("--steps", type=int, default=induction.RECIPE["steps"])
    parser.add_argument("--seed", type=int, default=0, help="induction model's seed")
    parser.add_argument("--save", help="save the trained induction model into this directory")
    parser.add_argument("--load", help="load an induction model saved with --save")
    args = parser.parse_args()
    if args.task == "induction":
        # one thread by default: two threads' OpenMP barriers spin on busy cores
        torch.set_num_threads(args.threads or 1)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        return induction_main(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {args.rounds} rounds"
    )
    model = ar.load_reference("fast")

    def metric_for(data: ar.AffineBatch):
        return lambda y: vi.masked_mse(y, data.targets, data.loss_mask)

    data = ar.generate(BATCH, length=LENGTH, seed=1)
    compare(model, data.inputs, data.targets, data.loss_mask, corruptions(data.inputs), HOOKS)

    data = ar.generate(TIMED_BATCH, length=LENGTH, seed=1)
    clean, metric = data.inputs, metric_for(data)
    corrupted = corruptions(clean)["other"]
    run = dict(model=model, clean_x=clean, corrupted_x=corrupted, metric=metric, hook_name="z")
    vi.attribution_patching(**run, by="head_pos")  # warm-up (activation patching is warm)
    act_t, att_t = [], []
    for _ in range(args.rounds):
        t, exact = timed(vi.activation_patching, **run, by="head_pos", progress=False)
        act_t.append(t)
        for _ in range(5):  # cheap: more samples for a steadier median
            t, estimate = timed(vi.attribution_patching, **run, by="head_pos")
            att_t.append(t)
    act_s, att_s = statistics.median(act_t), statistics.median(att_t)
    fwd_t, att_again = [], []
    for _ in range(20):
        with torch.no_grad():
            fwd_t.append(timed(model, clean)[0])
        att_again.append(timed(vi.attribution_patching, **run, by="head_pos")[0])
    fwd_s, att_again_s = statistics.median(fwd_t), statistics.median(att_again)
    with torch.no_grad():
        base = float(metric(model(corrupted)))
    r, _, _ = agreement(estimate, exact - base)
    print(
        f"every hook_z head x position cell ({exact.numel()} cells, batch {TIMED_BATCH}, "
        f"r = {r:.4f}): activation patching {act_s:.3f} s, attribution patching "
        f"{att_s:.4f} s: {act_s / att_s:.1f}x faster (target >= 20x)"
    )
    print(
        f"one forward pass {fwd_s:.4f} s, attribution patching {att_again_s:.4f} s: "
        f"{att_again_s / fwd_s:.2f} forward-equivalents (budget 3)"
    )


if __name__ == "__main__":
    main()
