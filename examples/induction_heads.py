"""Induction heads on vectors: train a 2-layer attention-only transformer on repeated random
vectors, then find its previous-position head, its induction head and the K-composition that
connects them.

The task (``vecinterp.tasks.induction``): ``m`` random unit vectors ``r_1 .. r_m``, then the
same ``m`` again; at every position predict the next vector; the loss is on the repeated half,
where the next vector is the one that followed the previous occurrence of the current one.
The framework paper's story (Elhage et al. 2021, "A Mathematical Framework for Transformer
Circuits", Transformer Circuits Thread, not on arXiv: transformer-circuits.pub/2021/framework;
section "Two-Layer Attention-Only Transformers") says a 2-layer attention-only model
solves this with two heads: a previous-position head in layer 0 and an induction head in
layer 1 whose keys read what the layer-0 head wrote (K-composition).

This script trains the model on CPU with the library's recipe
(``vecinterp.tasks.induction.RECIPE``: 2,000 steps, about 2 minutes on 2 busy cores), folds
its LayerNorms (``vi.process_weights``, exact), shows the core calls on it (the detectors,
the composition scores, a mean ablation), then measures the seven claims of the story with
``vecinterp.tasks.induction_claims``: the eval loss (``MSE x dim``, 1 = predicting 0), the
best previous-position and induction heads, their K-, Q- and V-composition against random
matrices, and two mean ablations. It prints the results table (``# | claim | ours |
verdict``; verdicts from ``induction_claims.THRESHOLDS``) and writes the figures,
``results.json`` and ``report.md`` into ``--out`` (default ``outputs/induction_heads``).
The choices behind each number are in ``vecinterp.tasks.induction_claims``'s docstring and
``docs/tasks_induction.rst``.

Run::

    python examples/induction_heads.py            # trains and analyses: ~2 min on 2 busy cores
    python examples/induction_heads.py --fast     # CI: a tiny model, ~15-30 s

``--fast`` trains a tiny model (8-dim vectors, d_model 32, 2 heads per layer, periods 3..8)
for 400 steps; it usually forms the circuit too, but its numbers are those of a tiny, briefly
trained model. ``--steps``, ``--lr``, ``--batch-size`` and ``--seed`` change the training.
``--acdc`` also runs automated circuit discovery (``vi.discover_circuit``, a few seconds) and
adds its graph, ``circuit.png``, to the report.
"""

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import vecinterp as vi
from vecinterp.tasks import induction
from vecinterp.tasks import induction_claims as ic
from vecinterp.tasks.induction_claims import FAST, FULL, THRESHOLDS, Settings

DEFAULT_OUT = "outputs/induction_heads"


def train_model(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    """Train the 2-layer attention-only model with the library's recipe."""
    model = vi.HookedVectorTransformer(s.model_config(), seed=args.seed)
    recipe = s.recipe(steps=args.steps, lr=args.lr, batch_size=args.batch_size)
    batch_size = recipe.pop("batch_size")
    periods = dict(dim=s.dim, min_m=s.min_m, max_m=s.max_m)
    # a small eval set watched during training, one batch per period
    monitor = induction.fixed_eval_set(s.max_m - s.min_m + 1, 32, ic.MONITOR_SEED, **periods)
    start = time.perf_counter()
    result = vi.train(
        model,
        lambda step, gen: induction.generate(batch_size, generator=gen, **periods),
        **recipe,
        eval_data=monitor,
        eval_every=max(1, recipe["steps"] // 10),
        seed=args.seed,
        device="cpu",
        progress=not args.no_progress,
    )
    h = result.history
    return {
        "model": result.model.cpu(),
        "history": dict(
            steps=h.steps, train_loss=h.train_loss, eval_steps=h.eval_steps, eval_loss=h.eval_loss
        ),
        "seconds": time.perf_counter() - start,
        "description": f"{recipe['steps']} steps, batch {batch_size}, lr {recipe['lr']:g} "
        f"(cosine), periods m = {s.min_m}..{s.max_m}, seed {args.seed}",
    }


def core_calls(model: vi.HookedVectorTransformer, s: Settings) -> None:
    """The circuit in a few library calls (``measure_claims`` makes them with more care)."""
    batch = induction.generate(64, m=s.analysis_m, dim=s.dim, seed=1)  # one fixed period
    thr = THRESHOLDS["head_score"]
    prev = vi.detect_heads(model, batch.inputs, "previous_position", thr)  # [(layer, head)]
    ind, scores = vi.detect_heads(
        model, batch.inputs, "induction", thr, m=batch.m, return_scores=True
    )  # scores: [layer, head]
    prev, ind = [h for h in prev if h[0] == 0], [h for h in ind if h[0] == 1]
    print(f"previous-position heads in layer 0: {prev}; induction heads in layer 1: {ind}")
    if not (prev and ind):
        return
    k = vi.composition_scores(model, kind="K")  # [layer, head, layer, head]
    pair = (*prev[0], *max(ind, key=lambda head: scores[head]))  # the best induction head
    print(f"K-composition {pair[:2]} -> {pair[2:]}: {k[pair]:.3f}", end="; ")
    population = induction.generate(200, m=s.analysis_m, dim=s.dim, seed=2).inputs
    means = vi.mean_activations(model, population, "blocks.1.attn.hook_z")
    with torch.no_grad():
        ablated = vi.ablate_heads(
            model, batch.inputs, {1: [h for _, h in ind]}, kind="mean", population=means
        )
        mse = vi.masked_mse(ablated, batch.targets, batch.loss_mask).item()
    print(f"MSE x dim with the induction heads mean-ablated: {mse * s.dim:.3f}")


def discover(
    model: vi.HookedVectorTransformer, s: Settings, report: Path, progress: bool = True
) -> None:
    """ACDC on the trained model: fresh sequences as the corrupted input, the MSE to the
    model's output on the repeated half as the metric, tau 1% of its fully corrupted value;
    the graph into ``circuit.png`` and a section of the report."""
    from vecinterp.plot import plot_circuit, save_figure

    clean = induction.generate(64, m=s.analysis_m, dim=s.dim, seed=1)
    corrupted = induction.generate(64, m=s.analysis_m, dim=s.dim, seed=2).inputs
    with torch.no_grad():
        reference, y_corrupted = model(clean.inputs), model(corrupted)

    def metric(y: torch.Tensor) -> torch.Tensor:
        return vi.masked_mse(y, reference, clean.loss_mask)

    tau = 0.01 * float(metric(y_corrupted))
    result = vi.discover_circuit(
        model, clean.inputs, corrupted, threshold=tau, metric=metric, progress=progress
    )
    save_figure(plot_circuit(result).figure, report.parent / "circuit.png")
    section = (
        f"\n## Circuit found by ACDC\n\n![circuit](circuit.png)\n\n```\n{result.summary()}\n```\n"
    )
    report.write_text(report.read_text() + section)
    print(result.summary())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny model and data (CI)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--threads", type=int, help="torch's threads (default: vi.choose_threads(), the idle cores)"
    )
    parser.add_argument("--acdc", action="store_true", help="also discover the circuit (ACDC)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Train, analyse, write the report; returns the results table rows."""
    start = time.perf_counter()
    args = parse_args(argv)
    # the idle cores (at least 1), torch's setting restored at the end: see getting started
    with vi.use_threads(args.threads or "auto"):
        return run(args, start)


def run(args: argparse.Namespace, start: float) -> list[dict]:
    """Everything :func:`main` does, on torch's threads as :func:`main` set them."""
    settings = FAST if args.fast else FULL
    trained = train_model(args, settings)
    model = vi.process_weights(trained["model"]).eval()  # fold LN, centre writers: exact
    core_calls(model, settings)
    result = ic.measure_claims(model, **settings.measure_kwargs())
    meta = {
        "config": result.info["config"],
        "training": trained["description"],
        "settings": asdict(settings),
        "train_seconds": trained["seconds"],
        "wall": time.perf_counter() - start,
    }
    paths = ic.save_outputs(
        result, args.out, meta=meta, history=trained["history"], dpi=60 if args.fast else 100
    )
    if args.acdc:
        discover(model, settings, paths["report"], progress=not args.no_progress)
    print(ic.claims_table(result))
    figures = ", ".join(p.name for p in paths["figures"])
    print(f"\nreport: {paths['report']}; figures: {figures}")
    print(f"wall time: {time.perf_counter() - start:.1f} s (training {trained['seconds']:.1f} s)")
    return [asdict(claim) for claim in result.claims]


if __name__ == "__main__":
    main()
