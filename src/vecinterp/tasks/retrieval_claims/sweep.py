"""Seed sweeps: the claims measured on many IC and non-IC models trained at once with
:func:`vecinterp.train_ensemble` (:func:`run_sweep`), one :class:`SweepRow` per seed, and
what they say together (:func:`summarize_sweep`, :func:`sweep_table`).

The paper says that heads "always emerge in a specific sequence" (§9) and that the partial
losses fall in chain order in 100 % of its IC runs (§7.2). One model is an anecdote; a
sweep turns each into a measured fraction. Every seed is measured exactly as the single
model of :func:`~vecinterp.tasks.retrieval_claims.measure_claims` (the six claims, judged
by the same thresholds), and its *emergence order* (:func:`emergence_order`) names the
circuit's paths by their roles (``Q->R0``, not ``L2H1 Q->R0``: which head carries a path
differs from seed to seed) grouped, as claim 6 groups them, by the partial loss whose fall
they accompany.

One file of about 500 lines, half of them docstrings and examples: the training, the rows,
their summary and its rendering are one feature and are read together.
"""

import csv
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ...model import HookedVectorTransformer
from ...training import EnsembleResult, train_ensemble
from .. import retrieval as R
from .judge import emergence_groups, judge_claims
from .measure import _check_settings, measure_claims, model_config
from .report import _cell
from .results import HOLDS, THRESHOLDS, VERDICTS, Settings


@dataclass(frozen=True)
class SweepRow:
    """One seed of a sweep: its IC and non-IC models measured as one
    :func:`~vecinterp.tasks.retrieval_claims.measure_claims` would.

    Attributes:
        seed: the seed of both models' initial weights and data.
        ic_loss, non_ic_loss: final validation losses.
        partial: the IC model's final partial losses ``x_1 .. x_D``.
        loss_crossing: ``{"x_j": step or None}``: when each partial loss fell below
            ``THRESHOLDS["partial"]``.
        path_crossing: ``{path name: step or None}``: when each circuit path emerged
            (attention above ``THRESHOLDS["emerge"]``).
        carrying: the heads carrying the chain (``"L2H1"``).
        order: the emergence order (:func:`emergence_order`).
        verdicts: the verdicts of claims 1..6 for this seed.
        diverged: ``None``, or the error that froze a member of the ensemble
            (``"IC: ..."`` or ``"non-IC: ..."``).
        values: the claims' ``values`` dict (JSON-ready; ``judge_claims`` re-judges it).

    Example:
        >>> from vecinterp.tasks.retrieval_claims import SweepRow
        >>> row = SweepRow(0, 0.01, 0.8, (0.01, 0.01), {"x_1": 90.0, "x_2": 150.0}, {}, (),
        ...                "x_1: - | x_2: -", ("holds", "holds", "holds", "partly", "holds",
        ...                "partly"))
        >>> row.ic_learned, row.non_ic_learned, row.chain_order, row.paper_order
        (True, False, True, False)
    """

    seed: int
    ic_loss: float
    non_ic_loss: float
    partial: tuple[float, ...]
    loss_crossing: dict[str, float | None]
    path_crossing: dict[str, float | None]
    carrying: tuple[str, ...]
    order: str
    verdicts: tuple[str, ...]
    diverged: str | None = None
    values: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ic_learned(self) -> bool:
        """The IC model learnt: its loss is at most ``THRESHOLDS["ic_holds"]``."""
        return self.ic_loss <= THRESHOLDS["ic_holds"]

    @property
    def non_ic_learned(self) -> bool:
        """The non-IC model learnt, by the same bound as the IC one."""
        return self.non_ic_loss <= THRESHOLDS["ic_holds"]

    @property
    def chain_order(self) -> bool:
        """Claim 3 holds: every partial loss fell, ``x_1`` first, then ``x_2``, ..."""
        return self.verdicts[2] == HOLDS

    @property
    def paper_order(self) -> bool:
        """The paper's order (§7.2, §9): claims 3 and 6 hold, i.e. the partial losses fell
        in chain order and each fall brought new circuit paths, every one of them."""
        return self.chain_order and self.verdicts[5] == HOLDS

    def csv_row(self) -> dict[str, Any]:
        """The row as flat CSV cells (``x_j`` losses and steps, ``claim_k`` verdicts)."""
        out: dict[str, Any] = {"seed": self.seed, "ic_loss": self.ic_loss,
                               "non_ic_loss": self.non_ic_loss}  # fmt: skip
        out.update({f"loss_x_{j + 1}": x for j, x in enumerate(self.partial)})
        out.update({f"step_{n}": ("" if c is None else c) for n, c in self.loss_crossing.items()})
        out.update(ic_learned=self.ic_learned, non_ic_learned=self.non_ic_learned,
                   chain_order=self.chain_order, paper_order=self.paper_order,
                   carrying=" ".join(self.carrying), order=self.order)  # fmt: skip
        out.update({f"claim_{k + 1}": v for k, v in enumerate(self.verdicts)})
        out["diverged"] = self.diverged or ""
        return out


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns.

    Attributes:
        rows: one :class:`SweepRow` per seed, in the order of the seeds.
        summary: :func:`summarize_sweep` of the rows.
        info: the settings in words, the seeds, and the timings (``train_ic_s``,
            ``train_non_ic_s``, ``measure_s``: wall seconds).
        tables: ``{seed: EmergenceTable}``, each IC run's emergence curves (not serialised).

    Example:
        >>> from vecinterp.tasks.retrieval_claims import SweepResult, SweepRow, summarize_sweep
        >>> rows = [SweepRow(0, 0.01, 0.8, (0.01,), {"x_1": 90.0}, {}, (), "x_1: Q->R0",
        ...                  ("holds",) * 6)]
        >>> SweepResult(rows, summarize_sweep(rows), {"seeds": [0]}).summary["paper_order"]
        {'count': 1, 'of': 1, 'fraction': 1.0}
    """

    rows: list[SweepRow]
    summary: dict[str, Any]
    info: dict[str, Any]
    tables: dict[int, Any] = field(default_factory=dict, repr=False)


def emergence_order(values: Mapping[str, Any]) -> str:
    """A seed's emergence order, comparable across seeds: claim 6's groups
    (:func:`~vecinterp.tasks.retrieval_claims.emergence_groups`) of the circuit's paths
    named by their roles only (``Q->R0``, not ``L2H1 Q->R0``), each at the step its
    *first* head emerged (a later copy in another head is redundant), sorted within a
    group.

    ``"x_1: Q->R0, R0->L0 | x_2: Q->R1, R1->L1"`` reads: ``x_1``'s loss fell first, with
    (up to one checkpoint interval after it) paths ``Q->R0`` and ``R0->L0`` emerging;
    then ``x_2``'s, with ``Q->R1`` and ``R1->L1``. A fall with no new path shows ``-``, a
    loss that never fell ``never``; paths that first emerged after the last fall are
    listed under ``later``, circuit paths that never emerged in any head under ``never``.

    Args:
        values: the claims' ``values`` (``loss_crossing``, ``path_crossing``,
            ``checkpoint_every`` are read).

    Example:
        >>> from vecinterp.tasks.retrieval_claims import emergence_order
        >>> emergence_order({"loss_crossing": {"x_1": 96.0, "x_2": None},
        ...                  "path_crossing": {"L2H1 Q->R0": 108.0, "L1H0 R0->L0": 110.0,
        ...                                    "L3H2 Q->R0": 290.0, "L3H0 Q->R1": 300.0},
        ...                  "checkpoint_every": 25})
        'x_1: Q->R0, R0->L0 | x_2: never | later: Q->R1'
    """
    try:
        losses, paths, every = (
            values["loss_crossing"], values["path_crossing"], values["checkpoint_every"]
        )  # fmt: skip
    except KeyError as exc:
        raise ValueError(f"values lacks {exc.args[0]!r}: pass ClaimsResult.values") from exc
    first: dict[str, float | None] = {}
    for name, step in paths.items():
        role = name.split(" ", 1)[-1]
        known = first.get(role)
        first[role] = step if known is None else known if step is None else min(known, step)
    groups = emergence_groups(losses, first, every)

    def listed(roles: Iterable[str]) -> str:
        return ", ".join(sorted(roles)) or "-"

    parts = [f"{name}: {'never' if step is None else listed(new)}" for name, step, new in groups]
    grouped = {n for _, _, new in groups for n in new}
    late = [n for n, c in first.items() if c is not None and n not in grouped]
    never = [n for n, c in first.items() if c is None]
    parts += [f"later: {listed(late)}"] if late else []
    parts += [f"never: {listed(never)}"] if never else []
    return " | ".join(parts)


def sweep_row(seed: int, values: Mapping[str, Any], diverged: str | None = None) -> SweepRow:
    """The :class:`SweepRow` of one seed from its claims' ``values`` (pure: the verdicts
    come from :func:`~vecinterp.tasks.retrieval_claims.judge_claims`).

    Example:
        >>> from vecinterp.tasks.retrieval_claims import sweep_row
        >>> values = {"ic_loss": 0.9, "partial": [0.8, 1.0], "non_ic_loss": 1.0,
        ...           "non_ic_steps": 60, "checkpoint_every": 30, "n_heads_total": 6,
        ...           "paths": [], "loss_crossing": {"x_1": None, "x_2": None},
        ...           "path_crossing": {}, "validation": {"base": 0.9, "combined": 0.9,
        ...           "full": 0.9, "limit": 1.35, "all_uniform": 1.0, "kept": [],
        ...           "dropped": [], "carrying": [], "positional": [], "found_heads": [],
        ...           "without": {}}}
        >>> row = sweep_row(7, values)
        >>> row.order, row.verdicts[0], row.ic_learned
        ('x_1: never | x_2: never', 'does not hold', False)
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    verdicts = tuple(c.verdict for c in judge_claims(values))
    return SweepRow(
        seed=seed,
        ic_loss=float(values["ic_loss"]),
        non_ic_loss=float(values["non_ic_loss"]),
        partial=tuple(float(x) for x in values["partial"]),
        loss_crossing=dict(values["loss_crossing"]),
        path_crossing=dict(values["path_crossing"]),
        carrying=tuple(values["validation"]["carrying"]),
        order=emergence_order(values),
        verdicts=verdicts,
        diverged=diverged,
        values=dict(values),
    )


def _fraction(hits: int, n: int) -> dict[str, Any]:
    return {"count": hits, "of": n, "fraction": hits / n}


def summarize_sweep(rows: Sequence[SweepRow]) -> dict[str, Any]:
    """What the seeds say together (JSON-ready).

    Returns:
        ``n``; ``{count, of, fraction}`` for ``ic_learned``, ``non_ic_learned``,
        ``non_ic_fails`` (loss above ``THRESHOLDS["non_ic_fails"]``, the paper's claim
        2), ``chain_order`` (claim 3), ``paper_order`` (claims 3 and 6), ``modal_order``
        (the seeds whose order is the most common one; ties: the first seen) and
        ``paper_order_learned`` (``paper_order`` among the seeds whose IC model learnt);
        ``orders``: ``[(order, seeds)]``, most common first (ties: first seen);
        ``modal``: the most common order; ``verdicts``: ``{claim number: {verdict:
        seeds}}``; ``ic_loss``, ``non_ic_loss``: ``{median, min, max}``; ``diverged``:
        the seeds with a frozen member.

    Raises:
        ValueError: no rows, or a seed twice.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import SweepRow, summarize_sweep
        >>> ok = ("holds",) * 6
        >>> rows = [SweepRow(s, 0.01, 0.8, (0.01,), {"x_1": 90.0}, {}, (), order, ok)
        ...         for s, order in enumerate(["A", "B", "A"])]
        >>> s = summarize_sweep(rows)
        >>> s["orders"], s["modal"], s["modal_order"]["count"]
        ([('A', 2), ('B', 1)], 'A', 2)
    """
    rows = list(rows)
    if not rows or not all(isinstance(r, SweepRow) for r in rows):
        raise ValueError("rows must be a non-empty sequence of SweepRow")
    seeds = [r.seed for r in rows]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed appears twice among the rows: {seeds}")
    n = len(rows)
    orders = Counter(r.order for r in rows).most_common()  # stable: first seen wins ties
    modal = orders[0][0]
    learned = [r for r in rows if r.ic_learned]

    def spread(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        mid = len(xs) // 2
        median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
        return {"median": median, "min": xs[0], "max": xs[-1]}

    return {
        "n": n,
        "ic_learned": _fraction(len(learned), n),
        "non_ic_learned": _fraction(sum(r.non_ic_learned for r in rows), n),
        "non_ic_fails": _fraction(sum(r.non_ic_loss > THRESHOLDS["non_ic_fails"] for r in rows), n),
        "chain_order": _fraction(sum(r.chain_order for r in rows), n),
        "paper_order": _fraction(sum(r.paper_order for r in rows), n),
        "paper_order_learned": _fraction(sum(r.paper_order for r in learned), len(learned))
        if learned
        else {"count": 0, "of": 0, "fraction": None},
        "modal_order": _fraction(orders[0][1], n),
        "modal": modal,
        "orders": orders,
        "verdicts": {
            k + 1: {v: sum(r.verdicts[k] == v for r in rows) for v in VERDICTS} for k in range(6)
        },
        "ic_loss": spread([r.ic_loss for r in rows]),
        "non_ic_loss": spread([r.non_ic_loss for r in rows]),
        "diverged": [r.seed for r in rows if r.diverged],
    }


def _check_seeds(seeds: object) -> list[int]:
    """``seeds`` as a list of distinct ints >= 0, or a clear error."""
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a sequence of ints, got {seeds!r}")
    out = list(seeds)
    if not out:
        raise ValueError("seeds must not be empty")
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"seeds must be ints >= 0, got {s!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"seeds must be distinct, got {out}")
    return out


def train_sweep(
    settings: Settings,
    seeds: Sequence[int],
    *,
    ic: bool,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> EnsembleResult:
    """Train one model per seed with the recipe of ``settings``, as one
    :func:`vecinterp.train_ensemble`.

    Member ``i`` is :func:`~vecinterp.tasks.retrieval_claims.train_model` ``(settings,
    ic=ic, seed=seeds[i])`` (the same initial weights, batches, schedule and, with
    ``checkpoint_dir``, checkpoints in ``checkpoint_dir/member_00i/``), to rounding.

    Example:
        >>> import dataclasses
        >>> from vecinterp.tasks.retrieval_claims import FAST, train_sweep
        >>> out = train_sweep(dataclasses.replace(FAST, steps=3), [4, 9], ic=True)
        >>> [len(h.train_loss) for h in out.histories]
        [3, 3]
    """
    s, seeds = _check_settings(settings), _check_seeds(seeds)
    if not isinstance(ic, bool):
        raise TypeError(f"ic must be a bool, got {ic!r}")
    cfg = model_config(s, ic=ic)
    kw: dict[str, Any] = dict(n_chains=s.n_chains, dim=s.dim, implicit_curriculum=ic)
    return train_ensemble(
        [HookedVectorTransformer(cfg, seed=seed) for seed in seeds],
        lambda step, gen: R.generate(s.batch_size, s.depth, generator=gen, **kw),
        steps=s.steps if ic else s.non_ic_steps,
        lr=s.lr,
        weight_decay=cast(float, R.PAPER_RECIPE["weight_decay"]),
        schedule="cosine",
        min_lr=s.lr / 10,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=s.checkpoint_every if checkpoint_dir is not None else None,
        keep_last=None,
        seed=seeds,
        device="cpu",
        progress=progress,
    )


def run_sweep(
    settings: Settings,
    seeds: Sequence[int],
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    log: Callable[[str], Any] | None = None,
) -> SweepResult:
    """Train an IC and a non-IC ensemble (:func:`train_sweep`) and measure every seed.

    The IC ensemble checkpoints every ``settings.checkpoint_every`` steps (in
    ``checkpoint_dir``, kept; or a temporary folder, deleted); each seed's IC and non-IC
    models are then measured by :func:`~vecinterp.tasks.retrieval_claims.measure_claims`
    with its own checkpoints (its initial model as step 0) and summarised as a
    :class:`SweepRow`.

    Args:
        settings: the recipe (:data:`FULL`, :data:`FAST` or a replacement of one).
        seeds: distinct ints >= 0, one member per seed in each ensemble.
        checkpoint_dir: where to keep the IC checkpoints (an empty or new folder).
        progress: show the training and measuring progress bars.
        log: called with a line of text at each stage (e.g. ``print``).

    Returns:
        A :class:`SweepResult`.

    Example:
        >>> import dataclasses
        >>> from vecinterp.tasks.retrieval_claims import FAST, run_sweep
        >>> tiny = dataclasses.replace(FAST, steps=4, non_ic_steps=2, checkpoint_every=2,
        ...                            eval_size=16, analysis_size=8)
        >>> result = run_sweep(tiny, [0, 1])
        >>> [row.seed for row in result.rows], result.summary["n"]
        ([0, 1], 2)
    """
    s, seeds = _check_settings(settings), _check_seeds(seeds)
    say = log or (lambda line: None)
    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(checkpoint_dir) if checkpoint_dir is not None else Path(tmp) / "ic"
        t0 = time.perf_counter()
        ic = train_sweep(s, seeds, ic=True, checkpoint_dir=ck, progress=progress)
        t1 = time.perf_counter()
        say(f"IC ensemble of {len(seeds)} trained in {t1 - t0:.1f} s")
        non_ic = train_sweep(s, seeds, ic=False, progress=progress)
        t2 = time.perf_counter()
        say(f"non-IC ensemble of {len(seeds)} trained in {t2 - t1:.1f} s")
        rows, tables = [], {}
        for i, seed in enumerate(seeds):
            initial = HookedVectorTransformer(model_config(s), seed=seed)
            member = ck / f"member_{i:03d}"
            checkpoints = [(0, initial), *sorted(member.glob("step_*"))]
            result = measure_claims(ic.models[i], non_ic.models[i], s, checkpoints,
                                    progress=progress)  # fmt: skip
            frozen = [f"{name}: {e}" for name, e in (("IC", ic.diverged[i]),
                      ("non-IC", non_ic.diverged[i])) if e is not None]  # fmt: skip
            row = sweep_row(seed, result.values, "; ".join(frozen) or None)
            rows.append(row)
            tables[seed] = result.data["table"]
            say(f"seed {seed}: IC {row.ic_loss:.4f}, non-IC {row.non_ic_loss:.4f}, "
                f"claims {''.join(v[0] for v in row.verdicts)}, {row.order}")  # fmt: skip
        t3 = time.perf_counter()
    info = {
        **s.summary(),
        "seeds": seeds,
        "train_ic_s": t1 - t0,
        "train_non_ic_s": t2 - t1,
        "measure_s": t3 - t2,
    }
    return SweepResult(rows, summarize_sweep(rows), info, tables)


def write_sweep_csv(rows: Sequence[SweepRow], path: str | os.PathLike[str]) -> None:
    """Write one CSV row per seed (:meth:`SweepRow.csv_row`).

    Example:
        >>> import csv, os, tempfile
        >>> from vecinterp.tasks.retrieval_claims import SweepRow, write_sweep_csv
        >>> rows = [SweepRow(s, 0.01, 0.8, (0.01,), {"x_1": 90.0}, {}, (), "x_1: -",
        ...                  ("holds",) * 6) for s in (3, 4)]
        >>> path = os.path.join(tempfile.mkdtemp(), "sweep.csv")
        >>> write_sweep_csv(rows, path)
        >>> with open(path, newline="") as f:
        ...     [(r["seed"], r["step_x_1"], r["claim_6"]) for r in csv.DictReader(f)]
        [('3', '90.0', 'holds'), ('4', '90.0', 'holds')]
    """
    cells = [r.csv_row() for r in rows]
    if not cells:
        raise ValueError("rows must not be empty")
    names = list(dict.fromkeys(k for c in cells for k in c))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows(cells)


def _share(entry: Mapping[str, Any]) -> str:
    if entry["fraction"] is None:
        return "n/a (0 seeds)"
    return f"{entry['count']}/{entry['of']} ({100 * entry['fraction']:.0f} %)"


def sweep_table(result: SweepResult | Mapping[str, Any], rows: Sequence[SweepRow] = ()) -> str:
    """The sweep in Markdown: the fractions, the emergence orders and how often each
    claim held; with ``rows`` (or a :class:`SweepResult`), one line per seed too.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import SweepRow, summarize_sweep, sweep_table
        >>> ok = ("holds",) * 6
        >>> rows = [SweepRow(s, 0.01, 0.8, (0.01,), {"x_1": 90.0}, {}, (), "x_1: Q->R0", ok)
        ...         for s in range(2)]
        >>> print(sweep_table(summarize_sweep(rows)).splitlines()[2])
        | IC model learns (loss <= 0.05) | 2/2 (100 %) |
    """
    summary: Mapping[str, Any]
    if isinstance(result, SweepResult):
        summary, rows = result.summary, result.rows
    elif isinstance(result, Mapping):
        summary = result
    else:
        raise TypeError(f"result must be a SweepResult or a summary dict, got {result!r}")
    t = THRESHOLDS
    loss = "{median:.4f} ({min:.4f} - {max:.4f})"
    lines = [
        f"| {summary['n']} seeds | measured |",
        "|---|---|",
        f"| IC model learns (loss <= {t['ic_holds']}) | {_share(summary['ic_learned'])} |",
        f"| non-IC model learns (same bound) | {_share(summary['non_ic_learned'])} |",
        f"| non-IC loss > {t['non_ic_fails']} (paper: 100 %) | {_share(summary['non_ic_fails'])} |",
        f"| IC loss, median (min - max) | {loss.format(**summary['ic_loss'])} |",
        f"| non-IC loss, median (min - max) | {loss.format(**summary['non_ic_loss'])} |",
        f"| partial losses fall in chain order (claim 3; paper: 100 %) | "
        f"{_share(summary['chain_order'])} |",
        f"| paper's order: claims 3 and 6 hold | {_share(summary['paper_order'])} |",
        f"| ... among the seeds whose IC model learns | {_share(summary['paper_order_learned'])} |",
        f"| modal emergence order `{_cell(summary['modal'])}` | {_share(summary['modal_order'])} |",
        "",
        "| emergence order | seeds |",
        "|---|---|",
        *(f"| `{_cell(order)}` | {count} |" for order, count in summary["orders"]),
        "",
        "| claim | " + " | ".join(VERDICTS) + " |",
        "|---|---|---|---|",
        *(
            f"| {k} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |"
            for k, counts in summary["verdicts"].items()
        ),
    ]
    if rows:
        lines += [
            "",
            "| seed | IC loss | non-IC loss | partial losses fall at | carrying heads "
            "| emergence order | claims 1-6 |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            falls = ", ".join(
                f"{n} {'never' if c is None else f'{c:.0f}'}" for n, c in r.loss_crossing.items()
            )
            claims = " ".join({"holds": "H", "partly": "P"}.get(v, "N") for v in r.verdicts)
            lines.append(
                f"| {r.seed} | {r.ic_loss:.4f} | {r.non_ic_loss:.4f} | {falls} | "
                f"{len(r.carrying)} | `{_cell(r.order)}` | {claims}"
                + (" (diverged)" if r.diverged else "")
                + " |"
            )
    return "\n".join(lines)
