"""Path patching on the trained vector induction model: the previous-position head reaches
the induction heads through their keys (K-composition), not their queries or values.

Model: ``vecinterp.tasks.induction``'s preset (2 layers, attention only, LayerNorm, rotary,
d_model 64, 4 heads of 16), trained on the CPU with ``induction.RECIPE`` (2,000 steps of
batch 32, fresh periods ``m = 4..16``), seed 0; ``--load DIR`` reads a model saved with
``--save DIR`` instead of training.

Experiment: clean inputs ``r_1..r_m r_1..r_m`` (64 sequences, ``m = 10``, seed 1); the
corrupted inputs replace the first half's even positions ``0, 2, .., m-2`` by fresh unit
vectors (seed 2). At a scored position ``t = m + j`` (``j`` even) an induction head must
attend to ``j + 1``: that position's own vector (the value it copies, the answer) is the
same in both runs, but its previous vector, which a previous-position head writes there
and an induction head's key reads, is corrupted. Metric: the masked MSE x dim over those
positions against the clean targets (1 = predicting 0; the corrupted run is far above the
clean one). Each path patch pastes one layer-0 head's clean output into the chosen
receivers' inputs only; "restored" is ``(corrupted - patched) / (corrupted - clean)``.

Printed (and written to ``--json``): the detector scores, the clean and corrupted metric,
then for each layer-0 head the fraction restored along the path into the best induction
head's q, k or v input, into every layer-1 head's q, k or v, into the output (the direct
path), and by activation patching the head's whole output; the same on the model with
its LayerNorms folded (``vi.process_weights``), which must agree (path patching applies
each receiver's own LayerNorm, folded or not); and the time of one call.

Run: python benchmarks/path_patching_induction.py [--steps N] [--save DIR | --load DIR]

``--threads`` (default 1): torch threads. On two busy cores, two threads' OpenMP barriers
spin: the same training took over 20 minutes of CPU time instead of 2 minutes with one.
"""

import argparse
import json
import time

import torch

import vecinterp as vi
from vecinterp.tasks import induction

M, BATCH = 10, 64


def train(steps: int, seed: int) -> vi.HookedVectorTransformer:
    start = time.perf_counter()
    model = induction.train_preset(seed=seed, steps=steps).model
    print(f"trained {steps} steps in {time.perf_counter() - start:.0f} s")
    return model


def experiment() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clean inputs, corrupted inputs, clean targets and the scored positions."""
    batch = induction.generate(BATCH, m=M, seed=1)
    fresh = induction.generate(BATCH, m=M, seed=2).inputs
    corrupted = batch.inputs.clone()
    corrupted[:, 0:M:2] = fresh[:, 0:M:2]
    scored = torch.zeros(BATCH, 2 * M, dtype=torch.bool)
    scored[:, M + torch.arange(0, M - 1, 2)] = True
    return batch.inputs, corrupted, batch.targets, scored


def measure(model: vi.HookedVectorTransformer, ind_head: int) -> dict:
    clean, corrupted, targets, scored = experiment()
    dim = model.cfg.d_out

    def metric(y: torch.Tensor) -> torch.Tensor:
        return vi.masked_mse(y, targets, scored) * dim

    with torch.no_grad():
        clean_value, corrupted_value = (float(metric(model(x))) for x in (clean, corrupted))

    def restored(value: torch.Tensor) -> list[float]:
        return ((corrupted_value - value) / (corrupted_value - clean_value)).tolist()

    n_heads = model.cfg.n_heads
    senders = [(0, h) for h in range(n_heads)]
    rows: dict[str, list[float]] = {}
    start = time.perf_counter()
    for channel in "qkv":
        receiver = (1, ind_head, channel)
        rows[f"1.{ind_head} {channel}"] = restored(
            vi.path_patching(model, clean, corrupted, metric, senders, receiver, progress=False)
        )
    seconds = (time.perf_counter() - start) / 3
    for channel in "qkv":
        receivers = [(1, h, channel) for h in range(n_heads)]
        rows[f"all layer-1 {channel}"] = restored(
            vi.path_patching(model, clean, corrupted, metric, senders, receivers, progress=False)
        )
    rows["output (direct)"] = restored(
        vi.path_patching(model, clean, corrupted, metric, senders, "output", progress=False)
    )
    act = vi.activation_patching(
        model, clean, corrupted, metric, "blocks.0.attn.hook_result", by="head", progress=False
    )
    rows["activation patching"] = restored(act)
    return dict(
        clean=clean_value, corrupted=corrupted_value, restored=rows, seconds_per_call=seconds
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=induction.RECIPE["steps"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="save the trained model into this directory")
    parser.add_argument("--load", help="load a model saved with --save instead of training")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = vi.load(args.load) if args.load else train(args.steps, args.seed)
    if args.save:
        vi.save(model, args.save)
    model.eval()

    probe = induction.generate(BATCH, m=M, seed=3)
    patterns = vi.attention_patterns(model, probe.inputs)
    prev = vi.previous_position_score(patterns)
    ind = vi.induction_score(patterns, m=M)
    ind_head = int(ind[1].argmax())
    print(f"previous-position scores, layer 0: {[round(v, 3) for v in prev[0].tolist()]}")
    print(f"induction scores, layer 1:         {[round(v, 3) for v in ind[1].tolist()]}")

    results = {
        "raw": measure(model, ind_head),
        "folded": measure(vi.process_weights(model), ind_head),
    }
    raw = results["raw"]
    print(
        f"\nmetric (masked MSE x dim): clean {raw['clean']:.4f}, corrupted {raw['corrupted']:.4f}"
    )
    print("fraction of the corruption restored, by sender (layer-0 head) and path:\n")
    heads = " | ".join(f"0.{h}" for h in range(model.cfg.n_heads))
    print(f"| path into | {heads} |")
    print("|---" * (model.cfg.n_heads + 1) + "|")
    for name, values in raw["restored"].items():
        print(f"| {name} | " + " | ".join(f"{v:+.3f}" for v in values) + " |")
    gap = max(
        abs(a - b)
        for name in raw["restored"]
        for a, b in zip(raw["restored"][name], results["folded"]["restored"][name], strict=True)
    )
    print(f"\nLayerNorm folded (process_weights): largest difference {gap:.1e}")
    print(f"one call, {model.cfg.n_heads} senders, batch {BATCH}: {raw['seconds_per_call']:.2f} s")
    if args.json:
        results.update(prev_scores=prev.tolist(), induction_scores=ind.tolist(), ind_head=ind_head)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
