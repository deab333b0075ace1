"""Where does the affine-recurrence model keep c, d and a_{n-1}, and does it use them there?

The task of Bhargav & Gu, "Interpreting Affine Recurrence Learning in GPT-style
Transformers" (2024, arXiv:2410.17438): a 3-layer transformer reads ``a_0 .. a_{n-1}``
(40-dim vectors, normalised) of ``a_k = c a_{k-1} + d`` and predicts the next vector. This
script asks, on the shipped model:

1. **Decodability.** ``vi.fit_probes``: a ridge probe at each residual point (7 of them,
   in depth order) × position, for ``c`` (a scalar per sequence), ``d`` (40 numbers per
   sequence) and ``a_{t-1}`` at position ``t``: held-out R² with a 95 % bootstrap interval,
   and the selectivity against the same architecture with random weights.
2. **Use.** At every point × position, the probe's subspace (``c``: 1 direction, ``d``:
   40) is swapped from a source sequence into a base sequence (``vi.subspace_patch_hook``)
   and the prediction at that position compared with what the recurrence says the swap
   means: ``c_src a_t + d_base`` for ``c``, ``c_base a_t + d_src`` for ``d``. The figure
   shows the fraction of that counterfactual change the swap achieves (1: all of it, 0:
   none, < 0: it moves the prediction away).
3. **Alignment search.** ``vi.alignment_search`` learns a subspace for ``c`` (k = 1) and
   for ``d`` (k = 40) at one point and position, and compares its fraction with the
   probe subspace's there and with the same search on a random model.

Run::

    python examples/affine_probes.py              # the shipped model, a few minutes
    python examples/affine_probes.py --fast       # CI: fewer sequences and steps, seconds

It prints the headline numbers and writes ``probe_map.png`` and ``results.json`` to
``--out``.
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

POINTS = (
    "blocks.0.hook_resid_pre",
    "blocks.0.hook_resid_mid",
    "blocks.1.hook_resid_pre",
    "blocks.1.hook_resid_mid",
    "blocks.2.hook_resid_pre",
    "blocks.2.hook_resid_mid",
    "blocks.2.hook_resid_post",
)
"""The residual stream in depth order (``resid_post`` of layer L is ``resid_pre`` of L+1)."""
LABELS = ("pre 0", "mid 0", "pre 1", "mid 1", "pre 2", "mid 2", "post 2")
LENGTH = 14
SCORED = range(ar.FIRST_SCORED_POS, LENGTH)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="fast", help="a reference name or vi.save folder")
    parser.add_argument("--fast", action="store_true", help="few sequences and steps (CI)")
    parser.add_argument("--sequences", type=int, default=4096, help="for the probes")
    parser.add_argument("--pairs", type=int, default=128, help="for the interventions")
    parser.add_argument("--das-pairs", type=int, default=256)
    parser.add_argument("--swap-positions", type=int, nargs="+", default=list(SCORED))
    parser.add_argument("--das-steps", type=int, default=30)
    parser.add_argument("--das-point", default="blocks.2.hook_resid_mid")
    parser.add_argument("--das-pos", type=int, default=8)
    parser.add_argument("--out", default="outputs/affine_probes")
    parser.add_argument("--dpi", type=int, default=100)
    parser.add_argument(
        "--threads", type=int, help="torch's threads (default: vi.choose_threads(), the idle cores)"
    )
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.fast:
        args.sequences, args.pairs, args.das_pairs, args.das_steps = 256, 16, 64, 3
        args.swap_positions = [2, 8, 13]
    return args


def counterfactuals(base: ar.AffineBatch, source: ar.AffineBatch) -> dict[str, torch.Tensor]:
    """The recurrence's next vector with ``c`` (or ``d``) taken from the source."""
    a = base.inputs
    return {
        "c": source.c[:, None, None] * a + base.d[:, None],
        "d": base.c[:, None, None] * a + source.d[:, None],
    }


def swap_map(
    model: vi.HookedVectorTransformer,
    base: ar.AffineBatch,
    source: ar.AffineBatch,
    target: torch.Tensor,
    weight: torch.Tensor,
    positions: list[int],
) -> torch.Tensor:
    """``[point, pos]``: fraction of the counterfactual change at position ``t`` achieved by
    swapping the probe subspace ``weight[point, t]`` at ``(point, t)`` only (NaN at the
    positions not swapped). Each run starts at the point's block from the base's cached
    residual stream."""
    out = torch.full((len(POINTS), LENGTH), torch.nan, dtype=torch.float64)
    with torch.no_grad():
        y_base = model(base.inputs)
        _, cache = model.run_with_cache(source.inputs, names_filter=list(POINTS))
        for i, name in enumerate(POINTS):
            layer = int(name.split(".")[1])
            resid = model(base.inputs, stop_at_layer=layer) if layer else base.inputs
            for t in positions:
                hook = vi.subspace_patch_hook(cache[name], weight[i, t].to(y_base), (t,))
                with model.hooks(fwd_hooks=[(name, hook)]):
                    y = model(resid, start_at_layer=layer) if layer else model(resid)
                moved = (y[:, t] - target[:, t]).pow(2).sum()
                before = (y_base[:, t] - target[:, t]).pow(2).sum()
                out[i, t] = float(1 - moved / before)
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # the idle cores (at least 1), torch's setting restored at the end: see getting started
    with vi.use_threads(args.threads or "auto"):
        return run(args)


def run(args: argparse.Namespace) -> dict:
    """Everything :func:`main` does, on torch's threads as :func:`main` set them."""
    progress = not args.no_progress
    if args.checkpoint in ar.REFERENCE_MODELS:
        model = ar.load_reference(args.checkpoint, device="cpu")
    else:
        model = vi.load(args.checkpoint, device="cpu")
    timings: dict[str, float] = {}

    # 1. where each variable is linearly decodable
    t0 = time.perf_counter()
    data = ar.generate(args.sequences, length=LENGTH, seed=0)
    prev = torch.full_like(data.inputs, torch.nan)
    prev[:, 1:] = data.inputs[:, :-1]  # a_{t-1} at position t; undefined at 0
    targets = {"c": data.c, "d": data.d, "a_prev": prev}
    fewer = dict(n_folds=2, n_bootstrap=50) if args.fast else {}
    probes = vi.fit_probes(model, data.inputs, targets, list(POINTS), progress=progress, **fewer)
    timings["probes"] = time.perf_counter() - t0

    # 2. swapping the probe subspace: does the prediction move as the recurrence says?
    t0 = time.perf_counter()
    base = ar.generate(args.pairs, length=LENGTH, seed=1)
    source = ar.generate(args.pairs, length=LENGTH, seed=2)
    cf = counterfactuals(base, source)
    swaps = {
        v: swap_map(model, base, source, cf[v], probes[v].weight, args.swap_positions)
        for v in ("c", "d")
    }
    timings["swaps"] = time.perf_counter() - t0

    # 3. alignment search at one point x position, against the random model
    t0 = time.perf_counter()
    das_base = ar.generate(args.das_pairs, length=LENGTH, seed=3)
    das_source = ar.generate(args.das_pairs, length=LENGTH, seed=4)
    das_cf = counterfactuals(das_base, das_source)
    mask = torch.zeros(LENGTH, dtype=torch.bool)
    mask[args.das_pos] = True
    das = {
        v: vi.alignment_search(
            model,
            das_base.inputs,
            das_source.inputs,
            das_cf[v],
            args.das_point,
            k,
            position=args.das_pos,
            output_mask=mask,
            steps=args.das_steps,
            progress=progress,
        )
        for v, k in (("c", 1), ("d", ar.DEFAULT_DIM))
    }
    timings["alignment search"] = time.perf_counter() - t0

    summary = headline(probes, swaps, das, args)
    summary["timings_s"] = timings
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    if not args.no_figures and importlib.util.find_spec("matplotlib") is not None:
        draw(probes, swaps, das, args).savefig(out / "probe_map.png", dpi=args.dpi)
        print(f"figure: {out / 'probe_map.png'}")
    return {"probes": probes, "swaps": swaps, "das": das, "summary": summary}


def headline(probes: dict, swaps: dict, das: dict, args: argparse.Namespace) -> dict:
    """Print and return, per variable: the best cell and the per-point medians."""
    summary: dict = {"variables": {}}
    scored = list(SCORED)
    for v, r in probes.items():
        r2 = r.r2[:, scored]
        i, j = divmod(int(r2.nan_to_num(-1e9).argmax()), len(scored))
        t = scored[j]
        entry = {
            "best": dict(
                point=POINTS[i],
                pos=t,
                r2=float(r.r2[i, t]),
                ci=[float(r.r2_low[i, t]), float(r.r2_high[i, t])],
                control_r2=float(r.control_r2[i, t]),
                shuffled_r2=float(r.shuffled_r2[i, t]),
            ),
            "median_r2_by_point": dict(zip(LABELS, r2.nanmedian(1).values.tolist(), strict=True)),
            "median_selectivity_by_point": dict(
                zip(LABELS, r.selectivity[:, scored].nanmedian(1).values.tolist(), strict=True)
            ),
        }
        print(
            f"\n{v}: best at {POINTS[i]} position {t}: R² {r.r2[i, t]:.3f} "
            f"[{r.r2_low[i, t]:.3f}, {r.r2_high[i, t]:.3f}], random model "
            f"{r.control_r2[i, t]:.3f}, shuffled {r.shuffled_r2[i, t]:.3f}"
        )
        print(
            "  median over positions 2..13 by point (R² / selectivity):  "
            + "  ".join(
                f"{lab} {a:.2f}/{s:.2f}"
                for lab, a, s in zip(
                    LABELS,
                    r2.nanmedian(1).values,
                    r.selectivity[:, scored].nanmedian(1).values,
                    strict=True,
                )
            )
        )
        if v in swaps:
            s = swaps[v][:, args.swap_positions]
            k, m = divmod(int(s.argmax()), len(args.swap_positions))
            entry["swap"] = dict(
                median_by_point=dict(zip(LABELS, s.nanmedian(1).values.tolist(), strict=True)),
                best=dict(point=POINTS[k], pos=args.swap_positions[m], fraction=float(s[k, m])),
            )
            print(
                "  swapping its probe subspace: median fraction of the counterfactual change "
                "by point: "
                + "  ".join(
                    f"{lab} {f:.2f}" for lab, f in zip(LABELS, s.nanmedian(1).values, strict=True)
                )
                + f"; best {s[k, m]:.3f} at {POINTS[k]} position {args.swap_positions[m]}"
            )
            found = das[v]
            i_das = POINTS.index(found.hook_name) if found.hook_name in POINTS else None
            probe_there = (
                float(swaps[v][i_das, args.das_pos]) if i_das is not None else float("nan")
            )
            entry["alignment_search"] = dict(
                point=found.hook_name,
                pos=args.das_pos,
                k=found.basis.shape[1],
                fraction=found.fraction_explained,
                random_model=found.control_fraction_explained,
                probe_subspace=probe_there,
            )
            print(
                f"  alignment search (k={found.basis.shape[1]}) at {found.hook_name} position "
                f"{args.das_pos}: held-out fraction {found.fraction_explained:.3f} (random "
                f"model {found.control_fraction_explained:.3f}; probe subspace there "
                f"{probe_there:.3f})"
            )
        summary["variables"][v] = entry
    return summary


def draw(probes: dict, swaps: dict, das: dict, args: argparse.Namespace):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(13, 10), constrained_layout=True)
    rows = [
        ("probe R² (held out)", {v: probes[v].r2 for v in probes}, (0, 1), "viridis"),
        ("selectivity", {v: probes[v].selectivity for v in probes}, (-1, 1), "RdBu_r"),
        ("probe-subspace swap", dict(swaps), (-1, 1), "RdBu_r"),
    ]
    names = {"c": "c", "d": "d", "a_prev": "a_{t-1}"}
    for r, (title, maps, (lo, hi), cmap) in enumerate(rows):
        for col, v in enumerate(("c", "d", "a_prev")):
            ax = axes[r, col]
            if v not in maps:
                ax.axis("off")
                if r == 2:
                    ax.text(
                        0,
                        0.5,
                        das_text(das, args),
                        fontsize=9,
                        va="center",
                        family="monospace",
                        transform=ax.transAxes,
                    )
                continue
            im = draw_map(ax, maps[v], lo, hi, cmap)
            ax.set_yticks(range(len(LABELS)), LABELS)
            ax.set_xlabel("position")
            ax.set_title(f"{names[v]}: {title}", fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(
        "Affine recurrence, shipped model; residual points in depth order × position.\n"
        "Row 1: held-out R² of a ridge probe for c, d, a_{t-1}.  Row 2: selectivity = R² − "
        "R² of the same probe on the architecture with random weights.\nRow 3: swapping "
        "the probe's subspace from another sequence at one point × position: fraction of "
        "the change to the recurrence's counterfactual\n(c_src a_t + d for c, c a_t + "
        "d_src for d) achieved at that position (1: all, 0: none).  Hatched grey: not "
        "computed (a_{t-1} is undefined at position 0; only some positions are swapped).",
        fontsize=10,
    )
    return fig


def draw_map(ax, values: torch.Tensor, lo: float, hi: float, cmap: str):
    """``values [point, pos]`` as an image on ``ax``; its NaN cells (not computed) hatched
    grey, which no value's colour is (in a diverging map white is 0)."""
    import matplotlib
    from matplotlib.patches import Rectangle

    colours = matplotlib.colormaps[cmap].with_extremes(bad=(0, 0, 0, 0))  # NaN: transparent
    n_rows, n_cols = values.shape
    ax.add_patch(
        Rectangle(
            (-0.5, -0.5),
            n_cols,
            n_rows,
            facecolor="0.8",
            edgecolor="0.45",
            hatch="///",
            linewidth=0,
            zorder=0,
        )  # fmt: skip
    )
    return ax.imshow(values.numpy(), vmin=lo, vmax=hi, cmap=colours, aspect="auto", zorder=1)


def das_text(das: dict, args: argparse.Namespace) -> str:
    lines = [f"alignment search at\n{args.das_point}, position {args.das_pos}", ""]
    for v, found in das.items():
        lines.append(
            f"{v} (k={found.basis.shape[1]}): held-out fraction {found.fraction_explained:.3f}"
        )
        lines.append(f"   random model: {found.control_fraction_explained:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
