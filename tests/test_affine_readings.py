"""The per-sequence and output-space readings of the affine claims (claims 3, 4, 6, 7, 9, 11
and 13): hand-made cases whose answer is known, and each reading recomputed independently
(loops, numpy, hand-written hooks) on a small model against what ``measure_claims`` stores.
"""

import math

import numpy as np
import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from vecinterp.tasks import affine_claims as ac
from vecinterp.tasks import affine_recurrence as ar

SIZES = dict(
    analysis_batch=48,
    population=24,
    eval_batches=12,
    eval_batch_size=4,
    sweep_batches=6,
    sweep_batch_size=2,
    n_random=16,
)


def tiny(seed: int = 0) -> vi.HookedVectorTransformer:
    cfg = vi.VectorTransformerConfig(
        d_in=4, d_model=16, d_head=4, n_heads=5, n_layers=3, d_mlp=16, n_ctx=16
    )
    return vi.HookedVectorTransformer(cfg, seed=seed, dtype=torch.float64)


@pytest.fixture(scope="module")
def measured():
    model = tiny()
    return model, ac.measure_claims(model, **SIZES)


@pytest.fixture(scope="module")
def analysis_pass():
    net = vi.process_weights(tiny())
    batch = ar.generate(SIZES["analysis_batch"], length=14, seed=20_000, dim=4, dtype=torch.float64)
    _, cache = net.run_with_cache(batch.inputs)
    return net, batch, cache


# ------------------------------------------------------------------------- hand-made


def _on(n_heads: int, n: int, targets: list[int]) -> torch.Tensor:
    """One sequence's patterns: head h puts all attention of rows d > targets[h] on it (and
    the earlier rows on position 0)."""
    a = torch.zeros(1, n_heads, n, n)
    a[..., 0] = 1.0
    for h, k in enumerate(targets):
        a[0, h, k + 1 :] = 0.0
        a[0, h, k + 1 :, k] = 1.0
    return a


def test_early_focus_needs_a_majority_on_the_same_position():
    n = 6
    three_on_1 = _on(5, n, [1, 1, 1, 2, 2])  # 3 of 5 on a_1: a majority
    split = _on(5, n, [1, 1, 2, 2, 0])  # 2 on a_1, 2 on a_2: no position has 3
    three_on_2 = _on(5, n, [2, 0, 2, 2, 1])
    shows, which = ac.early_focus_per_sequence(torch.cat([three_on_1, split, three_on_2]))
    assert shows.tolist() == [True, False, True] and which.tolist() == [1, -1, 2]
    # min_heads counts heads; positions restricts the candidates
    shows, _ = ac.early_focus_per_sequence(split, min_heads=2)
    assert shows.tolist() == [True]
    shows, which = ac.early_focus_per_sequence(three_on_2, (1,))
    assert shows.tolist() == [False] and which.tolist() == [-1]


def test_early_focus_share_is_the_mean_over_the_rows_after_the_position():
    # rows 2..5 after a_1 carry 0.75, 0.5, 0.5, 0.25 on it: mean 0.5, which is not > 0.5
    a = torch.zeros(1, 1, 6, 6)
    a[0, 0, :, 0] = 1.0
    for d, w in zip(range(2, 6), [0.75, 0.5, 0.5, 0.25], strict=True):
        a[0, 0, d, 1], a[0, 0, d, 0] = w, 1 - w
    assert ac.early_focus_per_sequence(a, (1,), min_heads=1)[0].tolist() == [False]
    a[0, 0, 5, 1], a[0, 0, 5, 0] = 0.3, 0.7  # mean 0.5125
    assert ac.early_focus_per_sequence(a, (1,), min_heads=1)[0].tolist() == [True]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(positions=(5,)), "positions"),
        (dict(positions=()), "positions"),
        (dict(min_heads=0), "min_heads"),
        (dict(min_heads=6), "min_heads"),
    ],
)
def test_early_focus_refuses_bad_arguments(kwargs, match):
    with unchecked(), pytest.raises(ValueError, match=match):
        ac.early_focus_per_sequence(torch.zeros(1, 5, 6, 6), **kwargs)


def test_checkerboard_per_sequence_is_the_batch_contrast_of_each_sequence():
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(7, 3, 9, 9, generator=gen, dtype=torch.float64).tril()
    p = p / p.sum(-1, keepdim=True)
    per = ac.checkerboard_contrast(p, per_sequence=True)
    assert per.shape == (7, 3)
    for b in range(7):
        assert torch.equal(per[b], ac.checkerboard_contrast(p[b : b + 1]))


def test_identity_share_hand_values_and_invariances():
    assert ac.identity_share(3.0 * torch.eye(5)) == pytest.approx(1.0, abs=1e-15)
    assert ac.identity_share(torch.tensor([[0.0, 1.0], [1.0, 0.0]])) == 0.0
    # diag(1, 3): mean 2, 2² · 2 = 8 of 1 + 9 = 10
    assert ac.identity_share(torch.diag(torch.tensor([1.0, 3.0]))) == pytest.approx(0.8)
    gen = torch.Generator().manual_seed(1)
    m = torch.randn(6, 6, generator=gen, dtype=torch.float64) + torch.eye(6)
    share = ac.identity_share(m)
    assert ac.identity_share(-2.5 * m) == pytest.approx(share, rel=1e-12)
    assert ac.identity_share(m.T) == pytest.approx(share, rel=1e-12)
    assert math.isnan(ac.identity_share(torch.zeros(3, 3)))
    with unchecked(), pytest.raises(ValueError, match="square"):
        ac.identity_share(torch.zeros(2, 3))
    with unchecked(), pytest.raises(ValueError, match="NaN"):
        ac.identity_share(torch.full((2, 2), float("nan")))


@pytest.mark.parametrize("target", [0.2, 0.6, 0.9])
def test_identity_share_is_the_r2_of_random_vectors_through_the_matrix(target):
    """Claim 7's argument: for x ~ N(0, I) the mean per-vector R² of (x_d, (x M)_d) is
    about the identity share of M. M = a I + N with N traceless random and a chosen so the
    share is ``target``; 4,000 vectors of 128 dimensions: sampling error about 0.003, and
    the finite-d bias (the intercept and the variance of each vector's norm) about 0.01."""
    d = 128
    gen = torch.Generator().manual_seed(2)
    noise = torch.randn(d, d, generator=gen, dtype=torch.float64)
    noise -= noise.trace() / d * torch.eye(d, dtype=torch.float64)
    a = math.sqrt(target * float(noise.square().sum()) / ((1 - target) * d))
    m = a * torch.eye(d, dtype=torch.float64) + noise
    assert ac.identity_share(m) == pytest.approx(target, abs=1e-12)
    x = torch.randn(4000, d, generator=gen, dtype=torch.float64)
    r2 = float(vi.analysis.fit_line(x, x @ m).r2.mean())
    assert r2 == pytest.approx(target, abs=0.02)


def test_previous_vector_fit_recovers_a_planted_line_and_matches_numpy():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    est = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    est[0, 1:] = 2.3 * a[0, :-1] - 0.1  # sequence 0: exactly 2.3 a_{n-1} - 0.1
    fit = ac.previous_vector_fit(est, a)
    assert fit.slope.shape == (3, 4)
    assert torch.allclose(fit.slope[0], torch.full((4,), 2.3, dtype=torch.float64))
    assert torch.allclose(fit.intercept[0], torch.full((4,), -0.1, dtype=torch.float64))
    assert torch.allclose(fit.r2[0], torch.ones(4, dtype=torch.float64))
    for b in range(3):
        for n in range(1, 5):
            x, y = a[b, n - 1].numpy(), est[b, n].numpy()
            slope, intercept = np.polyfit(x, y, 1)
            r2 = np.corrcoef(x, y)[0, 1] ** 2
            assert fit.slope[b, n - 1].item() == pytest.approx(slope, rel=1e-9, abs=1e-12)
            assert fit.intercept[b, n - 1].item() == pytest.approx(intercept, abs=1e-12)
            assert fit.r2[b, n - 1].item() == pytest.approx(r2, rel=1e-9)
    with unchecked(), pytest.raises(ValueError, match="one shape"):
        ac.previous_vector_fit(est, a[:, :4])


def test_share_by_c_counts_open_bins():
    flags = torch.tensor([True, False, True, True, False])
    c = torch.tensor([-1.5, -1.0, -0.5, 1.5, 1.9])
    assert ac.share_by_c(flags, c, ac.C_BINS)[0] == 1.0  # c = -1 is in no open bin
    shares = ac.share_by_c(flags, c, [(-2, 0), (1, 2), (2, 3)])
    assert shares[:2] == [pytest.approx(2 / 3), 0.5] and math.isnan(shares[2])
    with unchecked(), pytest.raises(ValueError, match="one length"):
        ac.share_by_c(flags, c[:3], ac.C_BINS)


# ------------------------------------------------------ independent recomputation


def test_claim_3_and_4_per_sequence_readings_recomputed_by_loops(measured, analysis_pass):
    _, result = measured
    net, batch, cache = analysis_pass
    v = result.values
    l1, l2 = cache["pattern", 1], cache["pattern", 2]
    c = batch.c.tolist()
    shows, a1, a2 = [], [], []
    for b in range(len(c)):
        counts = {
            k: sum(float(l1[b, h, k + 1 :, k].mean()) > 0.5 for h in range(5)) for k in (1, 2)
        }
        shows.append(counts[1] >= 3 or counts[2] >= 3)
        a1.append(counts[1] >= 3)
        a2.append(counts[2] >= 3 and counts[1] < 3)
    strong = [i for i, ci in enumerate(c) if abs(ci) > 1]
    assert v["focus_seq"] == pytest.approx(sum(shows) / len(c))
    assert v["focus_seq_strong"] == pytest.approx(sum(shows[i] for i in strong) / len(strong))
    assert v["focus_seq_k"] == pytest.approx([sum(a1) / len(c), sum(a2) / len(c)])
    # claim 4: the contrast of each sequence by its own formula, rows d >= 2, s < d
    contrast = []
    for b in range(len(c)):
        per_head = []
        for h in range(5):
            num = den = 0.0
            for d in range(2, 14):
                same = [float(l2[b, h, d, s]) for s in range(d) if (d - s) % 2 == 0]
                other = [float(l2[b, h, d, s]) for s in range(d) if (d - s) % 2 == 1]
                m_same, m_other = sum(same) / len(same), sum(other) / len(other)
                num, den = num + m_same - m_other, den + m_same + m_other
            per_head.append(num / den)
        contrast.append(sum(per_head) / 5)
    for (lo, hi), share in zip([(-9, -1), (1, 9)], v["checker_seq_strong"], strict=True):
        kind = [contrast[i] > 0.2 for i, ci in enumerate(c) if lo < ci < hi]
        assert share == pytest.approx(sum(kind) / len(kind))


def test_output_space_fit_recomputed_with_a_hand_written_lens(measured, analysis_pass):
    _, result = measured
    net, batch, cache = analysis_pass
    for key, stream in (("mid", "resid_mid"), ("post", "resid_post")):
        x = cache[stream, 0]
        x = x - x.mean(-1, keepdim=True)
        x = x / (x.square().mean(-1, keepdim=True) + net.cfg.eps).sqrt()  # ln_final, folded
        y = (x @ net.W_U + net.b_U).detach().numpy()
        a = batch.inputs.numpy()
        slopes, r2s, intercepts = [], [], []
        for b in range(a.shape[0]):
            for n in range(1, 14):
                slope, intercept = np.polyfit(a[b, n - 1], y[b, n], 1)
                slopes.append(slope)
                intercepts.append(intercept)
                r2s.append(np.corrcoef(a[b, n - 1], y[b, n])[0, 1] ** 2)
        got = result.values[f"prev_fit_{key}"]
        assert got["r2"] == pytest.approx(np.mean(r2s), rel=1e-9)
        assert got["slope"] == pytest.approx(np.median(slopes), rel=1e-9)
        assert got["slope_q25"] == pytest.approx(np.quantile(slopes, 0.25), rel=1e-9)
        assert got["intercept"] == pytest.approx(np.mean(intercepts), rel=1e-9, abs=1e-12)


def test_identity_share_of_the_summed_ov_recomputed(measured, analysis_pass):
    _, result = measured
    net = analysis_pass[0]
    attn = net.blocks[0].attn
    m = sum(attn.W_V[h] @ attn.W_O[h] for h in range(5)).detach().numpy()
    expected = (np.trace(m) / 16) ** 2 * 16 / np.sum(m**2)
    assert result.values["ov_identity_share"] == pytest.approx(expected, rel=1e-9)
    claim = result[7]
    assert next(r for r in claim.alternatives if r.name == "identity_share").key


def test_joint_ablation_by_length_recomputed_with_the_library(measured):
    _, result = measured
    v = result.values
    model = vi.process_weights(tiny())
    kw = dict(dim=4, dtype=torch.float64)
    eval_set = ar.fixed_eval_set(12, 4, seed=10_000, **kw)
    per = SIZES["population"] // 12
    name = "blocks.1.attn.hook_z"
    by_length = []
    for n in range(3, 15):
        batches = [b for b in eval_set if b.length == n]
        pop = ar.generate(per, length=n, seed=30_000 + n, **kw).inputs
        means = vi.mean_activations(model, pop, name)
        ablated = [
            vi.masked_mse(
                vi.ablate_heads(
                    model, b.inputs, heads={1: range(5)}, kind="mean", population=means
                ),
                b.targets,
                b.loss_mask,
            )
            for b in batches
        ]
        by_length.append(float(sum(ablated)) / len(ablated) / vi.evaluate(model, batches))
    assert v["ablate_joint_lengths"] == list(range(3, 15))
    assert v["ablate_joint_by_length"] == pytest.approx(by_length, rel=1e-9)


def test_own_heads_patch_and_uniform_reference_recomputed(measured):
    _, result = measured
    v = result.values
    model = vi.process_weights(tiny())
    eval_set = ar.fixed_eval_set(12, 4, seed=10_000, dim=4, dtype=torch.float64)
    qk = vi.eigenvalue_scores(model, kind="qk")[2]
    top = sorted(qk.topk(5).indices.tolist())
    assert v["qk_top_heads"] == top
    patched = vi.patch_qk_identity(model, 2, top, seed=0)
    assert v["qk_own_patch"] == pytest.approx(vi.evaluate(patched, eval_set), rel=1e-10)

    def uniform(pattern, hook):  # causal uniform rows in the chosen heads, by hand
        n = pattern.shape[-1]
        rows = torch.ones(n, n, dtype=pattern.dtype).tril()
        out = pattern.clone()
        out[:, top] = rows / rows.sum(-1, keepdim=True)
        return out

    with model.hooks(fwd_hooks=[("blocks.2.attn.hook_pattern", uniform)]):
        reference = vi.evaluate(model, eval_set)
    assert v["qk_own_uniform"] == pytest.approx(reference, rel=1e-10)


# ------------------------------------------------------------------ the decision rule


def _meets(**changes):
    values = dict(
        checker_seq_strong=[0.5, 0.1],
        qk_scores=[[0.0] * 8, [0.0] * 8, [0.6] * 5 + [0.4] * 3],
        mse=2.0,
        qk_own_patch=3.0,  # x1.5
        qk_own_uniform=4.0,  # x2
    )
    return ac.meets_rule(dict(values, **changes))


def test_decision_rule_parts_at_their_thresholds():
    assert _meets() == dict(checkerboards=True, identity_qk=True, patch=True, all=True)
    off = [
        (dict(checker_seq_strong=[0.49, 0.0]), "checkerboards"),
        (dict(checker_seq_strong=[0.9, 0.11]), "checkerboards"),
        (dict(qk_scores=[[], [], [0.6] * 4 + [0.5] * 4]), "identity_qk"),  # 0.5 is not > 0.5
        (dict(qk_own_patch=3.01), "patch"),
        (dict(qk_own_uniform=3.99), "patch"),  # uniform x1.995: the heads matter too little
    ]
    for changes, part in off:
        got = _meets(**changes)
        assert not got[part] and not got["all"], changes
        assert all(got[k] for k in ("checkerboards", "identity_qk", "patch") if k != part)


def test_setup_decision_per_seed(measured):
    good = dict(
        checker_seq_strong=[0.5, 0.1],
        qk_scores=[[], [], [0.9] * 8],
        mse=1.0,
        qk_own_patch=1.0,
        qk_own_uniform=2.0,
    )
    bad = dict(good, checker_seq_strong=[0.0, 0.0])
    assert ac.setup_decision([good, good]) == ac.EXPLAINED
    assert ac.setup_decision([good, bad]) == ac.SEED_DEPENDENT
    assert ac.setup_decision([bad, bad]) == ac.NOT_REPRODUCED
    # a measured model: its values carry every key the rule reads
    _, result = measured
    assert set(ac.meets_rule(result.values)) == {"checkerboards", "identity_qk", "patch", "all"}
    with unchecked(), pytest.raises(ValueError, match="values"):
        ac.meets_rule({"mse": 1.0})
    with unchecked(), pytest.raises(ValueError, match="at least one"):
        ac.setup_decision([])


def test_report_shows_the_decision_rule_per_model(measured):
    _, result = measured
    good = dict(
        result.values,
        checker_seq_strong=[0.6, 0.0],
        qk_scores=[[0.0] * 5, [0.0] * 5, [0.9] * 5],
        mse=1.0,
        qk_own_patch=1.0,
        qk_own_uniform=3.0,
    )
    met = ac.ClaimsResult(ac.judge_claims(good), good, {}, {})
    text = ac.claims_report([result, met], ["tiny", "planted"])
    assert "## The decision rule for claims 4, 10b and 11" in text
    assert "| planted | yes | yes | yes | yes |" in text
    assert "| tiny | " in text
