"""Rendering: the claims table, the robustness table across models, the Markdown report."""

import json
import re
from collections.abc import Sequence

from .decision import meets_rule
from .results import THRESHOLDS, Claim, ClaimsResult, Reading


def _claims_of(result: ClaimsResult | Sequence[Claim]) -> tuple[Claim, ...]:
    if isinstance(result, ClaimsResult):
        return result.claims
    claims = tuple(result)
    if not all(isinstance(c, Claim) for c in claims):
        raise TypeError("expected a ClaimsResult or a sequence of Claim objects")
    return claims


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rst(text: str) -> str:
    """Escape reStructuredText's inline markup characters (``|QK|`` would be a
    substitution, ``*x*`` emphasis)."""
    for char in ("\\", "|", "*", "`"):
        text = text.replace(char, "\\" + char)
    return text.replace("\n", " ")


def _list_table(rows: list[list[str]], widths: str | None = None) -> str:
    lines = [".. list-table::", "   :header-rows: 1"]
    lines += [f"   :widths: {widths}"] if widths else []
    lines.append("")
    for row in rows:
        lines.append(f"   * - {_rst(row[0])}")
        lines += [f"     - {_rst(x)}" if x else "     -" for x in row[1:]]
    return "\n".join(lines)


def claims_table(result: ClaimsResult | Sequence[Claim], *, fmt: str = "markdown") -> str:
    """The claims table: one row per claim, the paper's figure, ours under the primary
    reading, the other readings, the verdict.

    Args:
        result: a :class:`ClaimsResult` or its claims.
        fmt: ``"markdown"`` (a table), ``"rst"`` (a ``list-table``, for the docs) or
            ``"text"`` (a block per claim, for a terminal).

    Example:
        >>> from vecinterp.tasks.affine_claims import Claim, Reading, claims_table
        >>> claim = Claim(1, "final eval MSE", "1e-4", Reading("eval", "eval set", "9.2e-05",
        ...               9.2e-5), (Reading("len14", "length 14", "9.9e-05", 9.9e-5),),
        ...               "holds", "9.2e-05", "", "")
        >>> print(claims_table([claim]))
        | # | claim | paper | ours (primary reading) | other readings | verdict |
        |---|---|---|---|---|---|
        | 1 | final eval MSE | 1e-4 | 9.2e-05 (eval set) | length 14: 9.9e-05 | holds |
    """
    claims = _claims_of(result)
    header = ["#", "claim", "paper", "ours (primary reading)", "other readings", "verdict"]
    rows = [
        [
            c.label,
            c.claim,
            c.paper,
            f"{c.primary.text} ({c.primary.label})",
            "; ".join(f"{r.label}: {r.text}" for r in c.alternatives),
            c.verdict,
        ]
        for c in claims
    ]
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
        return "\n".join(lines)
    if fmt == "rst":
        return _list_table([header, *rows], widths="3 20 10 27 30 10")
    if fmt == "text":
        lines = []
        for c in claims:
            lines.append(f"{c.label:>3}  {c.claim}  [paper: {c.paper}]  -> {c.verdict.upper()}")
            lines.append(f"    ours: {c.primary.text}  ({c.primary.label})")
            lines += [f"    also: {r.text}  ({r.label})" for r in c.alternatives]
        return "\n".join(lines)
    raise ValueError(f"fmt must be 'markdown', 'rst' or 'text', got {fmt!r}")


def _alternative_row(number: str, readings: Sequence[Reading]) -> list[str]:
    """One ′ row: the reading's label, or, where the label names something that differs
    between models (the heads a reading picked on each), the label without that
    parenthesis and each model's own parenthesis in its cell."""
    labels = [r.label for r in readings]
    if len(set(labels)) == 1:
        return [f"{number}′", f"· {labels[0]}", ""] + [r.text for r in readings]
    parts = [_TRAILING_PARENTHESIS.match(label) for label in labels]
    bases = {m.group(1) if m else label for m, label in zip(parts, labels, strict=True)}
    if len(bases) != 1 or not all(parts):
        raise ValueError(f"claim {number}: the models' alternative readings differ: {labels}")
    cells = [f"{r.text} ({m.group(2)})" for r, m in zip(readings, parts, strict=True) if m]
    return [f"{number}′", f"· {bases.pop()}", "", *cells]


_TRAILING_PARENTHESIS = re.compile(r"(.*?)\s*\(([^()]*)\)\s*$")


def robustness_table(
    results: Sequence[ClaimsResult], names: Sequence[str], *, fmt: str = "markdown"
) -> str:
    """The claims across models: per claim, the primary figure and verdict on each model,
    plus a row for each key alternative reading (:attr:`Reading.key`).

    Args:
        results: one :class:`ClaimsResult` per model.
        names: one column name per model.
        fmt: ``"markdown"`` or ``"rst"`` (a ``list-table``, for the docs).

    Example:
        >>> from vecinterp.tasks.affine_claims import (Claim, ClaimsResult, Reading,
        ...                                            robustness_table)
        >>> def result(mse):
        ...     primary = Reading("eval", "eval set", f"{mse:.1e}", mse)
        ...     claim = Claim(1, "final eval MSE", "1e-4", primary, (), "holds", primary.text,
        ...                   "", "")
        ...     return ClaimsResult((claim,), {}, {}, {})
        >>> print(robustness_table([result(9.2e-5), result(1.1e-4)], ["fast", "paper"]))
        | # | claim | paper | fast | paper |
        |---|---|---|---|---|
        | 1 | final eval MSE | 1e-4 | 9.2e-05 (holds) | 1.1e-04 (holds) |
    """
    results = list(results)
    names = [str(n) for n in names]
    if not results or len(results) != len(names):
        raise ValueError(
            f"results and names must be non-empty and of one length, got "
            f"{len(results)} and {len(names)}"
        )
    rows: list[list[str]] = []
    per_model = [_claims_of(r) for r in results]
    for i, c in enumerate(per_model[0]):
        rows.append(
            [c.label, c.claim, c.paper] + [f"{m[i].headline} ({m[i].verdict})" for m in per_model]
        )
        for j, alt in enumerate(c.alternatives):
            if alt.key:
                rows.append(_alternative_row(c.label, [m[i].alternatives[j] for m in per_model]))
    header = ["#", "claim", "paper", *names]
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
        return "\n".join(lines)
    if fmt == "rst":
        return _list_table([header, *rows])
    raise ValueError(f"fmt must be 'markdown' or 'rst', got {fmt!r}")


def claims_report(
    results: Sequence[ClaimsResult],
    names: Sequence[str],
    *,
    sources: Sequence[str] | None = None,
    figures: Sequence[str] = (),
    wall: float | None = None,
) -> str:
    """The Markdown report: the robustness table (one column per model), the claims table
    of the first model with the reasoning per claim, the thresholds, timings and figures.

    Args:
        results: one :class:`ClaimsResult` per model (the first one is detailed).
        names: one name per model.
        sources: where each model came from (a path, "trained here", ...).
        figures: image file names to link (relative to the report).
        wall: total run time in seconds.

    Example:
        >>> from vecinterp.tasks.affine_claims import Claim, ClaimsResult, Reading, claims_report
        >>> claim = Claim(1, "final eval MSE", "1e-4", Reading("eval", "eval set", "9.2e-05",
        ...               9.2e-5), (), "holds", "9.2e-05", "the training distribution", "")
        >>> text = claims_report([ClaimsResult((claim,), {}, {"eval": 1.5}, {})], ["fast"])
        >>> print(text.splitlines()[0])
        # Affine recurrences: the paper's claims on our models
    """
    results = list(results)
    names = list(names)
    first = results[0] if results else None
    lines = ["# Affine recurrences: the paper's claims on our models", ""]
    for i, (res, name) in enumerate(zip(results, names, strict=True)):
        src = f", {sources[i]}" if sources else ""
        lines.append(f"- **{name}**{src}; {res.info.get('config', '')}")
    if wall is not None:
        lines += ["", f"Wall time: {wall:.1f} s."]
    lines += ["", "## Robustness across models", "", robustness_table(results, names), ""]
    lines += _decision_lines(results, names)
    assert first is not None
    lines += [f"## Claims on {names[0]}, every reading", "", claims_table(first), ""]
    lines += ["## Readings: which one the verdict rests on, and why", ""]
    for c in first.claims:
        text = (
            f"**{c.label}. {c.claim}** — {c.verdict}. Primary reading: {c.primary.label}, "
            f"because {c.basis}."
        )
        lines += [text + (f" {c.note}" if c.note else ""), ""]
    lines += [
        "Verdicts follow from these thresholds (`vecinterp.tasks.affine_claims.THRESHOLDS`):",
        "",
        "```",
        json.dumps(THRESHOLDS),
        "```",
        "",
        "## Time per analysis",
        "",
        "| analysis | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label in first.timings:
        cells = [f"{r.timings.get(label, float('nan')):.1f} s" for r in results]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if figures:
        lines += ["", f"## Figures ({names[0]})", ""] + [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def _decision_lines(results: Sequence[ClaimsResult], names: Sequence[str]) -> list[str]:
    """The decision rule for claims 4, 10b and 11 (:func:`meets_rule`), one row per model
    whose values carry what it reads."""
    rows = []
    for res, name in zip(results, names, strict=True):
        try:
            met = meets_rule(res.values)
        except ValueError:
            continue
        marks = [
            "yes" if met[k] else "no" for k in ("checkerboards", "identity_qk", "patch", "all")
        ]
        rows.append(f"| {name} | " + " | ".join(marks) + " |")
    if not rows:
        return []
    return [
        "## The decision rule for claims 4, 10b and 11",
        "",
        "(a) per-sequence checkerboards for c < -1 only, (b) at least 5 of 8 identity-like QK "
        "heads, (c) the patch of the model's own heads at most x1.5 while uniform attention "
        "on them costs at least x2 (`vecinterp.tasks.affine_claims.meets_rule`):",
        "",
        "| model | (a) checkerboards | (b) identity-like QK | (c) patch | all |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
