"""ACDC (``vi.discover_circuit``) on the shipped affine reference model and on the trained
vector induction model: wall time, edges kept, metrics; draws the two circuits.

Affine: ``affine_recurrence.load_reference("fast")``, the paper's model (3 layers x 8 heads
+ MLPs of 3072; 802 edges). Clean inputs: 32 recurrences of length 10
(``affine_recurrence.generate``, seed 1); corrupted inputs: 32 others (seed 2), i.e. other
coefficients ``c``, ``d`` and start. Metric: the MSE of the circuit's output to the model's
own output at the scored positions (``loss_mask``: 2..9), the MSE analogue of ACDC's KL
divergence to the model.

Induction: ``vecinterp.tasks.induction``'s preset (2 layers x 4 heads, attention only,
LayerNorm, rotary; 80 edges) trained on the CPU with ``induction.RECIPE`` (2,000 steps,
about 2 minutes on two busy cores), seed 0, as ``benchmarks/path_patching_induction.py``
does; ``--load DIR`` reads a model saved with ``--save DIR`` instead. Clean inputs:
``r_1..r_m r_1..r_m`` (64 sequences, ``m = 10``, seed 1); corrupted: 64 fresh sequences
(seed 2). Metric: the MSE to the model's output on the repeated half (the scored
positions).

The threshold is ``--tau`` times the metric with every edge removed (one cheap pass); the
affine run at ``--tau`` is the speed figure (the target: 5 minutes on 2 cores); both models
also get a sweep over smaller and larger fractions (``--sweep``, ``--affine-sweep``).

Run::

    python benchmarks/circuit_discovery.py --figures docs/_static/circuit_discovery
    python benchmarks/circuit_discovery.py --skip-affine --load DIR   # induction only

``--threads`` (default 1): torch threads. On two busy cores, two threads' OpenMP barriers
spin: the affine run at ``--tau`` took 48 s with two, 6.6 s with one. ``--json FILE``
writes every figure.
"""

import argparse
import json
import os
import time
from typing import Any

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar
from vecinterp.tasks import induction


def masked_mse_to(reference: torch.Tensor, mask: torch.Tensor):
    """The circuit's distance from the model: MSE to its output at the masked positions."""

    def metric(y: torch.Tensor) -> torch.Tensor:
        return vi.masked_mse(y, reference, mask)

    return metric


def run(name, model, clean, corrupted, mask, taus, figures) -> dict[str, Any]:
    with torch.no_grad():
        reference, y_corrupted = model(clean), model(corrupted)
    metric = masked_mse_to(reference, mask)
    scale = float(metric(y_corrupted))  # every edge removed: the corrupted model
    rows = []
    for fraction in taus:
        start = time.perf_counter()
        result = vi.discover_circuit(
            model, clean, corrupted, threshold=fraction * scale, metric=metric, progress=False
        )
        seconds = time.perf_counter() - start
        tried = len(result.scores)
        print(
            f"{name}: tau = {fraction:g} x {scale:.4g}: {result.n_kept} of {result.n_edges} "
            f"edges kept, metric {result.metric:.4g} ({result.metric / scale:.1%} of all "
            f"removed), {seconds:.1f} s, {result.n_passes} passes, {result.n_trials} trials "
            f"for {tried} edges tried"
        )
        rows.append(
            dict(
                fraction=fraction,
                threshold=result.threshold,
                n_kept=result.n_kept,
                n_edges=result.n_edges,
                metric=result.metric,
                corrupted_metric=result.corrupted_metric,
                seconds=seconds,
                n_passes=result.n_passes,
                n_trials=result.n_trials,
                tried=tried,
                nodes=[str(n) for n in result.nodes],
                edges=[[str(s), str(r)] for s, r in result.edges],
            )
        )
        if figures and fraction == taus[0]:
            print(result.summary())
            _draw(result, os.path.join(figures, f"{name}.png"), name)
    return dict(scale=scale, runs=rows)


def _draw(result, path: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from vecinterp.plot import plot_circuit, save_figure

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    ax = plot_circuit(result, show_unused=True)
    title = ax.get_title().replace("ACDC circuit", f"ACDC circuit, {name} model")
    ax.set_title(title, fontsize="medium")
    save_figure(ax.figure, path, dpi=80)
    print(f"wrote {path} ({os.path.getsize(path) / 1e3:.0f} kB)")


def affine(taus, figures) -> dict[str, Any]:
    model = ar.load_reference("fast").eval()
    clean, corrupted = (ar.generate(32, length=10, seed=seed) for seed in (1, 2))
    mask = clean.loss_mask
    return run("affine", model, clean.inputs, corrupted.inputs, mask, taus, figures)


def train_induction(steps: int, seed: int) -> vi.HookedVectorTransformer:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads' OpenMP barriers spin on busy cores
    start = time.perf_counter()
    model = induction.train_preset(seed=seed, steps=steps).model
    print(f"trained the induction model, {steps} steps, in {time.perf_counter() - start:.0f} s")
    torch.set_num_threads(threads)
    return model


def induction_run(args, taus, figures) -> dict[str, Any]:
    model = vi.load(args.load) if args.load else train_induction(args.steps, args.seed)
    if args.save:
        vi.save(model, args.save)
    model.eval()
    clean = induction.generate(64, m=10, seed=1)
    corrupted = induction.generate(64, m=10, seed=2).inputs
    return run("induction", model, clean.inputs, corrupted, clean.loss_mask, taus, figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau", type=float, default=0.01, help="fraction of the scale")
    parser.add_argument("--sweep", type=float, nargs="*", default=[0.001, 0.003, 0.03, 0.1])
    parser.add_argument("--affine-sweep", type=float, nargs="*", default=[0.001, 0.003])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=induction.RECIPE["steps"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="save the trained induction model here")
    parser.add_argument("--load", help="load the induction model from here (no training)")
    parser.add_argument("--figures", help="draw the circuits into this folder")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--skip-affine", action="store_true")
    parser.add_argument("--skip-induction", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads: {args.threads}; os.cpu_count(): {os.cpu_count()}")
    results: dict[str, Any] = {"threads": args.threads}
    if not args.skip_induction:
        results["induction"] = induction_run(args, [args.tau, *args.sweep], args.figures)
    if not args.skip_affine:
        results["affine"] = affine([args.tau, *args.affine_sweep], args.figures)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
