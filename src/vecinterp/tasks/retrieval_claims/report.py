"""Rendering: the results table and the Markdown report (:func:`claims_table`,
:func:`claims_report`)."""

from collections.abc import Sequence

from .results import CANDIDATES, THRESHOLDS, Claim, ClaimsResult


def _claims_of(result: ClaimsResult | Sequence[Claim]) -> tuple[Claim, ...]:
    claims = result.claims if isinstance(result, ClaimsResult) else tuple(result)
    if not all(isinstance(c, Claim) for c in claims):
        raise TypeError("expected a ClaimsResult or a sequence of Claim objects")
    return claims


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claims_table(result: ClaimsResult | Sequence[Claim]) -> str:
    """The results table in Markdown: ``# | claim | paper | ours | verdict``.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import Claim, claims_table
        >>> print(claims_table([Claim(1, "IC formulation learns", "low loss",
        ...                           "final IC loss 0.0125", 0.0125, "holds")]))
        | # | claim | paper | ours | verdict |
        |---|---|---|---|---|
        | 1 | IC formulation learns | low loss | final IC loss 0.0125 | holds |
    """
    lines = ["| # | claim | paper | ours | verdict |", "|---|---|---|---|---|"]
    for c in _claims_of(result):
        cells = [str(c.number), c.claim, c.paper, c.ours, c.verdict]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines)


def claims_report(
    result: ClaimsResult,
    *,
    figures: Sequence[str] = (),
    wall: float | None = None,
    train_time: float | None = None,
) -> str:
    """``report.md``: the setup, the results table, the ablation in detail, the
    thresholds and the figures.

    Args:
        result: what :func:`~vecinterp.tasks.retrieval_claims.measure_claims` returned.
        figures: file names of the figures to link (PNGs next to the report).
        wall: the run's wall time in seconds, if it is to be reported.
        train_time: the seconds of it spent training.

    Returns:
        The report's Markdown text.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import ClaimsResult, claims_report
        >>> from vecinterp.tasks.retrieval_claims import FAST, judge_claims
        >>> path = {"layer": 1, "head": 0, "dest": 1, "src": 0, "value": 0.9,
        ...         "name": "L1H0 R0->L0"}
        >>> values = {
        ...     "ic_loss": 0.01, "partial": [0.01], "non_ic_loss": 0.9, "non_ic_steps": 600,
        ...     "checkpoint_every": 25, "n_heads_total": 4, "paths": [path],
        ...     "loss_crossing": {"x_1": 100.0}, "path_crossing": {"L1H0 R0->L0": 90.0},
        ...     "validation": {"base": 0.01, "combined": 0.02, "full": 0.02, "limit": 0.05,
        ...                    "all_uniform": 1.0, "kept": [path], "dropped": [],
        ...                    "carrying": ["L1H0"], "positional": [],
        ...                    "found_heads": ["L1H0"], "without": {"L1H0 R0->L0": 0.9},
        ...                    "choice": {"L1H0": "paths"}, "single": {"L1H0": {"paths": 0.02}}}}
        >>> text = claims_report(ClaimsResult(judge_claims(values), values, FAST.summary()))
        >>> text.splitlines()[0]
        '# The retrieval problem (Musat 2024), scaled down'
    """
    if not isinstance(result, ClaimsResult):
        raise TypeError(f"result must be a ClaimsResult, got {type(result).__name__}")
    v, info = result.values["validation"], result.info
    lines = [
        "# The retrieval problem (Musat 2024), scaled down",
        "",
        f"Task: {info.get('task', '?')}. Models: {info.get('model', '?')}. "
        f"Training: {info.get('training', '?')}.",
    ]
    if wall is not None:
        trained = f" (training {train_time:.1f} s)" if train_time is not None else ""
        lines.append(f"Wall time: {wall:.1f} s{trained}.")
    lines += [
        "",
        claims_table(result),
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
    for head, losses in v["single"].items():
        cells = [f"{losses[k]:.4f}" if k in losses else "-" for k in CANDIDATES]
        lines.append(f"| {head} | " + " | ".join(cells) + f" | {v['choice'][head]} |")
    lines += ["", "| circuit path removed from the combined ablation | loss |", "|---|---|"]
    lines += [f"| {n} | {loss:.4f} |" for n, loss in v["without"].items()]
    lines += [
        "",
        "Verdicts are computed from these thresholds "
        "(`vecinterp.tasks.retrieval_claims.THRESHOLDS`):",
        "",
        "```",
        "\n".join(f"{k} = {val}" for k, val in THRESHOLDS.items()),
        "```",
    ]
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{name}]({name})" for name in figures]
    return "\n".join(lines) + "\n"
