"""Judging the claims: the primary reading of each, its reason, the alternatives and the
verdict by :data:`~vecinterp.tasks.affine_claims.THRESHOLDS` (:func:`judge_claims`).

One file although it is long: it is thirteen parallel functions, ``_judge_1`` ..
``_judge_13``, one per claim in the paper's order, each the same shape (readings, basis,
note, verdict) over the same few helpers. A reader checks a verdict by reading one of them
and compares wordings and thresholds across claims by reading on; split in two, the
parallel would be lost and nothing else gained."""

import math
from collections.abc import Sequence
from typing import Any

from .results import CLAIM_PARTS, CLAIMS, HOLDS, NO, PARTLY, THRESHOLDS, Claim, Reading


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _alpha(alpha: float) -> str:
    """``α = q/p`` to the digits it has: when ``p`` is small, ``q/p`` is ill-conditioned."""
    return f"{alpha:.1f}" if abs(alpha) < 10 else "> 10"


def _level(ok: bool, partly: bool) -> str:
    return HOLDS if ok else PARTLY if partly else NO


def _scores(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def _pct(x: float) -> str:
    """A share as a whole percentage; ``n/a`` for NaN (no sequence of that kind)."""
    return "n/a" if x != x else f"{100 * x:.0f} %"


def _count(xs: Sequence[float], threshold: float) -> int:
    return sum(x > threshold for x in xs)


def judge_claims(values: dict[str, Any]) -> tuple[Claim, ...]:
    """Build the thirteen :class:`Claim` objects from measured numbers.

    Pure: the verdicts follow from ``values`` (as :func:`measure_claims` stores them in
    :attr:`ClaimsResult.values`, JSON round-trips included) and :data:`THRESHOLDS` only,
    so a saved ``values`` dict can be re-judged.

    Args:
        values: the dict of :attr:`ClaimsResult.values`.

    Returns:
        The claims 1..13, in order, claim 10 as two (10a and 10b, :data:`CLAIM_PARTS`).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import affine_claims as ac
        >>> cfg = vi.VectorTransformerConfig(d_in=4, d_model=16, d_head=4, n_heads=5,
        ...                                  n_layers=3, d_mlp=32, n_ctx=16)
        >>> result = ac.measure_claims(vi.HookedVectorTransformer(cfg, seed=0),
        ...     analysis_batch=8, population=8, eval_batches=3, eval_batch_size=2,
        ...     sweep_batches=1, n_random=4)
        >>> values = dict(result.values, mse=1.5e-4)       # as if the model were better
        >>> ac.judge_claims(values)[0].verdict
        'holds'
    """
    if not isinstance(values, dict):
        raise TypeError(
            f"values must be the dict of ClaimsResult.values, got {type(values).__name__}"
        )
    try:
        claims: list[Claim] = []
        for judge in _JUDGES:
            judged = judge(values)
            claims.extend(judged if isinstance(judged, tuple) else (judged,))
        return tuple(claims)
    except KeyError as exc:
        raise ValueError(f"values lacks {exc.args[0]!r}: pass ClaimsResult.values") from exc


def _claim(
    number: int,
    primary: Reading,
    alternatives: list[Reading],
    verdict: str,
    headline: str,
    basis: str,
    note: str,
    part: str = "",
) -> Claim:
    claim, paper = CLAIM_PARTS[f"{number}{part}"] if part else CLAIMS[number]
    alts = tuple(alternatives)
    return Claim(number, claim, paper, primary, alts, verdict, headline, basis, note, part)


def _judge_1(v: dict[str, Any]) -> Claim:
    t, mse = THRESHOLDS, v["mse"]
    return _claim(
        1,
        Reading("eval_set", "eval set, every length 3-14", f"{mse:.2e}", mse),
        [
            Reading(
                "pooled",
                "pooled over scored positions (long sequences weigh more)",
                f"{v['mse_pooled']:.2e}",
                v["mse_pooled"],
            ),
            Reading(
                "by_length",
                "per length, shortest and longest",
                f"{v['mse_by_length'][0]:.1e} (length 3) .. {v['mse_by_length'][-1]:.1e} "
                f"(length {2 + len(v['mse_by_length'])})",
                max(v["mse_by_length"]),
            ),
        ],
        _level(mse <= t["eval_mse_holds"], mse <= t["eval_mse_partly"]),
        f"{mse:.1e}",
        "the paper reports one MSE of the trained model: its training distribution, every "
        "length 3-14, read here as the mean over a fixed set covering each length twice",
        "",
    )


def _judge_2(v: dict[str, Any]) -> Claim:
    t, n = THRESHOLDS, v["n_heads"]
    thr = t["head_score"]
    k = _count(v["prev"], thr)
    return _claim(
        2,
        Reading(
            "share",
            f"share of attention on the previous position > {thr}",
            f"{k}/{n} heads ({_scores(v['prev'])})",
            k / n,
        ),
        [
            Reading(
                "argmax",
                "rows whose largest weight is the previous position, > half",
                f"{_count(v['prev_argmax'], 0.5)}/{n}",
                _count(v["prev_argmax"], 0.5) / n,
            ),
            Reading(
                "all_lengths",
                "share, every length 3-14",
                f"{_count(v['prev_lengths'], thr)}/{n}",
                _count(v["prev_lengths"], thr) / n,
            ),
        ],
        _level(k >= n - 1, k >= n / 2),
        f"{k}/{n} heads",
        "'all attention appears to be directed toward the previous vector': most of a "
        "head's attention, i.e. more than half of it, on length-14 sequences",
        "",
    )


def _judge_3(v: dict[str, Any]) -> Claim:
    t, n = THRESHOLDS, v["n_heads"]
    thr, part = t["head_score"], t["head_score_partly"]
    k, kp = _count(v["pos1"], thr), _count(v["pos1"], part)
    alts = [
        ("argmax", "rows whose largest weight is position 1", v["pos1_argmax"]),
        ("all_lengths", "every length 3-14", v["pos1_lengths"]),
        ("alternating", "c < 0 only", v["pos1_alt"]),
        ("non_alternating", "c > 0 only", v["pos1_non"]),
    ]
    readings = [
        Reading(
            name,
            f"{label}, > {thr}",
            f"{_count(xs, thr)}/{n} (best {max(xs):.2f})",
            _count(xs, thr) / n,
        )
        for name, label, xs in alts
    ]
    readings.append(
        Reading(
            "above_chance",
            f"share > {part} (uniform: {v['pos1_uniform']:.2f})",
            f"{kp}/{n}",
            kp / n,
        )
    )
    k2, k2_all = _count(v["pos2"], thr), _count(v["pos2_lengths"], thr)
    tops = v["top_earlier"]
    top1, top2 = tops.count(1), tops.count(2)
    readings.append(
        Reading(
            "a2",
            "a_2 ('the second vector' counted from zero): heads attending to it most often",
            f"{top2}/{n} heads (share > {thr}: {k2}/{n}; every length {k2_all}/{n})",
            top2 / n,
            key=True,
        )
    )
    readings.append(
        Reading(
            "most_attended",
            "the earlier position each head's rows attend to most often",
            f"positions {', '.join(map(str, tops))}: a_1 in {top1}/{n} heads",
            top1 / n,
        )
    )
    best = max(max(xs) for _, _, xs in alts)
    on0 = [h for h, s in enumerate(v["pos0"]) if s > part]
    note = (
        f"Averaged over sequences no reading of a_1 gives most heads: at best "
        f"{max(_count(xs, thr) for _, _, xs in alts)}/{n} heads put most of their attention "
        f"on position 1 (best share {best:.2f})."
        if max(_count(xs, thr) for _, _, xs in alts) <= n / 2
        else ""
    )
    if top1 > n / 2 or top2 > n / 2:
        which, count = ("a_1", top1) if top1 > n / 2 else ("a_2 (counting from zero)", top2)
        note += (
            f" Averaged, read as the earlier position each head attends to most, {which} wins in "
            f"{count}/{n} heads: a majority, without most of the attention on it."
        )
    if on0:
        note += f" Heads {', '.join(map(str, on0))} attend to position 0 more than {part}."
    averaged = Reading(
        "averaged",
        f"averaged over sequences: share of attention on position 1 > {thr}",
        f"{k}/{n} heads ({_scores(v['pos1'])})",
        k / n,
        key=True,
    )
    strong, strong_k = v["focus_seq_strong"], v["focus_seq_strong_k"]
    bins = v["focus_seq_bins"]
    by_c = Reading(
        "by_c",
        "per sequence, by c: (-2,-1), (-1,0), (0,1), (1,2)",
        ", ".join(_pct(x) for x in bins),
        strong,
    )
    fs, sp = t["focus_seq_holds"], t["focus_seq_partly"]
    if strong >= sp:
        note += (
            f" Per sequence the claim appears: in {_pct(strong)} of the |c| > 1 sequences "
            f"(a_1 {_pct(strong_k[0])}, a_2 {_pct(strong_k[1])}) and {_pct(v['focus_seq_weak'])} "
            "of the others most heads look at one early vector; averaging over sequences "
            "(the readings above) mixes them with sequences in which no head does."
        )
    return _claim(
        3,
        Reading(
            "per_sequence",
            f"per sequence: >= a majority of heads with > {thr} of their attention on a_1 "
            "(or on a_2), share of |c| > 1 sequences",
            f"{_pct(strong)} of |c| > 1 (a_1 {_pct(strong_k[0])}, a_2 {_pct(strong_k[1])}); "
            f"all {_pct(v['focus_seq'])}",
            strong,
        ),
        [averaged, by_c, *readings],
        _level(strong >= fs, strong >= sp),
        f"{_pct(strong)} of |c|>1",
        "the paper shows one sequence (Figure 4) in which 'the majority of attention heads "
        "focus specifically on the second vector': per sequence, more than half of the "
        f"heads with > {thr} of their attention (rows after it) on one early vector, a_1 or "
        "a_2 ('the second vector' counted from 1 or from 0); judged on the sequences with "
        "|c| > 1, where the recurrence's terms differ most",
        note.strip(),
    )


def _judge_4(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS

    def pair(key: str) -> tuple[float, float]:
        return _mean(v[f"checker_alt{key}"]), _mean(v[f"checker_non{key}"])

    alt, non = pair("")
    readings = [
        Reading(
            "averaged",
            "averaged over sequences: parity contrast, c<0 vs c>0",
            f"{alt:+.2f} vs {non:+.2f}",
            alt - non,
            key=True,
        )
    ]
    for name, label, key in (
        ("diagonal", "averaged, diagonal counted as same parity", "_diag"),
        ("strong", "averaged, c < -1 vs c > 1", "_strong"),
        ("all_lengths", "averaged, every length 4-14", "_lengths"),
    ):
        a, b = pair(key)
        readings.append(Reading(name, label, f"{a:+.2f} vs {b:+.2f}", a - b))
    gaps = [a - b for a, b in zip(v["checker_alt"], v["checker_non"], strict=True)]
    best = max(range(len(gaps)), key=lambda h: gaps[h])
    readings.append(
        Reading(
            "best_head",
            "averaged, the head with the largest gap",
            f"head {best}: {v['checker_alt'][best]:+.2f} vs {v['checker_non'][best]:+.2f}",
            gaps[best],
        )
    )
    neg, pos = v["checker_seq_sign"]
    readings.append(
        Reading(
            "sign",
            f"per sequence, contrast > {t['checker_alt']}: c < 0 vs c > 0",
            f"{_pct(neg)} vs {_pct(pos)}",
            neg - pos,
        )
    )
    a, b = v["checker_seq_strong"]
    ok = a >= t["checker_seq_holds"] and b <= t["checker_seq_other"]
    verdict = _level(ok, a >= t["checker_seq_partly"] and a > b)
    note = ""
    if verdict == NO:
        most = max(a, neg)
        note = (
            f"No reading shows checkerboards for c < 0 only: per sequence at most "
            f"{_pct(most)} of the c < 0 sequences have a contrast above {t['checker_alt']}"
            + (
                f", and more of the c > 0 ones ({_pct(max(b, pos))})."
                if max(b, pos) > most
                else "."
            )
        )
    return _claim(
        4,
        Reading(
            "per_sequence",
            f"per sequence: head-mean parity contrast > {t['checker_alt']}, share of c < -1 "
            "vs c > 1 sequences",
            f"{_pct(a)} vs {_pct(b)}",
            a - b,
        ),
        readings,
        verdict,
        f"{_pct(a)} vs {_pct(b)}",
        "the paper shows the patterns of single sequences (Figures 5 and 6): per sequence, the "
        "parity contrast over earlier positions (the diagonal alone is no checkerboard) "
        "averaged over the layer's heads, in most strongly alternating sequences (c < -1) "
        "and few strongly growing ones (c > 1)",
        note,
    )


def _judge_5(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    l0, l1, l2 = v["attr_layers"][:3]
    small = abs(l1) <= t["near_zero"] * max(abs(l0), abs(l2))
    n_ok = (l0 > 0) + small + (l2 < 0)
    s0, s1, s2 = v["attr_layers_step"][:3]
    heads = v["attr_heads"]
    n = v["n_heads"]
    return _claim(
        5,
        Reading(
            "next", "target a_{m+1}, heads summed per layer", f"{l0:+.3f}, {l1:+.3f}, {l2:+.3f}", l2
        ),
        [
            Reading("step", "target a_{m+1} - a_m", f"{s0:+.3f}, {s1:+.3f}, {s2:+.3f}", s2),
            Reading(
                "per_head",
                "heads with the layer's sign (L0 +, L2 -)",
                f"{sum(x > 0 for x in heads[0])}/{n}, {sum(x < 0 for x in heads[2])}/{n}",
                sum(x < 0 for x in heads[2]) / n,
            ),
        ],
        _level(n_ok == 3, n_ok == 2),
        f"{l0:+.2f}, {l1:+.2f}, {l2:+.2f}",
        "§4.3 defines it: ⟨ln_final(v) W_U, a_{m+1}⟩ per head; the layers' signs are read "
        "from the heads together (Figure 7)",
        "",
    )


def _judge_6(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    lo, hi = t["slope_range"]
    r2, slope = v["ov_r2"], v["ov_slope"]
    ok = r2 >= t["r2_holds"] and lo <= slope <= hi and abs(v["ov_intercept"]) <= t["intercept_max"]
    best = max(range(v["n_heads"]), key=lambda h: v["ov_head_r2"][h])
    readings = [
        Reading(
            "unfolded",
            "d_model, raw resid_pre, unfolded model",
            f"R² {v['ov_unfolded_r2']:.2f}, slope {v['ov_unfolded_slope']:.2f}",
            v["ov_unfolded_r2"],
        ),
        Reading(
            "embed",
            "d_model, embedding only (a W_E)",
            f"R² {v['ov_embed_r2']:.2f}, slope {v['ov_embed_slope']:.2f}",
            v["ov_embed_r2"],
        ),
        Reading(
            "best_head",
            "d_model, one head (the best)",
            f"head {best}: R² {v['ov_head_r2'][best]:.2f}",
            v["ov_head_r2"][best],
        ),
        Reading(
            "full_ov",
            "full OV W_E·ΣOV·W_U, input→output",
            f"R² {v['full_ov_r2']:.2f}, slope {v['full_ov_slope']:.2f}, "
            f"b {v['full_ov_intercept']:+.3f}",
            v["full_ov_slope"],
            key=True,
        ),
        Reading(
            "transposed",
            "d_model, OV transposed (x OV^T): the convention check",
            f"slope {v['ov_slope_transposed']:.2f}, R² {v['ov_r2_transposed']:.3f} (x OV: "
            f"{slope:.2f}; x·xOV/|x|² {v['ov_rayleigh']:.2f})",
            v["ov_slope_transposed"],
        ),
        Reading(
            "full_ov_unfolded",
            "full OV, unfolded model",
            f"R² {v['full_ov_unfolded_r2']:.2f}, slope {v['full_ov_unfolded_slope']:.2f}",
            v["full_ov_unfolded_slope"],
        ),
    ]
    mid, post = v["prev_fit_mid"], v["prev_fit_post"]
    readings.append(
        Reading(
            "output_lens",
            "post hoc, output space: lens of layer 0's resid_mid (ln_final, W_U) on a_{n-1}, "
            "per vector",
            f"R² {mid['r2']:.2f}, slope {mid['slope']:.2f} (IQR {mid['slope_q25']:.2f}-"
            f"{mid['slope_q75']:.2f}), b {mid['intercept']:+.3f}; resid_post R² "
            f"{post['r2']:.2f}, slope {post['slope']:.2f}",
            mid["r2"],
            key=True,
        )
    )
    lens_ok = (
        mid["r2"] >= t["r2_holds"]
        and lo <= mid["slope"] <= hi
        and abs(mid["intercept"]) <= t["intercept_max"]
    )
    copies = v["full_ov_r2"] >= t["r2_holds"]
    note = (
        f"In d_model every variant gives R² "
        f"{min(r2, v['ov_unfolded_r2'], v['ov_embed_r2']):.2f}-"
        f"{max(r2, v['ov_unfolded_r2'], v['ov_embed_r2'], v['ov_head_r2'][best]):.2f}. "
        if not ok
        else ""
    )
    if not ok and lens_ok:
        note += (
            f"A reading found after trying the others (post hoc) gives the paper's three "
            f"numbers at once: the output-space lens after layer 0's attention against "
            f"a_{{n-1}}, R² {mid['r2']:.2f}, slope {mid['slope']:.2f}, intercept "
            f"{mid['intercept']:+.3f}. "
        )
    elif not ok:
        note += "No reading reproduces the figure, the post-hoc output-space lens included. "
    if copies:
        note += (
            f"From input to output space layer 0 is a scaled copy (R² {v['full_ov_r2']:.2f}, "
            f"every eigenvalue score of the summed full OV {v['full_ov_l0_summed_score']:+.2f}) "
            f"with α = {v['full_ov_slope']:.2f}, not 2.1-2.5 (and in the residual read "
            f"through W_U after layer 0, α = q/p {_alpha(v['lens_alpha'])}, claim 13)."
        )
    return _claim(
        6,
        Reading(
            "d_model",
            "d_model, summed OV, normalised layer-0 input, per vector",
            f"R² {r2:.2f}, slope {v['ov_slope_lo']:.2f}..{v['ov_slope_hi']:.2f} "
            f"(median {slope:.2f}), b {v['ov_intercept']:+.3f}",
            r2,
        ),
        readings,
        _level(ok, r2 >= t["r2_partly"] and slope > 0),
        f"R² {r2:.2f}",
        "'we plotted (x_d, (OV x)_d) for each dimension 0 <= d < d_model' of residual stream "
        "vectors, for the sum over heads (Figure 9), with LayerNorm folded (§4.1)",
        note.strip(),
    )


def _judge_7(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    r2 = v["ov_random_r2"]
    below = r2 <= v["ov_r2"] - t["r2_gap"]
    return _claim(
        7,
        Reading(
            "d_model",
            "d_model, N(0, 1) vectors, summed OV",
            f"R² {r2:.2f} (residual {v['ov_r2']:.2f})",
            r2,
        ),
        [
            Reading(
                "full_ov",
                "full OV, N(0, 1) input vectors",
                f"R² {v['full_ov_random_r2']:.2f} (inputs {v['full_ov_r2']:.2f})",
                v["full_ov_random_r2"],
                key=True,
            ),
            Reading(
                "identity_share",
                "scaled-identity share of the summed OV's |M|_F² (≈ R² on N(0, I) vectors; "
                "the paper's 0.60 needs ≈ 0.60)",
                f"{v['ov_identity_share']:.5f} (full OV {v['full_ov_identity_share']:.2f})",
                v["ov_identity_share"],
                key=True,
            ),
        ],
        _level(below and abs(r2 - 0.60) <= t["r2_random_tol"], below),
        f"R² {r2:.2f}",
        "'inputting a random, non-residual stream vector into the OV matrix': the claim 6 "
        "reading with random vectors",
        (
            "Under neither reading is the fit worse on random vectors than on residual ones: "
            "the OV map treats both alike. "
            if v["ov_random_r2"] > v["ov_r2"] - t["r2_gap"]
            and v["full_ov_random_r2"] > v["full_ov_r2"] - t["r2_gap"]
            else ""
        )
        + f"For N(0, I) vectors the per-vector R² of x ↦ x M is about the share of |M|_F² in "
        f"M's scaled-identity part; R² 0.60 would need that share near 0.60, a plainly "
        f"visible diagonal; the summed OV's share is {v['ov_identity_share']:.5f}.",
    )


def _judge_8(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    out = v["outside"]
    return _claim(
        8,
        Reading(
            "norm_ratio",
            "‖outside‖/‖x OV‖, summed OV, normalised layer-0 input",
            f"{100 * out:.2f} %",
            out,
        ),
        [
            Reading(
                "squared",
                "share of ‖x OV‖²",
                f"{100 * v['outside_squared']:.1f} %",
                v["outside_squared"],
            ),
            Reading(
                "per_head",
                "each head's x OV_h",
                f"{100 * v['outside_heads']:.1f} %",
                v["outside_heads"],
            ),
            Reading(
                "attn_out",
                "layer 0's actual output",
                f"{100 * v['outside_attn_out']:.1f} %",
                v["outside_attn_out"],
            ),
            Reading(
                "chance",
                f"a random direction, sqrt(1 - {v['embed_rank']}/{v['d_model']})",
                f"{100 * v['outside_chance']:.1f} %",
                v["outside_chance"],
            ),
            Reading(
                "inputs",
                "baseline: the OV's input vectors x themselves",
                f"{100 * v['outside_inputs']:.1f} % (x OV: {100 * out:.1f} %)",
                v["outside_inputs"],
                key=True,
            ),
        ],
        _level(abs(out - 0.8415) <= t["outside_tol"], out >= t["outside_partly"]),
        f"{100 * out:.1f} %",
        "'the ratio of this norm to the original norm' of OV x, x a residual stream vector: "
        "the same vectors and OV as claim 6",
        f"The residual vectors the OV reads already have {100 * v['outside_inputs']:.1f} % of "
        f"their norm outside W_E's row space, and a direction drawn at random would have "
        f"{100 * v['outside_chance']:.1f} % outside a rank-{v['embed_rank']} subspace of "
        f"{v['d_model']} dimensions, so the share says little beyond 'not aligned with the "
        "embedding'.",
    )


def _judge_9(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    base = v["sweep_base"]
    ratios = [m / base for m in v["ablate_heads"]]
    n = len(ratios)
    k = sum(r <= t["ablation_holds"] for r in ratios)
    med = sorted(ratios)[n // 2] if n % 2 else _mean(sorted(ratios)[n // 2 - 1 : n // 2 + 1])
    worst = max(range(n), key=lambda h: ratios[h])
    joint = v["ablate_joint"] / v["mse"]
    longest = v["ablate_joint_longest"] / base  # on the sweep set, as the single heads
    zero = v["ablate_joint_zero"] / base
    per = v["population_per_length"]
    sweep_n = v["sizes"]["sweep_batches"] * v["sizes"]["sweep_batch_size"]
    lengths, by_len = v["ablate_joint_lengths"], v["ablate_joint_by_length"]
    shown = [i for i, n in enumerate(lengths) if n in (lengths[0], 7, lengths[-1])]
    return _claim(
        9,
        Reading(
            "joint",
            f"all heads of layer 1 at once, means of each length ({per} sequences per length)",
            f"{v['mse']:.1e} -> {v['ablate_joint']:.1e} (x{joint:.0f})",
            joint,
        ),
        [
            Reading(
                "by_length",
                "all heads at once, by sequence length (eval set)",
                ", ".join(f"x{by_len[i]:.1f} at {lengths[i]}" for i in shown),
                by_len[-1],
            ),
            Reading(
                "single_head",
                f"one head at a time (the sweep set: {sweep_n} sequences, every length, "
                "against their own unablated MSE)",
                f"{k}/{n} heads <= x{t['ablation_holds']:g}, median x{med:.1f}, worst head "
                f"{worst} x{ratios[worst]:.1f} (unablated {base:.1e})",
                med,
                key=True,
            ),
            Reading(
                "zero",
                "all heads at once, zero ablation (sweep set)",
                f"x{zero:.0f}",
                zero,
            ),
            Reading(
                "longest_means",
                "all heads at once, length-14 means for every length (mismatched; sweep set)",
                f"x{longest:.0f}",
                longest,
            ),
        ],
        _level(joint <= t["ablation_holds"], joint <= t["ablation_partly"]),
        f"x{joint:.0f}",
        "the paper reports one number for 'the first layer heads' ('a new mean squared "
        "error of 0.0002') and concludes that their 'outputs do not depend significantly on "
        "their inputs': the layer's heads ablated together; one head at a time is the "
        "alternative",
        f"Ablating layer 1's heads together costs x{joint:.0f}: the layer's outputs matter. One "
        f"head at a time, {k}/{n} heads cost at most x{t['ablation_holds']:g} (median "
        f"x{med:.1f}): the heads are redundant, not useless, so 'comparatively less useful' "
        "holds for each head, not for the layer.",
    )


def _judge_10(v: dict[str, Any]) -> tuple[Claim, Claim]:
    t = THRESHOLDS
    n = v["n_heads"]
    ov, qk = v["ov_scores"][2], v["qk_scores"][2]
    n_ov, n_qk = sum(x < 0 for x in ov), sum(x > 0 for x in qk)
    fov, fqk = v["full_ov_scores"][2], v["full_qk_scores"][2]
    part_a = _claim(
        10,
        Reading(
            "d_model",
            "eigenvalue scores of W_V W_O",
            f"OV < 0 in {n_ov}/{n} (mean {_mean(ov):+.2f})",
            _mean(ov),
        ),
        [
            Reading(
                "full",
                "full circuit W_E W_V W_O W_U",
                f"OV < 0 in {sum(x < 0 for x in fov)}/{n} (mean {_mean(fov):+.2f})",
                _mean(fov),
            ),
        ],
        _level(n_ov == n, n_ov > n / 2),
        f"OV {n_ov}/{n}",
        "Figure 15 scores 'the OV circuit', the d_model matrix of §4.4: every score negative",
        "",
        part="a",
    )
    thr = t["qk_identity"]
    paper = list(v["qk_heads"])
    like = [h for h in range(n) if qk[h] > thr]
    in_paper = [h for h in paper if qk[h] > thr]
    need, need_partly = math.ceil(t["qk_heads_holds"] * n), math.ceil(t["qk_heads_partly"] * n)
    part_b = _claim(
        10,
        Reading(
            "all_heads",
            f"QK eigenvalue scores > {thr} (identity-like), every layer-2 head",
            f"{len(like)}/{n} (heads {','.join(map(str, like)) or 'none'})",
            len(like) / n,
        ),
        [
            Reading(
                "paper_heads",
                f"the paper's head indices {','.join(map(str, paper))} (an index means "
                "nothing across models)",
                f"{len(in_paper)}/{len(paper)} ({_scores([qk[h] for h in paper])})",
                len(in_paper) / max(1, len(paper)),
            ),
            Reading(
                "positive",
                "QK scores > 0 (sign only)",
                f"{n_qk}/{n} (mean {_mean(qk):+.2f})",
                n_qk / n,
            ),
            Reading(
                "full",
                "full circuit W_E W_Q W_K^T W_E^T, scores > 0",
                f"{sum(x > 0 for x in fqk)}/{n} (mean {_mean(fqk):+.2f})",
                _mean(fqk),
            ),
        ],
        _level(len(like) >= need, len(like) >= need_partly),
        f"{len(like)}/{n} heads",
        f"§4.6: QK 'strongly resembles a positive identity', and the paper patches five "
        f"heads (5 of 8) as the identity-like ones: at least {need} of {n} heads with a "
        f"score > {thr}, judged by the score's size, not its sign, wherever the heads are "
        "(any permutation of a layer's heads is the same model)",
        "",
        part="b",
    )
    return part_a, part_b


def _judge_11(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    base = v["mse"]
    own, uniform = v["qk_own_patch"] / base, v["qk_own_uniform"] / base
    paper_ratio = v["qk_patch"] / base
    sub = v["sweep_base"]
    alt = v["qk_alt"]
    heads = ",".join(map(str, v["qk_heads"]))
    top = ",".join(map(str, v["qk_top_heads"]))
    k = len(v["qk_top_heads"])
    labels = {
        "seed+1": "sweep set: another random Q, the paper's head indices",
        "all": "sweep set: all heads",
        "matched": "sweep set: P scaled to each head's |QK|_F, the paper's head indices",
        "uniform": "sweep set: the paper's head indices attend uniformly",
    }
    readings = [
        Reading(
            "own_uniform",
            f"reference: the same {k} heads attend uniformly (eval set); patch / uniform",
            f"x{uniform:.1f} ({top}); patch/uniform {own / uniform:.2f}",
            uniform,
            key=True,
        ),
        Reading(
            "paper_heads",
            f"the paper's head indices {heads} (an index means nothing across models), eval set",
            f"x{paper_ratio:.1f}",
            paper_ratio,
        ),
    ]
    readings += [
        Reading(key, labels[key], f"x{alt[key] / sub:.1f}", alt[key] / sub)
        for key in ("seed+1", "all", "matched", "uniform")
    ]
    verdict = _level(own <= t["patch_holds"], own <= t["patch_partly"])
    best = min(own, paper_ratio, *(alt[key] / sub for key in ("seed+1", "all", "matched")))
    note = (
        f"No reading keeps the MSE: the patched variants cost x{best:.1f} or more. "
        if best > t["patch_holds"]
        else ""
    )
    if uniform < t["uniform_matters"]:
        note += (
            f"Uniform attention in the same heads costs only x{uniform:.1f}: their patterns "
            "matter little on this model, so the patch's cost says little about their QK."
        )
    else:
        note += (
            f"Uniform attention in the same heads costs x{uniform:.1f}: the patch is "
            f"{own / uniform:.2f} times that."
        )
    return _claim(
        11,
        Reading(
            "own_heads",
            f"the model's own {k} most identity-like QK heads, random Q, K^T = pinv(Q), eval set",
            f"MSE {base:.2e} -> {v['qk_own_patch']:.2e} (x{own:.2f}; heads {top})",
            own,
        ),
        readings,
        verdict,
        f"x{own:.1f}",
        "the paper patches (Q random, K^T = pinv(Q)) the heads it found identity-like, five "
        "of eight, and reports the MSE unchanged; on another model the identity-like heads "
        "are its own, so the patch goes to its five with the largest QK scores",
        note.strip(),
    )


def _judge_12(v: dict[str, Any]) -> Claim:
    by_pos, step = v["mlp_by_pos"], v["mlp_by_pos_step"]
    last3, last5 = by_pos[-3:], by_pos[-5:]
    n = len(by_pos)
    return _claim(
        12,
        Reading(
            "last_3",
            f"all MLPs, target a_{{m+1}}, positions {n - 3}-{n - 1}",
            ", ".join(f"{x:+.3f}" for x in last3),
            min(last3),
        ),
        [
            Reading(
                "last_5",
                f"positions {n - 5}-{n - 1}",
                f"{sum(x > 0 for x in last5)}/5 > 0",
                min(last5),
            ),
            Reading(
                "step",
                "target a_{m+1} - a_m",
                ", ".join(f"{x:+.3f}" for x in step[-3:]),
                min(step[-3:]),
            ),
        ],
        _level(all(x > 0 for x in last3), sum(last3) > 0),
        ", ".join(f"{x:+.2f}" for x in last3),
        "'contribute in the correct direction for the final few sequence positions': the "
        "last three positions of length-14 sequences",
        "",
    )


def _judge_13(v: dict[str, Any]) -> Claim:
    t = THRESHOLDS
    corr = v["lens_corr"]
    return _claim(
        13,
        Reading(
            "corr",
            "after layer 0 through ln_final and W_U vs a_{n+1}, correlation",
            f"corr {corr:.2f} (current vector: {v['lens_corr_current']:.2f})",
            corr,
        ),
        [
            Reading("rel_err", "relative error", f"{v['lens_rel_err']:.2f}", v["lens_rel_err"]),
            Reading(
                "linearised",
                "final LN at its cached scale",
                f"corr {v['lens_corr_linearised']:.3f}",
                v["lens_corr_linearised"],
            ),
            Reading(
                "alpha",
                "fit p a_n + q a_{n-1}, α = q/p (paper 2.3)",
                f"p {v['lens_p']:.2f}, q {v['lens_q']:.2f}: α {_alpha(v['lens_alpha'])} "
                f"(R² {v['lens_fit_r2']:.2f})",
                v["lens_alpha"],
                key=True,
            ),
            Reading(
                "single",
                "one regressor: the lens on a_{n-1} alone, per vector, median slope (paper's "
                "α 2.3)",
                f"resid_mid {v['prev_fit_mid']['slope']:.2f} (R² {v['prev_fit_mid']['r2']:.2f}), "
                f"resid_post {v['prev_fit_post']['slope']:.2f} "
                f"(R² {v['prev_fit_post']['r2']:.2f})",
                v["prev_fit_mid"]["slope"],
                key=True,
            ),
            Reading(
                "paper_transform",
                "a_n + 2.3 a_{n-1} vs a_{n+1}",
                f"corr {v['paper_transform_corr']:.2f}",
                v["paper_transform_corr"],
            ),
        ],
        _level(corr >= t["lens_holds"], corr >= t["lens_partly"]),
        f"corr {corr:.2f}",
        "'project the residual stream vectors into the unembedding space directly after the "
        "zeroth layer' (Figure 14): ln_final and W_U on resid_post of layer 0",
        "",
    )


_JUDGES = (
    _judge_1,
    _judge_2,
    _judge_3,
    _judge_4,
    _judge_5,
    _judge_6,
    _judge_7,
    _judge_8,
    _judge_9,
    _judge_10,
    _judge_11,
    _judge_12,
    _judge_13,
)
