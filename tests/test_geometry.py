"""Residual-stream geometry: OV linearity fits, the share of a vector outside the embedding
space and the logit lens, on hand-built heads, against numpy, and on bad input."""

import math

import numpy as np
import pytest
import torch

from helpers import random_input, random_model, tiny_cfg
from vecinterp.analysis.geometry import (
    fit_line,
    fraction_outside_embedding,
    logit_lens,
    ov_linearity,
)

EXACT = 1e-12


def unwrapped(fn):
    """``fn`` without the test suite's runtime type checker, as users run it."""
    return getattr(fn, "__wrapped__", fn)


def copying_model(scales, d_model=4, normalization=None):
    """1 attention-only layer whose head h has ``OV = scales[h] · I`` (``d_head = d_model``)."""
    cfg = tiny_cfg(
        d_model=d_model,
        d_head=d_model,
        n_heads=len(scales),
        n_layers=1,
        attn_only=True,
        normalization=normalization,
    )
    model = random_model(cfg)
    eye = torch.eye(d_model, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[0].attn.W_V.copy_(eye.expand(len(scales), d_model, d_model))
        model.blocks[0].attn.W_O.copy_(torch.stack([c * eye for c in scales]))
    return model


# ---------------------------------------------------------------- fit_line


def test_fit_line_recovers_a_planted_affine_map_exactly():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, generator=gen, dtype=torch.float64)
    slope = torch.tensor([2.5, -0.5, 0.0], dtype=torch.float64)
    intercept = torch.tensor([0.0, 1.25, -3.0], dtype=torch.float64)
    fit = fit_line(x, slope[:, None] * x + intercept[:, None])
    assert torch.allclose(fit.slope, slope, rtol=0, atol=EXACT)
    assert torch.allclose(fit.intercept, intercept, rtol=0, atol=EXACT)
    # y constant (slope 0): R² is 0/0
    assert torch.allclose(fit.r2[:2], torch.ones(2, dtype=torch.float64), rtol=0, atol=EXACT)
    assert math.isnan(fit.r2[2])
    assert fit.n_points == 50


def test_fit_line_matches_numpy_on_noisy_points():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, generator=gen, dtype=torch.float64)
    y = 1.7 * x - 0.3 + 0.8 * torch.randn(200, generator=gen, dtype=torch.float64)
    fit = fit_line(x, y)
    np_slope, np_intercept = np.polyfit(x.numpy(), y.numpy(), 1)
    np_r2 = np.corrcoef(x.numpy(), y.numpy())[0, 1] ** 2
    assert abs(fit.slope.item() - np_slope) <= EXACT
    assert abs(fit.intercept.item() - np_intercept) <= EXACT
    assert abs(fit.r2.item() - np_r2) <= EXACT
    assert 0.5 < fit.r2.item() < 0.95  # genuinely noisy


def test_fit_line_bad_input():
    with pytest.raises(TypeError):  # the runtime type checker binds n from x
        fit_line(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"same number \(>= 2\) of points"):
        unwrapped(fit_line)(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"same number \(>= 2\) of points"):
        fit_line(torch.zeros(2, 1), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="x is constant"):
        fit_line(torch.ones(3), torch.arange(3.0))


# ---------------------------------------------------------------- ov_linearity


@pytest.mark.parametrize("given", [True, False], ids=["given-vectors", "random-vectors"])
def test_ov_multiple_of_identity_gives_exact_fit(given):
    model = copying_model([3.0, -0.5])
    gen = torch.Generator().manual_seed(2)
    vectors = torch.randn(5, 2, 4, generator=gen, dtype=torch.float64) + 1  # any leading axes
    fit = ov_linearity(model, 0, vectors if given else None)
    assert fit.layer == 0
    assert torch.allclose(fit.heads.slope, torch.tensor([3.0, -0.5], dtype=torch.float64))
    assert fit.heads.intercept.abs().max() <= EXACT
    assert (fit.heads.r2 - 1).abs().max() <= EXACT
    assert abs(fit.summed.slope.item() - 2.5) <= EXACT
    assert abs(fit.summed.intercept.item()) <= EXACT
    assert abs(fit.summed.r2.item() - 1) <= EXACT
    assert fit.summed.n_points == (10 if given else 100) * 4


def test_ov_linearity_matches_dense_ov_and_numpy():
    cfg = tiny_cfg(n_layers=2, n_heads=3)
    model = random_model(cfg)
    gen = torch.Generator().manual_seed(3)
    vectors = torch.randn(7, cfg.d_model, generator=gen, dtype=torch.float64)
    fit = ov_linearity(model, -1, vectors)
    assert fit.layer == 1
    ov = model.OV.AB[1].detach()  # [n_heads, d_model, d_model], dense
    xs = vectors.reshape(-1).numpy()
    for h in range(3):
        ys = (vectors @ ov[h]).reshape(-1).numpy()
        slope, intercept = np.polyfit(xs, ys, 1)
        assert abs(fit.heads.slope[h].item() - slope) <= EXACT
        assert abs(fit.heads.intercept[h].item() - intercept) <= EXACT
        assert abs(fit.heads.r2[h].item() - np.corrcoef(xs, ys)[0, 1] ** 2) <= EXACT
    ys = (vectors @ ov.sum(0)).reshape(-1).numpy()
    slope, intercept = np.polyfit(xs, ys, 1)
    assert abs(fit.summed.slope.item() - slope) <= EXACT
    assert abs(fit.summed.intercept.item() - intercept) <= EXACT


def test_per_vector_fits_equal_one_fit_per_vector():
    model = random_model(tiny_cfg(n_heads=3))
    gen = torch.Generator().manual_seed(4)
    vectors = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    fit = ov_linearity(model, 0, vectors, per_vector=True)
    assert fit.summed.slope.shape == (2, 3)
    assert fit.heads.slope.shape == (2, 3, 3)
    for i in range(2):
        for j in range(3):
            one = ov_linearity(model, 0, vectors[i, j])
            assert torch.allclose(fit.heads.r2[i, j], one.heads.r2, rtol=0, atol=EXACT)
            assert torch.allclose(fit.summed.slope[i, j], one.summed.slope, rtol=0, atol=EXACT)
            assert torch.allclose(fit.summed.intercept[i, j], one.summed.intercept, atol=EXACT)


def test_random_vectors_are_seeded_standard_normal():
    model = random_model(tiny_cfg())
    a = ov_linearity(model, 0, n_random=20, seed=7, per_head=False)
    assert a.heads is None
    gen = torch.Generator().manual_seed(7)
    explicit = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    b = ov_linearity(model, 0, explicit, per_head=False)
    assert torch.equal(a.summed.slope, b.summed.slope)
    assert torch.equal(a.summed.r2, b.summed.r2)
    c = ov_linearity(model, 0, n_random=20, seed=8, per_head=False)
    assert not torch.equal(a.summed.slope, c.summed.slope)


def test_apply_ln_normalises_with_ln1_without_its_bias():
    model = random_model(tiny_cfg(normalization="LN"))
    gen = torch.Generator().manual_seed(5)
    resid = torch.randn(6, 8, generator=gen, dtype=torch.float64) * 3 + 1
    fit = ov_linearity(model, 1, resid, apply_ln=True)
    ln1 = model.blocks[1].ln1
    with torch.no_grad():
        read = ln1(resid[None])[0] - ln1.b
    writes = read @ model.OV.AB[1].detach().sum(0)
    expected = fit_line(resid.reshape(-1), writes.reshape(-1))
    assert abs(fit.summed.slope - expected.slope) <= EXACT
    assert abs(fit.summed.r2 - expected.r2) <= EXACT
    # without a norm there is nothing to apply
    plain = random_model(tiny_cfg(normalization=None))
    with_ln = ov_linearity(plain, 0, resid, apply_ln=True)
    without = ov_linearity(plain, 0, resid)
    assert torch.equal(with_ln.heads.slope, without.heads.slope)


def test_ov_linearity_bad_input():
    model = random_model(tiny_cfg())
    with pytest.raises(ValueError, match=r"layer must be an int in \[-2, 1\]"):
        ov_linearity(model, 2)
    with pytest.raises(ValueError, match=r"vectors must be a non-empty tensor \[..., d_model=8\]"):
        ov_linearity(model, 0, torch.zeros(4, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="dtype torch.float32 but the model's weights"):
        ov_linearity(model, 0, torch.zeros(4, 8))
    with pytest.raises(ValueError, match="NaN or inf"):
        ov_linearity(model, 0, torch.full((4, 8), float("inf"), dtype=torch.float64))
    with pytest.raises(ValueError, match="n_random must be a positive int"):
        ov_linearity(model, 0, n_random=0)
    with pytest.raises(TypeError, match="vectors must be a tensor"):
        unwrapped(ov_linearity)(model, 0, [[0.0] * 8])


# ---------------------------------------------------------------- fraction outside W_E


@pytest.fixture(scope="module")
def embedded():
    """A random model (W_E of rank d_in = 3 in d_model = 8), one unit vector inside the
    row space of W_E and one unit vector orthogonal to it."""
    model = random_model(tiny_cfg())
    W_E = model.W_E.detach()
    gen = torch.Generator().manual_seed(6)
    inside = torch.randn(3, generator=gen, dtype=torch.float64) @ W_E
    raw = torch.randn(8, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(W_E.T)  # orthonormal basis of the row space
    outside = raw - q @ (q.T @ raw)
    return model, inside / inside.norm(), outside / outside.norm()


def test_fraction_outside_hand_values(embedded):
    model, inside, outside = embedded
    vectors = torch.stack([5 * inside, -2 * outside, inside + outside, 3 * inside + 4 * outside])
    frac = fraction_outside_embedding(vectors, model)
    expected = torch.tensor([0.0, 1.0, 1 / math.sqrt(2), 0.8], dtype=torch.float64)
    assert torch.allclose(frac, expected, rtol=0, atol=EXACT)
    squared = fraction_outside_embedding(vectors, model, squared=True)
    assert torch.allclose(squared, expected.square(), rtol=0, atol=EXACT)
    # any leading axes; a zero vector has no direction
    nested = fraction_outside_embedding(vectors.reshape(2, 2, 8), model)
    assert torch.equal(nested, frac.reshape(2, 2))
    assert fraction_outside_embedding(torch.zeros(8, dtype=torch.float64), model).item() == 0.0


def test_fraction_outside_respects_rank_tolerance():
    model = random_model(tiny_cfg())
    with torch.no_grad():  # rank 2: the third input row is a combination of the others
        model.embed.W_E[2] = model.embed.W_E[0] - 2 * model.embed.W_E[1]
        model.embed.W_E[2, 0] += 1e-9
    W_E = model.W_E.detach()
    q, _ = torch.linalg.qr(W_E[:2].T)
    third = W_E[2] - q @ (q.T @ W_E[2])  # the 1e-9 direction, normalised
    third = third / third.norm()
    assert fraction_outside_embedding(third, model).item() <= 1e-6  # rank 3 by default
    assert abs(fraction_outside_embedding(third, model, rtol=1e-6).item() - 1) <= 1e-6


def test_fraction_outside_bad_input(embedded):
    model, inside, _ = embedded
    with pytest.raises(ValueError, match=r"vectors must be a non-empty tensor \[..., d_model=8\]"):
        fraction_outside_embedding(torch.zeros(2, 3, dtype=torch.float64), model)
    with pytest.raises(ValueError, match=r"rtol must be a number in \[0, 1\)"):
        fraction_outside_embedding(inside, model, rtol=1.5)
    with pytest.raises(TypeError, match="expected a HookedVectorTransformer"):
        unwrapped(fraction_outside_embedding)(inside, model.state_dict())


# ---------------------------------------------------------------- logit lens

LENS_CFGS = {
    str(norm): tiny_cfg(normalization=norm, embed_bias=True, n_layers=3)
    for norm in ["LN", "LNPre", "RMS", "RMSPre", None]
}


@pytest.mark.parametrize("cfg", LENS_CFGS.values(), ids=LENS_CFGS.keys())
def test_logit_lens_last_layer_is_the_output_and_others_truncate(cfg):
    model = random_model(cfg)
    x = random_input(cfg, batch=2, n_pos=5)
    y, cache = model.run_with_cache(x)
    lens = logit_lens(model, cache)
    assert lens.shape == (4, 2, 5, cfg.d_out)
    assert torch.equal(lens[-1], y)
    assert torch.equal(logit_lens(model, cache, -1), y)
    for ell in range(3):
        assert torch.equal(logit_lens(model, cache, ell), lens[ell + 1])
        # the model with the blocks after ell removed
        with torch.no_grad():
            resid = model(x, stop_at_layer=ell + 1)
            truncated = model.unembed(model.ln_final(resid))
        assert (lens[ell + 1] - truncated).abs().max() <= EXACT
    with torch.no_grad():
        embedded = model(x, stop_at_layer=0)
        assert (lens[0] - model.unembed(model.ln_final(embedded))).abs().max() <= EXACT


@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_logit_lens_linearised_uses_the_cached_final_scale(norm):
    cfg = tiny_cfg(normalization=norm)
    model = random_model(cfg)
    y, cache = model.run_with_cache(random_input(cfg))
    lin = logit_lens(model, cache, linearised=True)
    assert (lin[-1] - y).abs().max() <= EXACT  # the cached scale is the final one
    ln, W_U, b_U = model.ln_final, model.W_U.detach(), model.unembed.b_U.detach()
    bias = ln.b.detach() if ln.b is not None else 0
    expected0 = (cache.apply_ln_to_stack(cache["resid_pre", 0]) + bias) @ W_U + b_U
    assert (lin[0] - expected0).abs().max() <= EXACT
    assert (lin[0] - logit_lens(model, cache)[0]).abs().max() > 1e-3  # a different scale


def test_logit_lens_bad_input():
    cfg = tiny_cfg()
    model = random_model(cfg)
    y, cache = model.run_with_cache(random_input(cfg))
    with pytest.raises(ValueError, match=r"layer must be an int in \[-2, 1\]"):
        logit_lens(model, cache, 2)
    with pytest.raises(ValueError, match="not produced by this model"):
        logit_lens(random_model(cfg, seed=1), cache)
    with pytest.raises(TypeError, match="cache must be an ActivationCache"):
        unwrapped(logit_lens)(model, dict(cache))
    _, partial = model.run_with_cache(random_input(cfg), names_filter="blocks.0.hook_resid_pre")
    with pytest.raises(KeyError, match="blocks.1.hook_resid_pre"):
        logit_lens(model, partial)
