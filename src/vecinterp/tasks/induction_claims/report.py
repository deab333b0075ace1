"""Rendering and saving: the results table, ``report.md``, ``results.json`` and the figures."""

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .results import THRESHOLDS, Claim, ClaimsResult


def _claims_of(result: ClaimsResult | Sequence[Claim]) -> tuple[Claim, ...]:
    claims = result.claims if isinstance(result, ClaimsResult) else tuple(result)
    if not all(isinstance(c, Claim) for c in claims):
        raise TypeError("expected a ClaimsResult or a sequence of Claim objects")
    return claims


def claims_table(result: ClaimsResult | Sequence[Claim]) -> str:
    """The results table in Markdown: ``| # | claim | ours | verdict |``, one row per claim.

    Example:
        >>> from vecinterp.tasks.induction_claims import Claim, claims_table
        >>> print(claims_table([Claim(2, "layer 0 has a previous-position head",
        ...                           "L0H1: score 0.865", 0.865, "holds")]))
        | # | claim | ours | verdict |
        |---|---|---|---|
        | 2 | layer 0 has a previous-position head | L0H1: score 0.865 | holds |
    """
    lines = ["| # | claim | ours | verdict |", "|---|---|---|---|"]
    lines += [f"| {c.number} | {c.claim} | {c.ours} | {c.verdict} |" for c in _claims_of(result)]
    return "\n".join(lines)


def claims_report(
    result: ClaimsResult | Sequence[Claim],
    *,
    meta: dict[str, Any] | None = None,
    figures: Sequence[str] = (),
) -> str:
    """``report.md``: the setup, the results table, the thresholds, links to the figures.

    Args:
        result: a :class:`ClaimsResult` or its claims.
        meta: optional lines of the setup: ``config`` (the model; a
            :class:`ClaimsResult`'s own by default), ``training`` (how it was trained),
            ``wall`` and ``train_seconds`` (seconds).
        figures: file names of the figures to link, relative to the report.

    Example:
        >>> from vecinterp.tasks.induction_claims import Claim, claims_report
        >>> text = claims_report([Claim(1, "claim", "0.0012", 0.0012, "holds")],
        ...                      meta={"training": "400 steps"}, figures=["loss.png"])
        >>> text.splitlines()[2], text.splitlines()[-1]
        ('Training: 400 steps.', '![loss.png](loss.png)')
    """
    meta = dict(meta or {})
    if isinstance(result, ClaimsResult):
        meta.setdefault("config", result.info.get("config"))
    lines = ["# Induction heads on vectors", ""]
    if meta.get("config"):
        lines.append(f"Model: {meta['config']}.")
    if meta.get("training"):
        lines.append(f"Training: {meta['training']}.")
    if "wall" in meta:
        train = f" (training {meta['train_seconds']:.1f} s)" if "train_seconds" in meta else ""
        lines.append(f"Wall time: {meta['wall']:.1f} s{train}.")
    lines += [
        "",
        claims_table(result),
        "",
        "Verdicts are computed from these thresholds "
        "(`vecinterp.tasks.induction_claims.THRESHOLDS`):",
        "",
        "```",
        json.dumps(THRESHOLDS, indent=1),
        "```",
    ]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    return "\n".join(lines) + "\n"


def results_payload(result: ClaimsResult, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``results.json`` holds: ``meta``, every value of :attr:`ClaimsResult.values`
    (at the top level, so :func:`judge_claims` reads the file back as it is), the ``rows``
    and the ``thresholds``.

    Example:
        >>> from vecinterp.tasks.induction_claims import ClaimsResult, results_payload
        >>> sorted(results_payload(ClaimsResult((), {"rel_mse": 0.5}, {}), {"seed": 0}))
        ['meta', 'rel_mse', 'rows', 'thresholds']
    """
    if not isinstance(result, ClaimsResult):
        raise TypeError(f"result must be a ClaimsResult, got {type(result).__name__}")
    return {
        "meta": dict(meta or {}),
        **result.values,
        "rows": [asdict(c) for c in result.claims],
        "thresholds": THRESHOLDS,
    }


def save_outputs(
    result: ClaimsResult,
    out: str | Path,
    *,
    meta: dict[str, Any] | None = None,
    history: dict[str, Any] | None = None,
    figures: bool = True,
    dpi: int = 100,
) -> dict[str, Any]:
    """Write the figures (PNG, :func:`claim_figures`; needs matplotlib), ``results.json``
    (:func:`results_payload`) and ``report.md`` (:func:`claims_report`) into ``out``.

    Args:
        result: a :class:`ClaimsResult` of :func:`measure_claims` (with its ``data`` when
            ``figures``).
        out: the folder; created if missing.
        meta: the setup, for both files (see :func:`claims_report`).
        history: the training history, for the ``loss`` figure (see
            :func:`claim_figures`).
        figures: False writes no figures (and needs no matplotlib).
        dpi: resolution of the PNGs.

    Returns:
        ``{"report": Path, "results": Path, "figures": [Path, ...]}``.

    Example:
        >>> import json, tempfile
        >>> from vecinterp.tasks.induction_claims import ClaimsResult, save_outputs
        >>> with tempfile.TemporaryDirectory() as out:
        ...     paths = save_outputs(ClaimsResult((), {"rel_mse": 0.5}, {}), out, figures=False)
        ...     json.loads(paths["results"].read_text())["rel_mse"]
        0.5
    """
    if not isinstance(result, ClaimsResult):
        raise TypeError(f"result must be a ClaimsResult, got {type(result).__name__}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    if figures:
        import matplotlib.pyplot as plt

        from .figures import claim_figures

        for name, fig in claim_figures(result, history=history).items():
            fig.savefig(out / f"{name}.png", dpi=dpi)
            plt.close(fig)
            saved.append(out / f"{name}.png")
    results = out / "results.json"
    results.write_text(json.dumps(results_payload(result, meta), indent=1))
    report = out / "report.md"
    report.write_text(claims_report(result, meta=meta, figures=[p.name for p in saved]))
    return {"report": report, "results": results, "figures": saved}
