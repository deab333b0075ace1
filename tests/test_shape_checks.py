"""The runtime shape checks the suite runs under are really on.

pytest loads vecinterp through jaxtyping's import hook with beartype (pyproject's
``--jaxtyping-packages``). If that pairing silently checked nothing, these fail."""

import jaxtyping
import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg


def test_mismatched_named_axis_is_caught_by_jaxtyping():
    pred = torch.zeros(2, 3, 4)
    with pytest.raises(jaxtyping.TypeCheckError):
        vi.masked_mse(pred, pred.clone(), torch.ones(3, 3, dtype=torch.bool))


def test_wrong_return_shape_of_a_component_is_caught():
    model = random_model(tiny_cfg(), dtype=torch.float32)
    unembed = model.unembed
    # a d_model x d_out matrix swapped for one with a different d_model breaks the
    # annotated contract "batch pos d_model -> batch pos d_out" at the einsum or the check
    with pytest.raises((jaxtyping.TypeCheckError, RuntimeError)):
        unembed(torch.zeros(2, 3, 7))
    with pytest.raises(jaxtyping.TypeCheckError):
        model.blocks[0].attn.rotary  # noqa: B018 - attribute exists (None for learned)
        model.ln_final(torch.zeros(2, 3))


def test_component_call_is_wrapped_by_the_checker():
    cfg = tiny_cfg()
    model = random_model(cfg, dtype=torch.float32)
    x = torch.zeros(2, 4, cfg.d_in)
    with pytest.raises(jaxtyping.TypeCheckError):
        model.embed(x[0])  # rank 2 where "batch pos d_in" is annotated
