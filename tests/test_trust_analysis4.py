"""What the probes, subspace patching, alignment search and activation patching trust,
attacked (issue 33, items 9, 11, 14 and 15): a ``[batch, pos]`` target, the random
control equal to a default-seed model, a NaN clean cache, a gated MLP's
``hook_pre_linear``, seeds at the top of the range, and the raw errors of
``orthonormal_basis``, ``subspace_patch_hook`` and ``error_curves``."""

import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from vecinterp.analysis._points import random_twin
from vecinterp.analysis.patching import activation_patching
from vecinterp.analysis.subspace import orthonormal_basis, subspace_patch_hook
from vecinterp.tasks import linear_regression as lr


def small(**kw) -> vi.HookedVectorTransformer:
    cfg = dict(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6)
    return vi.HookedVectorTransformer(vi.VectorTransformerConfig(**{**cfg, **kw}), seed=0)


def fast(**kw):
    return dict(n_bootstrap=5, progress=False, **kw)


# ---------------------------------------------------------------- item 9: [batch, pos]


def test_a_batch_by_pos_target_is_refused_naming_both_spellings():
    """A scalar per position in its natural shape [batch, pos] used to be read as pos values
    per sequence and probed everywhere (R² about 0.1 where [batch, pos, 1] gives 1.0)."""
    model = small()
    x = torch.randn(60, 5, 3)
    with pytest.raises(ValueError) as err:
        vi.fit_probes(model, x, {"x0": x[..., 0]}, "blocks.0.hook_resid_pre", **fast())
    message = str(err.value)
    assert "targets['x0'] is [batch=60, 5] and x has 5 positions" in message
    assert "targets['x0'][..., None] ([batch, pos, 1])" in message
    assert "targets['x0'][:, None, :].expand(-1, 5, -1) ([batch, pos, 5])" in message


def test_the_two_spellings_the_refusal_names_probe_what_they_say():
    """[batch, pos, 1]: each position's own value, decodable at its own position (R² 1 at
    layer 0's resid_pre, which is the embedding of x); the expanded form equals the
    [batch, k] form (k != pos) it stands for, cell for cell."""
    model = small()
    x = torch.randn(60, 5, 3, dtype=torch.float32)
    t = x[..., 0]
    per_position = vi.fit_probes(model, x, t[..., None], "blocks.0.hook_resid_pre", **fast())
    assert bool((per_position["target"].r2 > 0.999).all())
    wide = torch.randn(60, 4)
    expanded = wide[:, None, :].expand(-1, 5, -1)
    a = vi.fit_probes(model, x, wide, "blocks.0.hook_resid_pre", **fast())["target"]
    b = vi.fit_probes(model, x, expanded, "blocks.0.hook_resid_pre", **fast())["target"]
    torch.testing.assert_close(a.r2, b.r2, rtol=0, atol=1e-12)


def test_one_position_is_not_ambiguous():
    model = small()
    x = torch.randn(60, 1, 3)
    out = vi.fit_probes(model, x, x[..., 0], "blocks.0.hook_resid_pre", **fast())
    assert out["target"].r2.shape == (1, 1)


# ---------------------------------------------------------------- item 14: the control


def test_the_random_control_is_not_the_default_seed_model_on_the_docs_snippet():
    """docs/howto_probes.rst's snippet: the model is built with seed=0 and the control was
    HookedVectorTransformer(cfg, seed=control_seed=0), the same weights: selectivity was
    exactly 0 in every cell."""
    torch.manual_seed(0)
    cfg = vi.VectorTransformerConfig(d_in=4, d_model=32, d_head=8, n_heads=4, n_layers=2,
                                     n_ctx=16)  # fmt: skip
    model = vi.HookedVectorTransformer(cfg, seed=0)
    x = torch.randn(512, 10, 4)
    prev = torch.full_like(x, float("nan"))
    prev[:, 1:] = x[:, :-1]
    probes = vi.fit_probes(model, x, {"prev": prev}, ["resid_pre", "resid_post"],
                           n_bootstrap=5, progress=False)  # fmt: skip
    p = probes["prev"]
    defined = p.selectivity[:, 1:]
    assert bool((defined != 0).all()), "a cell's control equals the model's R²"
    assert p.control_seed == 0
    twin, seed = random_twin(model, 0)
    assert seed == 0
    assert not torch.equal(twin.W_E, model.W_E)
    for s in (0, 1, 2**64 - 1, -1):
        assert not torch.equal(twin.W_E, vi.HookedVectorTransformer(cfg, seed=s).W_E)


def test_a_model_equal_to_the_control_gets_the_next_control_seed():
    """Redraw if the model is the control itself (made to match): the result says which
    control seed was used."""
    model = small()
    twin, _ = random_twin(model, 5)
    x = torch.randn(60, 5, 3)
    out = vi.fit_probes(twin, x, x[:, 0], "blocks.0.hook_resid_pre", control_seed=5, **fast())
    assert out["target"].control_seed == 6
    assert bool((out["target"].control_r2 != out["target"].r2).any())
    again, seed = random_twin(twin, 5)
    assert seed == 6 and not torch.equal(again.W_E, twin.W_E)


def test_the_control_leaves_the_global_rng_alone_and_is_reproducible():
    model = small()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, _ = random_twin(model, 7)
    assert torch.equal(torch.rand(3), expected)
    b, _ = random_twin(model, 7)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_alignment_search_reports_the_control_seed():
    model = small(n_layers=1)
    base, source = torch.randn(30, 4, 3), torch.randn(30, 4, 3)
    with torch.no_grad():
        cf = model(source)
    found = vi.alignment_search(model, base, source, cf, "blocks.0.hook_resid_post", k=2,
                                steps=3, progress=False)  # fmt: skip
    assert found.control_seed == 0
    off = vi.alignment_search(model, base, source, cf, "blocks.0.hook_resid_post", k=2,
                              steps=3, control=False, progress=False)  # fmt: skip
    assert off.control_seed is None


# ---------------------------------------------------------------- item 15: NaN clean cache


def test_activation_patching_refuses_a_nan_clean_cache():
    """It used to return NaN cells, where attribution_patching refuses the same cache."""
    model = small()
    clean, corrupted = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    _, cache = model.run_with_cache(clean)
    name = "blocks.1.hook_resid_pre"
    bad = {key: cache[key] for key in ("hook_embed", name)}
    bad[name] = bad[name].clone()
    bad[name][0, 2, 1] = torch.nan
    metric = lambda y: y.sum()  # noqa: E731
    with pytest.raises(ValueError, match=rf"clean_cache holds NaN or inf in 1 entries of "
                                         rf"'{name}'"):  # fmt: skip
        activation_patching(model, clean, corrupted, metric, name, clean_cache=bad,
                            progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="clean_cache holds NaN or inf"):
        vi.attribution_patching(model, clean, corrupted, metric, name, clean_cache=bad)
    good = activation_patching(model, clean, corrupted, metric, name, clean_cache=cache,
                               progress=False)  # fmt: skip
    assert bool(good.isfinite().all())


# ---------------------------------------------------------------- item 11: messages


def test_patch_subspace_names_its_own_arguments():
    model = small()
    with pytest.raises(
        ValueError,
        match=r"source_x and base_x must have the same shape.*"
        r"source_x is \(2, 5, 3\), base_x is \(2, 4, 3\)",
    ):
        vi.patch_subspace(model, torch.randn(2, 5, 3), torch.randn(2, 4, 3), lambda y: y.sum(),
                          "resid_pre", torch.randn(8), progress=False)  # fmt: skip


def test_a_gated_mlps_pre_linear_is_probed_patched_and_searched():
    """hook_pre_linear ([batch, pos, d_mlp]) used to be refused as "not laid out [batch,
    pos, features]". Probing it recovers its own first unit exactly; patching its whole
    space equals activation patching."""
    model = small(gated_mlp=True, d_mlp=12)
    name = "blocks.0.mlp.hook_pre_linear"
    x = torch.randn(60, 5, 3)
    _, cache = model.run_with_cache(x)
    unit = cache[name][..., :1].detach()
    out = vi.fit_probes(model, x, unit, name, controls=(), **fast())["target"]
    assert bool((out.r2 > 0.999).all())
    source, base = torch.randn(3, 5, 3), torch.randn(3, 5, 3)
    metric = lambda y: y[:, -1].sum()  # noqa: E731
    whole = vi.patch_subspace(model, source, base, metric, name, torch.eye(12), progress=False)
    plain = activation_patching(model, source, base, metric, name, progress=False)
    torch.testing.assert_close(whole, plain, rtol=1e-4, atol=1e-5)  # float32 rounding
    with torch.no_grad():
        cf = model(source)
    found = vi.alignment_search(model, base, source, cf, name, k=2, steps=2, control=False,
                                progress=False)  # fmt: skip
    assert found.basis.shape == (12, 2)


def test_the_largest_seed_is_accepted_and_runs():
    """seed=2**64-1 passed the check, then seed + 1 overflowed the generator."""
    model = small()
    x = torch.randn(60, 5, 3)
    top = vi.fit_probes(model, x, x[:, 0], "blocks.0.hook_resid_pre", seed=2**64 - 1, **fast())
    assert top["target"].r2.shape == (1, 5)
    assert bool(top["target"].shuffled_r2.isfinite().all())


def test_orthonormal_basis_of_a_0d_tensor_is_refused_clearly():
    with pytest.raises(ValueError, match=r"subspace must be \[\.\.\., d, k\].*got a 0-d tensor"):
        orthonormal_basis(torch.tensor(1.0))


def test_an_out_of_range_index_of_subspace_patch_hook_is_refused_when_made():
    source = torch.ones(2, 4, 3)
    with pytest.raises(ValueError, match=r"entry 7 indexes axis 1 of the source activation "
                                         r"\(2, 4, 3\), which has 4 entries"):  # fmt: skip
        subspace_patch_hook(source, torch.tensor([1.0, 0.0, 0.0]), (7,))
    with pytest.raises(ValueError, match=r"has 2 entries, but the source activation"):
        subspace_patch_hook(source, torch.tensor([1.0, 0.0, 0.0]), (1, 0))
    hook = subspace_patch_hook(source, torch.tensor([1.0, 0.0, 0.0]), (-1,))
    assert hook(torch.zeros(2, 4, 3), hook=None)[0, 3].tolist() == [1.0, 0.0, 0.0]


def test_error_curves_of_a_list_of_models_says_to_pass_one():
    batch = lr.generate(8, seed=0)
    with unchecked(), pytest.raises(TypeError, match=r"got list: pass one model"):
        lr.error_curves([small()], batch)


# ---------------------------------------------------------------- issue 34, item 4: kind


def test_leaving_out_kind_warns_which_default_each_ablation_uses():
    """ablate_heads zero-ablates by default and head_ablation_sweep mean-ablates: a call
    without kind now says which one it gets (a FutureWarning; kind will be required)."""
    model = small()
    x, t, pop = torch.randn(4, 5, 3), torch.randn(4, 5, 3), torch.randn(20, 5, 3)
    with pytest.warns(FutureWarning, match=r"ablate_heads was called without kind, so it uses "
                                           r"its default kind='zero' \(head_ablation_sweep's "
                                           r"default is 'mean'\)"):  # fmt: skip
        plain = vi.ablate_heads(model, x, (1, 0), population=pop)
    assert torch.equal(plain, vi.ablate_heads(model, x, (1, 0), kind="zero"))
    with pytest.warns(FutureWarning, match=r"head_ablation_sweep was called without kind, so "
                                           r"it uses its default kind='mean'"):  # fmt: skip
        swept = vi.head_ablation_sweep(model, x, t, population=pop, progress=False)
    assert torch.equal(swept, vi.head_ablation_sweep(model, x, t, "mean", population=pop,
                                                     progress=False))  # fmt: skip
