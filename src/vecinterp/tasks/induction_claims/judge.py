"""Judging the claims: one :class:`~vecinterp.tasks.induction_claims.Claim` row per claim,
its verdict by :data:`~vecinterp.tasks.induction_claims.THRESHOLDS` (:func:`judge_claims`)."""

from collections.abc import Callable, Sequence
from typing import Any

from .results import CLAIMS, HOLDS, NO, PARTLY, THRESHOLDS, Claim


def judge_claims(values: dict[str, Any]) -> tuple[Claim, ...]:
    """Build the seven :class:`Claim` rows from measured numbers.

    Pure: the verdicts follow from ``values`` (as :func:`measure_claims` stores them in
    :attr:`ClaimsResult.values`, JSON round trips included, and ``results.json`` as
    :func:`save_outputs` writes it) and :data:`THRESHOLDS` only, so saved numbers can be
    re-judged.

    Args:
        values: the dict of :attr:`ClaimsResult.values` (extra keys are ignored).

    Returns:
        The claims 1..7, in order.

    Raises:
        TypeError: ``values`` is not a dict.
        ValueError: a number the claims need is missing.

    Example:
        >>> from vecinterp.tasks.induction_claims import judge_claims
        >>> heads = dict(prev_head=[0, 1], induction_head=[1, 2], prev_score=0.9,
        ...              induction_score=0.99, induction_score_by_m={"4": 0.98, "16": 0.99},
        ...              prev_heads=[[0, 1]], induction_heads=[[1, 2]])
        >>> composition = dict(pair=dict(K=0.3, Q=0.02, V=0.01),
        ...     z=dict(K=25.0, Q=-15.0, V=-16.0), baseline_mean=0.125, baseline_std=0.007,
        ...     baseline_max=0.15, rank_in_column=1, runner_up=0.2)
        >>> ablation = dict(prev_heads=[[0, 1]], induction_heads=[[1, 2]],
        ...     score_before=0.99, score_after=0.03, rel_mse_before=0.001,
        ...     rel_mse_after=1.04, rel_mse_after_prev=1.9)
        >>> claims = judge_claims(dict(rel_mse=0.2, rel_mse_copy_current=2.0, heads=heads,
        ...                            composition=composition, ablation=ablation))
        >>> [c.verdict for c in claims][:2], claims[0].ours
        (['partly', 'holds'], '0.2000 (copying the current vector: 2.00)')
    """
    if not isinstance(values, dict):
        raise TypeError(
            f"values must be the dict of ClaimsResult.values, got {type(values).__name__}"
        )
    try:
        return tuple(judge(values, number) for number, judge in enumerate(_JUDGES, start=1))
    except (KeyError, TypeError) as exc:
        missing = exc.args[0] if isinstance(exc, KeyError) else exc
        raise ValueError(
            f"values lacks {missing!r} or has it in another form: pass ClaimsResult.values "
            "(or a results.json read back)"
        ) from exc


def level(holds: bool, partly: bool) -> str:
    """The verdict: :data:`HOLDS` if ``holds``, else :data:`PARTLY` if ``partly``, else
    :data:`NO`.

    Example:
        >>> from vecinterp.tasks.induction_claims import level
        >>> level(False, True), level(True, False)
        ('partly', 'holds')
    """
    return HOLDS if holds else PARTLY if partly else NO


def head_name(head: Sequence[int]) -> str:
    """``[layer, head]`` -> ``"L<layer>H<head>"``.

    Example:
        >>> from vecinterp.tasks.induction_claims import head_name
        >>> head_name([1, 2])
        'L1H2'
    """
    return f"L{head[0]}H{head[1]}"


def _names(heads: Sequence[Sequence[int]]) -> str:
    return ", ".join(map(head_name, heads))


def _claim(number: int, ours: str, value: float, verdict: str) -> Claim:
    return Claim(number, CLAIMS[number], ours, float(value), verdict)


def _judge_mse(v: dict[str, Any], number: int) -> Claim:
    t, mse = THRESHOLDS, v["rel_mse"]
    ours = f"{mse:.4f} (copying the current vector: {v['rel_mse_copy_current']:.2f})"
    return _claim(number, ours, mse, level(mse <= t["rel_mse_holds"], mse <= t["rel_mse_partly"]))


def _judge_prev(v: dict[str, Any], number: int) -> Claim:
    t, h = THRESHOLDS, v["heads"]
    score = h["prev_score"]
    ours = (
        f"{head_name(h['prev_head'])}: score {score:.3f} (heads >= {t['head_score']}: "
        f"{_names(h['prev_heads']) or 'none'})"
    )
    verdict = level(score >= t["head_score"], score >= t["head_score_partly"])
    return _claim(number, ours, score, verdict)


def _judge_induction(v: dict[str, Any], number: int) -> Claim:
    t, h = THRESHOLDS, v["heads"]
    score = h["induction_score"]
    by_m = sorted((int(m), s) for m, s in h["induction_score_by_m"].items())
    ours = (
        f"{head_name(h['induction_head'])}: score {score:.3f} ("
        + ", ".join(f"m={m}: {s:.3f}" for m, s in by_m)
        + f"; heads >= {t['head_score']}: {_names(h['induction_heads']) or 'none'})"
    )
    verdict = level(score >= t["head_score"], score >= t["head_score_partly"])
    return _claim(number, ours, score, verdict)


def _judge_k_composition(v: dict[str, Any], number: int) -> Claim:
    t, h, c = THRESHOLDS, v["heads"], v["composition"]
    zk, ind = c["z"]["K"], head_name(h["induction_head"])
    ours = (
        f"{head_name(h['prev_head'])} -> {ind}: K {c['pair']['K']:.3f} vs random "
        f"{c['baseline_mean']:.3f} +- {c['baseline_std']:.3f} (z = {zk:.1f}; random max "
        f"{c['baseline_max']:.3f}); rank {c['rank_in_column']} of the layer-0 heads into "
        f"{ind} (next best {c['runner_up']:.3f})"
    )
    verdict = level(zk >= t["z_holds"] and c["rank_in_column"] == 1, zk >= t["z_partly"])
    return _claim(number, ours, zk, verdict)


def _judge_kqv(v: dict[str, Any], number: int) -> Claim:
    c, z = v["composition"], v["composition"]["z"]
    k, q, vv = c["pair"]["K"], c["pair"]["Q"], c["pair"]["V"]
    ours = f"K {k:.3f}, Q {q:.3f}, V {vv:.3f} (z: {z['K']:.1f}, {z['Q']:.1f}, {z['V']:.1f})"
    verdict = level(k > max(q, vv) and z["K"] >= THRESHOLDS["z_holds"], k > min(q, vv))
    return _claim(number, ours, k - max(q, vv), verdict)


def _judge_needs_prev(v: dict[str, Any], number: int) -> Claim:
    t, h, a = THRESHOLDS, v["heads"], v["ablation"]
    before, after = a["score_before"], a["score_after"]
    ratio = after / before if before > 0 else float("nan")
    ours = (
        f"{_names(a['prev_heads'])} ablated: {head_name(h['induction_head'])} induction score "
        f"{before:.3f} -> {after:.3f} (x{ratio:.2f})"
    )
    verdict = level(ratio <= t["ablated_score_holds"], ratio <= t["ablated_score_partly"])
    return _claim(number, ours, ratio, verdict)


def _judge_needs_induction(v: dict[str, Any], number: int) -> Claim:
    t, a = THRESHOLDS, v["ablation"]
    after = a["rel_mse_after"]
    ours = (
        f"{_names(a['induction_heads'])} ablated: MSE x dim {a['rel_mse_before']:.4f} -> "
        f"{after:.3f} (ablating {_names(a['prev_heads'])} instead: "
        f"{a['rel_mse_after_prev']:.3f})"
    )
    rise = after / a["rel_mse_before"] if a["rel_mse_before"] > 0 else float("inf")
    verdict = level(
        after >= t["ablated_mse_holds"] and rise >= t["ablated_mse_rise_holds"],
        after >= t["ablated_mse_partly"] and rise >= t["ablated_mse_rise_partly"],
    )
    return _claim(number, ours, after, verdict)


_JUDGES: tuple[Callable[[dict[str, Any], int], Claim], ...] = (
    _judge_mse,
    _judge_prev,
    _judge_induction,
    _judge_k_composition,
    _judge_kqv,
    _judge_needs_prev,
    _judge_needs_induction,
)
