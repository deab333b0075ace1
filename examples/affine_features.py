"""Which sparse features of the affine-recurrence model track a_{n-1}, c and d, and what
does replacing activations by their dictionaries cost?

On the shipped model (``load_reference("fast")``: 3 layers, d_model 128, 40-dim vectors
of ``a_k = c a_{k-1} + d``), this script trains

- a **TopK SAE** on layer 0's residual output ``blocks.0.hook_resid_post``: by then the
  probes (``examples/affine_probes.py``) find ``a_{t-1}`` at position ``t`` (R² 0.96-0.98)
  and ``d`` (0.72) but hardly ``c`` (0.14-0.23);
- a **TopK transcoder** replacing layer 0's MLP (``blocks.0.ln2.hook_normalized`` ->
  ``blocks.0.hook_mlp_out``): the MLP that writes into the stream the SAE reads, so the
  two dictionaries see the same computation (the attention before it gathers ``a_{t-1}``;
  whatever the MLP adds to it is what a feature of layer 0 can hold), and the cheapest to
  harvest (one block's forward);

then, on held-out sequences, correlates each feature's activation with each variable at
each position (Pearson's r for ``c``; for the 40-dim ``d`` and ``a_{t-1}`` the multiple
correlation, the square root of the held-out R² of a least-squares fit of the feature on
the 40 coordinates, fitted on half the sequences and scored on the other half), compares
the SAE's decoder rows with least-squares probe directions for the three variables at the
same point, and measures the task MSE with each dictionary spliced in with the error term
(equal to the original's) and without it.

Run::

    python examples/affine_features.py           # the default, a few minutes on one core
    python examples/affine_features.py --fast    # CI: fewer sequences and steps, seconds

It prints the headline numbers and writes ``report.md``, ``results.json``,
``features.png`` and the two dictionaries (``sae/``, ``transcoder/``) to ``--out``.
"""

import argparse
import importlib.util
import json
import math
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

LENGTH = 14
SCORED = list(range(ar.FIRST_SCORED_POS, LENGTH))
SAE_POINT = "blocks.0.hook_resid_post"
TC_IN, TC_OUT = vi.transcoder_hooks(0)
VARIABLES = ("a_prev", "c", "d")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="fast", help="a reference name or vi.save folder")
    parser.add_argument("--fast", action="store_true", help="few sequences and steps (CI)")
    parser.add_argument("--train-sequences", type=int, default=4096)
    parser.add_argument("--eval-sequences", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--out", default="outputs/affine_features")
    parser.add_argument("--dpi", type=int, default=100)
    parser.add_argument(
        "--threads", type=int, help="torch's threads (default: vi.choose_threads(), the idle cores)"
    )
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.fast:
        args.train_sequences, args.eval_sequences, args.steps = 256, 256, 150
        args.batch_size, args.d_sae = 256, 256
    return args


def multiple_correlation(acts: torch.Tensor, variable: torch.Tensor) -> torch.Tensor:
    """``[d_sae]``: for each column of ``acts [n, d_sae]``, the square root of the
    held-out R² (clamped at 0) of its least-squares fit on ``variable [n, k]`` with an
    intercept: fitted on the first half of the rows, scored on the second (in-sample, 40
    regressors on a few hundred rows would inflate it); NaN for a column constant on
    either half."""
    a = acts.double()
    v = variable.double().reshape(len(variable), -1)
    h = len(a) // 2
    a_mean, v_mean = a[:h].mean(0), v[:h].mean(0)
    coef = torch.linalg.lstsq(v[:h] - v_mean, a[:h] - a_mean).solution
    test = a[h:] - a_mean
    fit = (v[h:] - v_mean) @ coef
    total = (a[h:] - a[h:].mean(0)).pow(2).sum(0)
    r2 = 1 - (test - fit).pow(2).sum(0) / total
    varies = (total > 0) & (a[:h].std(0) > 0)
    return torch.where(varies, r2.clamp(0, 1).sqrt(), torch.full_like(total, math.nan))


def variables(batch: ar.AffineBatch) -> dict[str, torch.Tensor]:
    """Per sequence and position ``[batch, pos, k]``: ``a_{t-1}`` (NaN at position 0),
    ``c`` and ``d`` (the same at every position)."""
    n, length, dim = batch.inputs.shape
    prev = torch.full_like(batch.inputs, math.nan)
    prev[:, 1:] = batch.inputs[:, :-1]
    return {
        "a_prev": prev,
        "c": batch.c[:, None, None].expand(n, length, 1),
        "d": batch.d[:, None].expand(n, length, dim),
    }


def correlation_map(acts: torch.Tensor, values: dict[str, torch.Tensor]) -> dict:
    """``{variable: [pos, d_sae]}``: the correlation of each feature with the variable at
    each position (signed Pearson r for ``c``, the multiple correlation otherwise; NaN
    where the variable is undefined). ``acts [batch, pos, d_sae]``."""
    out = {}
    for v, value in values.items():
        m = torch.full((acts.shape[1], acts.shape[2]), math.nan, dtype=torch.float64)
        for t in range(acts.shape[1]):
            if value[:, t].isnan().any():
                continue
            if value.shape[-1] == 1:
                m[t] = vi.feature_correlations(acts[:, t], value[:, t, 0])
            else:
                m[t] = multiple_correlation(acts[:, t], value[:, t])
        out[v] = m
    return out


def probe_directions(resid: torch.Tensor, values: dict[str, torch.Tensor]) -> dict:
    """Least-squares readout directions ``[k, d_model]`` of each variable from ``resid
    [batch, pos, d_model]``, pooled over the scored positions."""
    x = resid[:, SCORED].reshape(-1, resid.shape[-1]).double()
    x = torch.cat([x - x.mean(0), torch.ones(len(x), 1, dtype=x.dtype)], 1)
    out = {}
    for v, value in values.items():
        y = value[:, SCORED].reshape(len(x), -1).double()
        out[v] = torch.linalg.lstsq(x, y - y.mean(0)).solution[:-1].T
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with vi.use_threads(args.threads or "auto"):
        return run(args)


def train(model, args, progress: bool) -> tuple[dict, dict[str, float]]:
    """The SAE and the transcoder, trained on layer 0's activations of fresh sequences."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    data = ar.generate(args.train_sequences, length=LENGTH, seed=10)
    with torch.no_grad():
        _, cache = model.run_with_cache(
            data.inputs, names_filter=[SAE_POINT, TC_IN, TC_OUT], stop_at_layer=1
        )
    rows = {n: cache[n].reshape(-1, cache[n].shape[-1]) for n in (SAE_POINT, TC_IN, TC_OUT)}
    timings["harvest"] = time.perf_counter() - t0
    d_model = model.cfg.d_model
    common = dict(d_sae=args.d_sae, activation="topk", k=args.k)
    sae = vi.SparseAutoencoder(vi.DictionaryConfig(d_in=d_model, hook_in=SAE_POINT, **common))
    tc = vi.Transcoder(
        vi.DictionaryConfig(d_in=d_model, transcoder=True, hook_in=TC_IN, hook_out=TC_OUT, **common)
    )
    fit = dict(
        steps=args.steps, batch_size=args.batch_size, lr=3e-3, warmup_steps=args.steps // 20,
        schedule="cosine", progress=progress, threads=None,
    )  # fmt: skip
    for name, d, data_ in (
        ("sae", sae, rows[SAE_POINT]),
        ("transcoder", tc, (rows[TC_IN], rows[TC_OUT])),
    ):
        t0 = time.perf_counter()
        vi.train_dictionary(d, data_, **fit)
        timings[f"train {name}"] = time.perf_counter() - t0
    return {"sae": sae, "transcoder": tc}, timings


def run(args: argparse.Namespace) -> dict:
    """Everything :func:`main` does, on torch's threads as :func:`main` set them."""
    progress = not args.no_progress
    if args.checkpoint in ar.REFERENCE_MODELS:
        model = ar.load_reference(args.checkpoint, device="cpu")
    else:
        model = vi.load(args.checkpoint, device="cpu")
    dictionaries, timings = train(model, args, progress)
    sae, tc = dictionaries["sae"], dictionaries["transcoder"]

    t0 = time.perf_counter()
    ev = ar.generate(args.eval_sequences, length=LENGTH, seed=11)
    values = variables(ev)
    with torch.no_grad():
        _, cache = model.run_with_cache(ev.inputs, names_filter=[SAE_POINT, TC_IN, TC_OUT])
        acts = {"sae": sae.encode(cache[SAE_POINT]), "transcoder": tc.encode(cache[TC_IN])}
    rows = {n: cache[n].reshape(-1, cache[n].shape[-1]) for n in (SAE_POINT, TC_IN, TC_OUT)}
    reports = {
        "sae": vi.feature_report(
            sae, rows[SAE_POINT], name=f"SAE {SAE_POINT}", model=model, point=SAE_POINT,
            x=ev.inputs, model_targets=ev.targets, loss_mask=ev.loss_mask,
        ),
        "transcoder": vi.feature_report(
            tc, rows[TC_IN], rows[TC_OUT], name=f"transcoder {TC_OUT}", model=model,
            x=ev.inputs, model_targets=ev.targets, loss_mask=ev.loss_mask,
        ),
    }  # fmt: skip
    both = vi.splice_metric(model, {SAE_POINT: sae, TC_OUT: tc}, ev.inputs, ev.targets,
                            ev.loss_mask)  # fmt: skip
    with torch.no_grad():
        spliced = vi.splice(model, {SAE_POINT: sae, TC_OUT: tc}, error_term=True)
        with_error = float(spliced(ev.inputs, targets=ev.targets, loss_mask=ev.loss_mask,
                                   return_type="loss"))  # fmt: skip
    corr = {name: correlation_map(a, values) for name, a in acts.items()}
    density = {
        "sae": vi.feature_density(sae, rows[SAE_POINT]),
        "transcoder": vi.feature_density(tc, rows[TC_IN]),
    }
    probes = probe_directions(cache[SAE_POINT], values)
    similarity = {v: vi.decoder_similarity(sae, probes[v]) for v in VARIABLES}
    timings["evaluate"] = time.perf_counter() - t0

    summary = headline(reports, both, with_error, corr, similarity, density)
    summary["timings_s"] = timings
    summary["args"] = {k: v for k, v in vars(args).items() if k != "threads"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "report.md").write_text(markdown(summary, reports))
    for name, d in dictionaries.items():
        vi.save_dictionary(d, out / name)
    if not args.no_figures and importlib.util.find_spec("matplotlib") is not None:
        fig = draw(corr, similarity, density, acts, values, summary)
        fig.savefig(out / "features.png", dpi=args.dpi)
        print(f"figure: {out / 'features.png'}")
    print(f"report: {out / 'report.md'}")
    return dict(
        model=model, dictionaries=dictionaries, reports=reports, corr=corr, acts=acts,
        values=values, eval=ev, density=density, similarity=similarity, summary=summary,
    )  # fmt: skip


def headline(reports, both, with_error, corr, similarity, density) -> dict:
    """Print and return the numbers of the report."""
    summary: dict = {"reports": {}, "features": {}, "probe_similarity": {}}
    for name, r in reports.items():
        s = r.splice
        summary["reports"][name] = dict(
            fvu=r.fvu, l0=r.l0, n_dead=r.n_dead, n_dense=r.n_dense, d_sae=r.d_sae,
            original_mse=s.original_mse, spliced_mse=s.spliced_mse, increase=s.increase,
        )  # fmt: skip
        print(
            f"{r.name}: FVU {r.fvu:.4f}, L0 {r.l0:.1f}, dead {r.n_dead}/{r.d_sae}, dense "
            f"{r.n_dense}; MSE {s.original_mse:.4g} -> {s.spliced_mse:.4g} spliced without "
            f"the error term ({s.increase:+.4g})"
        )
    summary["splice_both"] = dict(
        original_mse=both.original_mse, spliced_mse=both.spliced_mse, increase=both.increase,
        with_error_term_mse=with_error,
    )  # fmt: skip
    print(
        f"both spliced: MSE {both.spliced_mse:.4g} without the error term, {with_error:.4g} "
        f"with it (original {both.original_mse:.4g})"
    )
    for name, maps in corr.items():
        summary["features"][name] = {}
        for v, m in maps.items():
            scored = m[SCORED].abs().nan_to_num(-1)
            best_per_pos = scored.max(1)
            # the feature best at the most positions, and its median |r| over them
            top = int(torch.mode(best_per_pos.indices).values)
            strong = (scored > 0.5).any(0)
            entry = dict(
                best_abs_r_by_pos=dict(zip(SCORED, best_per_pos.values.tolist(), strict=True)),
                best_feature_by_pos=dict(zip(SCORED, best_per_pos.indices.tolist(), strict=True)),
                top_feature=top,
                top_feature_r_by_pos=dict(zip(SCORED, m[SCORED, top].tolist(), strict=True)),
                n_features_above_0_5=int(strong.sum()),
            )
            summary["features"][name][v] = entry
            print(
                f"{name} / {v}: best |r| per position {best_per_pos.values.min():.2f}-"
                f"{best_per_pos.values.max():.2f} (median "
                f"{best_per_pos.values.median():.2f}); feature {top} best at the most "
                f"positions; {int(strong.sum())} features with |r| > 0.5 at some position"
            )
    for v, sim in similarity.items():
        best = sim.abs().nan_to_num(0).max(1).values
        summary["probe_similarity"][v] = dict(
            median_best_abs_cos=float(best.median()), max_best_abs_cos=float(best.max())
        )
        print(
            f"SAE decoder rows vs the {v} readout directions ({sim.shape[0]}): best |cos| "
            f"median {best.median():.2f}, max {best.max():.2f}"
        )
    summary["density"] = {
        k: dict(dead=int((d == 0).sum()), median=float(d.median())) for k, d in density.items()
    }
    return summary


def markdown(summary: dict, reports: dict) -> str:
    lines = ["# Affine recurrence: SAE and transcoder features (layer 0)", ""]
    lines += [vi.FeatureReport.markdown_table(list(reports.values())), ""]
    b = summary["splice_both"]
    lines += [
        f"Both spliced: MSE {b['original_mse']:.4g} (original), {b['with_error_term_mse']:.4g} "
        f"with the error term, {b['spliced_mse']:.4g} without it ({b['increase']:+.4g}).",
        "",
        "## Features tracking each variable (scored positions 2..13)",
        "",
        "| dictionary | variable | best abs r, min..max over positions | median | "
        "features with abs r > 0.5 | feature best at most positions |",
        "|---|---|---|---|---|---|",
    ]
    for name, per_var in summary["features"].items():
        for v, e in per_var.items():
            r = torch.tensor(list(e["best_abs_r_by_pos"].values()))
            lines.append(
                f"| {name} | {v} | {r.min():.3f}..{r.max():.3f} | {r.median():.3f} | "
                f"{e['n_features_above_0_5']} | {e['top_feature']} |"
            )
    lines += ["", "## SAE decoder rows vs least-squares readout directions", ""]
    lines += ["| variable | median best abs cos | max |", "|---|---|---|"]
    for v, e in summary["probe_similarity"].items():
        lines.append(f"| {v} | {e['median_best_abs_cos']:.3f} | {e['max_best_abs_cos']:.3f} |")
    lines += ["", "Timings (s): " + ", ".join(f"{k} {t:.1f}" for k, t in
                                              summary["timings_s"].items())]  # fmt: skip
    return "\n".join(lines) + "\n"


def draw(corr, similarity, density, acts, values, summary):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import vecinterp.plot as vp

    fig, axes = plt.subplots(3, 3, figsize=(14, 11), layout="constrained")
    for col, name in enumerate(("sae", "transcoder")):
        vp.plot_feature_density(density[name], ax=axes[0, col], title=f"{name}: feature density")
    sim = torch.cat([similarity["c"], similarity["d"][:5], similarity["a_prev"][:5]])
    labels = ["c"] + [f"d[{i}]" for i in range(5)] + [f"a_(t-1)[{i}]" for i in range(5)]
    vp.plot_decoder_similarity(sim, labels=labels, top=20, ax=axes[0, 2],
                               title="SAE rows vs readout directions")  # fmt: skip
    for col, name in enumerate(("sae", "transcoder")):
        for row, v in ((1, "a_prev"), (2, "d")):
            ax = axes[row, col]
            m = corr[name][v].abs().numpy()
            top = summary["features"][name][v]["top_feature"]
            ax.plot(range(m.shape[0]), m[:, top], "-o", ms=3, label=f"feature {top}")
            ax.plot(range(m.shape[0]), torch.tensor(m).nan_to_num(-1).max(1).values, "k:",
                    label="best feature")  # fmt: skip
            cm = corr[name]["c"].abs()
            ax.plot(range(m.shape[0]), cm.nan_to_num(-1).max(1).values, "r--",
                    label="best feature for c")  # fmt: skip
            ax.set_ylim(0, 1)
            ax.set_xlabel("position")
            ax.set_ylabel("|r| (multiple r for vectors)")
            ax.set_title(f"{name}: features vs {v}", fontsize=9)
            ax.legend(fontsize=7)
    for row, v in ((1, "a_prev"), (2, "c")):
        name = "sae"
        top = summary["features"][name][v]["top_feature"]
        t = 8
        a = acts[name][:, t, top]
        x = values[v][:, t]
        if x.shape[-1] > 1:  # the feature's least-squares readout of the vector
            xc = x.double() - x.double().mean(0)
            x = xc @ torch.linalg.lstsq(xc, a.double()[:, None] - a.double().mean()).solution
            label = f"best linear readout of {v} (position {t})"
        else:
            label = f"{v} (position {t})"
        vp.plot_feature_activation(x.reshape(-1), a, ax=axes[row, 2], xlabel=label,
                                   title=f"SAE feature {top}")  # fmt: skip
    fig.suptitle(
        "Affine recurrence, shipped model, layer 0: TopK SAE on blocks.0.hook_resid_post and "
        "TopK transcoder for blocks.0's MLP.\nRows 2-3: per position, |correlation| of "
        "features with a_{t-1} and d (multiple correlation over 40 coordinates) and c.",
        fontsize=10,
    )
    return fig


if __name__ == "__main__":
    main()
