"""Inputs you can trust (issue 12, item 6 and its messages): non-finite values are refused
with the argument named, messages name the argument that is actually wrong, and the
TransformerLens habits users bring (stacked weights, ``return_type="logits"``, scores of
unfolded models, half-precision factors) either work or say why not."""

import dataclasses
import math
import re

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp import FactoredMatrix
from vecinterp.analysis.ablation import (
    ablate,
    ablate_heads,
    ablate_patterns,
    head_ablation_sweep,
    mean_activations,
)
from vecinterp.analysis.patching import activation_patching, patch_hook, patch_qk_identity
from vecinterp.analysis.scores import composition_scores, eigenvalue_scores

F64 = torch.float64
CFG_KW = dict(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6)


@pytest.fixture(scope="module")
def model() -> vi.HookedVectorTransformer:
    # d_in=3, d_out=5, d_model=8, d_head=4, n_heads=2, n_layers=2, d_mlp=16, n_ctx=7, float64
    return random_model(tiny_cfg())


@pytest.fixture(scope="module")
def x(model) -> torch.Tensor:
    return random_input(model.cfg, batch=2)


def targets_like(model, x, seed=1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*x.shape[:2], model.cfg.d_out, generator=gen, dtype=F64)


# -- 1. non-finite config fields ------------------------------------------------------------


def float_fields() -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(vi.VectorTransformerConfig)
        if f.type in (float, "float", float | None, "float | None")
    ]


@pytest.mark.parametrize("field", ["eps", "rotary_base", "init_range"])
def test_infinite_config_floats_are_refused_with_the_field_named(field):
    with pytest.raises(
        ValueError,
        match=re.escape(f"VectorTransformerConfig.{field} must be a positive number, got inf")
        + ".*not finite",
    ):
        vi.VectorTransformerConfig(**CFG_KW, **{field: math.inf})


def test_every_float_field_refuses_inf_also_through_replace_and_from_dict():
    assert set(float_fields()) == {"eps", "rotary_base", "init_range"}  # the ones above
    cfg = vi.VectorTransformerConfig(**CFG_KW)
    for field in float_fields():
        with pytest.raises(ValueError, match=f"VectorTransformerConfig.{field} .*not finite"):
            cfg.replace(**{field: math.inf})
        with pytest.raises(ValueError, match=f"VectorTransformerConfig.{field} .*not finite"):
            vi.VectorTransformerConfig.from_dict({**cfg.to_dict(), field: math.inf})


# -- 1. non-finite targets --------------------------------------------------------------------


@pytest.mark.parametrize("return_type", ["loss", "both"])
@pytest.mark.parametrize("bad", [float("nan"), math.inf])
def test_forward_refuses_non_finite_targets_with_the_index(model, x, return_type, bad):
    t = targets_like(model, x)
    t[1, 4, 2] = bad
    with pytest.raises(
        ValueError,
        match=re.escape("targets contains NaN or inf at a position the loss uses")
        + r".*\[1, 4, 2\]",
    ):
        model(x, targets=t, return_type=return_type)


def test_forward_ignores_non_finite_targets_at_masked_out_positions(model, x):
    """A NaN target at a masked-out position is how a missing target is written; it is
    refused only where the loss reads it."""
    t = targets_like(model, x)
    filled = t.clone()
    t[:, -1] = float("nan")  # the last position has no next vector
    mask = torch.ones(x.shape[1], dtype=torch.bool)
    mask[-1] = False
    with pytest.raises(ValueError, match="targets contains NaN"):
        model(x, targets=t, return_type="loss")
    got = model(x, targets=t, loss_mask=mask, return_type="loss")
    assert torch.equal(got, model(x, targets=filled, loss_mask=mask, return_type="loss"))


def test_loss_mask_as_a_list_is_refused_with_a_type_error(model, x):
    t = targets_like(model, x)
    as_list = [True] * x.shape[1]
    with unchecked():  # users do not run the suite's annotation checker
        with pytest.raises(TypeError, match="loss_mask must be a bool tensor .* got list"):
            model(x, targets=t, loss_mask=as_list, return_type="loss")
        with pytest.raises(TypeError, match="loss_mask must be a bool tensor .* got list"):
            vi.masked_mse(model(x), t, as_list)
        with pytest.raises(TypeError, match="loss_mask must be a bool tensor .* got list"):
            head_ablation_sweep(model, x, t, kind="zero", loss_mask=as_list, progress=False)


def test_head_ablation_sweep_refuses_non_finite_targets_where_the_loss_reads_them(model, x):
    t = targets_like(model, x)
    holes = t.clone()
    holes[0, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"targets contains NaN or inf .*\[0, 0, 1\]"):
        head_ablation_sweep(model, x, holes, kind="zero", progress=False)
    # a masked-out position may hold NaN: the scores are those of any finite value there
    holes[:, 0] = float("nan")
    mask = torch.ones(x.shape[1], dtype=torch.bool)
    mask[0] = False
    got = head_ablation_sweep(model, x, holes, kind="zero", loss_mask=mask, progress=False)
    want = head_ablation_sweep(model, x, t, kind="zero", loss_mask=mask, progress=False)
    assert bool(got.isfinite().all())
    assert torch.equal(got, want)


def test_head_ablation_sweep_refuses_a_non_finite_baseline_metric(model, x):
    """A custom metric (or NaN weights) that makes every score NaN is an error, not a grid
    of NaNs."""
    t = targets_like(model, x)
    with pytest.raises(ValueError, match="metric of the unablated model is nan"):
        head_ablation_sweep(
            model, x, t, kind="zero", metric=lambda y, t: (y - t).sum() * math.nan, progress=False
        )
    broken = random_model(tiny_cfg())
    with torch.no_grad():
        broken.blocks[1].mlp.W_out[0, 0] = math.nan
    with pytest.raises(ValueError, match="metric of the unablated model is nan.*weights"):
        head_ablation_sweep(broken, x, t, kind="zero", progress=False)


# -- 1. non-finite weights --------------------------------------------------------------------


@pytest.mark.parametrize(
    "param, call",
    [
        ("blocks.1.attn.W_V", lambda m: eigenvalue_scores(m, kind="ov")),
        ("blocks.0.attn.W_K", lambda m: eigenvalue_scores(m, kind="qk")),
        ("blocks.1.attn.W_O", lambda m: composition_scores(m, kind="V")),
        ("embed.W_E", lambda m: vi.full_ov_circuit(m)),
        ("unembed.W_U", lambda m: vi.full_ov_circuit(m, layer=0)),
        ("pos_embed.W_pos", lambda m: vi.analysis.circuits.pos_qk_circuit(m)),
        ("blocks.1.attn.W_Q", lambda m: vi.analysis.circuits.qk_circuit(m, layer=-1)),
    ],
)
def test_circuit_analyses_name_a_non_finite_weight(param, call):
    broken = random_model(tiny_cfg())
    with torch.no_grad():
        broken.get_parameter(param).view(-1)[-1] = math.inf
    with pytest.raises(ValueError, match=re.escape(f"the model's weight {param} contains NaN")):
        call(broken)


# -- 2. messages that name the argument that is wrong -----------------------------------------


def pop_with(model, *, n_pos=None, bad=None, dtype=F64):
    pop = random_input(model.cfg, batch=8, n_pos=n_pos, seed=3).to(dtype)
    if bad is not None:
        pop[5, 1, 0] = bad
    return pop


@pytest.mark.parametrize("kind", ["mean", "resample"])
def test_population_errors_name_the_population(model, x, kind):
    call = dict(model=model, x=x, heads=(0, 1), kind=kind)
    with pytest.raises(ValueError, match=r"population contains NaN or inf .*\[5, 1, 0\]"):
        ablate_heads(**call, population=pop_with(model, bad=math.nan))
    with pytest.raises(ValueError, match="population has 8 positions but the model takes at most"):
        ablate_heads(**call, population=pop_with(model, n_pos=8))
    with pytest.raises(TypeError, match="population has dtype torch.float32 .* population.to"):
        ablate_heads(**call, population=pop_with(model, dtype=torch.float32))


def test_population_errors_name_the_population_in_ablate_and_mean_activations(model, x):
    pop = pop_with(model, bad=math.inf)
    with pytest.raises(ValueError, match="population contains NaN or inf"):
        ablate(model, x, ("mlp_out", 0), kind="mean", population=pop)
    with pytest.raises(ValueError, match="population contains NaN or inf"):
        mean_activations(model, pop, "blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match="population has 8 positions"):
        head_ablation_sweep(
            model,
            x,
            targets_like(model, x),
            "mean",
            population=pop_with(model, n_pos=8),
            progress=False,
        )


def test_precomputed_means_with_nan_are_named(model, x):
    means = mean_activations(model, pop_with(model), "blocks.0.attn.hook_z")
    means["blocks.0.attn.hook_z"][0, 0, 0] = math.nan
    with pytest.raises(ValueError, match=re.escape("population['blocks.0.attn.hook_z'] contains")):
        ablate_heads(model, x, (0, 0), kind="mean", population=means)


def test_resample_source_errors_name_it(model, x):
    source = x.clone()
    source[1, 0, 2] = math.nan
    with pytest.raises(ValueError, match=r"resample_source contains NaN or inf .*\[1, 0, 2\]"):
        ablate_heads(model, x, (1, 0), kind="resample", resample_source=source)


def test_patching_errors_name_clean_x_and_corrupted_x(model, x):
    metric = lambda y: y.sum()  # noqa: E731
    bad = x.clone()
    bad[0, 3, 1] = math.nan
    with pytest.raises(ValueError, match=r"corrupted_x contains NaN or inf .*\[0, 3, 1\]"):
        activation_patching(model, x, bad, metric, "resid_pre", progress=False)
    with pytest.raises(ValueError, match=r"clean_x contains NaN or inf"):
        activation_patching(model, bad, x, metric, "resid_pre", progress=False)
    with pytest.raises(TypeError, match="corrupted_x has dtype torch.float32"):
        activation_patching(model, x, x.float(), metric, "resid_pre", progress=False)


@pytest.mark.parametrize(
    "heads, match",
    [
        ({5: [0]}, r"layer must be an int in [-2, 1], got 5 (a key of heads"),
        ({0: [0, 7]}, r"head must be an int in [-2, 1], got 7 (in heads[0]"),
        ([(0, 0), (3, 1)], r"got 3 (in the (layer, head) pair (3, 1) of heads"),
        ((0, 9), r"head must be an int in [-2, 1], got 9 (in the (layer, head) pair (0, 9)"),
    ],
)
def test_head_selection_errors_say_which_argument(model, x, heads, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        ablate_heads(model, x, heads, kind="zero")


def test_pattern_and_component_layer_errors_say_which_argument(model, x):
    with pytest.raises(ValueError, match=re.escape("got 4 (in the key (4, 0) of patterns")):
        ablate_patterns(model, x, {(4, 0): "uniform"})
    with pytest.raises(ValueError, match=re.escape("got 6 (in ('mlp_out', 6)")):
        ablate(model, x, [("attn_out", 0), ("mlp_out", 6)])


def test_config_d_vocab_points_to_d_in_and_d_out():
    with pytest.raises(TypeError, match=r"'d_vocab' is TransformerLens's name; here use d_in"):
        vi.VectorTransformerConfig(d_vocab=10, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4)
    with pytest.raises(TypeError, match=r"'d_vocab_out' .* here use d_out"):
        vi.VectorTransformerConfig(**CFG_KW, d_vocab_out=10)
    with pytest.raises(TypeError, match=r"'normalization_type' .* here use normalization"):
        vi.VectorTransformerConfig(**CFG_KW, normalization_type="LN")
    with pytest.raises(TypeError, match=r"'d_modle': did you mean 'd_model'"):
        vi.VectorTransformerConfig(d_in=3, d_modle=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4)
    data = {**vi.VectorTransformerConfig(**CFG_KW).to_dict(), "d_vocab": 3}
    with pytest.raises(ValueError, match=r"'d_vocab' is TransformerLens's name; here use d_in"):
        vi.VectorTransformerConfig.from_dict(data)


def test_config_keeps_its_dataclass_signature_and_behaviour():
    import inspect

    params = inspect.signature(vi.VectorTransformerConfig).parameters
    assert list(params)[:6] == ["d_in", "d_model", "d_head", "n_heads", "n_layers", "n_ctx"]
    cfg = vi.VectorTransformerConfig(3, 8, 4, 2, 2, 6, eps=1e-6)
    assert cfg == vi.VectorTransformerConfig(**CFG_KW, eps=1e-6)
    assert cfg.replace(d_model=16).d_model == 16
    with pytest.raises(TypeError, match="'d_vocab' is TransformerLens's name"):
        cfg.replace(d_vocab=4)


def test_patch_hook_position_out_of_range_is_refused_when_the_hook_is_made():
    clean = torch.ones(2, 6, 8)
    with pytest.raises(ValueError, match=r"index \(9,\) is out of range: entry 9 .* axis 1"):
        patch_hook(clean, (9,))
    with pytest.raises(ValueError, match=r"entry -4 indexes axis 2 .* 3 entries"):
        patch_hook(torch.ones(2, 6, 3, 4), (slice(None), -4))
    with pytest.raises(ValueError, match=r"has 3 entries but the activation .* only 2 axes"):
        patch_hook(clean, (0, 1, 2))
    # in range, negative and slices still work
    out = patch_hook(clean, (-1,))(torch.zeros(2, 6, 8), None)
    assert out[:, -1].eq(1).all() and out[:, :-1].eq(0).all()


@pytest.mark.parametrize("heads", [1.0, None, torch.tensor(0.5)])
def test_patch_qk_identity_heads_of_the_wrong_type_is_a_type_error(model, heads):
    with unchecked():
        with pytest.raises(TypeError, match="heads must be a head index .*, got"):
            patch_qk_identity(model, 0, heads)


# -- 3. TransformerLens habits ------------------------------------------------------------------


STACKS = {
    # name: (per-block attribute path, TL's shape from the config)
    "b_Q": ("attn.b_Q", lambda c: (c.n_layers, c.n_heads, c.d_head)),
    "b_K": ("attn.b_K", lambda c: (c.n_layers, c.n_heads, c.d_head)),
    "b_V": ("attn.b_V", lambda c: (c.n_layers, c.n_heads, c.d_head)),
    "b_O": ("attn.b_O", lambda c: (c.n_layers, c.d_model)),
    "W_in": ("mlp.W_in", lambda c: (c.n_layers, c.d_model, c.d_mlp)),
    "b_in": ("mlp.b_in", lambda c: (c.n_layers, c.d_mlp)),
    "W_out": ("mlp.W_out", lambda c: (c.n_layers, c.d_mlp, c.d_model)),
    "b_out": ("mlp.b_out", lambda c: (c.n_layers, c.d_model)),
}


@pytest.mark.parametrize("name", sorted(STACKS))
def test_stacked_parameters_have_tl_shapes_and_the_per_block_values(name):
    model = random_model(tiny_cfg(n_layers=3, d_mlp=12))  # every parameter non-trivial
    path, shape = STACKS[name]
    stacked = getattr(model, name)
    assert tuple(stacked.shape) == shape(model.cfg)
    for layer, block in enumerate(model.blocks):
        assert torch.equal(stacked[layer], block.get_parameter(path))
    # gradients flow back to the per-block parameters, as for W_Q..W_O
    weights = torch.arange(stacked.numel(), dtype=F64).view_as(stacked)
    (stacked * weights).sum().backward()
    grad = model.blocks[2].get_parameter(path).grad
    assert grad is not None and torch.equal(grad, weights[2])


def test_w_pos_and_b_u_are_the_parameters_themselves():
    model = random_model(tiny_cfg(d_out=5))
    assert model.W_pos is model.pos_embed.W_pos and model.W_pos.shape == (7, 8)
    assert model.b_U is model.unembed.b_U and model.b_U.shape == (5,)
    sinusoidal = random_model(tiny_cfg(positional="sinusoidal"))
    assert torch.equal(sinusoidal.W_pos, sinusoidal.pos_embed.W_pos)


@pytest.mark.parametrize("positional", ["rotary", "none"])
def test_w_pos_without_an_additive_embedding_says_why(positional):
    model = random_model(tiny_cfg(positional=positional))
    with pytest.raises(AttributeError, match=f"W_pos: this model has positional='{positional}'"):
        model.W_pos
    assert not hasattr(model, "W_pos")


@pytest.mark.parametrize("name", ["W_in", "b_in", "W_out", "b_out"])
def test_mlp_stacks_of_an_attention_only_model_say_why(name):
    model = random_model(tiny_cfg(attn_only=True))
    with pytest.raises(AttributeError, match=f"{name}: this model is attention-only"):
        getattr(model, name)
    assert not hasattr(model, name)
    with pytest.raises(AttributeError, match="has no attribute 'W_nothing'"):
        model.W_nothing  # other missing names keep torch's message


def test_return_type_logits_is_refused_with_the_reason(model, x):
    with pytest.raises(
        ValueError, match=r"got 'logits' \('logits' is TransformerLens's name.*no softmax"
    ) as err:
        model(x, return_type="logits")
    assert "return_type='output'" in str(err.value)


@pytest.mark.parametrize("normalization", ["LN", "RMS"])
def test_scores_with_fold_ln_equal_the_scores_of_the_folded_model(normalization):
    model = random_model(tiny_cfg(d_out=3, n_layers=3, normalization=normalization))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = vi.fold_layer_norm(model)
    for kind in ("ov", "qk", "full_ov", "full_qk", "pos_qk"):
        got = eigenvalue_scores(model, kind=kind, fold_ln=True)
        assert torch.equal(got, eigenvalue_scores(folded, kind=kind))
    for kind in "QKV":
        got = composition_scores(model, kind=kind, fold_ln=True)
        want = composition_scores(folded, kind=kind)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    # the unfolded scores are those of the raw weights, and they differ
    raw, fold = (
        eigenvalue_scores(model, kind="ov"),
        eigenvalue_scores(model, kind="ov", fold_ln=True),
    )
    assert float((raw - fold).abs().max()) > 1e-3
    for key, value in model.state_dict().items():  # the model is left as it was
        assert torch.equal(value, before[key])


def test_fold_ln_with_a_factored_matrix_or_a_non_bool_is_refused(model):
    with pytest.raises(ValueError, match="fold_ln folds a model's normalization"):
        eigenvalue_scores(model.OV, fold_ln=True)
    with unchecked():
        with pytest.raises(TypeError, match="composition_scores: fold_ln must be a bool"):
            composition_scores(model, kind="K", fold_ln="yes")


def half_factors(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(3, 6, 2, generator=gen).to(dtype)
    B = torch.randn(3, 2, 6, generator=gen).to(dtype)
    return A, B


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_factored_matrix_decomposes_in_float32(dtype):
    A, B = half_factors(dtype)
    half, single = FactoredMatrix(A, B), FactoredMatrix(A.float(), B.float())
    assert half.eigenvalues.dtype == torch.complex64
    assert torch.equal(half.eigenvalues, single.eigenvalues)
    assert half.norm().dtype == torch.float32
    assert torch.equal(half.norm(), single.norm())
    assert torch.equal(half.singular_values, single.singular_values)
    for got, want in zip(half.svd(), single.svd(), strict=True):
        assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(eigenvalue_scores(half), eigenvalue_scores(single))
    assert eigenvalue_scores(half).dtype == torch.float32
    # the products stay in the factors' dtype
    assert half.AB.dtype == dtype and (half @ torch.ones(6, 4, dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_score_like_their_float32_copy(dtype):
    model = random_model(tiny_cfg(n_layers=3), dtype=dtype)
    single = vi.HookedVectorTransformer(model.cfg, dtype=torch.float32)
    single.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    for kind in ("ov", "qk"):
        got = eigenvalue_scores(model, kind=kind)
        assert got.dtype == torch.float32
        assert torch.equal(got, eigenvalue_scores(single, kind=kind))
    for kind in "QKV":
        got = composition_scores(model, kind=kind)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, composition_scores(single, kind=kind), equal_nan=True)
