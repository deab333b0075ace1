"""The retrieval problem of Mușat (2024), "Mechanism and Emergence of Stacked Attention Heads
in Multi-Layer Transformers" (arXiv:2411.12118), scaled down to minutes on a CPU, with
vecinterp.

A transformer reads ``N`` chains of pairs ``(x_0, x_1), (x_1, x_2), ...`` of random vectors
(interleaved step by step, shuffled within a step) and then one query ``x_0`` per chain,
and must output the chain that starts at each query (the minimal formulation of §6,
:mod:`vecinterp.tasks.retrieval`). The script trains two small attention-only models,
with the implicit curriculum (IC: the target is ``x_1 .. x_D``) and without it (non-IC:
the target is ``x_D`` only), and checks the paper's findings with
:mod:`vecinterp.tasks.retrieval_claims`:

1. with the implicit curriculum the model learns;
2. without it it does not (paper: loss above 0.7);
3. the partial losses fall below 0.5 in chain order, ``x_1`` first (§7.2);
4. a few heads carry the chain, the others are idle (§8.2), found from the heads'
   chain-aligned attention maps and the ablations of 5;
5. the paper's validation (Appendix E): replace every idle head's attention map by uniform
   or identity attention, every carrying head's by a one-hot map along its paths, all at
   once (:func:`vecinterp.ablate_patterns`), and the loss stays low;
6. the circuit's heads emerge during training one by one, with the partial losses
   (average attention along the path above 0.5, §9), measured over the saved checkpoints
   with :func:`vecinterp.analysis.emergence.emergence`.

It prints the results table (``# | claim | paper | ours | verdict``; each verdict is
computed from the numbers by the thresholds in ``retrieval_claims.THRESHOLDS``) and writes
``report.md``, ``values.json`` (every number the verdicts read:
``retrieval_claims.judge_claims(json.load(...))`` re-judges them), ``emergence.csv`` and
PNG figures into ``--out``.

Run::

    python examples/retrieval_problem.py                # about 3 min on 2 CPU cores
    python examples/retrieval_problem.py --fast         # CI: well under a minute
    python examples/retrieval_problem.py --seed 1       # another run
    python examples/retrieval_problem.py --sweep 16     # 16 seeds each, IC and non-IC

``--sweep N`` trains N IC and N non-IC models (seeds ``--seed`` .. ``--seed + N - 1``) as
two :func:`vecinterp.train_ensemble` runs, measures every seed as the default run does
(``retrieval_claims.run_sweep``) and writes ``sweep.md`` (the fractions: how many seeds
learn, in which order the partial losses fall and the circuit's paths emerge),
``sweep.csv`` (a row per seed), ``sweep.json`` and each seed's ``emergence/seed_<s>.csv``.

The default run (``retrieval_claims.FULL``) keeps the paper's ``N = K = 4`` but ``D = 2``,
with 4 attention-only layers of 4 heads, ``d_model`` 64, and 1,000 IC / 600 non-IC steps
at batch 128; ``--fast`` (``retrieval_claims.FAST``) trains 3-layer models on two chains
for 300 steps: it exercises the plumbing, its numbers say nothing about the paper's
claims. The docstring of :mod:`vecinterp.tasks.retrieval_claims` says how the paper is
scaled down and lists every choice the paper leaves open (what "carrying" a path means,
the hypotheses tried for each head, when a loss is "low").
"""

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import vecinterp as vi
from vecinterp.tasks import retrieval_claims as rc

DEFAULT_OUT = "outputs/retrieval_problem"


def save_figures(
    result: rc.ClaimsResult, histories: tuple[Any, Any], out: Path, dpi: int
) -> list[str]:
    """Write the claims' figures as PNGs into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ic_history, non_ic_history = histories
    figures = rc.claim_figures(result, ic_history=ic_history, non_ic_history=non_ic_history)
    names = []
    for name, fig in figures.items():
        fig.savefig(out / f"{name}.png", dpi=dpi)
        plt.close(fig)
        names.append(f"{name}.png")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny models and data (CI)")
    parser.add_argument("--steps", type=int, help="IC training steps")
    parser.add_argument("--non-ic-steps", type=int, help="non-IC training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep them in --out")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--threads", type=int, help="torch's threads (default: vi.choose_threads(), the idle cores)"
    )
    parser.add_argument("--sweep", type=int, metavar="N", help="N seeds each, IC and non-IC")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run everything; returns the results table rows (dicts)."""
    start = time.perf_counter()
    args = parse_args(argv)
    # the idle cores (at least 1), torch's setting restored at the end: see getting started
    with vi.use_threads(args.threads or "auto"):
        return run(args, start)


def run(args: argparse.Namespace, start: float) -> list[dict]:
    """Everything :func:`main` does, on torch's threads as :func:`main` set them."""
    s = rc.FAST if args.fast else rc.FULL
    s = dataclasses.replace(
        s, steps=args.steps or s.steps, non_ic_steps=args.non_ic_steps or s.non_ic_steps
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    if args.sweep is not None:
        return sweep(s, args, out, progress, start)
    with tempfile.TemporaryDirectory() as tmp:
        ck = out / "checkpoints" if args.keep_checkpoints else Path(tmp) / "checkpoints"

        # 1. Train (vi.train on fresh batches of retrieval.generate): IC with a checkpoint
        #    every s.checkpoint_every steps, for the emergence curves; non-IC without.
        t0 = time.perf_counter()
        ic = rc.train_model(s, ic=True, seed=args.seed, checkpoint_dir=ck, progress=progress)
        non_ic = rc.train_model(s, ic=False, seed=args.seed, progress=progress)
        train_time = time.perf_counter() - t0

        # 2. Measure: validation losses, chain-aligned attention maps -> candidate paths,
        #    the Appendix E pattern ablation -> carrying / positional / idle heads, and the
        #    paths' attention and the partial losses at every checkpoint. vi.train saves no
        #    step 0, so the initial model (the same seed) is passed as one.
        initial = vi.HookedVectorTransformer(ic.model.cfg, seed=args.seed)
        checkpoints = [(0, initial), *sorted(ck.glob("step_*"))]
        result = rc.measure_claims(ic.model, non_ic.model, s, checkpoints, progress=progress)

    # 3. Write and print: the numbers, the figures, the report.
    result.data["table"].to_csv(out / "emergence.csv")
    (out / "values.json").write_text(json.dumps(result.values, indent=1) + "\n")
    figures = save_figures(result, (ic.history, non_ic.history), out, dpi=60 if args.fast else 100)
    wall = time.perf_counter() - start
    report = out / "report.md"
    report.write_text(rc.claims_report(result, figures=figures, wall=wall, train_time=train_time))
    print(rc.claims_table(result))
    print(f"\nscaled down from the paper: {result.info['model']}; {result.info['training']}")
    print(f"report: {report}; figures: {', '.join(figures)}")
    print(f"wall time: {wall:.1f} s (training {train_time:.1f} s)")
    return [claim.as_dict() for claim in result.claims]


def sweep(
    s: rc.Settings, args: argparse.Namespace, out: Path, progress: bool, start: float
) -> list:
    """``--sweep N``: N seeds each, IC and non-IC, as two ensembles; returns the rows."""
    ck = out / "checkpoints" if args.keep_checkpoints else None
    seeds = range(args.seed, args.seed + args.sweep)
    result = rc.run_sweep(s, seeds, checkpoint_dir=ck, progress=progress, log=print)
    (out / "emergence").mkdir(exist_ok=True)
    for seed, table in result.tables.items():
        table.to_csv(out / "emergence" / f"seed_{seed}.csv")
    rc.write_sweep_csv(result.rows, out / "sweep.csv")
    info = {**result.info, "wall_s": time.perf_counter() - start}
    dump = {"info": info, "summary": result.summary, "values": [r.values for r in result.rows]}
    (out / "sweep.json").write_text(json.dumps(dump, indent=1) + "\n")
    table = rc.sweep_table(result)
    times = ", ".join(f"{k} {v:.0f}" for k, v in info.items() if k.endswith("_s"))
    setup = "\n".join(f"- {k}: {v}" for k, v in info.items() if not k.endswith("_s"))
    text = f"# Retrieval problem: a sweep over {args.sweep} seeds\n\n{setup}\n- seconds: {times}\n"
    (out / "sweep.md").write_text(f"{text}\n{table}\n")
    print(f"{table}\n\nreport: {out / 'sweep.md'}; wall time {info['wall_s']:.0f} s")
    return [r.csv_row() for r in result.rows]


if __name__ == "__main__":
    main()
