"""The analyses behind the claims, one function per pass, each writing its readings into
the ``values`` dict that :func:`~vecinterp.tasks.affine_claims.judge_claims` reads. Called
in order by :func:`~vecinterp.tasks.affine_claims.measure_claims` (``measure.py``); the
attention-pattern measures they use are in ``patterns.py``, the other per-sequence
readings in ``readings.py``.

One file although it is long: its functions are the passes of one measurement in the
order they run, each writing the keys the next ones and the judge read; split, the order
and the shared keys would be read across files."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...analysis import (
    direct_attribution,
    eigenvalue_scores,
    fit_line,
    fraction_outside_embedding,
    full_ov_circuit,
    head_ablation_sweep,
    logit_lens,
    mean_activations,
    ov_circuit,
    ov_linearity,
    patch_qk_identity,
    pattern_ablation_hook,
    position_k_score,
    previous_position_score,
)
from ...factored_matrix import FactoredMatrix
from ...loss import masked_mse
from ...model import HookedVectorTransformer
from .. import affine_recurrence as ar
from .patterns import (
    checkerboard_contrast,
    early_focus_per_sequence,
    most_attended_earlier_position,
)
from .readings import C_BINS, identity_share, previous_vector_fit, share_by_c
from .results import PAPER_ALPHA, PAPER_QK_HEADS, THRESHOLDS

_INF = float("inf")


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / (a.norm() * b.norm()))


def _argmax_share(patterns: torch.Tensor, target: torch.Tensor) -> list[float]:
    """Per head, the share of rows (where ``target`` has a position) whose largest weight
    sits on the target position; ``target [dest]`` holds a source index or -1."""
    rows = target >= 0
    top = patterns.argmax(-1)[..., rows]  # [batch, heads, rows]
    return (top == target[rows]).to(torch.float64).mean(dim=(0, 2)).tolist()


@dataclass
class _Run:
    """One eval batch's unablated run: what later passes start from."""

    batch: ar.AffineBatch
    out: torch.Tensor
    resid: dict[int, torch.Tensor]  # resid_pre of blocks 1 and 2
    patterns: list[torch.Tensor]  # [batch, heads, dest, src] for every layer


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _mse(out: torch.Tensor, batch: ar.AffineBatch) -> float:
    return float(masked_mse(out, batch.targets, batch.loss_mask))


def _by_length(v: dict[str, Any], runs: list["_Run"]) -> None:
    """The eval MSE per length (mean over that length's batches) and pooled over every
    scored position."""
    per: dict[int, list[float]] = {}
    sq, count = 0.0, 0
    for r in runs:
        per.setdefault(r.batch.length, []).append(_mse(r.out, r.batch))
        err = (r.out - r.batch.targets).pow(2).mean(-1)[r.batch.loss_mask]
        sq, count = sq + float(err.sum()), count + err.numel()
    v["mse_by_length"] = [_mean(per[n]) for n in sorted(per)]
    v["mse_pooled"] = sq / count


def _eval_run(net: HookedVectorTransformer, batch: ar.AffineBatch) -> _Run:
    n = net.cfg.n_layers
    names = [f"blocks.{ell}.attn.hook_pattern" for ell in range(n)]
    names += ["blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre"]
    out, cache = net.run_with_cache(batch.inputs, names_filter=names)
    resid = {ell: cache[f"blocks.{ell}.hook_resid_pre"] for ell in (1, 2)}
    return _Run(batch, out, resid, [cache["pattern", ell] for ell in range(n)])


def _attention(
    v: dict[str, Any], patterns: torch.Tensor, batch: ar.AffineBatch, runs: list[_Run]
) -> None:
    n_pos = patterns.shape[-1]
    alt = batch.alternating
    prev_target = torch.arange(n_pos, device=patterns[0].device) - 1  # row d -> d - 1 (row 0: none)
    pos1_target = torch.where(prev_target >= 1, 1, -1)  # rows d >= 2 -> 1
    v["prev"] = previous_position_score(patterns[0]).tolist()
    v["prev_argmax"] = _argmax_share(patterns[0], prev_target)
    v["prev_lengths"] = _mean_lists([previous_position_score(r.patterns[0]).tolist() for r in runs])
    v["pos1"] = position_k_score(patterns[1], 1).tolist()
    v["pos0"] = position_k_score(patterns[1], 0).tolist()
    v["pos1_argmax"] = _argmax_share(patterns[1], pos1_target)
    v["pos1_lengths"] = _mean_lists([position_k_score(r.patterns[1], 1).tolist() for r in runs])
    v["pos1_alt"] = position_k_score(patterns[1][alt], 1).tolist() if alt.any() else v["pos1"]
    v["pos1_non"] = position_k_score(patterns[1][~alt], 1).tolist() if (~alt).any() else v["pos1"]
    v["pos1_uniform"] = _mean([1 / (d + 1) for d in range(1, n_pos)])
    # "the second vector" counted from zero (the paper counts layers from zero): a_2
    v["pos2"] = position_k_score(patterns[1], 2).tolist()
    v["pos2_lengths"] = _mean_lists([position_k_score(r.patterns[1], 2).tolist() for r in runs])
    v["top_earlier"], v["top_earlier_share"] = most_attended_earlier_position(patterns[1])
    p2 = patterns[2]

    def contrasts(mask: torch.Tensor, diag: bool = False) -> list[float]:
        if not bool(mask.any()):
            return [float("nan")] * p2.shape[1]
        return checkerboard_contrast(p2[mask], include_diagonal=diag).tolist()

    v["checker_alt"], v["checker_non"] = contrasts(alt), contrasts(~alt)
    v["checker_alt_diag"], v["checker_non_diag"] = contrasts(alt, True), contrasts(~alt, True)
    v["checker_alt_strong"], v["checker_non_strong"] = (
        contrasts(batch.c < -1),
        contrasts(batch.c > 1),
    )
    v["n_alt"], v["n_non"] = int(alt.sum()), int((~alt).sum())
    _per_sequence(v, patterns, batch)
    alt_l, non_l = [], []
    for r in runs:  # every length, each sequence kind of each batch
        a = r.batch.alternating
        if a.any() and (~a).any() and r.batch.length >= 4:
            alt_l.append(checkerboard_contrast(r.patterns[2][a]).tolist())
            non_l.append(checkerboard_contrast(r.patterns[2][~a]).tolist())
    v["checker_alt_lengths"] = _mean_lists(alt_l) if alt_l else v["checker_alt"]
    v["checker_non_lengths"] = _mean_lists(non_l) if non_l else v["checker_non"]


def _per_sequence(v: dict[str, Any], patterns: torch.Tensor, batch: ar.AffineBatch) -> None:
    """Claims 3 and 4 read per sequence (the paper's Figures 4, 5 and 6 show one sequence
    each), reported by the recurrence's ``c``: averaging over sequences mixes kinds of
    sequence whose patterns differ."""
    c = batch.c.to(torch.float64)
    shows, which = early_focus_per_sequence(patterns[1], (1, 2), threshold=THRESHOLDS["head_score"])
    strong = [(-_INF, -1.0), (1.0, _INF)]
    v["focus_seq"] = float(shows.double().mean())
    v["focus_seq_k"] = [float((which == k).double().mean()) for k in (1, 2)]
    v["focus_seq_bins"] = share_by_c(shows, c, C_BINS)
    v["focus_seq_strong"] = share_by_c(shows, c.abs(), [(1.0, _INF)])[0]
    v["focus_seq_strong_k"] = [share_by_c(which == k, c.abs(), [(1.0, _INF)])[0] for k in (1, 2)]
    v["focus_seq_weak"] = share_by_c(shows, c.abs(), [(-_INF, 1.0)])[0]
    contrast = checkerboard_contrast(patterns[2], per_sequence=True).mean(1)  # mean over heads
    checker = contrast > THRESHOLDS["checker_alt"]
    v["checker_seq_strong"] = share_by_c(checker, c, strong)  # c < -1, c > 1
    v["checker_seq_sign"] = share_by_c(checker, c, [(-_INF, 0.0), (0.0, _INF)])
    v["checker_seq_bins"] = share_by_c(checker, c, C_BINS)
    v["n_seq_strong"] = [int((c < -1).sum()), int((c > 1).sum())]


def _mean_lists(rows: list[list[float]]) -> list[float]:
    return [_mean(col) for col in zip(*rows, strict=True)]


def _attribution(
    v: dict[str, Any],
    data: dict[str, Any],
    net: HookedVectorTransformer,
    cache: Any,
    batch: ar.AffineBatch,
) -> None:
    cfg = net.cfg
    for suffix, targets in (("", batch.targets), ("_step", batch.targets - batch.inputs)):
        attr = direct_attribution(net, cache, targets, loss_mask=batch.loss_mask)
        means = dict(zip(attr.labels, attr.mean().tolist(), strict=True))
        heads = [[means[f"L{ell}H{h}"] for h in range(cfg.n_heads)] for ell in range(cfg.n_layers)]
        mlp_labels = [_mlp_label(attr.labels, ell) for ell in range(cfg.n_layers)]
        mlp = torch.stack([attr[label] for label in mlp_labels])  # [layer, batch, pos]
        v[f"attr_heads{suffix}"] = heads
        v[f"attr_layers{suffix}"] = [sum(h) for h in heads]
        v[f"mlp_by_pos{suffix}"] = mlp.sum(0).mean(0).tolist()
        v[f"mlp_layers{suffix}"] = [means[label] for label in mlp_labels]
        if not suffix:
            labels = [f"L{ell}H{h}" for ell in range(cfg.n_layers) for h in range(cfg.n_heads)]
            labels += mlp_labels
            data["attribution"] = (labels, [means[label] for label in labels])


def _mlp_label(labels: Sequence[str], layer: int) -> str:
    for label in (f"{layer}_mlp_out", f"L{layer}_mlp"):
        if label in labels:
            return label
    raise KeyError(f"no MLP component for layer {layer} in {list(labels)}")


def _lens(
    v: dict[str, Any],
    data: dict[str, Any],
    net: HookedVectorTransformer,
    cache: Any,
    batch: ar.AffineBatch,
) -> None:
    lens = logit_lens(net, cache, 0)
    mask = batch.loss_mask
    est, tgt, cur = lens[mask], batch.targets[mask], batch.inputs[mask]
    v["lens_corr"] = _pearson(est, tgt)
    v["lens_rel_err"] = float((est - tgt).norm() / tgt.norm())
    v["lens_corr_current"] = _pearson(cur, tgt)
    v["lens_corr_linearised"] = _pearson(logit_lens(net, cache, 0, linearised=True)[mask], tgt)
    # §4.8: the estimate after layer 0 ≈ p a_n + q a_{n-1}; the paper's α is q / p
    prev = batch.inputs[:, :-1][mask[:, 1:]]
    features = torch.stack([cur.flatten(), prev.flatten()], 1).double()
    coef = torch.linalg.lstsq(features, est.flatten().double()[:, None]).solution[:, 0]
    fitted = features @ coef
    resid = est.flatten().double() - fitted
    centred = est.flatten().double() - est.double().mean()
    v["lens_p"], v["lens_q"] = float(coef[0]), float(coef[1])
    v["lens_alpha"] = float(coef[1] / coef[0])
    v["lens_fit_r2"] = float(1 - resid.square().sum() / centred.square().sum())
    paper = cur + PAPER_ALPHA * prev  # Figure 17's green curve
    v["paper_transform_corr"] = _pearson(paper, tgt)
    data["lens"] = lens
    # claims 6 (output space, post hoc) and 13' (one regressor): the lens of layer 0's
    # resid_mid and resid_post, ln_final recomputed on each, fitted per vector on a_{n-1}
    mid = net.unembed(net.ln_final(cache["resid_mid", 0]))
    for key, estimate in (("mid", mid), ("post", lens)):
        fit = previous_vector_fit(estimate, batch.inputs)
        slopes = fit.slope.flatten()
        v[f"prev_fit_{key}"] = dict(
            r2=float(fit.r2.mean()),
            slope=float(slopes.quantile(0.5)),  # numpy's median: the mean of the middle two
            slope_q25=float(slopes.quantile(0.25)),
            slope_q75=float(slopes.quantile(0.75)),
            intercept=float(fit.intercept.mean()),
        )


def _geometry(
    v: dict[str, Any],
    data: dict[str, Any],
    net: HookedVectorTransformer,
    original: HookedVectorTransformer,
    cache: Any,
    batch: ar.AffineBatch,
    n_random: int,
) -> None:
    x = cache["normalized", 0, "ln1"]  # what layer 0's W_V reads (folded model)
    fit = ov_linearity(net, 0, x, per_vector=True, per_head=True)
    s = fit.summed
    slopes = s.slope.flatten()
    v["ov_r2"] = float(s.r2.mean())
    v["ov_slope"] = float(slopes.median())
    v["ov_slope_lo"], v["ov_slope_hi"] = float(slopes.quantile(0.05)), float(slopes.quantile(0.95))
    v["ov_intercept"] = float(s.intercept.mean())
    # for centred x (a LayerNorm output) the per-vector slope is x·(x OV)/|x|², the same
    # for OV and its transpose: no convention slip (OV x vs x OV) changes it
    ov_heads = ov_circuit(net, 0).AB  # [heads, d_model, d_model]
    summed_ov = ov_heads.sum(0)
    flat = x.reshape(-1, x.shape[-1])
    transposed = fit_line(flat, flat @ summed_ov.T)
    v["ov_slope_transposed"] = float(transposed.slope.median())
    v["ov_r2_transposed"] = float(transposed.r2.mean())
    rayleigh = (flat * (flat @ summed_ov)).sum(-1) / flat.square().sum(-1)
    v["ov_rayleigh"] = float(rayleigh.median())
    v["ov_identity_share"] = identity_share(summed_ov)
    assert fit.heads is not None
    v["ov_head_r2"] = fit.heads.r2.flatten(0, -2).mean(0).tolist()
    emb = ov_linearity(net, 0, cache["embed"], per_vector=True, per_head=False).summed
    v["ov_embed_r2"], v["ov_embed_slope"] = float(emb.r2.mean()), float(emb.slope.median())
    _, raw_cache = original.run_with_cache(
        batch.inputs, names_filter="blocks.0.hook_resid_pre", stop_at_layer=1
    )
    raw = ov_linearity(
        original, 0, raw_cache["resid_pre", 0], per_vector=True, per_head=False
    ).summed
    v["ov_unfolded_r2"], v["ov_unfolded_slope"] = float(raw.r2.mean()), float(raw.slope.median())
    rand = ov_linearity(net, 0, n_random=n_random, seed=1, per_vector=True, per_head=False).summed
    v["ov_random_r2"], v["ov_random_slope"] = float(rand.r2.mean()), float(rand.slope.median())
    # the full OV circuit W_E (Σ_h W_V W_O) W_U, from input vectors to output vectors
    full = full_ov_circuit(net, 0).AB.sum(0)  # [d_in, d_out]
    a = batch.inputs.reshape(-1, batch.inputs.shape[-1])
    ff = fit_line(a, a @ full)
    v["full_ov_r2"], v["full_ov_slope"] = float(ff.r2.mean()), float(ff.slope.median())
    v["full_ov_identity_share"] = identity_share(full)
    v["full_ov_intercept"] = float(ff.intercept.mean())
    gen = torch.Generator().manual_seed(1)
    r = torch.randn(n_random, a.shape[-1], generator=gen, dtype=torch.float64).to(a)
    fr = fit_line(r, r @ full)
    v["full_ov_random_r2"], v["full_ov_random_slope"] = (
        float(fr.r2.mean()),
        float(fr.slope.median()),
    )
    full_raw = full_ov_circuit(original, 0).AB.sum(0)
    fu = fit_line(a, a @ full_raw)
    v["full_ov_unfolded_r2"], v["full_ov_unfolded_slope"] = (
        float(fu.r2.mean()),
        float(fu.slope.median()),
    )
    # claim 8: the share of x (Σ_h OV_h) outside W_E's row space
    writes = flat @ summed_ov
    v["outside"] = float(fraction_outside_embedding(writes, net).mean())
    v["outside_squared"] = float(fraction_outside_embedding(writes, net, squared=True).mean())
    per_head = torch.einsum("vd,hde->vhe", flat, ov_heads)
    v["outside_heads"] = float(fraction_outside_embedding(per_head, net).mean())
    attn_out = cache["attn_out", 0].reshape(-1, x.shape[-1])
    v["outside_attn_out"] = float(fraction_outside_embedding(attn_out, net).mean())
    emb_writes = cache["embed"].reshape(-1, x.shape[-1]) @ summed_ov
    v["outside_embed"] = float(fraction_outside_embedding(emb_writes, net).mean())
    rank = int(torch.linalg.matrix_rank(net.W_E.detach()))
    v["embed_rank"] = rank
    v["outside_chance"] = math.sqrt(max(0.0, 1 - rank / net.cfg.d_model))
    # the baseline: how much of the OV's input itself already lies outside the row space
    v["outside_inputs"] = float(fraction_outside_embedding(flat, net).mean())
    data["ov_example"] = (flat[-1], writes[-1])
    gen = torch.Generator().manual_seed(1)
    rv = torch.randn(net.cfg.d_model, generator=gen, dtype=torch.float64).to(flat)
    data["ov_random_example"] = (rv, rv @ summed_ov)
    data["full_ov_example"] = (a[-1], a[-1] @ full)


def _eigen(
    v: dict[str, Any],
    data: dict[str, Any],
    net: HookedVectorTransformer,
    original: HookedVectorTransformer,
) -> None:
    ov, qk = eigenvalue_scores(net, kind="ov"), eigenvalue_scores(net, kind="qk")
    v["ov_scores"], v["qk_scores"] = ov.tolist(), qk.tolist()
    v["full_ov_scores"] = eigenvalue_scores(net, kind="full_ov").tolist()
    v["full_qk_scores"] = eigenvalue_scores(net, kind="full_qk").tolist()
    v["ov_scores_unfolded"] = eigenvalue_scores(original, kind="ov").tolist()
    summed = full_ov_circuit(net, 0).AB.sum(0)
    eye = torch.eye(summed.shape[1], dtype=summed.dtype, device=summed.device)
    v["full_ov_l0_summed_score"] = float(eigenvalue_scores(FactoredMatrix(summed, eye)))
    data["eigen"] = (ov, qk)


def _ablation(
    v: dict[str, Any],
    data: dict[str, Any],
    net: HookedVectorTransformer,
    runs: list[_Run],
    populations: dict[int, torch.Tensor],
    sizes: dict[str, int],
) -> None:
    """Claim 9. ``populations[n]``: inputs of length ``n`` for every length ``runs`` has;
    each run is ablated with the means of its own length (the per-position statistics
    depend on the length: every sequence is normalised by its own largest norm)."""
    name = "blocks.1.attn.hook_z"
    means = {n: mean_activations(net, pop, name)[name] for n, pop in populations.items()}
    v["population"] = sum(p.shape[0] for p in populations.values())
    v["population_per_length"] = min(p.shape[0] for p in populations.values())
    longest = means[max(means)]

    def joint(run: _Run, rows: slice, kinds: Sequence[str]) -> list[float]:
        """Every head of layer 1 replaced, in one pass with the rows tiled once per kind:
        ``"matched"`` the means of the run's length, ``"longest"`` the longest length's
        means (the former measurement), ``"zero"`` zeros."""
        n, resid = run.batch.length, run.resid[1][rows]
        z = means[n]
        by_kind = {"matched": z, "longest": longest[:n], "zero": torch.zeros_like(z)}
        b = resid.shape[0]
        repl = torch.stack([by_kind[k] for k in kinds]).repeat_interleave(b, 0)
        with net.hooks(fwd_hooks=[(name, lambda act, hook: repl.to(act.dtype))]):
            out = net(resid.repeat(len(kinds), 1, 1), start_at_layer=1)
        t, mask = run.batch.targets[rows], run.batch.loss_mask[rows]
        return [float(masked_mse(o, t, mask)) for o in out.split(b)]

    joint_runs = [joint(r, slice(None), ["matched"])[0] for r in runs]
    v["ablate_joint"] = _mean(joint_runs)
    per: dict[int, list[float]] = {}
    for r, mse in zip(runs, joint_runs, strict=True):
        per.setdefault(r.batch.length, []).append(mse)
    v["ablate_joint_lengths"] = sorted(per)
    v["ablate_joint_by_length"] = [  # ablated / unablated MSE, each over that length's batches
        _mean(per[n]) / m for n, m in zip(sorted(per), v["mse_by_length"], strict=True)
    ]
    rows = slice(0, sizes["sweep_batch_size"])
    sweep = runs[: sizes["sweep_batches"]]
    v["sweep_base"] = _mean([_mse(r.out[rows], _rows(r.batch, rows)) for r in sweep])
    # the alternatives of the joint reading, on the sweep set (against sweep_base)
    alternatives = [joint(r, rows, ["longest", "zero"]) for r in sweep]
    v["ablate_joint_longest"], v["ablate_joint_zero"] = (
        _mean(list(col)) for col in zip(*alternatives, strict=True)
    )
    per_batch = [  # one batched pass per batch: its rows tiled once per head
        head_ablation_sweep(
            net,
            r.batch.inputs[rows],
            r.batch.targets[rows],
            kind="mean",
            population={name: means[r.batch.length]},
            loss_mask=r.batch.loss_mask[rows],
            heads={1: range(net.cfg.n_heads)},
            progress=False,
        )[1].tolist()
        for r in sweep
    ]
    v["ablate_heads"] = [_mean(list(col)) for col in zip(*per_batch, strict=True)]
    data["ablation"] = (v["ablate_heads"], v["sweep_base"])


def _rows(batch: ar.AffineBatch, rows: slice) -> ar.AffineBatch:
    return ar.AffineBatch(
        batch.inputs[rows],
        batch.targets[rows],
        batch.loss_mask[rows],
        batch.c[rows],
        batch.d[rows],
        batch.scale[rows],
    )


def _qk_patch(
    v: dict[str, Any],
    net: HookedVectorTransformer,
    runs: list[_Run],
    sizes: dict[str, int],
    seed: int,
) -> None:
    n_heads = net.cfg.n_heads
    heads = [h for h in PAPER_QK_HEADS if h < n_heads]
    qk = eigenvalue_scores(net, kind="qk")[2]
    top = sorted(qk.topk(len(heads)).indices.tolist())

    def mse_from_layer_2(
        model: HookedVectorTransformer,
        pool: list[_Run],
        rows: slice,
        hooks: list[Any] | None = None,
    ) -> float:
        losses = []
        for r in pool:
            with model.hooks(fwd_hooks=hooks or []):
                out = model(r.resid[2][rows], start_at_layer=2)
            losses.append(float(masked_mse(out, r.batch.targets[rows], r.batch.loss_mask[rows])))
        return _mean(losses)

    v["qk_heads"], v["qk_top_heads"] = heads, top
    v["qk_patch"] = mse_from_layer_2(patch_qk_identity(net, 2, heads, seed=seed), runs, slice(None))
    # primary (index-free): the model's own most identity-like heads, beside uniform
    # attention in the same heads (what the patch would cost if the patterns were lost)
    v["qk_own_patch"] = mse_from_layer_2(
        patch_qk_identity(net, 2, top, seed=seed), runs, slice(None)
    )
    own_uniform = ("blocks.2.attn.hook_pattern", pattern_ablation_hook("uniform", top))
    v["qk_own_uniform"] = mse_from_layer_2(net, runs, slice(None), [own_uniform])
    rows = slice(0, sizes["sweep_batch_size"])
    sweep = runs[: sizes["sweep_batches"]]
    frob = net.QK[2].AB.detach().flatten(1).norm(dim=1) / math.sqrt(net.cfg.d_head)
    matched = net
    for h in heads:  # one call per head: each keeps its own Q (same seed), its own scale
        matched = patch_qk_identity(matched, 2, [h], seed=seed, scale=float(frob[h]))
    variants = {
        "seed+1": patch_qk_identity(net, 2, heads, seed=seed + 1),
        "all": patch_qk_identity(net, 2, "all", seed=seed),
        "matched": matched,
    }
    v["qk_alt"] = {k: mse_from_layer_2(m, sweep, rows) for k, m in variants.items()}
    hook = ("blocks.2.attn.hook_pattern", pattern_ablation_hook("uniform", heads))
    v["qk_alt"]["uniform"] = mse_from_layer_2(net, sweep, rows, [hook])
