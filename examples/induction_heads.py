"""Induction heads on vectors: train a 2-layer attention-only transformer on repeated random
vectors, then find its previous-position head, its induction head and the K-composition that
connects them.

The task (``vecinterp.tasks.induction``): ``m`` random unit vectors ``r_1 .. r_m``, then the
same ``m`` again; at every position predict the next vector; the loss is on the repeated half,
where the next vector is the one that followed the previous occurrence of the current one.
The framework paper's story (Elhage et al. 2021; notes in
``papers/mathematical_framework_notes_li.md``, §4.3-4.4) says a 2-layer attention-only model
solves this with two heads: a previous-position head in layer 0 and an induction head in
layer 1 whose keys read what the layer-0 head wrote (K-composition).

This script trains the model on CPU (``vecinterp.tasks.induction.RECIPE``: 2,000 steps,
about 2 minutes on 2 busy cores), folds its LayerNorms (``vi.process_weights``, exact) and
measures with the library's API:

- the eval loss on the repeated half, as ``MSE x dim`` (1 = predicting 0);
- previous-position and induction scores of every head (``vi.previous_position_score``,
  ``vi.induction_score``), hence the best head of each kind;
- the K-, Q- and V-composition scores of the pair (``vi.composition_scores``) against the
  scores of random matrices of the same shapes (``vi.composition_baseline``), as a z-score;
- two causal checks: mean-ablating the layer-0 previous-position heads (their ``hook_z``) and
  re-measuring the induction head's score; mean-ablating the layer-1 induction heads and
  re-measuring the loss.

It prints a results table (``# | claim | ours | verdict``) whose verdicts ("holds" /
"partly" / "does not hold") are computed from the numbers by the thresholds in
:data:`THRESHOLDS`, and writes PNG figures, ``results.json`` and ``report.md`` into
``--out`` (default ``outputs/induction_heads``).

Run::

    python examples/induction_heads.py            # trains and analyses: ~2 min on 2 busy cores
    python examples/induction_heads.py --fast     # CI: a tiny model, ~15-30 s

``--fast`` trains a tiny model (8-dim vectors, d_model 32, 2 heads per layer, periods 3..8)
for 400 steps; it usually forms the circuit too, but its numbers are those of a tiny, briefly
trained model.

Choices (documented here, used below):

- Detector scores are measured on a fixed-period batch (``Settings.analysis_m``: 10, or 5
  with ``--fast``) of 256 (64) fresh sequences; the induction score is also reported at the
  shortest and longest training periods. The previous-position score scores rows ``1..``,
  the induction score rows ``m..`` (``vecinterp.analysis.detectors``).
- "The" previous-position head is the layer-0 head with the highest previous-position score,
  "the" induction head the layer-1 head with the highest induction score; the heads whose
  scores reach ``head_score`` are listed too, and the ablations use all of them (falling back
  to the best head when none reaches it), since a model may spread a role over several heads.
- Composition scores are computed on the processed model (LayerNorm folded into the readers)
  and, for the rotary model, from the QK circuits at offset 0. The baseline draws 1,000
  random pairs; ``z = (score - mean) / std``. Random Gaussian matrices are a low bar: trained
  heads read and write a few structured subspaces, and most trained pairs score above it. So
  claim 4 "holds" only if the pair also has the highest K-composition among the layer-0
  heads writing into the induction head.
- Mean ablation replaces a head's ``hook_z`` by its per-position mean over a population of
  1,000 (200) sequences of the analysis period.
"""

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import vecinterp as vi
from vecinterp.tasks import induction

DEFAULT_OUT = "outputs/induction_heads"
EVAL_SEED = 10_000
MONITOR_SEED = 10_001  # the small eval set watched during training
ANALYSIS_SEED = 20_000
POPULATION_SEED = 30_000


@dataclass(frozen=True)
class Settings:
    """Model, training and analysis sizes."""

    dim: int
    min_m: int
    max_m: int
    d_model: int
    n_heads: int
    d_head: int
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    analysis_m: int
    analysis_batch: int
    population: int
    eval_batches: int
    eval_batch_size: int
    baseline_samples: int


_R = induction.RECIPE
FULL = Settings(
    dim=induction.DEFAULT_DIM,
    min_m=induction.DEFAULT_MIN_M,
    max_m=induction.DEFAULT_MAX_M,
    d_model=64,
    n_heads=4,
    d_head=16,
    steps=_R["steps"],
    batch_size=_R["batch_size"],
    lr=_R["lr"],
    warmup_steps=_R["warmup_steps"],
    analysis_m=10,
    analysis_batch=256,
    population=1000,
    eval_batches=26,  # every period 4..16 twice
    eval_batch_size=64,
    baseline_samples=1000,
)
FAST = Settings(
    dim=8,
    min_m=3,
    max_m=8,
    d_model=32,
    n_heads=2,
    d_head=8,
    steps=400,
    batch_size=32,
    lr=5e-3,
    warmup_steps=20,
    analysis_m=5,
    analysis_batch=64,
    population=200,
    eval_batches=12,
    eval_batch_size=32,
    baseline_samples=300,
)

THRESHOLDS = dict(
    rel_mse_holds=0.05,  # claim 1: MSE x dim on the repeated half (predicting 0 scores 1)
    rel_mse_partly=0.5,
    head_score=0.5,  # claims 2, 3: a head "is" a previous-position / induction head
    head_score_partly=0.3,
    z_holds=5.0,  # claim 4: K-composition of the pair, std above the random baseline (and
    # "holds" also needs the pair to be the top layer-0 writer into the induction head)
    z_partly=2.0,
    ablated_score_holds=0.5,  # claim 6: induction score after / before ablating layer 0
    ablated_score_partly=0.8,
    ablated_mse_holds=0.5,  # claim 7: MSE x dim after ablating the induction heads
    ablated_mse_partly=0.2,
)
"""Every verdict below is computed from these numbers."""

HOLDS, PARTLY, NO = "holds", "partly", "does not hold"


def _level(holds: bool, partly: bool) -> str:
    return HOLDS if holds else PARTLY if partly else NO


def _name(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


# ------------------------------------------------------------------------------ training


def train_model(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    """Train the 2-layer attention-only model; ``{"model", "history", "seconds", ...}``."""
    cfg = induction.model_config(
        s.dim, s.max_m, d_model=s.d_model, n_heads=s.n_heads, d_head=s.d_head
    )
    model = vi.HookedVectorTransformer(cfg, seed=args.seed)
    steps = args.steps or s.steps
    lr = args.lr or s.lr
    batch_size = args.batch_size or s.batch_size
    monitor = induction.fixed_eval_set(
        s.max_m - s.min_m + 1, 32, seed=MONITOR_SEED, dim=s.dim, min_m=s.min_m, max_m=s.max_m
    )

    def make_batch(step: int, gen: torch.Generator) -> induction.InductionBatch:
        return induction.generate(
            batch_size, dim=s.dim, min_m=s.min_m, max_m=s.max_m, generator=gen
        )

    start = time.perf_counter()
    result = vi.train(
        model,
        make_batch,
        steps=steps,
        lr=lr,
        weight_decay=_R["weight_decay"],
        warmup_steps=min(s.warmup_steps, steps),
        schedule=_R["schedule"],
        min_lr=lr * _R["min_lr"] / _R["lr"],
        grad_clip=_R["grad_clip"],
        eval_data=monitor,
        eval_every=max(1, steps // 10),
        seed=args.seed,
        device="cpu",
        progress=not args.no_progress,
    )
    h = result.history
    return {
        "model": result.model.cpu(),
        "history": {
            "steps": h.steps,
            "train_loss": h.train_loss,
            "eval_steps": h.eval_steps,
            "eval_loss": h.eval_loss,
        },
        "seconds": time.perf_counter() - start,
        "steps": steps,
        "lr": lr,
        "batch_size": batch_size,
    }


# ------------------------------------------------------------------------------ analyses


def make_data(s: Settings, dtype: torch.dtype) -> dict[str, Any]:
    """The eval set (every period), the analysis batch and the ablation population."""
    kw = dict(dim=s.dim, dtype=dtype)
    return {
        "eval_set": induction.fixed_eval_set(
            s.eval_batches, s.eval_batch_size, EVAL_SEED, min_m=s.min_m, max_m=s.max_m, **kw
        ),
        "batch": induction.generate(s.analysis_batch, m=s.analysis_m, seed=ANALYSIS_SEED, **kw),
        "population": induction.generate(
            s.population, m=s.analysis_m, seed=POPULATION_SEED, **kw
        ).inputs,
        "short": induction.generate(s.analysis_batch, m=s.min_m, seed=ANALYSIS_SEED + 1, **kw),
        "long": induction.generate(s.analysis_batch, m=s.max_m, seed=ANALYSIS_SEED + 2, **kw),
    }


def relative_mse(model: vi.HookedVectorTransformer, batches: list, dim: int) -> float:
    """Mean per-batch masked MSE times ``dim`` (1 = predicting 0)."""
    return vi.evaluate(model, batches) * dim


def head_scores(model: vi.HookedVectorTransformer, data: dict) -> dict[str, Any]:
    """Claims 2 and 3: detector scores of every head, the best head of each kind."""
    batch = data["batch"]
    patterns = vi.attention_patterns(model, batch.inputs)  # [layer, batch, head, dest, src]
    prev = vi.previous_position_score(patterns)  # [n_layers, n_heads]
    ind = vi.induction_score(patterns, m=batch.m)
    thr = THRESHOLDS["head_score"]
    prev_head = (0, int(prev[0].argmax()))
    ind_head = (1, int(ind[1].argmax()))
    ind_by_m = {}
    for key in ("short", "long"):
        b = data[key]
        ind_by_m[b.m] = float(
            vi.induction_score(vi.attention_patterns(model, b.inputs), m=b.m)[ind_head]
        )
    return {
        "patterns": patterns,
        "prev_scores": prev.tolist(),
        "induction_scores": ind.tolist(),
        "prev_head": prev_head,
        "induction_head": ind_head,
        "prev_score": float(prev[prev_head]),
        "induction_score": float(ind[ind_head]),
        "induction_score_by_m": ind_by_m,
        "prev_heads": [(0, h) for h in range(prev.shape[1]) if prev[0, h] >= thr],
        "induction_heads": [(1, h) for h in range(ind.shape[1]) if ind[1, h] >= thr],
    }


def composition(model: vi.HookedVectorTransformer, heads: dict, s: Settings) -> dict[str, Any]:
    """Claims 4 and 5: K/Q/V composition of the pair against the random baseline."""
    (l0, h0), (l1, h1) = heads["prev_head"], heads["induction_head"]
    scores = {kind: vi.composition_scores(model, kind=kind) for kind in ("K", "Q", "V")}
    base = vi.composition_baseline(model, "K", n_samples=s.baseline_samples, seed=0)
    pair = {kind: float(sc[l0, h0, l1, h1]) for kind, sc in scores.items()}
    z = {kind: (value - base.mean) / base.std for kind, value in pair.items()}
    k01 = scores["K"][0, :, 1, :]  # [layer-0 head, layer-1 head]
    others = k01[:, h1][torch.arange(k01.shape[0]) != h0]  # other writers into the head
    return {
        "pair": pair,
        "z": z,
        "baseline_mean": base.mean,
        "baseline_std": base.std,
        "baseline_max": float(base.samples.max()),
        "baseline_samples": base.samples.tolist(),
        "k_grid": k01.tolist(),
        "q_grid": scores["Q"][0, :, 1, :].tolist(),
        "v_grid": scores["V"][0, :, 1, :].tolist(),
        # among the layer-0 heads, how the pair ranks as a writer into the induction head
        "rank_in_column": int((k01[:, h1] > k01[h0, h1]).sum()) + 1,
        "runner_up": float(others.max()) if others.numel() else float("nan"),
    }


def _ablated_heads(found: list, best: tuple[int, int]) -> list[tuple[int, int]]:
    return found if found else [best]


def ablations(model: vi.HookedVectorTransformer, heads: dict, data: dict, s: Settings) -> dict:
    """Claims 6 and 7: mean-ablate the previous-position heads, then the induction heads."""
    batch, pop = data["batch"], data["population"]
    prev_heads = _ablated_heads(heads["prev_heads"], heads["prev_head"])
    ind_heads = _ablated_heads(heads["induction_heads"], heads["induction_head"])
    means = vi.mean_activations(model, pop, ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"])
    hook = vi.mean_ablation_hook(means["blocks.0.attn.hook_z"], heads=[h for _, h in prev_heads])
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", hook)]):
        patterns = vi.attention_patterns(model, batch.inputs)
    score_after = float(vi.induction_score(patterns, m=batch.m)[heads["induction_head"]])
    with torch.no_grad():
        before = vi.masked_mse(model(batch.inputs), batch.targets, batch.loss_mask).item()
        out = vi.ablate_heads(
            model, batch.inputs, {1: [h for _, h in ind_heads]}, kind="mean", population=means
        )
        after = vi.masked_mse(out, batch.targets, batch.loss_mask).item()
        out_prev = vi.ablate_heads(
            model, batch.inputs, {0: [h for _, h in prev_heads]}, kind="mean", population=means
        )
        after_prev = vi.masked_mse(out_prev, batch.targets, batch.loss_mask).item()
    return {
        "prev_heads": prev_heads,
        "induction_heads": ind_heads,
        "score_before": heads["induction_score"],
        "score_after": score_after,
        "rel_mse_before": before * s.dim,
        "rel_mse_after": after * s.dim,
        "rel_mse_after_prev": after_prev * s.dim,
        "population": int(pop.shape[0]),
    }


def run_analyses(model: vi.HookedVectorTransformer, data: dict, s: Settings) -> dict[str, Any]:
    """Every measurement; plain numbers (and the patterns for the figures)."""
    results: dict[str, Any] = {}
    with torch.no_grad():
        results["rel_mse"] = relative_mse(model, data["eval_set"], s.dim)
        copy_current = [
            vi.masked_mse(b.inputs, b.targets, b.loss_mask).item() for b in data["eval_set"]
        ]
    results["rel_mse_copy_current"] = sum(copy_current) / len(copy_current) * s.dim
    results["heads"] = head_scores(model, data)
    results["composition"] = composition(model, results["heads"], s)
    results["ablation"] = ablations(model, results["heads"], data, s)
    return results


# ------------------------------------------------------------------------------- claims


def claims_table(r: dict) -> list[dict]:
    """The rows ``{number, claim, ours, value, verdict}``; verdicts from :data:`THRESHOLDS`."""
    t = THRESHOLDS
    rows: list[dict] = []

    def row(claim: str, ours: str, value: float, verdict: str) -> None:
        rows.append(
            {"number": len(rows) + 1, "claim": claim, "ours": ours, "value": value,
             "verdict": verdict}
        )  # fmt: skip

    mse = r["rel_mse"]
    row(
        "the model predicts the repeated half (eval MSE x dim; predicting 0 scores 1)",
        f"{mse:.4f} (copying the current vector: {r['rel_mse_copy_current']:.2f})",
        mse,
        _level(mse <= t["rel_mse_holds"], mse <= t["rel_mse_partly"]),
    )
    h = r["heads"]
    found = ", ".join(map(_name, h["prev_heads"])) or "none"
    row(
        "layer 0 has a previous-position head",
        f"{_name(h['prev_head'])}: score {h['prev_score']:.3f} (heads >= {t['head_score']}: "
        f"{found})",
        h["prev_score"],
        _level(h["prev_score"] >= t["head_score"], h["prev_score"] >= t["head_score_partly"]),
    )
    found = ", ".join(map(_name, h["induction_heads"])) or "none"
    by_m = ", ".join(f"m={m}: {v:.3f}" for m, v in sorted(h["induction_score_by_m"].items()))
    row(
        "layer 1 has an induction head (attends to the vector after the previous occurrence)",
        f"{_name(h['induction_head'])}: score {h['induction_score']:.3f} ({by_m}; heads >= "
        f"{t['head_score']}: {found})",
        h["induction_score"],
        _level(
            h["induction_score"] >= t["head_score"],
            h["induction_score"] >= t["head_score_partly"],
        ),
    )
    c = r["composition"]
    pair = f"{_name(h['prev_head'])} -> {_name(h['induction_head'])}"
    zk = c["z"]["K"]
    row(
        "their K-composition stands out from random matrices",
        f"{pair}: K {c['pair']['K']:.3f} vs random {c['baseline_mean']:.3f} +- "
        f"{c['baseline_std']:.3f} (z = {zk:.1f}; random max {c['baseline_max']:.3f}); rank "
        f"{c['rank_in_column']} of the layer-0 heads into {_name(h['induction_head'])} "
        f"(next best {c['runner_up']:.3f})",
        zk,
        _level(zk >= t["z_holds"] and c["rank_in_column"] == 1, zk >= t["z_partly"]),
    )
    k, q, v = c["pair"]["K"], c["pair"]["Q"], c["pair"]["V"]
    row(
        "K-composition, not Q or V, connects the pair",
        f"K {k:.3f}, Q {q:.3f}, V {v:.3f} (z: {zk:.1f}, {c['z']['Q']:.1f}, {c['z']['V']:.1f})",
        k - max(q, v),
        _level(k > max(q, v) and zk >= t["z_holds"], k > min(q, v)),
    )
    a = r["ablation"]
    ratio = a["score_after"] / a["score_before"] if a["score_before"] > 0 else float("nan")
    prevs = ", ".join(map(_name, a["prev_heads"]))
    row(
        "the induction head needs the previous-position head(s): mean-ablate them",
        f"{prevs} ablated: {_name(h['induction_head'])} induction score "
        f"{a['score_before']:.3f} -> {a['score_after']:.3f} (x{ratio:.2f})",
        ratio,
        _level(ratio <= t["ablated_score_holds"], ratio <= t["ablated_score_partly"]),
    )
    inds = ", ".join(map(_name, a["induction_heads"]))
    row(
        "the prediction needs the induction head(s): mean-ablate them",
        f"{inds} ablated: MSE x dim {a['rel_mse_before']:.4f} -> {a['rel_mse_after']:.3f} "
        f"(ablating {prevs} instead: {a['rel_mse_after_prev']:.3f})",
        a["rel_mse_after"],
        _level(
            a["rel_mse_after"] >= t["ablated_mse_holds"],
            a["rel_mse_after"] >= t["ablated_mse_partly"],
        ),
    )
    return rows


def format_table(rows: list[dict]) -> str:
    """The results table in Markdown."""
    lines = ["| # | claim | ours | verdict |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['number']} | {row['claim']} | {row['ours']} | {row['verdict']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- figures


def _mark(ax: Any, target: torch.Tensor, color: str) -> None:
    """Outline the cells where ``target [dest, src]`` is nonzero."""
    dest, src = target.nonzero(as_tuple=True)
    ax.scatter(src, dest, marker="s", s=30, facecolors="none", edgecolors=color, linewidths=1.0)


def save_figures(results: dict, data: dict, history: dict, out: Path, dpi: int) -> list[str]:
    """Write the PNG figures into ``out``; returns their file names."""
    dim = data["batch"].inputs.shape[-1]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vecinterp import plot

    names: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.savefig(out / name, dpi=dpi)
        plt.close(fig)
        names.append(name)

    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    plot.plot_loss(
        history["steps"],
        history["train_loss"],
        eval_steps=history["eval_steps"],
        eval_losses=history["eval_loss"],
        ax=ax,
        title="training loss (masked MSE on the repeated half)",
    )
    ax.axhline(1 / dim, color="0.4", linestyle="--", linewidth=1, label="predicting 0 (1/dim)")
    ax.legend()
    save(fig, "loss.png")

    h, batch = results["heads"], data["batch"]
    mean_patterns = h["patterns"].mean(dim=1)  # [layer, head, dest, src], over the batch
    n = batch.length
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
    for ax, head, target, label in (
        (axes[0], h["prev_head"], vi.previous_position_target(n), "previous-position"),
        (axes[1], h["induction_head"], vi.induction_target(n, batch.m), "induction"),
    ):
        plot.plot_attention(
            mean_patterns[head],
            ax=ax,
            title=f"{_name(head)}, {label} head (m = {batch.m}; boxes: target)",
        )
        _mark(ax, target, "tab:red")
    save(fig, "patterns.png")

    n_heads = mean_patterns.shape[1]
    fig = plot.plot_attention_grid(
        mean_patterns,
        title=f"every head's attention, mean of {batch.inputs.shape[0]} sequences (m = {batch.m})",
    )
    save(fig, "attention_all_heads.png")

    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.6 * n_heads, 3.2), layout="constrained")
    plot.plot_score_grid(h["prev_scores"], ax=axes[0], title="previous-position score")
    plot.plot_score_grid(
        h["induction_scores"], ax=axes[1], title=f"induction score (m = {batch.m})"
    )
    save(fig, "head_scores.png")

    c = results["composition"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    plot.plot_score_grid(
        c["k_grid"], ax=axes[0], title="K-composition: layer-0 head -> layer-1 head", fmt=".3f"
    )
    axes[0].set_xlabel("layer-1 head")
    axes[0].set_ylabel("layer-0 head")
    ax = axes[1]
    ax.hist(c["baseline_samples"], bins=40, color="0.7", label="random matrices")
    for kind, color, style in (
        ("K", "tab:red", "-"),
        ("Q", "tab:blue", "--"),
        ("V", "tab:green", ":"),
    ):
        ax.axvline(
            c["pair"][kind], color=color, linestyle=style, linewidth=2, label=f"pair: {kind}"
        )
    for value in torch.tensor(c["k_grid"]).flatten().tolist():  # every layer-0 -> layer-1 pair
        ax.axvline(value, color="tab:red", linewidth=0.8, alpha=0.5, ymax=0.12)
    values = [*c["baseline_samples"], *c["pair"].values(), *torch.tensor(c["k_grid"]).flatten()]
    span = max(values) - min(values)
    ax.set_xlim(min(values) - 0.05 * span, max(values) + 0.05 * span)
    ax.set_title(f"{_name(h['prev_head'])} -> {_name(h['induction_head'])} vs random pairs")
    ax.set_xlabel("composition score ‖L R‖_F / (‖L‖_F ‖R‖_F)  (ticks: all K pairs)")
    ax.set_ylabel("count")
    ax.legend(fontsize=8, loc="upper center")
    save(fig, "composition.png")
    return names


def write_report(rows: list[dict], figures: list[str], meta: dict, out: Path) -> Path:
    """``report.md``: setup, the results table, the thresholds, the figures."""
    lines = [
        "# Induction heads on vectors",
        "",
        f"Model: {meta['config']}.",
        f"Training: {meta['training']}.",
        f"Wall time: {meta['wall']:.1f} s (training {meta['train_seconds']:.1f} s).",
        "",
        format_table(rows),
        "",
        "Verdicts are computed from these thresholds (`THRESHOLDS` in "
        "`examples/induction_heads.py`):",
        "",
        "```",
        json.dumps(THRESHOLDS, indent=1),
        "```",
        "",
        "## Figures",
        "",
    ]
    lines += [f"![{name}]({name})" for name in figures]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_json(results: dict, rows: list[dict], meta: dict, out: Path) -> Path:
    """``results.json``: every number of the table (no tensors)."""
    h, c = results["heads"], dict(results["composition"])
    c.pop("baseline_samples")
    payload = {
        "meta": meta,
        "rel_mse": results["rel_mse"],
        "rel_mse_copy_current": results["rel_mse_copy_current"],
        "heads": {k: v for k, v in h.items() if k != "patterns"},
        "composition": c,
        "ablation": results["ablation"],
        "rows": rows,
        "thresholds": THRESHOLDS,
    }
    path = out / "results.json"
    path.write_text(json.dumps(payload, indent=1, default=list))
    return path


# ---------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny model and data (CI)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Train, analyse, write the report; returns the results table rows."""
    start = time.perf_counter()
    args = parse_args(argv)
    settings = FAST if args.fast else FULL
    torch.set_num_threads(1)  # small models: extra threads cost more than they give
    trained = train_model(args, settings)
    model = vi.process_weights(trained["model"])  # fold LN, centre writers, fold value biases
    model.eval()
    data = make_data(settings, model.W_E.dtype)
    results = run_analyses(model, data, settings)
    rows = claims_table(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = save_figures(results, data, trained["history"], out, dpi=60 if args.fast else 100)
    cfg = model.cfg
    meta = {
        "config": f"d_in {cfg.d_in}, d_model {cfg.d_model}, {cfg.n_layers} layers x "
        f"{cfg.n_heads} heads (d_head {cfg.d_head}), attention only, {cfg.positional} "
        f"positions, n_ctx {cfg.n_ctx}",
        "training": f"{trained['steps']} steps, batch {trained['batch_size']}, lr "
        f"{trained['lr']:g} (cosine), periods m = {settings.min_m}..{settings.max_m}, "
        f"seed {args.seed}",
        "settings": asdict(settings),
        "train_seconds": trained["seconds"],
        "wall": time.perf_counter() - start,
    }
    write_json(results, rows, meta, out)
    report = write_report(rows, figures, meta, out)
    print(format_table(rows))
    print(f"\nreport: {report}; figures: {', '.join(figures)}")
    print(f"wall time: {meta['wall']:.1f} s (training {trained['seconds']:.1f} s)")
    return rows


if __name__ == "__main__":
    main()
