"""Judging the claims: the measured numbers against :data:`~vecinterp.tasks.
retrieval_claims.THRESHOLDS`, one :class:`~vecinterp.tasks.retrieval_claims.Claim` per
claim (:func:`judge_claims`); pure, so a saved ``values`` dict can be re-judged."""

from collections.abc import Callable, Mapping
from typing import Any

from .results import CLAIMS, HOLDS, NO, PARTLY, THRESHOLDS, Claim


def _level(ok: bool, partly: bool) -> str:
    return HOLDS if ok else PARTLY if partly else NO


def _fmt_step(step: float | None) -> str:
    return "never" if step is None else f"{step:.0f}"


def _row(number: int, ours: str, value: float | int, verdict: str) -> Claim:
    claim, paper = (text.format(**THRESHOLDS) for text in CLAIMS[number])
    return Claim(number, claim, paper, ours, float(value), verdict)


def emergence_groups(
    loss_crossing: Mapping[str, float | None],
    path_crossing: Mapping[str, float | None],
    checkpoint_every: int,
) -> list[tuple[str, float | None, list[str]]]:
    """The circuit's paths grouped by the partial loss whose fall they accompany.

    For each partial loss ``x_j`` in the order they fell below their threshold: the paths
    that emerged since the previous fall, up to one checkpoint interval after this one
    (a path's attention is only sampled at checkpoints); then the losses that never fell,
    with no paths.

    Args:
        loss_crossing: ``{"x_j": step or None}``, when each partial loss fell.
        path_crossing: ``{path name: step or None}``, when each path emerged.
        checkpoint_every: the checkpoint interval, in steps.

    Returns:
        ``[(loss name, step or None, [path names])]``.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import emergence_groups
        >>> emergence_groups({"x_1": 96.0, "x_2": 152.0},
        ...                  {"a": 110.0, "b": 108.0, "c": 158.0, "d": None}, 25)
        [('x_1', 96.0, ['a', 'b']), ('x_2', 152.0, ['c'])]
    """
    drops = sorted(
        ((c, name) for name, c in loss_crossing.items() if c is not None),
        key=lambda pair: pair[0],
    )
    emerged = {n: c for n, c in path_crossing.items() if c is not None}
    groups: list[tuple[str, float | None, list[str]]] = []
    seen: set[str] = set()
    for step, name in drops:
        new = [n for n, c in emerged.items() if c <= step + checkpoint_every and n not in seen]
        seen.update(new)
        groups.append((name, step, new))
    groups += [(n, None, []) for n, c in loss_crossing.items() if c is None]
    return groups


def judge_claims(values: Mapping[str, Any]) -> tuple[Claim, ...]:
    """Build the six :class:`~vecinterp.tasks.retrieval_claims.Claim` rows from measured
    numbers.

    Pure: the verdicts follow from ``values`` (as
    :func:`~vecinterp.tasks.retrieval_claims.measure_claims` stores them in
    :attr:`ClaimsResult.values`, JSON round-trips included) and :data:`THRESHOLDS` only.

    1. IC learns: the final IC loss at most ``ic_holds`` (partly: ``ic_partly``).
    2. non-IC does not: its loss above ``non_ic_fails`` while the IC model's loss on the
       same target ``x_D`` is below it (partly: the non-IC loss alone).
    3. the partial losses fall below ``partial`` in chain order (partly: those that fell
       are a prefix, in order).
    4. a few heads carry: at least one carrying head and carrying plus positional heads at
       most half of them (partly: some but not all heads carry).
    5. the combined ablation keeps the loss at most its limit (partly: below
       ``ablation_partly`` of the all-uniform loss), with a circuit.
    6. every circuit path emerged (attention above ``emerge``) with a partial loss's fall,
       each fall bringing a new path (partly: some path emerged).

    Args:
        values: the dict of :attr:`ClaimsResult.values`.

    Returns:
        The claims 1..6, in order.

    Raises:
        TypeError: ``values`` is not a dict.
        ValueError: ``values`` lacks a number the verdicts need.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import judge_claims
        >>> path = {"layer": 1, "head": 0, "dest": 1, "src": 0, "value": 0.9,
        ...         "name": "L1H0 R0->L0"}
        >>> values = {
        ...     "ic_loss": 0.01, "partial": [0.01], "non_ic_loss": 0.9, "non_ic_steps": 600,
        ...     "checkpoint_every": 25, "n_heads_total": 4, "paths": [path],
        ...     "loss_crossing": {"x_1": 100.0}, "path_crossing": {"L1H0 R0->L0": 90.0},
        ...     "validation": {"base": 0.01, "combined": 0.02, "full": 0.02, "limit": 0.05,
        ...                    "all_uniform": 1.0, "kept": [path], "dropped": [],
        ...                    "carrying": ["L1H0"], "positional": [],
        ...                    "found_heads": ["L1H0"], "without": {"L1H0 R0->L0": 0.9}}}
        >>> [c.verdict for c in judge_claims(values)]
        ['holds', 'holds', 'holds', 'holds', 'holds', 'holds']
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"values must be the dict of ClaimsResult.values, got {type(values).__name__}"
        )
    try:
        return tuple(judge(values) for judge in _JUDGES)
    except KeyError as exc:
        raise ValueError(
            f"values lacks {exc.args[0]!r}: pass ClaimsResult.values (measure_claims)"
        ) from exc


def _judge_1(v: Mapping[str, Any]) -> Claim:
    t, ic, parts = THRESHOLDS, v["ic_loss"], v["partial"]
    partial_text = ", ".join(f"x_{j + 1} {x:.4f}" for j, x in enumerate(parts))
    return _row(
        1,
        f"final IC loss {ic:.4f} (partial: {partial_text})",
        ic,
        _level(ic <= t["ic_holds"], ic <= t["ic_partly"]),
    )


def _judge_2(v: Mapping[str, Any]) -> Claim:
    t, non_ic, parts = THRESHOLDS, v["non_ic_loss"], v["partial"]
    return _row(
        2,
        f"non-IC loss {non_ic:.4f} after {v['non_ic_steps']} steps "
        f"(IC model on x_{len(parts)}: {parts[-1]:.4f}; predicting 0: 1)",
        non_ic,
        _level(
            non_ic > t["non_ic_fails"] and parts[-1] < t["non_ic_fails"],
            non_ic > t["non_ic_fails"],
        ),
    )


def _judge_3(v: Mapping[str, Any]) -> Claim:
    cross = [v["loss_crossing"][f"x_{j + 1}"] for j in range(len(v["partial"]))]
    crossed = [c for c in cross if c is not None]
    ordered = all(a < b for a, b in zip(crossed, crossed[1:], strict=False))
    prefix = all(c is not None for c in cross[: len(crossed)])
    return _row(
        3,
        "steps " + ", ".join(f"x_{j + 1}: {_fmt_step(c)}" for j, c in enumerate(cross)),
        len(crossed),
        _level(ordered and len(crossed) == len(cross), ordered and prefix and len(crossed) > 0),
    )


def _judge_4(v: Mapping[str, Any]) -> Claim:
    t, val, n_heads = THRESHOLDS, v["validation"], v["n_heads_total"]
    n_carry, n_pos = len(val["carrying"]), len(val["positional"])
    kept = ", ".join(f"{p['name']} ({p['value']:.2f})" for p in val["kept"]) or "none"
    positional = ", ".join(val["positional"]) or "none"
    return _row(
        4,
        f"{n_carry} of {n_heads} heads carry: {kept}; positional one-hot heads: {positional}; "
        f"the other {n_heads - n_carry - n_pos} idle ({len(val['found_heads'])} heads had a "
        f"chain path with attention >= {t['path']})",
        n_carry,
        _level(1 <= n_carry and n_carry + n_pos <= n_heads / 2, 1 <= n_carry < n_heads),
    )


def _judge_5(v: Mapping[str, Any]) -> Claim:
    t, val = THRESHOLDS, v["validation"]
    base, comb, unif, limit = val["base"], val["combined"], val["all_uniform"], val["limit"]
    n_carry = len(val["carrying"])
    needed = [n for n, loss in val["without"].items() if loss > limit]
    return _row(
        5,
        f"{base:.4f} -> {comb:.4f} (limit {limit:.4f}; all heads uniform: {unif:.4f}); "
        f"removing one circuit path: {len(needed)} of {len(val['without'])} raise it above "
        "the limit",
        comb,
        _level(n_carry > 0 and comb <= limit, n_carry > 0 and comb < t["ablation_partly"] * unif),
    )


def _judge_6(v: Mapping[str, Any]) -> Claim:
    t, em = THRESHOLDS, v["path_crossing"]
    groups = emergence_groups(v["loss_crossing"], em, v["checkpoint_every"])
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
    return _row(
        6,
        text or "no circuit path",
        sum(c is not None for c in em.values()),
        _level(all_emerged and one_by_one, any(c is not None for c in em.values())),
    )


_JUDGES: tuple[Callable[[Mapping[str, Any]], Claim], ...] = (
    _judge_1,
    _judge_2,
    _judge_3,
    _judge_4,
    _judge_5,
    _judge_6,
)
