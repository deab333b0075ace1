"""Replicate Bhargav & Gu, "Interpreting Affine Recurrence Learning in GPT-style
Transformers" (2024, arXiv:2410.17438, §4) on trained models, every reading of each claim.

A 3-layer transformer reads normalised affine recurrences ``a_k = c a_{k-1} + d`` (real
vectors) and predicts the next vector. ``vecinterp.tasks.affine_claims.measure_claims``
measures each of the paper's claims under every reading its words allow and judges it on
the primary one by explicit thresholds. This script prints a line per analysis as it runs,
then the claims table, and writes figures and ``report.md`` (a column per model) to ``--out``.

Run::

    python examples/affine_recurrence.py                       # the shipped model, ~13 s
    python examples/affine_recurrence.py --checkpoint fast paper checkpoints/affine_fast_seed1
    python examples/affine_recurrence.py --train --steps 2000  # train a model here first
    python examples/affine_recurrence.py --fast                # CI: a tiny model, seconds

``--checkpoint`` takes reference names (``affine_recurrence.load_reference``, shipped in the
package) and ``vi.save`` folders. ``--fast`` trains a tiny model (d_model 32, 5 heads, 3
layers, 8-dim vectors) for 120 steps on small data: plumbing only, its numbers say nothing
about the paper. ``--acdc`` adds circuit discovery (``affine_claims.discover_affine_circuit``).
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import affine_claims as ac
from vecinterp.tasks import affine_recurrence as ar


def missing_checkpoint_message(path: Path) -> str:
    """What to tell a user whose checkpoint is not there."""
    return (
        f"No model at {path} (and it is not a reference name: {sorted(ar.REFERENCE_MODELS)}).\n"
        f"Train one:  python examples/train_affine.py --out {path}\n"
        "or train one here:  python examples/affine_recurrence.py --train [--steps N] "
        "(--fast for a tiny one)."
    )


def load_model(spec: str) -> tuple[vi.HookedVectorTransformer, dict | None, str, str]:
    """A reference name or a ``vi.save`` folder -> ``(model, training history, source,
    normalise)``; ``normalise``, how its training data were normalised, from its metadata."""
    if spec in ar.REFERENCE_MODELS:
        path, source = ar.reference_path(spec), f"reference model {spec!r}"
        model = ar.load_reference(spec, device="cpu")
    else:
        path, source = Path(spec), f"checkpoint {spec}"
        if not (path / "config.json").is_file():
            raise SystemExit(missing_checkpoint_message(path))
        model = vi.load(path, device="cpu")
    meta = json.loads((path / "config.json").read_text()).get("metadata", {})
    history = path / "history.json"
    history_data = json.loads(history.read_text()) if history.is_file() else None
    return model, history_data, source, meta.get("normalise", "inputs")


def train_model(args: argparse.Namespace) -> tuple[vi.HookedVectorTransformer, dict, str, str]:
    """Train a model here (``--train``/``--fast``) with a cosine schedule."""
    model = vi.HookedVectorTransformer(
        vi.VectorTransformerConfig(
            **(ac.FAST_MODEL_CONFIG if args.fast else ar.MODEL_CONFIG_KWARGS)
        ),
        seed=args.seed,
    )
    dim = model.cfg.d_in
    steps = args.steps or (120 if args.fast else 12_000)
    batch_size = args.batch_size or (16 if args.fast else 64)
    lr = args.lr or (3e-3 if args.fast else 1e-3)
    result = vi.train(
        model,
        lambda step, gen: ar.generate(batch_size, dim=dim, generator=gen),
        steps=steps,
        lr=lr,
        weight_decay=0.01,
        warmup_steps=steps // 20,
        schedule="cosine",
        min_lr=lr * 0.01,
        grad_clip=1.0,
        seed=args.seed,
        device="cpu",
        eval_data=ar.fixed_eval_set(6, 32, seed=10_001, dim=dim),  # monitoring only
        eval_every=max(1, steps // 5),
        progress=not args.no_progress,
    )
    h = result.history
    history = dict(
        steps=h.steps, train_loss=h.train_loss, eval_steps=h.eval_steps, eval_loss=h.eval_loss
    )
    return (
        result.model.cpu(),
        history,
        f"trained here: {steps} steps, batch {batch_size}, lr {lr:g}",
        "inputs",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint",
        nargs="+",
        default=["fast"],
        help="reference names (fast) and/or vi.save folders; one column each",
    )
    parser.add_argument("--train", action="store_true", help="train a model instead of loading")
    parser.add_argument("--fast", action="store_true", help="tiny model and data (CI); trains")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/affine_recurrence")
    parser.add_argument("--dpi", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="0: the idle cores (>= 1)")
    parser.add_argument("--acdc", action="store_true", help="also discover the circuit (~6 s)")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    args.train = args.train or args.fast
    return args


def main(argv: list[str] | None = None) -> list[ac.ClaimsResult]:
    """Run everything; returns one ``ClaimsResult`` per model."""
    start = time.perf_counter()
    args = parse_args(argv)
    if not args.no_figures and importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed (pip install 'vecinterp[plot]'): no figures")
        args.no_figures = True
    threads = args.threads or vi.choose_threads()  # the idle cores: see getting started
    torch.set_num_threads(threads)
    loaded = [train_model(args)] if args.train else [load_model(s) for s in args.checkpoint]
    names = ["trained"] if args.train else [Path(s).name for s in args.checkpoint]
    names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]

    def report(label: str, seconds: float) -> None:
        elapsed = time.perf_counter() - start
        print(f"  {label:<55} {seconds:6.1f} s   (elapsed {elapsed:.1f} s)", flush=True)

    results = []
    for name, (model, _, source, normalise) in zip(names, loaded, strict=True):
        print(f"{name} ({source}):", flush=True)  # judged on data normalised its own way
        sizes = ac.FAST_SIZES if args.fast else {}
        results.append(ac.measure_claims(model, progress=report, normalise=normalise, **sizes))
    if args.acdc:  # which residual-stream edges the first model needs (ACDC)
        t0 = time.perf_counter()
        circuit = ac.discover_affine_circuit(loaded[0][0], progress=not args.no_progress)
        report("automated circuit discovery (ACDC)", time.perf_counter() - t0)
    print()
    print(ac.claims_table(results[0], fmt="text"))
    if len(results) > 1:
        print("\n" + ac.robustness_table(results, names))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, result in zip(names, results, strict=True):  # to re-judge or tabulate later
        (out / f"values_{name}.json").write_text(json.dumps(result.values))
    figures: list[str] = []
    if not args.no_figures:
        import matplotlib

        matplotlib.use("Agg")
        from vecinterp import plot

        t0 = time.perf_counter()
        drawn = ac.claim_figures(results[0], history=loaded[0][1], lazy=True)  # drawn by:
        drawn.update({"circuit": lambda: plot.plot_circuit(circuit)} if args.acdc else {})
        figures = [p.name for p in plot.save_figures(drawn, out, dpi=args.dpi, processes=threads)]
        report("figures", time.perf_counter() - t0)
    wall = time.perf_counter() - start
    text = ac.claims_report(
        results, names, sources=[x[2] for x in loaded], figures=figures, wall=wall
    )
    text += f"\n## Circuit found by ACDC\n\n```\n{circuit.summary()}\n```\n" if args.acdc else ""
    (out / "report.md").write_text(text)
    print(f"\nreport: {out / 'report.md'}; figures: {', '.join(figures) or 'none'}")
    print(f"wall time: {wall:.1f} s")
    return results


if __name__ == "__main__":
    main()
