"""Norm statistics precision: float16 and bfloat16 models compute the mean and scale in
float32 (as torch's layer_norm and transformers' LlamaRMSNorm do), float32 and float64
models exactly as before."""

import copy

import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg
from vecinterp.model.components.norm import statistics_dtype

KINDS = ["LN", "LNPre", "RMS", "RMSPre"]


def _old_norm(norm, x):
    """The formula Norm.forward used before, in the input's own dtype throughout."""
    if norm.centre:
        x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
    x = x / scale
    if norm.w is None:
        return x, scale
    return (x * norm.w if norm.b is None else torch.addcmul(norm.b, x, norm.w)), scale


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64_norms_are_bit_identical_to_the_old_formula(kind, dtype):
    model = random_model(tiny_cfg(normalization=kind), dtype=dtype)
    norm = model.blocks[0].ln1
    x = 3 * torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0), dtype=dtype)
    scales = []
    handle = norm.hook_scale.add_hook(lambda s, hook: scales.append(s))
    try:
        out = norm(x)
    finally:
        handle.remove()
    old, old_scale = _old_norm(norm, x)
    assert out.dtype == scales[0].dtype == dtype
    assert torch.equal(out, old)  # the same kernels on the same data
    assert torch.equal(scales[0], old_scale)


def _big_residual_models(kind, dtype):
    """A float32 model whose residual stream reaches |x| ≈ 480 (embedding scaled up),
    and its copy in ``dtype``."""
    reference = random_model(tiny_cfg(normalization=kind), dtype=torch.float32)
    with torch.no_grad():
        reference.embed.W_E.mul_(300.0)
    low = copy.deepcopy(reference).to(dtype)
    return reference, low


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_precision_model_with_a_large_residual_matches_float32(kind, dtype, rtol):
    reference, low = _big_residual_models(kind, dtype)
    x = torch.randn(3, 7, 3, generator=torch.Generator().manual_seed(1))
    _, cache = reference.run_with_cache(x, names_filter="blocks.0.hook_resid_pre")
    # the case of the audit: x² overflows float16 (65504) for |x| > 256
    assert cache["blocks.0.hook_resid_pre"].abs().max() > 400
    want = reference(x)
    got, low_cache = low.run_with_cache(x.to(dtype))
    assert got.dtype == dtype and bool(got.isfinite().all())
    # a few roundings of float16 (2^-11) / bfloat16 (2^-8) per layer (measured 9e-4 and
    # 8e-3), relative to the
    # output's size; before, the scale overflowed to inf and the stream became 0 (off by
    # the output's whole size)
    err = (got.double() - want.double()).abs().max() / want.abs().max()
    assert err < rtol, err
    # hook_scale holds the float32 scale, finite
    scale = low_cache["blocks.0.ln1.hook_scale"]
    assert scale.dtype == statistics_dtype(dtype) == torch.float32
    assert bool(scale.isfinite().all()) and scale.max() > 100
    assert low_cache["blocks.0.ln1.hook_normalized"].dtype == dtype


@pytest.mark.parametrize("kind", ["LN", "RMS"])
def test_half_precision_cache_linearised_norm_matches_the_norm(kind):
    _, low = _big_residual_models(kind, torch.float16)
    x = torch.randn(3, 7, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float16)
    _, cache = low.run_with_cache(x)
    resid = cache["resid_post", -1]
    read = cache.apply_ln_to_stack(resid[None])[0]
    assert read.dtype == torch.float16
    want = low.ln_final(resid)
    if low.ln_final.b is not None:
        read = read + low.ln_final.b
    # the same float32 statistics; the last multiply by w rounds to float16 (2^-11)
    torch.testing.assert_close(read, want, rtol=2e-3, atol=2e-3)
    lens = cache.accumulated_resid(apply_ln=True)[-1]  # ln_final recomputed per entry
    assert bool(lens.isfinite().all())
    torch.testing.assert_close(lens, want, rtol=2e-3, atol=2e-3)


def test_statistics_dtype():
    assert statistics_dtype(torch.float16) == torch.float32
    assert statistics_dtype(torch.bfloat16) == torch.float32
    assert statistics_dtype(torch.float32) == torch.float32
    assert statistics_dtype(torch.float64) == torch.float64


@pytest.mark.parametrize("kind", ["LN", "RMS"])
def test_the_library_s_other_norm_formulas_follow_norm_in_half_precision(kind):
    """The stacked ensemble forward and the geometry analyses compute the norm by its
    formula without its hooks; in float16 with a residual of ~480 they must agree with
    :class:`Norm` (float32 statistics) bit for bit, not overflow to 0."""
    from vecinterp.analysis.geometry import _norm as geometry_norm
    from vecinterp.model.components import Norm
    from vecinterp.training._stacked import _norm as stacked_norm

    cfg = vi.VectorTransformerConfig(d_in=3, d_model=16, d_head=4, n_heads=2, n_layers=1,
                                     n_ctx=4, normalization=kind)  # fmt: skip
    norm = Norm(cfg).to(torch.float16)
    with torch.no_grad():
        norm.w.uniform_(0.5, 1.5)
        if norm.b is not None:
            norm.b.uniform_(-0.1, 0.1)
    gen = torch.Generator().manual_seed(0)
    x = (480 * torch.randn(2, 4, 16, generator=gen)).to(torch.float16)
    with torch.no_grad():
        expected = norm(x)
        assert bool(torch.isfinite(expected).all()) and float(expected.abs().max()) > 0.5
        assert torch.equal(geometry_norm(norm, x, with_bias=True), expected)
        w, b = norm.w[None], (norm.b[None] if norm.b is not None else None)
        assert torch.equal(stacked_norm(cfg, x, w, b), expected)
