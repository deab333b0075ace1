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


def test_wrong_rank_into_a_component_is_caught():
    model = random_model(tiny_cfg(), dtype=torch.float32)
    with pytest.raises(jaxtyping.TypeCheckError):
        model.ln_final(torch.zeros(2, 3))  # "batch pos d_model" is annotated
    with pytest.raises(jaxtyping.TypeCheckError):
        model.embed(torch.zeros(4, model.cfg.d_in))  # "batch pos d_in" is annotated


def test_inconsistent_axis_sizes_across_arguments_are_caught():
    a, b = torch.zeros(2, 3, 4), torch.zeros(2, 5, 4)  # pos 3 vs 5
    with pytest.raises(jaxtyping.TypeCheckError):
        vi.masked_mse(a, b)
