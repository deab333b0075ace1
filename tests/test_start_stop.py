"""start_at_layer / stop_at_layer: running part of the model from a cached residual."""

import pytest
import torch

from helpers import random_input, random_model, tiny_cfg


@pytest.mark.parametrize("attn_only", [False, True])
def test_starting_from_a_cached_resid_pre_gives_the_same_output_bit_for_bit(attn_only):
    model = random_model(tiny_cfg(n_layers=3, attn_only=attn_only))
    x = random_input(model.cfg)
    y, cache = model.run_with_cache(x)
    for layer in range(3):
        assert torch.equal(model(cache["resid_pre", layer], start_at_layer=layer), y)
    assert torch.equal(model(cache["resid_post", -1], start_at_layer=3), y)


def test_start_and_stop_together_run_only_the_blocks_between():
    model = random_model(tiny_cfg(n_layers=3))
    x = random_input(model.cfg)
    _, cache = model.run_with_cache(x)
    middle = model(cache["resid_pre", 1], start_at_layer=1, stop_at_layer=2)
    assert torch.equal(middle, cache["resid_post", 1])
    assert torch.equal(model(x, stop_at_layer=-1), cache["resid_pre", 2])


def test_start_at_layer_skips_the_embedding_hooks():
    model = random_model(tiny_cfg())
    _, cache = model.run_with_cache(random_input(model.cfg))
    _, late = model.run_with_cache(cache["resid_pre", 1], start_at_layer=1)
    assert "hook_embed" not in late and "blocks.0.hook_resid_post" not in late
    assert torch.equal(late["resid_pre", 1], cache["resid_pre", 1])


def test_bad_start_at_layer_is_refused():
    model = random_model(tiny_cfg())
    resid = torch.zeros(2, 3, model.cfg.d_model, dtype=torch.float64)
    with pytest.raises(ValueError, match="start_at_layer must be an int"):
        model(resid, start_at_layer=3)
    with pytest.raises(ValueError, match="start_at_layer must be an int"):
        model(resid, start_at_layer=True)
    with pytest.raises(ValueError, match="comes before"):
        model(resid, start_at_layer=2, stop_at_layer=1)


def test_start_at_layer_checks_the_residual_width():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)  # d_in wide, not d_model
    with pytest.raises(ValueError, match="d_model=8"):
        model(x, start_at_layer=1)
