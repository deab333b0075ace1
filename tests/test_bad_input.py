"""Bad input fails fast with a clear error naming what was expected.

The suite runs vecinterp under jaxtyping + typeguard, which rejects an argument that
contradicts its annotation (a 2-D ``x``, ``causal="yes"``) before the library's own
checks run. Users do not run that checker, so for those cases the user-facing message is
checked with the runtime checks switched off (``unchecked()``), and that the checker
still rejects the input is checked separately.
"""

import re

import jaxtyping
import numpy as np
import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked

F64 = torch.float64


@pytest.fixture(scope="module")
def model() -> vi.HookedVectorTransformer:
    # d_in=3, d_out=5, d_model=8, n_layers=2, n_ctx=7, float64
    return random_model(tiny_cfg())


@pytest.fixture(scope="module")
def x(model) -> torch.Tensor:
    return random_input(model.cfg, batch=2)


def test_unchecked_restores_the_checks():
    with unchecked():
        assert jaxtyping.config.jaxtyping_disable
    assert not jaxtyping.config.jaxtyping_disable


# -- the input x ------------------------------------------------------------------------


def test_wrong_last_axis(model):
    with pytest.raises(
        ValueError, match=re.escape("last axis of x to be d_in=3, got shape (2, 7, 4)")
    ):
        model(torch.zeros(2, 7, 4, dtype=F64))


def test_more_positions_than_n_ctx(model):
    with pytest.raises(ValueError, match="8 positions but the model takes at most n_ctx=7"):
        model(torch.zeros(2, 8, 3, dtype=F64))


def test_two_dimensional_input_suggests_unsqueeze(model):
    x2d = torch.zeros(7, 3, dtype=F64)
    with unchecked():
        with pytest.raises(
            ValueError, match=re.escape("rank 3 [batch, pos, d_in=3], got shape (7, 3)")
        ) as err:
            model(x2d)
    assert "x.unsqueeze(0)" in str(err.value)
    with pytest.raises((TypeError, ValueError)):
        model(x2d)  # rejected under the suite's runtime checks too


def test_four_dimensional_input(model):
    x4d = torch.zeros(1, 2, 7, 3, dtype=F64)
    with unchecked():
        with pytest.raises(ValueError, match=re.escape("got shape (1, 2, 7, 3)")) as err:
            model(x4d)
    assert "rank 3" in str(err.value)
    assert "unsqueeze" not in str(err.value)
    with pytest.raises((TypeError, ValueError)):
        model(x4d)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input(model, x, bad):
    x_bad = x.clone()
    x_bad[1, 4, 2] = bad
    with pytest.raises(ValueError, match=re.escape("NaN or inf (first at index [1, 4, 2])")):
        model(x_bad)


def test_integer_input(model):
    x_int = torch.zeros(2, 7, 3, dtype=torch.int64)
    with unchecked():
        with pytest.raises(TypeError, match=r"torch.float64\) shaped \[batch, pos, d_in\]"):
            model(x_int)
    with pytest.raises(TypeError):
        model(x_int)
    # token ids [batch, pos]: the dtype is named before the rank (before: "add a batch
    # axis with x.unsqueeze(0)"), with where token models go
    tokens = torch.zeros(2, 7, dtype=torch.int64)
    with unchecked(), pytest.raises(TypeError) as info:
        model(tokens)
    message = str(info.value)
    assert "x has dtype torch.int64, shape (2, 7)" in message
    assert "float vectors [batch, pos, d_in=3], not token ids" in message
    assert "TransformerLens's HookedTransformer" in message
    assert "unsqueeze" not in message


def test_float64_input_to_a_float32_model():
    model32 = random_model(tiny_cfg(n_layers=1), dtype=torch.float32)
    x64 = torch.zeros(2, 7, 3, dtype=F64)
    with pytest.raises(
        TypeError, match="x has dtype torch.float64 but the model's weights are torch.float32"
    ):
        model32(x64)
    with pytest.raises(TypeError, match=re.escape("x.to(torch.float32)")):
        model32(x64)


@pytest.mark.parametrize(
    "bad", [[[[0.0] * 3] * 7], np.zeros((1, 7, 3)), 1.0], ids=["list", "numpy", "float"]
)
def test_non_tensor_input(model, bad):
    with unchecked():
        with pytest.raises(TypeError, match=r"expected x as a torch.Tensor \[batch, pos, d_in\]"):
            model(bad)
    with pytest.raises(TypeError):
        model(bad)


@pytest.mark.parametrize("shape", [(0, 7, 3), (2, 0, 3)], ids=["no batch", "no pos"])
def test_empty_input(model, shape):
    with pytest.raises(
        ValueError, match=re.escape(f"at least one batch item and position, got {shape}")
    ):
        model(torch.zeros(shape, dtype=F64))


def test_device_mismatch_input_on_meta(model):
    with pytest.raises(ValueError, match=r"x is on meta but the model is on cpu"):
        model(torch.zeros(2, 7, 3, dtype=F64, device="meta"))


def test_device_mismatch_model_on_meta():
    meta_model = vi.HookedVectorTransformer(tiny_cfg(n_layers=1), dtype=F64, device="meta")
    assert meta_model.W_E.device.type == "meta"
    with pytest.raises(ValueError, match=r"x is on cpu but the model is on meta"):
        meta_model(torch.zeros(2, 7, 3, dtype=F64))


def test_device_mismatch_targets_on_meta(model, x):
    targets = torch.zeros(2, 7, 5, dtype=F64, device="meta")
    with pytest.raises(ValueError, match="targets is on meta but the model is on cpu"):
        model(x, targets=targets, return_type="loss")


# -- forward's other arguments -------------------------------------------------------------


@pytest.mark.parametrize("bad", ["logits", "Loss", None])
def test_bad_return_type(model, x, bad):
    with unchecked():  # None is also rejected by the annotation (str)
        with pytest.raises(
            ValueError, match=r"return_type must be one of \('output', 'loss', 'both'\)"
        ):
            model(x, return_type=bad)


@pytest.mark.parametrize("return_type", ["loss", "both"])
def test_loss_without_targets(model, x, return_type):
    with pytest.raises(
        ValueError, match=rf"return_type='{return_type}' needs targets \[batch, pos, d_out\]"
    ):
        model(x, return_type=return_type)


def test_targets_with_the_wrong_last_axis(model, x):
    with pytest.raises(
        ValueError, match=re.escape("expected targets of shape (2, 7, 5), got (2, 7, 4)")
    ):
        model(x, targets=torch.zeros(2, 7, 4, dtype=F64), return_type="loss")


@pytest.mark.parametrize("shape", [(1, 7, 5), (2, 6, 5), (2, 7)])
def test_targets_with_the_wrong_batch_pos_or_rank(model, x, shape):
    with unchecked():
        with pytest.raises(
            ValueError, match=re.escape(f"expected targets of shape (2, 7, 5), got {shape}")
        ):
            model(x, targets=torch.zeros(shape, dtype=F64), return_type="both")
    with pytest.raises((TypeError, ValueError)):
        model(x, targets=torch.zeros(shape, dtype=F64), return_type="both")


def test_targets_not_a_tensor(model, x):
    with unchecked():
        with pytest.raises(
            TypeError, match=r"expected targets as a torch.Tensor of shape \(2, 7, 5\)"
        ):
            model(x, targets=np.zeros((2, 7, 5)), return_type="loss")


def test_bad_loss_mask(model, x):
    targets = torch.zeros(2, 7, 5, dtype=F64)
    with unchecked():
        with pytest.raises(
            ValueError, match=re.escape("loss_mask must have shape [batch, pos]=(2, 7)")
        ):
            model(x, targets=targets, loss_mask=torch.ones(3, dtype=torch.bool), return_type="loss")
        with pytest.raises(TypeError, match="loss_mask must be a bool tensor, got torch.float64"):
            model(x, targets=targets, loss_mask=torch.ones(7, dtype=F64), return_type="loss")
    with pytest.raises(ValueError, match="loss_mask selects no position"):
        model(x, targets=targets, loss_mask=torch.zeros(7, dtype=torch.bool), return_type="loss")


@pytest.mark.parametrize("layer", [3, -3, 100])
def test_stop_at_layer_out_of_range(model, x, layer):
    with pytest.raises(
        ValueError, match=re.escape(f"stop_at_layer must be an int in [-2, 2], got {layer}")
    ):
        model(x, stop_at_layer=layer)


@pytest.mark.parametrize("layer", ["1", 1.0])
def test_stop_at_layer_not_an_int(model, x, layer):
    with unchecked():
        with pytest.raises(
            ValueError, match=re.escape(f"stop_at_layer must be an int in [-2, 2], got {layer!r}")
        ):
            model(x, stop_at_layer=layer)
    with pytest.raises((TypeError, ValueError)):
        model(x, stop_at_layer=layer)


def test_stop_at_layer_rejects_bools(model, x):
    """True is an int to isinstance, but not a layer (layer_index and the cache refuse it)."""
    with pytest.raises(ValueError, match="stop_at_layer must be an int"):
        model(x, stop_at_layer=True)


# -- hook names ---------------------------------------------------------------------------

TYPO = "blocks.1.attn.hook_patern"
CLOSE = re.escape("did you mean one of ['blocks.1.attn.hook_pattern'")


def test_unknown_hook_name_in_run_with_hooks(model, x):
    with pytest.raises(ValueError, match=CLOSE):
        # the valid hook is added first, then removed again by the failure
        model.run_with_hooks(
            x, fwd_hooks=[("hook_embed", lambda a, hook: None), (TYPO, lambda a, hook: None)]
        )
    with pytest.raises(ValueError, match="unknown hook name 'blocks.0.hook_resid_mdi'"):
        model.run_with_hooks(x, bwd_hooks=[("blocks.0.hook_resid_mdi", lambda g, hook: None)])
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


def test_unknown_hook_name_in_run_with_cache(model, x):
    with pytest.raises(ValueError, match=CLOSE):
        model.run_with_cache(x, names_filter=TYPO)
    with pytest.raises(ValueError, match=CLOSE):
        model.run_with_cache(x, names_filter=["hook_embed", TYPO])
    with pytest.raises(ValueError, match=CLOSE):
        model.run_with_cache(x, fwd_hooks=[(TYPO, lambda a, hook: None)])
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


def test_unknown_hook_name_in_add_hook(model):
    with pytest.raises(ValueError, match=CLOSE):
        model.add_hook(TYPO, lambda a, hook: None)
    with pytest.raises(ValueError, match=re.escape("'blocks.0.ln1.hook_scale'")):
        model.add_hook("blocks.0.ln1.hook_scal", lambda a, hook: None)
    # a short name is not a hook name, but the suggestion finds the full ones
    with pytest.raises(ValueError, match=re.escape("blocks.0.hook_resid_pre")):
        model.add_hook("hook_resid_pre", lambda a, hook: None)
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


def test_bad_hook_specs(model, x):
    with unchecked():
        with pytest.raises(TypeError, match=r"must be a \(name_or_filter, fn\) pair"):
            model.run_with_hooks(x, fwd_hooks=["hook_embed"])
        with pytest.raises(TypeError, match="must be callable"):
            model.run_with_hooks(x, fwd_hooks=[("hook_embed", "not a function")])
        with pytest.raises(ValueError, match="hook direction must be 'fwd' or 'bwd'"):
            model.add_hook("hook_embed", lambda a, hook: None, dir="sideways")
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


# -- configs --------------------------------------------------------------------------------

# (overrides, message): values of the annotated type, so the library's check is reached
BAD_VALUES = [
    (dict(d_in=0), "VectorTransformerConfig.d_in must be a positive int, got 0"),
    (dict(d_model=-8), "VectorTransformerConfig.d_model must be a positive int, got -8"),
    (dict(d_head=0), "VectorTransformerConfig.d_head must be a positive int, got 0"),
    (dict(n_heads=-1), "VectorTransformerConfig.n_heads must be a positive int, got -1"),
    (dict(n_layers=0), "VectorTransformerConfig.n_layers must be a positive int, got 0"),
    (dict(n_ctx=0), "VectorTransformerConfig.n_ctx must be a positive int, got 0"),
    (dict(d_out=0), "VectorTransformerConfig.d_out must be a positive int, got 0"),
    (dict(d_mlp=-16), "VectorTransformerConfig.d_mlp must be a positive int, got -16"),
    (dict(d_in=True), "VectorTransformerConfig.d_in must be a positive int, got True"),
    (dict(act_fn="tanh"), "VectorTransformerConfig.act_fn must be one of ('relu', 'gelu'"),
    (dict(normalization="BN"), "VectorTransformerConfig.normalization must be one of ('LN', "),
    (dict(positional="alibi"), "VectorTransformerConfig.positional must be one of ('learned', "),
    (
        dict(positional="rotary", d_head=3),
        "VectorTransformerConfig.d_head must be even with positional='rotary', got 3",
    ),
    (
        dict(positional="sinusoidal", d_model=7),
        "VectorTransformerConfig.d_model must be even with positional='sinusoidal', got 7",
    ),
    (dict(eps=0.0), "VectorTransformerConfig.eps must be a positive number, got 0.0"),
    (dict(eps=-1e-5), "VectorTransformerConfig.eps must be a positive number, got -1e-05"),
    (dict(eps=float("nan")), "VectorTransformerConfig.eps must be a positive number, got nan"),
    (dict(rotary_base=0.0), "VectorTransformerConfig.rotary_base must be a positive number"),
    (dict(init_range=-0.02), "VectorTransformerConfig.init_range must be a positive number"),
]

# values of the wrong type: the suite's checker rejects them first, users get the message
BAD_TYPES = [
    (dict(causal="yes"), "VectorTransformerConfig.causal must be a bool, got 'yes'"),
    (dict(attn_only=1), "VectorTransformerConfig.attn_only must be a bool, got 1"),
    (dict(embed_bias=None), "VectorTransformerConfig.embed_bias must be a bool, got None"),
    (dict(d_in=2.5), "VectorTransformerConfig.d_in must be a positive int, got 2.5"),
    (dict(n_heads="2"), "VectorTransformerConfig.n_heads must be a positive int, got '2'"),
    (dict(eps=0), "VectorTransformerConfig.eps must be a positive number, got 0"),
    (dict(eps="1e-5"), "VectorTransformerConfig.eps must be a positive number, got '1e-5'"),
    (dict(act_fn=None), "VectorTransformerConfig.act_fn must be one of"),
]


@pytest.mark.parametrize("overrides, message", BAD_VALUES, ids=lambda v: repr(v)[:40])
def test_invalid_config_values(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_cfg(**overrides)


@pytest.mark.parametrize("overrides, message", BAD_TYPES, ids=lambda v: repr(v)[:40])
def test_invalid_config_types(overrides, message):
    with unchecked():
        with pytest.raises(ValueError, match=re.escape(message)):
            tiny_cfg(**overrides)
    with pytest.raises((TypeError, ValueError)):
        tiny_cfg(**overrides)


def test_config_replace_is_validated_and_unknown_fields_are_named():
    cfg = tiny_cfg()
    with pytest.raises(ValueError, match="VectorTransformerConfig.n_ctx must be a positive int"):
        cfg.replace(n_ctx=-1)
    with pytest.raises(
        ValueError, match=re.escape("unknown VectorTransformerConfig fields ['n_head']")
    ):
        vi.VectorTransformerConfig.from_dict({**cfg.to_dict(), "n_head": 2})


def test_bad_model_constructor_arguments():
    with unchecked():
        with pytest.raises(TypeError, match="cfg must be a VectorTransformerConfig, got dict"):
            vi.HookedVectorTransformer(tiny_cfg().to_dict())
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype, got torch.int64"):
        vi.HookedVectorTransformer(tiny_cfg(), dtype=torch.int64)


# -- cache lookups --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(model, x) -> vi.ActivationCache:
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern", "blocks.1.hook_resid_post"]
    return model.run_with_cache(x, names_filter=names)[1]


def test_cache_missing_full_name_names_close_matches(cache):
    with pytest.raises(KeyError, match=re.escape("close matches: ['blocks.1.attn.hook_pattern'")):
        cache["blocks.1.attn.hook_patern"]


def test_cache_name_left_out_by_names_filter(cache):
    with pytest.raises(
        KeyError, match=r"'blocks\.0\.attn\.hook_q' is not in this cache.*names_filter"
    ):
        cache["q", 0]
    assert ("q", 0) not in cache
    assert ("pattern", 0) in cache


def test_cache_unknown_short_name(cache):
    with pytest.raises(KeyError, match="unknown short activation name 'patern'"):
        cache["patern", 0]
    with pytest.raises(KeyError, match="cache keys are a hook name or"):
        cache[3]


@pytest.mark.parametrize("layer", [2, 5, -3])
def test_cache_layer_out_of_range(cache, layer):
    expected = f"layer {layer} out of range for a 2-layer model; use 0..1 or -2..-1"
    with pytest.raises(ValueError, match=re.escape(expected)):
        cache["pattern", layer]


def test_cache_negative_layers_count_from_the_end(cache):
    assert cache["pattern", -1] is cache["blocks.1.attn.hook_pattern"]
    assert cache["pattern", -2] is cache["blocks.0.attn.hook_pattern"]
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    assert not torch.equal(cache["pattern", -1], cache["pattern", 0])


def test_cache_key_errors_name_the_part_of_the_key(cache):
    with pytest.raises(ValueError, match=re.escape("cache[('pattern', 5)]: the layer index")):
        cache["pattern", 5]
    with pytest.raises(KeyError, match="the name: unknown short activation name 'nope'"):
        cache["nope", 0]
    with pytest.raises(KeyError, match="only goes with 'scale' or 'normalized'"):
        cache["resid_pre", 0, "bogus"]
    with pytest.raises(KeyError, match=re.escape("(name, layer[, sub])")):
        cache["scale", 0, "ln1", 4]


def test_act_name_checks_its_arguments():
    from vecinterp.cache import act_name

    with unchecked(), pytest.raises(TypeError, match="name must be a str"):
        act_name(5)  # type: ignore[arg-type]
    with unchecked(), pytest.raises(TypeError, match="layer must be an int, got float 1.5"):
        act_name("pattern", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sub must be 'ln1' or 'ln2'"):
        act_name("scale", 0, "ln3")


def test_apply_ln_to_stack_checks_the_stack(model, x):
    cache = model.run_with_cache(x)[1]
    d_model = cache.cfg.d_model
    batch, pos = cache["resid_post", -1].shape[:2]
    with unchecked(), pytest.raises(ValueError, match=f"last axis must be d_model={d_model}"):
        cache.apply_ln_to_stack(torch.zeros(1, batch, pos, d_model + 1))
    with pytest.raises(ValueError, match="residual_stack contains NaN or inf"):
        cache.apply_ln_to_stack(torch.full((1, batch, pos, d_model), float("nan")))
    with unchecked(), pytest.raises(TypeError, match="residual_stack must be a tensor"):
        cache.apply_ln_to_stack([1.0, 2.0])  # type: ignore[arg-type]


def test_run_with_cache_checks_incl_bwd_and_loss_fn(model):
    x = torch.randn(2, 3, model.cfg.d_in)
    with unchecked(), pytest.raises(TypeError, match="incl_bwd must be a bool"):
        model.run_with_cache(x, incl_bwd="yes")  # type: ignore[arg-type]
    with unchecked(), pytest.raises(TypeError, match="loss_fn must be a function"):
        model.run_with_cache(x, incl_bwd=True, loss_fn=3)  # type: ignore[arg-type]
