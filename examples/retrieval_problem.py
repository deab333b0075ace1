"""The retrieval problem of Musat (2024), "Stacked attention heads" (``papers/
stacked_attention_heads_musat_2024.txt``), scaled down to minutes on a CPU, with vecinterp.

A transformer reads ``N`` chains of pairs ``(x_0, x_1), (x_1, x_2), ...`` of random vectors
(interleaved step by step, shuffled within a step) and then one query ``x_0`` per chain,
and must output the chain that starts at each query (the minimal formulation of §6,
:mod:`vecinterp.tasks.retrieval`). The script checks the paper's findings on small models
trained here:

1. with the implicit curriculum (IC: the target is ``x_1 .. x_D``) the model learns;
2. without it (non-IC: the target is ``x_D`` only) it does not (paper: loss above 0.7);
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
computed from the numbers by the thresholds in :data:`THRESHOLDS`) and writes PNG figures
and ``report.md`` into ``--out``.

Run::

    python examples/retrieval_problem.py                # about 3 min on 2 CPU cores
    python examples/retrieval_problem.py --fast         # CI: well under a minute
    python examples/retrieval_problem.py --seed 1       # another run

How it is scaled down from the paper (§7.1: ``N = 4``, ``K = 4``, ``D`` = 3 to 5, 8 heads,
``d_model`` 128, GPT-2 blocks, 1-8 layers, Adam lr 1e-3 with weight decay 0.1, batch 512,
10k steps on 2^20 fixed sequences): ``N = 4`` and ``K = 4`` as in the paper but ``D = 2``;
4 attention-only layers (no MLPs, as the paper's Transformer D of §9) of 4 heads,
``d_model`` 64; AdamW with weight decay 0.1 at lr 3e-3 with a cosine decay to 3e-4 (1e-3
had not learnt ``x_2`` after 600 steps; gradient clipping at 1 kept ``x_2`` from being learnt
within 1,200 steps); batch 128; 1,000 IC steps (a checkpoint every 25) and 600 non-IC steps
on fresh sequences. ``D = 3`` did not train in this budget: ``x_2`` and ``x_3`` stayed at
0.75 (the loss of averaging the four chains' candidates) for 1,500 steps, the paper's slow
phase before the heads emerge. ``--fast`` trains 3-layer models of width 32 on two chains
for 300 steps: it exercises the plumbing, its numbers say nothing about the paper's claims.

Choices where the paper is silent (documented here, used below):

- Chain-aligned attention map of head ``(l, h)``: ``M[r, s] = mean_{b, c} A[b, h,
  pos(b, c, r), pos(b, c, s)]`` over the roles ``L0 R0 L1 R1 .. Q`` of a chain (``L_i``:
  ``x_i`` in pair ``i``, ``R_i``: ``x_{i+1}`` in pair ``i``, ``Q``: the query; positions
  from :attr:`RetrievalBatch.role_positions`). A head *carries* the path ``r -> s``
  (``s != r``) if ``M[r, s] >= THRESHOLDS["path"]``: on average it puts that share of its
  attention from every chain's ``r`` token on the same chain's ``s`` token.
- Hypotheses for a head's map (:data:`CANDIDATES`, simplest first; per sequence
  ``[batch, pos, pos]`` for ``vi.ablate_patterns``): uniform (causal) or identity
  attention (idle); one-hot from each of its ``r`` tokens to the same chain's ``s`` token
  for its paths, identity rows elsewhere; or the same with *positional* one-hot rows
  elsewhere (each row on the position the head attends to most on average; the layout of
  positions is fixed, only the chains move), which for a head without paths is a purely
  positional head such as a previous-token head.
- A loss is "low" if at most ``limit = max(0.05, 1.5 x the unablated loss)`` (the paper's
  0.05, loosened for a model that is not that good). Each head gets the hypothesis with
  the lowest loss when that head alone is replaced; then all heads are replaced at once;
  then heads with one-hot maps are made idle one at a time, most dispensable first, while
  the combined loss stays at most ``max(limit, the combined loss before)`` (the paper's
  "simplest mechanism that maintains a low validation loss"). The heads left with
  one-hot maps along chain paths carry the chain.
- Removing a circuit path (its rows back to identity) from the final combined ablation
  shows whether it is needed; a path that another head duplicates is not.
- Losses are measured on one fixed validation batch of fresh sequences (``EVAL_SEED``), the
  emergence curves on a smaller one; a path "emerges" at the first step its average
  attention exceeds 0.5, interpolated linearly between checkpoints (§9).
"""

import argparse
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import vecinterp as vi
from vecinterp.analysis.emergence import EmergenceTable, emergence
from vecinterp.tasks import retrieval as R

DEFAULT_OUT = "outputs/retrieval_problem"
EVAL_SEED = 10_000
ANALYSIS_SEED = 20_000


@dataclass(frozen=True)
class Settings:
    """Sizes of the task, the models, the training and the data the analyses use."""

    n_chains: int
    depth: int
    dim: int
    n_layers: int
    n_heads: int
    d_model: int
    batch_size: int
    steps: int  # IC training
    non_ic_steps: int
    lr: float  # peak; cosine decay to lr / 10
    checkpoint_every: int
    eval_size: int  # validation sequences for the losses and ablations
    analysis_size: int  # sequences for attention maps and emergence curves


FULL = Settings(
    n_chains=4, depth=2, dim=4, n_layers=4, n_heads=4, d_model=64, batch_size=128,
    steps=1000, non_ic_steps=600, lr=3e-3, checkpoint_every=25,
    eval_size=512, analysis_size=256,
)  # fmt: skip
FAST = Settings(
    n_chains=2, depth=2, dim=4, n_layers=3, n_heads=2, d_model=32, batch_size=64,
    steps=300, non_ic_steps=60, lr=1e-2, checkpoint_every=30,
    eval_size=256, analysis_size=64,
)  # fmt: skip

THRESHOLDS = dict(
    ic_holds=0.05,  # claim 1: final IC loss (the paper's "low" after ablation, App. E)
    ic_partly=0.3,
    non_ic_fails=0.7,  # claim 2: every non-IC run of the paper ends above this
    partial=0.5,  # claim 3: a partial loss has "fallen" below this (§7.2)
    path=0.5,  # claim 4: a head carries r -> s with at least this average attention
    ablation_holds=0.05,  # claim 5 and the simplification: a loss is "low" if at most
    ablation_factor=1.5,  # max(ablation_holds, ablation_factor x the unablated loss)
    ablation_partly=0.5,  # ... partly: below this share of the all-uniform loss
    emerge=0.5,  # claim 6: a path emerged once its average attention exceeds this
)
"""Every verdict below is computed from these numbers."""

HOLDS, PARTLY, NO = "holds", "partly", "does not hold"


# ------------------------------------------------------------------------------ training


def train_model(
    s: Settings, *, ic: bool, steps: int, seed: int, checkpoint_dir: Path | None, progress: bool
) -> vi.TrainResult:
    """Train one attention-only model on fresh batches (IC or non-IC)."""
    cfg = R.model_config(
        s.depth, s.n_layers, implicit_curriculum=ic, n_chains=s.n_chains, dim=s.dim,
        d_model=s.d_model, n_heads=s.n_heads, attn_only=True,
    )  # fmt: skip
    model = vi.HookedVectorTransformer(cfg, seed=seed)
    kw = dict(n_chains=s.n_chains, dim=s.dim, implicit_curriculum=ic)
    return vi.train(
        model,
        lambda step, gen: R.generate(s.batch_size, s.depth, generator=gen, **kw),
        steps=steps,
        lr=s.lr,
        weight_decay=R.PAPER_RECIPE["weight_decay"],
        schedule="cosine",
        min_lr=s.lr / 10,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=s.checkpoint_every if checkpoint_dir is not None else None,
        keep_last=None,
        seed=seed,
        device="cpu",
        progress=progress,
    )


def eval_batch(s: Settings, size: int, seed: int, ic: bool = True) -> R.RetrievalBatch:
    """A fixed batch of fresh sequences (the same inputs for IC and non-IC)."""
    return R.generate(
        size, s.depth, n_chains=s.n_chains, dim=s.dim, implicit_curriculum=ic, seed=seed
    )


def loss_of(outputs: torch.Tensor, batch: R.RetrievalBatch) -> float:
    """The masked MSE at the query positions."""
    return float(vi.masked_mse(outputs, batch.targets, batch.loss_mask))


# ------------------------------------------------------------------------------ analyses


def role_maps(model: vi.HookedVectorTransformer, batch: R.RetrievalBatch) -> torch.Tensor:
    """Chain-aligned attention maps ``[n_layers, n_heads, n_roles, n_roles]``.

    ``M[l, h, r, s] = mean_{b, c} A_l[b, h, pos(b, c, r), pos(b, c, s)]``.
    """
    patterns = vi.attention_patterns(model, batch.inputs)  # [L, B, H, P, P]
    pos = batch.role_positions  # [B, N, roles]
    rows = torch.arange(pos.shape[0])[:, None, None, None]
    dest, src = pos[:, :, :, None], pos[:, :, None, :]
    maps = [
        torch.stack(
            [
                patterns[layer][rows, head, dest, src].mean((0, 1))
                for head in range(model.cfg.n_heads)
            ]
        )
        for layer in range(model.cfg.n_layers)
    ]
    return torch.stack(maps)


def find_paths(maps: torch.Tensor, depth: int, threshold: float) -> list[dict]:
    """Every ``(layer, head, r -> s)`` with ``s != r`` and ``M[r, s] >= threshold``."""
    names = R.role_names(depth)
    found = []
    n_layers, n_heads, n_roles, _ = maps.shape
    for layer in range(n_layers):
        for head in range(n_heads):
            for r in range(n_roles):
                for s in range(n_roles):
                    value = float(maps[layer, head, r, s])
                    if s != r and value >= threshold:
                        found.append(
                            dict(
                                layer=layer, head=head, dest=r, src=s, value=value,
                                name=f"L{layer}H{head} {names[r]}->{names[s]}",
                            )
                        )  # fmt: skip
    return found


def one_hot_map(
    batch: R.RetrievalBatch,
    paths: list[dict],
    base: torch.Tensor | None = None,
    removed: list[dict] = (),
) -> torch.Tensor:
    """``[batch, pos, pos]``: rows ``pos(b, c, r)`` one-hot on ``pos(b, c, s)`` for each path
    ``r -> s`` and every chain ``c``; the rows of the ``removed`` paths on themselves
    (identity); the other rows from ``base`` (``[pos, pos]``, default the identity)."""
    B, P = batch.inputs.shape[:2]
    attn = (torch.eye(P) if base is None else base.float()).repeat(B, 1, 1)
    pos = batch.role_positions
    rows = torch.arange(B)[:, None]
    for path, target in [(p, p["src"]) for p in paths] + [(p, p["dest"]) for p in removed]:
        dest, src = pos[:, :, path["dest"]], pos[:, :, target]  # [B, N]
        attn[rows, dest] = 0.0
        attn[rows, dest, src] = 1.0
    return attn.to(batch.inputs.dtype)


def positional_maps(patterns: torch.Tensor) -> torch.Tensor:
    """``[n_layers, n_heads, pos, pos]``: each destination row one-hot on the source position
    the head attends to most on average (the layout of positions is the same in every
    sequence; only the chains move)."""
    mean = patterns.mean(1)  # [L, H, P, P]
    return torch.nn.functional.one_hot(mean.argmax(-1), mean.shape[-1]).to(mean.dtype)


CANDIDATES = ("uniform", "identity", "paths", "paths+positional")
"""Hypotheses for a head's map, simplest first: idle (uniform, identity), one-hot along its
chain paths with identity rows elsewhere, or with positional one-hot rows elsewhere."""


def validate_circuit(
    model: vi.HookedVectorTransformer,
    batch: R.RetrievalBatch,
    paths: list[dict],
    positional: torch.Tensor,
    sweeps: int = 1,
) -> dict:
    """The paper's Appendix E with ``vi.ablate_patterns``.

    1. Each head alone, every hypothesis of :data:`CANDIDATES` (``"paths"`` only for a head
       with chain paths); each head starts with the one of lowest loss.
    2. ``sweeps`` rounds over the heads: each head takes the hypothesis that gives the
       lowest loss with every head replaced (ties: the simpler); the result is ``full``.
    3. Simplest circuit: heads with a one-hot map, most dispensable first (lowest loss when
       idle alone), are made idle (uniform or identity, the better) while the combined
       loss stays at most ``max(limit, full)``, ``limit = max(ablation_holds,
       ablation_factor x base)``.
    4. Not excessive: the combined loss with each circuit path's rows set to identity.
    """
    cfg = model.cfg
    x = batch.inputs
    with torch.no_grad():
        base = loss_of(model(x), batch)
    t = THRESHOLDS
    limit = max(t["ablation_holds"], t["ablation_factor"] * base)
    heads = [(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    IDLE = ("uniform", "identity")

    def label(key: tuple[int, int]) -> str:
        return f"L{key[0]}H{key[1]}"

    def paths_of(key: tuple[int, int], among: list[dict]) -> list[dict]:
        return [p for p in among if (p["layer"], p["head"]) == key]

    def build(key: tuple[int, int], kind: str, removed: list[dict] = ()) -> Any:
        if kind in IDLE:
            return kind
        base_rows = positional[key] if kind == "paths+positional" else None
        mine = paths_of(key, paths)
        kept = [p for p in mine if p not in removed]
        return one_hot_map(batch, kept, base_rows, [p for p in mine if p in removed])

    def loss_with(choice: dict, removed: list[dict] = ()) -> float:
        maps = {key: build(key, kind, removed) for key, kind in choice.items()}
        return loss_of(vi.ablate_patterns(model, x, maps), batch)

    kinds_of = {
        key: [k for k in CANDIDATES if k != "paths" or paths_of(key, paths)] for key in heads
    }
    single = {key: {k: loss_with({key: k}) for k in kinds_of[key]} for key in heads}
    choice = {key: min(kinds_of[key], key=single[key].get) for key in heads}
    for _ in range(sweeps):
        for key in heads:
            losses = {k: loss_with({**choice, key: k}) for k in kinds_of[key]}
            choice[key] = min(kinds_of[key], key=losses.get)
    full = loss_with(choice)
    bound = max(limit, full)
    idle_of = {key: min(IDLE, key=single[key].get) for key in heads}
    busy = [key for key in heads if choice[key] not in IDLE]
    for key in sorted(busy, key=lambda k: single[k][idle_of[k]]):
        trial = {**choice, key: idle_of[key]}
        if loss_with(trial) <= bound:
            choice = trial
    combined = loss_with(choice)
    circuit = [p for p in paths if choice[(p["layer"], p["head"])] not in IDLE]
    without = {p["name"]: loss_with(choice, [p]) for p in circuit}
    all_uniform = loss_with(dict.fromkeys(heads, "uniform"))
    one_hot = [key for key in heads if choice[key] not in IDLE]
    return {
        "base": base,
        "full": full,
        "combined": combined,
        "limit": limit,
        "all_uniform": all_uniform,
        "kept": circuit,
        "dropped": [p for p in paths if p not in circuit],
        "choice": {label(k): choice[k] for k in heads},
        "single": {label(k): single[k] for k in heads},
        "without": without,
        "carrying": [label(k) for k in one_hot if paths_of(k, circuit)],
        "positional": [label(k) for k in one_hot if not paths_of(k, circuit)],
        "found_heads": [label(k) for k in sorted({(p["layer"], p["head"]) for p in paths})],
    }


def track_emergence(
    checkpoint_dir: Path,
    initial: vi.HookedVectorTransformer,
    batch: R.RetrievalBatch,
    paths: list[dict],
    progress: bool,
) -> EmergenceTable:
    """Average attention along every path and the partial losses at each checkpoint, and
    at step 0 (the initial model, which ``vi.train`` does not checkpoint)."""
    pos = batch.role_positions
    specs = {
        p["name"]: (p["layer"], p["head"], pos[:, :, p["dest"]], pos[:, :, p["src"]]) for p in paths
    }

    def losses(model: vi.HookedVectorTransformer) -> dict[str, float]:
        out = model(batch.inputs)
        parts = R.partial_losses(out, batch)
        named = {f"x_{j + 1}": float(v) for j, v in enumerate(parts)}
        named["loss"] = loss_of(out, batch)
        return named

    checkpoints = [(0, initial)] + sorted(checkpoint_dir.glob("step_*"))
    return emergence(checkpoints, batch, specs or None, losses, progress=progress)


def crossings(table: EmergenceTable, names: list[str], threshold: float, above: bool) -> dict:
    """First (interpolated) step each quantity crosses ``threshold``; None if never."""
    return {n: table.crossing_step(n, threshold, above=above) for n in names}


# ---------------------------------------------------------------------------- the table


def _level(ok: bool, partly: bool) -> str:
    return HOLDS if ok else PARTLY if partly else NO


def _fmt_step(step: float | None) -> str:
    return "never" if step is None else f"{step:.0f}"


def emergence_groups(r: dict) -> list[tuple[str, float | None, list[str]]]:
    """For each partial loss ``x_j`` in the order they fell: the circuit paths that emerged
    since the previous drop, up to one checkpoint interval after this one."""
    drops = sorted(
        ((c, name) for name, c in r["loss_crossing"].items() if c is not None),
        key=lambda pair: pair[0],
    )
    emerged = {n: c for n, c in r["path_crossing"].items() if c is not None}
    groups, seen = [], set()
    for step, name in drops:
        new = [n for n, c in emerged.items() if c <= step + r["checkpoint_every"] and n not in seen]
        seen.update(new)
        groups.append((name, step, new))
    groups += [(n, None, []) for n, c in r["loss_crossing"].items() if c is None]
    return groups


def results_table(r: dict) -> list[dict]:
    """One row per claim: number, claim, paper, ours (text), value (a number), verdict."""
    t = THRESHOLDS
    rows = []

    def row(number: int, claim: str, paper: str, ours: str, value: float, verdict: str) -> None:
        rows.append(
            dict(number=number, claim=claim, paper=paper, ours=ours, value=value, verdict=verdict)
        )

    ic, non_ic, parts = r["ic_loss"], r["non_ic_loss"], r["partial"]
    partial_text = ", ".join(f"x_{j + 1} {v:.4f}" for j, v in enumerate(parts))
    row(
        1,
        "IC formulation learns",
        "low loss (Fig. 4; < 0.05 in App. E)",
        f"final IC loss {ic:.4f} (partial: {partial_text})",
        ic,
        _level(ic <= t["ic_holds"], ic <= t["ic_partly"]),
    )
    row(
        2,
        "non-IC formulation does not learn",
        f"loss > {t['non_ic_fails']} in 100 % of runs",
        f"non-IC loss {non_ic:.4f} after {r['non_ic_steps']} steps "
        f"(IC model on x_{len(parts)}: {parts[-1]:.4f}; predicting 0: 1)",
        non_ic,
        _level(
            non_ic > t["non_ic_fails"] and parts[-1] < t["non_ic_fails"],
            non_ic > t["non_ic_fails"],
        ),
    )
    cross = [r["loss_crossing"][f"x_{j + 1}"] for j in range(len(parts))]
    crossed = [c for c in cross if c is not None]
    ordered = all(a < b for a, b in zip(crossed, crossed[1:], strict=False))
    prefix = all(c is not None for c in cross[: len(crossed)])
    row(
        3,
        f"partial losses fall below {t['partial']} in chain order",
        "x_1 first, then x_2, ... (100 % of runs)",
        "steps " + ", ".join(f"x_{j + 1}: {_fmt_step(c)}" for j, c in enumerate(cross)),
        float(len(crossed)),
        _level(ordered and len(crossed) == len(cross), ordered and prefix and len(crossed) > 0),
    )
    v = r["validation"]
    n_heads = r["n_heads_total"]
    n_carry, n_pos = len(v["carrying"]), len(v["positional"])
    kept = ", ".join(f"{p['name']} ({p['value']:.2f})" for p in v["kept"]) or "none"
    positional = ", ".join(v["positional"]) or "none"
    row(
        4,
        "a few heads carry the chain, most are idle",
        "most heads idle (§8.2); 4 of 12 carry (D = 3, App. E)",
        f"{n_carry} of {n_heads} heads carry: {kept}; positional one-hot heads: {positional}; "
        f"the other {n_heads - n_carry - n_pos} idle ({len(v['found_heads'])} heads had a "
        f"chain path with attention >= {t['path']})",
        float(n_carry),
        _level(1 <= n_carry and n_carry + n_pos <= n_heads / 2, 1 <= n_carry < n_heads),
    )
    base, comb, unif = v["base"], v["combined"], v["all_uniform"]
    needed = [n for n, loss in v["without"].items() if loss > v["limit"]]
    row(
        5,
        "combined attention-map ablation keeps the loss low (App. E)",
        "0.031 -> 0.045 (Transformer D; procedure: < 0.05)",
        f"{base:.4f} -> {comb:.4f} (limit {v['limit']:.4f}; all heads uniform: {unif:.4f}); "
        f"removing one circuit path: {len(needed)} of {len(v['without'])} raise it above "
        "the limit",
        comb,
        _level(
            n_carry > 0 and comb <= v["limit"], n_carry > 0 and comb < t["ablation_partly"] * unif
        ),
    )
    groups = emergence_groups(r)
    em = r["path_crossing"]
    all_emerged = len(em) > 0 and all(c is not None for c in em.values())
    one_by_one = len(groups) > 0 and all(step is not None and new for _, step, new in groups)
    text = "; ".join(
        f"{name} < {t['partial']} at {_fmt_step(step)}: "
        + (", ".join(f"{n} ({em[n]:.0f})" for n in new) or "no new path")
        for name, step, new in groups
    )
    late = [n for n, c in em.items() if c is not None and all(n not in g[2] for g in groups)]
    if late:
        text += "; later: " + ", ".join(f"{n} ({em[n]:.0f})" for n in late)
    never = [n for n, c in em.items() if c is None]
    if never:
        text += "; never: " + ", ".join(never)
    row(
        6,
        f"circuit heads emerge one by one with the partial losses (attention > {t['emerge']})",
        "an induction head drives x_1 down, then one new head per step (§9)",
        text or "no circuit path",
        float(sum(c is not None for c in em.values())),
        _level(all_emerged and one_by_one, any(c is not None for c in em.values())),
    )
    return rows


def format_table(rows: list[dict]) -> str:
    """The results table in Markdown."""
    lines = ["| # | claim | paper | ours | verdict |", "|---|---|---|---|---|"]
    for row in rows:
        cells = [str(row["number"]), row["claim"], row["paper"], row["ours"], row["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- figures


def save_figures(r: dict, out: Path, dpi: int = 100) -> list[str]:
    """Write the PNG figures into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vecinterp import plot

    names = []

    def save(fig: Any, name: str) -> None:
        fig.savefig(out / name, dpi=dpi)
        plt.close(fig)
        names.append(name)

    table: EmergenceTable = r["table"]
    depth = len(r["partial"])

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    for ax, key, label in zip(
        axes, ("ic_history", "non_ic_history"), ("IC", "non-IC"), strict=True
    ):
        plot.plot_loss(r[key], ax=ax, title=f"{label} training loss", log=True)
    save(fig, "loss.png")

    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    plot.plot_emergence(
        table, [f"x_{j + 1}" for j in range(depth)] + ["loss"], ax=ax, log=True,
        threshold=THRESHOLDS["partial"], title="partial validation losses (IC)", ylabel="MSE",
    )  # fmt: skip
    save(fig, "partial_losses.png")

    path_names = [p["name"] for p in r["validation"]["kept"]]
    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    if path_names:
        plot.plot_emergence(
            table, path_names, ax=ax, threshold=THRESHOLDS["emerge"],
            title="average attention along the circuit's paths", ylabel="attention",
        )  # fmt: skip
    else:
        ax.set_title("no carrying path found")
    save(fig, "emergence.png")

    maps = r["role_maps"]
    n_layers, n_heads = maps.shape[:2]
    labels = R.role_names(depth)
    fig, axes = plt.subplots(
        n_layers, n_heads, figsize=(2.3 * n_heads, 2.2 * n_layers), layout="constrained",
        squeeze=False,
    )  # fmt: skip
    for layer in range(n_layers):
        for head in range(n_heads):
            plot.plot_attention(
                maps[layer, head], ax=axes[layer, head], labels=labels, colorbar=False,
                title=f"L{layer}H{head}",
            )  # fmt: skip
    fig.suptitle("chain-aligned attention (mean over sequences and chains)")
    save(fig, "role_attention.png")

    batch: R.RetrievalBatch = r["analysis_batch"]
    v = r["validation"]
    kinds = {h: "carrying" for h in v["carrying"]} | {h: "positional" for h in v["positional"]}
    shown = sorted(kinds) or ["L0H0"]
    pos_labels = position_labels(batch, 0)
    ncols = min(4, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 4.2 * nrows), layout="constrained", squeeze=False
    )
    for ax in axes.flat[len(shown) :]:
        ax.set_axis_off()
    for ax, name in zip(axes.flat, shown, strict=False):
        layer, head = (int(value) for value in name[1:].split("H"))
        plot.plot_attention(
            r["patterns"][layer, 0, head], ax=ax, labels=pos_labels, colorbar=False,
            title=f"{name} ({kinds.get(name, 'no circuit head found')})",
        )  # fmt: skip
    fig.suptitle("the circuit's heads on one sequence (positions: chain a..d, role)")
    save(fig, "carrying_heads.png")
    return names


def position_labels(batch: R.RetrievalBatch, index: int) -> list[str]:
    """``"a:L0"``-style labels of sequence ``index``'s positions (chain letter, role)."""
    labels = [""] * batch.n_pos
    roles = R.role_names(batch.depth)
    for chain in range(batch.n_chains):
        for role, pos in enumerate(batch.role_positions[index, chain].tolist()):
            labels[pos] = f"{chr(ord('a') + chain)}:{roles[role]}"
    return labels


def write_report(rows: list[dict], figures: list[str], r: dict, meta: dict, out: Path) -> Path:
    """``report.md``: the setup, the results table, the ablation details, the figures."""
    v = r["validation"]
    lines = [
        "# The retrieval problem (Musat 2024), scaled down",
        "",
        f"Task: N = {meta['n_chains']} chains, D = {meta['depth']} steps, K = {meta['dim']} "
        f"dims. Models: {meta['config']}. Training: {meta['training']}.",
        f"Wall time: {meta['wall']:.1f} s (training {meta['train_time']:.1f} s).",
        "",
        format_table(rows),
        "",
        "## Attention-map ablation (Appendix E)",
        "",
        f"Validation loss {v['base']:.4f}; combined ablation {v['combined']:.4f} "
        f"(limit {v['limit']:.4f}); with every found path one-hot {v['full']:.4f}; "
        f"all heads uniform {v['all_uniform']:.4f}.",
        "",
        "Circuit paths (mean attention along the path on the analysis batch): "
        + (", ".join(f"{p['name']} ({p['value']:.2f})" for p in v["kept"]) or "none")
        + ". Found paths left out (their heads are idle in the combined ablation): "
        + (", ".join(p["name"] for p in v["dropped"]) or "none")
        + ".",
        "",
        "Loss with only one head replaced, per hypothesis (`paths`: one-hot along its chain "
        "paths, identity elsewhere; `paths+positional`: positional one-hot elsewhere, or "
        "everywhere for a head without paths), and the map each head has in the combined "
        "ablation:",
        "",
        "| head | " + " | ".join(CANDIDATES) + " | combined ablation uses |",
        "|---|" + "---|" * len(CANDIDATES) + "---|",
    ]
    for h, losses in v["single"].items():
        cells = [f"{losses[k]:.4f}" if k in losses else "-" for k in CANDIDATES]
        lines.append(f"| {h} | " + " | ".join(cells) + f" | {v['choice'][h]} |")
    lines += ["", "| circuit path removed from the combined ablation | loss |", "|---|---|"]
    lines += [f"| {n} | {loss:.4f} |" for n, loss in v["without"].items()]
    lines += [
        "",
        "Verdicts are computed from these thresholds (`THRESHOLDS` in "
        "`examples/retrieval_problem.py`):",
        "",
        "```",
        "\n".join(f"{k} = {val}" for k, val in THRESHOLDS.items()),
        "```",
        "",
        "## Figures",
        "",
    ]
    lines += [f"![{name}]({name})" for name in figures]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny models and data (CI)")
    parser.add_argument("--steps", type=int, help="IC training steps")
    parser.add_argument("--non-ic-steps", type=int, help="non-IC training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep them in --out")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run everything; returns the results table rows."""
    start = time.perf_counter()
    args = parse_args(argv)
    s = FAST if args.fast else FULL
    steps = args.steps or s.steps
    non_ic_steps = args.non_ic_steps or s.non_ic_steps
    torch.set_num_threads(1)  # small models: more threads cost more than they give
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    with tempfile.TemporaryDirectory() as tmp:
        ck = out / "checkpoints" if args.keep_checkpoints else Path(tmp) / "checkpoints"
        t0 = time.perf_counter()
        ic = train_model(
            s, ic=True, steps=steps, seed=args.seed, checkpoint_dir=ck, progress=progress
        )
        non_ic = train_model(
            s, ic=False, steps=non_ic_steps, seed=args.seed, checkpoint_dir=None, progress=progress
        )
        train_time = time.perf_counter() - t0
        model = ic.model.cpu().eval()
        val = eval_batch(s, s.eval_size, EVAL_SEED)
        val_non_ic = eval_batch(s, s.eval_size, EVAL_SEED, ic=False)
        analysis = eval_batch(s, s.analysis_size, ANALYSIS_SEED)
        with torch.no_grad():
            out_ic = model(val.inputs)
            r: dict[str, Any] = {
                "ic_loss": loss_of(out_ic, val),
                "partial": R.partial_losses(out_ic, val).tolist(),
                "non_ic_loss": loss_of(non_ic.model.cpu().eval()(val_non_ic.inputs), val_non_ic),
            }
        r["non_ic_steps"] = non_ic_steps
        r["checkpoint_every"] = s.checkpoint_every
        r["ic_history"], r["non_ic_history"] = ic.history, non_ic.history
        r["role_maps"] = role_maps(model, analysis)
        r["patterns"] = vi.attention_patterns(model, analysis.inputs)
        r["analysis_batch"] = analysis
        r["paths"] = find_paths(r["role_maps"], s.depth, THRESHOLDS["path"])
        r["n_heads_total"] = s.n_layers * s.n_heads
        r["validation"] = validate_circuit(model, val, r["paths"], positional_maps(r["patterns"]))
        initial = vi.HookedVectorTransformer(ic.model.cfg, seed=args.seed)  # as trained from
        r["table"] = track_emergence(ck, initial, analysis, r["paths"], progress)
    depth = s.depth
    r["loss_crossing"] = crossings(
        r["table"], [f"x_{j + 1}" for j in range(depth)], THRESHOLDS["partial"], above=False
    )
    r["path_crossing"] = crossings(
        r["table"], [p["name"] for p in r["validation"]["kept"]], THRESHOLDS["emerge"], above=True
    )
    rows = results_table(r)
    r["table"].to_csv(out / "emergence.csv")
    figures = save_figures(r, out, dpi=60 if args.fast else 100)
    wall = time.perf_counter() - start
    cfg = model.cfg
    meta = {
        "n_chains": s.n_chains,
        "depth": s.depth,
        "dim": s.dim,
        "config": f"{cfg.n_layers} attention-only layers x {cfg.n_heads} heads, d_model "
        f"{cfg.d_model} (d_head {cfg.d_head}), LayerNorm, no positional embedding",
        "training": f"AdamW lr {s.lr:g} (cosine to {s.lr / 10:g}), weight decay "
        f"{R.PAPER_RECIPE['weight_decay']}, batch {s.batch_size}, {steps} IC / "
        f"{non_ic_steps} non-IC steps, checkpoint every {s.checkpoint_every}",
        "wall": wall,
        "train_time": train_time,
    }
    report = write_report(rows, figures, r, meta, out)
    print(format_table(rows))
    print(f"\nscaled down from the paper: {meta['config']}; {meta['training']}")
    print(f"report: {report}; figures: {', '.join(figures)}")
    print(f"wall time: {wall:.1f} s (training {train_time:.1f} s)")
    return rows


if __name__ == "__main__":
    main()
