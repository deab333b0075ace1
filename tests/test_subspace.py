"""patch_subspace and subspace_patch_hook: a hand-worked case, the whole space is activation
patching, the zero subspace the base run, per-cell bases equal single-cell runs."""

import math

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_cfg()
    model = random_model(cfg, seed=1)
    source, base = random_input(cfg, batch=4, seed=2), random_input(cfg, batch=4, seed=3)
    return model, source, base


def metric(y):
    return y[:, -1].sum() + 0.5 * y[:, 1].pow(2).sum()


def test_hook_hand_worked():
    base = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=torch.float64)
    source = torch.tensor([[[4.0, 6.0, 3.0]]], dtype=torch.float64)
    hook = vi.subspace_patch_hook(source, torch.tensor([2.0, 2.0, 0.0], dtype=torch.float64))
    # Q = (1, 1, 0) / sqrt 2; (s - a) Q = 7 / sqrt 2; a + 3.5 (1, 1, 0) = (4.5, 5.5, 3)
    out = hook(base, hook=None)
    torch.testing.assert_close(
        out,
        torch.tensor([[[4.5, 5.5, 3.0]]], dtype=torch.float64),
        rtol=0,
        atol=4 * torch.finfo(torch.float64).eps * 8,
    )
    # only the indexed position changes
    two = torch.cat([base, base], 1)
    out = vi.subspace_patch_hook(torch.cat([source, source], 1), torch.eye(3)[:, :1], (1,))(
        two.float(), hook=None
    )
    assert torch.equal(out[0, 0], two[0, 0].float())
    assert torch.equal(out[0, 1], torch.tensor([4.0, 2.0, 3.0]))


def test_orthonormal_basis_spans_the_columns():
    b = torch.randn(6, 3, dtype=torch.float64)
    b = torch.cat([b, b[:, :1] + b[:, 1:2]], 1)  # rank 3 in 4 columns
    q = vi.orthonormal_basis(b)
    assert q.shape == (6, 4)
    assert int((q.norm(dim=0) > 0.5).sum()) == 3
    torch.testing.assert_close(
        q.T @ q, torch.diag((q.norm(dim=0) > 0.5).double()), rtol=0, atol=1e-14
    )
    torch.testing.assert_close(q @ (q.T @ b), b, rtol=0, atol=1e-13)
    assert torch.equal(vi.orthonormal_basis(torch.zeros(6, 2)), torch.zeros(6, 2))


@pytest.mark.parametrize(
    "hook_name",
    [
        "resid_pre",
        "resid_post",
        "blocks.1.hook_resid_mid",
        "hook_embed",
        "mlp_out",
        "ln_final.hook_normalized",
    ],
)
@pytest.mark.parametrize("by", ["layer_pos", "layer"])
def test_whole_space_is_activation_patching_and_zero_is_the_base(setup, hook_name, by):
    model, source, base = setup
    expected = vi.activation_patching(model, source, base, metric, hook_name, by=by, progress=False)
    d = model.cfg.d_model
    whole = vi.patch_subspace(
        model,
        source,
        base,
        metric,
        hook_name,
        torch.eye(d, dtype=torch.float64),
        by=by,
        progress=False,
    )
    assert whole.shape == expected.shape
    torch.testing.assert_close(whole, expected, rtol=1e-12, atol=1e-12)
    zero = vi.patch_subspace(
        model,
        source,
        base,
        metric,
        hook_name,
        torch.zeros(d, 2, dtype=torch.float64),
        by=by,
        progress=False,
    )
    base_metric = metric(model(base))
    torch.testing.assert_close(zero, base_metric.expand(zero.shape), rtol=1e-12, atol=1e-12)


def test_complement_stays_the_base(setup):
    model, source, base = setup
    basis = torch.randn(8, 3, dtype=torch.float64)
    q = vi.orthonormal_basis(basis)
    name = "blocks.1.hook_resid_pre"
    _, cache_s = model.run_with_cache(source, names_filter=[name])
    _, cache_b = model.run_with_cache(base, names_filter=[name])
    seen = {}

    def record(act, hook):
        seen["act"] = act.clone()

    hook = vi.subspace_patch_hook(cache_s[name], basis, (2,))
    with model.hooks(fwd_hooks=[(name, hook), (name, record)]):
        model(base)
    patched, s, b = seen["act"][:, 2], cache_s[name][:, 2], cache_b[name][:, 2]
    proj = q @ q.T
    torch.testing.assert_close(patched @ proj, s @ proj, rtol=0, atol=1e-12)
    torch.testing.assert_close(patched - patched @ proj, b - b @ proj, rtol=0, atol=1e-12)


def test_per_cell_bases_equal_single_cells(setup):
    model, source, base = setup
    n_pos = source.shape[1]
    bases = torch.randn(
        2, n_pos, 8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    sweep = vi.patch_subspace(model, source, base, metric, "resid_mid", bases, progress=False)
    assert sweep.shape == (2, n_pos)
    for layer in range(2):
        for p in (0, n_pos - 1):
            name = f"blocks.{layer}.hook_resid_mid"
            _, cache = model.run_with_cache(source, names_filter=[name])
            hook = vi.subspace_patch_hook(cache[name], bases[layer, p], (p,))
            one = metric(model.run_with_hooks(base, fwd_hooks=[(name, hook)]))
            torch.testing.assert_close(sweep[layer, p], one, rtol=1e-12, atol=1e-12)
    # chunking does not change the numbers beyond rounding
    chunked = vi.patch_subspace(
        model, source, base, metric, "resid_mid", bases, chunk_size=2, progress=False
    )
    torch.testing.assert_close(chunked, sweep, rtol=1e-12, atol=1e-12)


def test_probe_direction_moves_the_planted_variable():
    from planted_variable import planted_model

    model, direction = planted_model()
    gen = torch.Generator().manual_seed(5)
    base, source = (torch.randn(50, 6, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    # the output at position 3 is v = x[0, 0]; patch V's direction at position 3 only
    moved = vi.patch_subspace(
        model,
        source,
        base,
        lambda y: y[:, 3, 0].sum(),
        "blocks.0.hook_resid_post",
        direction,
        progress=False,
    )
    torch.testing.assert_close(moved[3], source[:, 0, 0].sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(moved[2], base[:, 0, 0].sum(), rtol=1e-12, atol=1e-12)
    assert math.isfinite(float(moved.sum()))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(subspace=torch.randn(5, 2)), ValueError, "d = 5"),
        (dict(subspace=torch.randn(3, 8, 2)), ValueError, "cells"),
        (dict(subspace=torch.full((8,), torch.nan)), ValueError, "finite"),
        (dict(hook_name="z"), ValueError, "not laid out"),
        (dict(by="head"), ValueError, "by must be"),
    ],
)
def test_bad_arguments(setup, kwargs, error, match):
    model, source, base = setup
    args = dict(hook_name="resid_pre", subspace=torch.randn(8, dtype=torch.float64))
    args.update(kwargs)
    with pytest.raises(error, match=match):
        vi.patch_subspace(
            model,
            source,
            base,
            metric,
            args.pop("hook_name"),
            args.pop("subspace"),
            progress=False,
            **args,
        )
