"""Direct attribution: the sum identity on random models, a hand-worked model, coordinate
targets, next-vector targets, the result object and bad input."""

import pytest
import torch

from helpers import random_input, random_model, tiny_cfg
from vecinterp.analysis.attribution import (
    DirectAttribution,
    direct_attribution,
    next_vector_targets,
)

EXACT = 1e-10  # float64: the identity is linear algebra on the very tensors the model added

# d_in == d_out so next-vector targets apply; each config exercises a different readout
IDENTITY_CFGS = {
    f"{norm}-{pos}-{'attn_only' if attn_only else 'mlp'}": tiny_cfg(
        d_out=3,
        normalization=norm,
        positional=pos,
        attn_only=attn_only,
        embed_bias=True,
        n_layers=2,
    )
    for norm in ["LN", "LNPre", "RMS", "RMSPre", None]
    for pos, attn_only in [("learned", False), ("rotary", True)]
}


def rhs(y, model, t):
    """⟨y − b_U, t⟩ per batch item and position."""
    n_t = t.shape[1]
    return ((y[:, :n_t] - model.unembed.b_U.detach()) * t).sum(-1)


def unwrapped(fn):
    """``fn`` without the runtime type checker the test suite wraps it in, as users run it:
    its own checks must still give clear errors."""
    return getattr(fn, "__wrapped__", fn)


def run(cfg, seed=0, batch=3, n_pos=6, names_filter=None):
    model = random_model(cfg, seed=seed)
    x = random_input(cfg, batch=batch, n_pos=n_pos, seed=seed)
    y, cache = model.run_with_cache(x, names_filter=names_filter)
    return model, x, y, cache


# ---------------------------------------------------------------- the sum identity


@pytest.mark.parametrize("cfg", IDENTITY_CFGS.values(), ids=IDENTITY_CFGS.keys())
def test_attributions_sum_to_output_minus_b_U(cfg):
    model, x, y, cache = run(cfg)
    gen = torch.Generator().manual_seed(5)
    t = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    for components in ("all", "layers"):
        attr = direct_attribution(model, cache, t, components=components)
        assert (attr.total() - rhs(y, model, t)).abs().max() <= EXACT
        # the final norm's bias is a separate constant term exactly when it exists
        assert ("ln_final_b" in attr.labels) == (cfg.normalization == "LN")


@pytest.mark.parametrize("norm", ["LN", "RMS", None])
def test_identity_with_next_vector_targets_default_or_full_cache(norm):
    """The default cache and one of every hook give the same attributions (head outputs
    are hook_result as it flowed in both); targets one position short of the run."""
    cfg = tiny_cfg(d_out=3, normalization=norm)
    model, x, y, default = run(cfg)
    _, full = model.run_with_cache(x, names_filter=lambda name: True)
    assert "blocks.0.attn.hook_result" in default.cache_dict
    for minus_current in (False, True):
        t = next_vector_targets(model, x, minus_current=minus_current)
        attr = direct_attribution(model, default, t)
        assert attr.values.shape == (len(attr.labels), 3, 5)
        assert (attr.total() - rhs(y, model, t)).abs().max() <= EXACT
        again = direct_attribution(model, full, t)
        assert torch.equal(again.values, attr.values)


def test_identity_float32():
    cfg = tiny_cfg(d_out=3)
    model = random_model(cfg, dtype=torch.float32)
    x = random_input(cfg, dtype=torch.float32)
    y, cache = model.run_with_cache(x)
    t = next_vector_targets(model, x)
    attr = direct_attribution(model, cache, t)
    assert attr.values.dtype == torch.float32
    assert (attr.total() - rhs(y, model, t)).abs().max() <= 1e-4


# ---------------------------------------------------------------- labels, shapes, modes


def test_labels_and_shapes():
    cfg = tiny_cfg(d_out=3, n_layers=2, n_heads=2)
    model, x, y, cache = run(cfg, batch=2, n_pos=4)
    t = torch.ones_like(y)
    attr = direct_attribution(model, cache, t)
    assert attr.labels == (
        "embed",
        "pos_embed",
        "L0H0",
        "L0H1",
        "0_b_O",
        "0_mlp_out",
        "L1H0",
        "L1H1",
        "1_b_O",
        "1_mlp_out",
        "ln_final_b",
    )
    assert attr.values.shape == (11, 2, 4)
    layers = direct_attribution(model, cache, t, components="layers")
    assert layers.labels == (
        "embed",
        "pos_embed",
        "0_attn_out",
        "0_mlp_out",
        "1_attn_out",
        "1_mlp_out",
        "ln_final_b",
    )
    heads = direct_attribution(model, cache, t, components="heads")
    assert heads.labels == ("L0H0", "L0H1", "L1H0", "L1H1")
    for label in heads.labels:
        # a stack of 4 components, not 11: the read-out's matrix product has other row
        # counts, whose last bits may differ (float64 rounding of values of order 1)
        torch.testing.assert_close(heads[label], attr[label], rtol=0, atol=1e-13)


def test_no_pos_embed_label_without_additive_positions():
    cfg = tiny_cfg(d_out=3, positional="rotary", attn_only=True, n_layers=1)
    model, x, y, cache = run(cfg)
    attr = direct_attribution(model, cache, torch.ones_like(y))
    assert attr.labels == ("embed", "L0H0", "L0H1", "0_b_O", "ln_final_b")


def test_by_layer_equals_layers_components():
    cfg = tiny_cfg(d_out=3, n_layers=3, normalization="RMS")
    model, x, y, cache = run(cfg)
    t = next_vector_targets(model, x)
    merged = direct_attribution(model, cache, t).by_layer()
    layers = direct_attribution(model, cache, t, components="layers")
    assert merged.labels == layers.labels
    assert (merged.values - layers.values).abs().max() <= EXACT


def test_heads_mode_by_layer_sums_heads_only():
    cfg = tiny_cfg(d_out=3, n_heads=3)
    model, x, y, cache = run(cfg)
    heads = direct_attribution(model, cache, torch.ones_like(y), components="heads")
    merged = heads.by_layer()
    assert merged.labels == ("0_attn_out", "1_attn_out")
    assert torch.allclose(merged["1_attn_out"], heads.values[3:].sum(0), rtol=0, atol=1e-14)


# ---------------------------------------------------------------- hand-worked values


def hand_model():
    """1 layer, 2 heads, no norm, no positions: uniform causal attention (W_Q = W_K = 0),
    W_E = W_V = W_U = I, head 0 writes the mean of the inputs so far, head 1 twice it."""
    cfg = tiny_cfg(
        d_in=2,
        d_out=2,
        d_model=2,
        d_head=2,
        n_heads=2,
        n_layers=1,
        n_ctx=2,
        attn_only=True,
        normalization=None,
        positional="none",
    )
    model = random_model(cfg)
    eye = torch.eye(2, dtype=torch.float64)
    attn = model.blocks[0].attn
    with torch.no_grad():
        model.embed.W_E.copy_(eye)
        for p in (attn.W_Q, attn.W_K, attn.b_Q, attn.b_K, attn.b_V):
            p.zero_()
        attn.W_V.copy_(eye.expand(2, 2, 2))
        attn.W_O.copy_(torch.stack([eye, 2 * eye]))
        attn.b_O.copy_(torch.tensor([0.5, 0.0]))
        model.unembed.W_U.copy_(eye)
        model.unembed.b_U.copy_(torch.tensor([7.0, -3.0]))  # excluded from the identity
    return model


def test_hand_worked_attributions():
    model = hand_model()
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    t = torch.tensor([[[1.0, 1.0], [3.0, -1.0]]], dtype=torch.float64)
    y, cache = model.run_with_cache(x)
    attr = direct_attribution(model, cache, t)
    assert attr.labels == ("embed", "L0H0", "L0H1", "0_b_O")
    # embed: <x_p, t_p>; head 0 at p=1 writes (x_0 + x_1)/2 = (0.5, 1); b_O = (0.5, 0)
    expected = torch.tensor(
        [[[1.0, -2.0]], [[1.0, 0.5]], [[2.0, 1.0]], [[0.5, 1.5]]], dtype=torch.float64
    )
    assert torch.allclose(attr.values, expected, rtol=0, atol=1e-14)
    assert torch.allclose(attr.total(), torch.tensor([[4.5, 1.0]], dtype=torch.float64))
    assert torch.allclose(rhs(y, model, t), torch.tensor([[4.5, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("norm", ["LN", "RMSPre"])
def test_unit_target_picks_output_coordinate(norm):
    cfg = tiny_cfg(normalization=norm)  # d_out = 5 != d_in
    model, x, y, cache = run(cfg)
    j = 3
    t = torch.zeros_like(y)
    t[..., j] = 1.0
    attr = direct_attribution(model, cache, t, components="layers")
    stack = cache.decompose_resid(apply_ln=True)  # embed, pos_embed, attn/mlp per layer
    expected = stack @ model.W_U.detach()[:, j]
    assert torch.allclose(attr.values[: len(stack)], expected, rtol=0, atol=1e-12)
    target_coord = y[..., j] - model.unembed.b_U.detach()[j]
    assert (attr.total() - target_coord).abs().max() <= EXACT


# ---------------------------------------------------------------- targets


def test_next_vector_targets_values():
    model = hand_model()
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    final = torch.tensor([[5.0, 5.0]], dtype=torch.float64)
    assert next_vector_targets(model, x).tolist() == [[[0.0, 2.0]]]
    assert next_vector_targets(model, x, minus_current=True).tolist() == [[[-1.0, 2.0]]]
    assert next_vector_targets(model, x, final=final).tolist() == [[[0.0, 2.0], [5.0, 5.0]]]
    delta = next_vector_targets(model, x, final=final, minus_current=True)
    assert delta.tolist() == [[[-1.0, 2.0], [5.0, 3.0]]]
    # the inputs are not aliased
    out = next_vector_targets(model, x)
    out.zero_()
    assert x[0, 1, 1] == 2.0


def test_short_targets_attribute_the_first_positions():
    cfg = tiny_cfg(d_out=3)
    model, x, y, cache = run(cfg)
    final = torch.randn(3, 3, dtype=torch.float64)
    full = direct_attribution(model, cache, next_vector_targets(model, x, final=final))
    short = direct_attribution(model, cache, next_vector_targets(model, x))
    assert short.labels == full.labels
    # two computations (targets of 3 and of 4 positions) whose BLAS calls may split the sums
    # differently: float64 rounding of values of order 1 (8.9e-16 seen with AVX-512 MKL)
    torch.testing.assert_close(short.values, full.values[:, :, :-1], rtol=0, atol=1e-13)


# ---------------------------------------------------------------- the result object


def test_mean_over_mask():
    values = torch.arange(12, dtype=torch.float64).reshape(2, 2, 3)
    attr = DirectAttribution(values, ("a", "b"))
    assert attr.mean().tolist() == [2.5, 8.5]
    mask = torch.tensor([[False, True, True], [False, False, True]])
    # component a at the masked-in positions: 1, 2, 5
    assert attr.mean(mask).tolist() == [8 / 3, 8 / 3 + 6]
    assert attr.mean(torch.tensor([True, False, False])).tolist() == [1.5, 7.5]
    stored = DirectAttribution(values, ("a", "b"), mask)
    assert stored.mean().tolist() == attr.mean(mask).tolist()


def test_loss_mask_stored_and_cut_to_target_positions():
    cfg = tiny_cfg(d_out=3)
    model, x, y, cache = run(cfg, batch=2, n_pos=4)
    run_mask = torch.tensor([False, False, True, True])  # over the run's 4 positions
    attr = direct_attribution(model, cache, next_vector_targets(model, x), loss_mask=run_mask)
    assert attr.loss_mask.tolist() == [[False, False, True]] * 2
    assert torch.allclose(attr.mean(), attr.values[:, :, 2].mean(1), rtol=0, atol=1e-15)


def test_result_getitem_and_construction_errors():
    attr = DirectAttribution(torch.zeros(2, 1, 3), ("a", "b"))
    with pytest.raises(KeyError, match="no component 'c'"):
        attr["c"]
    with pytest.raises(ValueError, match="3 labels for 2 components"):
        DirectAttribution(torch.zeros(2, 1, 3), ("a", "b", "c"))
    with pytest.raises(ValueError, match="labels must be distinct"):
        DirectAttribution(torch.zeros(2, 1, 3), ("a", "a"))
    with pytest.raises(ValueError, match="selects no position"):
        attr.mean(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="loss_mask must have shape"):
        attr.mean(torch.ones(4, dtype=torch.bool))
    with pytest.raises(TypeError):  # caught by the runtime type checker in the test suite
        attr.mean(torch.ones(3))
    with pytest.raises(TypeError, match="loss_mask must be a bool tensor"):
        unwrapped(DirectAttribution.mean)(attr, torch.ones(3))


# ---------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def ran():
    return run(tiny_cfg(d_out=3), batch=2, n_pos=4)


def test_next_vector_targets_needs_d_in_equal_d_out():
    cfg = tiny_cfg()  # d_in=3, d_out=5
    model = random_model(cfg)
    with pytest.raises(ValueError, match="d_in == d_out.*d_in=3 and d_out=5"):
        next_vector_targets(model, random_input(cfg))


def test_next_vector_targets_bad_input(ran):
    model, x, _, _ = ran
    with pytest.raises(ValueError, match="at least 2 positions"):
        next_vector_targets(model, x[:, :1])
    with pytest.raises(TypeError):  # the runtime type checker binds d_in from x
        next_vector_targets(model, x, final=torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"final must have shape \[batch, d_in\]=\(2, 3\)"):
        unwrapped(next_vector_targets)(model, x, final=torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="final must be a tensor"):
        unwrapped(next_vector_targets)(model, x, final=[[0.0] * 3] * 2)
    with pytest.raises(ValueError, match="last axis of x to be d_in=3"):
        next_vector_targets(model, torch.zeros(2, 4, 2, dtype=torch.float64))


@pytest.mark.parametrize(
    "shape",
    [(3, 4, 3), (2, 5, 3), (2, 4, 2)],
    ids=["wrong-batch", "too-many-positions", "wrong-d_out"],
)
def test_wrong_targets_shape(ran, shape):
    model, _, _, cache = ran
    with pytest.raises(ValueError, match=r"targets must have shape \[batch=2, pos<=4, d_out=3\]"):
        direct_attribution(model, cache, torch.zeros(shape, dtype=torch.float64))


def test_bad_targets_values_and_types(ran):
    model, _, y, cache = ran
    with pytest.raises(TypeError):
        direct_attribution(model, cache, y.tolist())
    with pytest.raises(TypeError, match="targets must be a tensor"):
        unwrapped(direct_attribution)(model, cache, y.tolist())
    with pytest.raises(TypeError, match="targets must be a floating-point tensor"):
        unwrapped(direct_attribution)(model, cache, torch.ones(2, 4, 3, dtype=torch.int64))
    bad = y.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        direct_attribution(model, cache, bad)


def test_bad_components_cache_and_mask(ran):
    model, x, y, cache = ran
    with pytest.raises(ValueError, match="components must be one of"):
        direct_attribution(model, cache, y, components="mlps")
    with pytest.raises(ValueError, match="not produced by this model"):
        direct_attribution(random_model(model.cfg, seed=1), cache, y)
    with pytest.raises(TypeError):
        direct_attribution(model, dict(cache), y)
    with pytest.raises(TypeError, match="cache must be an ActivationCache"):
        unwrapped(direct_attribution)(model, dict(cache), y)
    with pytest.raises(TypeError, match="expected a HookedVectorTransformer"):
        unwrapped(direct_attribution)(model.state_dict(), cache, y)
    with pytest.raises(ValueError, match="loss_mask must have shape"):
        direct_attribution(model, cache, y, loss_mask=torch.ones(3, dtype=torch.bool))


def test_missing_cache_entry_is_named(ran):
    model, x, _, _ = ran
    y, cache = model.run_with_cache(x, names_filter=lambda n: "ln_final" not in n)
    with pytest.raises(KeyError, match="ln_final.hook_scale"):
        direct_attribution(model, cache, y)
