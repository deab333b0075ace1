"""TransformerLens's model and cache methods that have another form here (or none) raise
an AttributeError that says what to use, and every function it names exists."""

import re

import pytest
import torch

import vecinterp as vi
from helpers import random_input, tiny_cfg
from vecinterp.cache.activation_cache import _TL_HABITS as CACHE_HABITS
from vecinterp.model.transformer import _TL_HABITS as MODEL_HABITS

CFG = tiny_cfg()


@pytest.fixture(scope="module")
def model_and_cache():
    model = vi.HookedVectorTransformer(CFG, seed=0)
    _, cache = model.run_with_cache(random_input(CFG, dtype=torch.float32))
    return model, cache


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("process_weights_", r"use model = vi\.process_weights\(model\).*new model"),
        ("fold_layer_norm", r"use model = vi\.fold_layer_norm\(model\).*leaves model unchanged"),
        ("center_writing_weights", r"vi\.center_writing_weights\(model\)"),
        ("fold_value_biases", r"vi\.fold_value_biases\(model\)"),
        ("center_unembed", r"not offered.*changes a regression output"),
        ("to_tokens", r"no tokenizer.*float vectors \[batch, pos, d_in\].*model\(x\)"),
        ("to_str_tokens", r"no tokenizer"),
        ("tokenizer", r"no tokenizer"),
    ],
)
def test_model_habits_say_what_to_use(model_and_cache, name, says):
    model, _ = model_and_cache
    with pytest.raises(AttributeError, match=rf"no attribute '{name}' \(TransformerLens's "):
        getattr(model, name)
    with pytest.raises(AttributeError, match=says):
        getattr(model, name)
    assert not hasattr(model, name)  # duck-typing code does not take the model for TL's


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("logit_attrs", r"use vi\.direct_attribution\(model, cache, targets\)"),
        ("get_full_resid_decomposition", r"cache\.decompose_resid\(\)"),
        ("compute_head_results", r'cache\["result", layer\]'),
    ],
)
def test_cache_habits_say_what_to_use(model_and_cache, name, says):
    _, cache = model_and_cache
    with pytest.raises(AttributeError, match=rf"no attribute '{name}' \(TransformerLens's "):
        getattr(cache, name)
    with pytest.raises(AttributeError, match=says):
        getattr(cache, name)
    assert not hasattr(cache, name)


def test_every_name_a_hint_gives_exists(model_and_cache):
    model, cache = model_and_cache
    hints = " ".join([*MODEL_HABITS.values(), *CACHE_HABITS.values()])
    functions = set(re.findall(r"\bvi\.(\w+)", hints))
    methods = set(re.findall(r"\bcache\.(\w+)", hints))
    assert {"process_weights", "fold_layer_norm", "direct_attribution"} <= functions
    assert {"decompose_resid", "apply_ln_to_stack"} <= methods
    assert all(callable(getattr(vi, f)) for f in functions), functions
    assert all(callable(getattr(cache, m)) for m in methods), methods
    assert "blocks.0.attn.hook_result" in cache  # what compute_head_results points to


def test_other_missing_names_keep_the_plain_message(model_and_cache):
    model, cache = model_and_cache
    with pytest.raises(AttributeError, match=r"^'HookedVectorTransformer' object has no attr"):
        model.no_such_attribute  # noqa: B018
    with pytest.raises(AttributeError, match=r"^'ActivationCache' object has no attribute"):
        cache.no_such_attribute  # noqa: B018
    # the properties' own messages are kept (an attention-only model has no W_in)
    attn_only = vi.HookedVectorTransformer(tiny_cfg(attn_only=True), seed=0)
    with pytest.raises(AttributeError, match="W_in: this model is attention-only"):
        attn_only.W_in  # noqa: B018
