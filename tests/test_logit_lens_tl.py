"""The residual-stream readings through a norm against TransformerLens's on the converted
model: ``accumulated_resid(apply_ln=True)`` of the final stream is a logit lens (``ln_final``
recomputed on each entry, as TransformerLens's ``recompute_ln``), while the decompositions
(``decompose_resid``, ``stack_head_results``) and a block's input stay linearised at the
run's scale, so that they add up to what the norm output.

TransformerLens's linearised reading leaves the norm's weight ``w`` out (it expects folded
norms); vecinterp applies it, so those comparisons multiply TransformerLens's by ``w``.
"""

import pytest
import torch

pytest.importorskip(
    "transformer_lens",
    reason='TransformerLens is not installed (pip install "vecinterp[transformer-lens]")',
)

from helpers import random_input, random_model, tiny_cfg  # noqa: E402
from vecinterp.interop.transformer_lens import (  # noqa: E402
    tl_run_with_cache_vectors,
    to_transformer_lens,
)

pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

NORMS = ["LN", "LNPre", "RMS", "RMSPre", None]
# float64, the same formulas in another order on each side: a few ulps of values of order 1-10
TOL = dict(rtol=1e-12, atol=1e-12)


def both_runs(normalization):
    cfg = tiny_cfg(normalization=normalization)
    model = random_model(cfg, scale=0.3)  # non-trivial w and b in every norm
    tl_model = to_transformer_lens(model)
    tl_model.set_use_attn_result(True)
    x = random_input(cfg, batch=3, n_pos=6)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        _, cache_tl = tl_run_with_cache_vectors(tl_model, x)
    return model, cache, cache_tl


def w_of(ln) -> torch.Tensor | float:
    w = getattr(ln, "w", None)
    return 1.0 if w is None else w.detach()


def b_of(ln) -> torch.Tensor | float:
    b = getattr(ln, "b", None)
    return 0.0 if b is None else b.detach()


@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("incl_mid", [False, True])
def test_the_final_stream_is_a_logit_lens_as_in_transformer_lens(normalization, incl_mid):
    model, cache, cache_tl = both_runs(normalization)
    with torch.no_grad():
        ours, labels = cache.accumulated_resid(incl_mid=incl_mid, apply_ln=True, return_labels=True)
        theirs, labels_tl = cache_tl.accumulated_resid(
            incl_mid=incl_mid, apply_ln=True, return_labels=True
        )
        raw = cache.accumulated_resid(incl_mid=incl_mid)
        each = torch.stack([model.ln_final(r) for r in raw])  # the norm run on each entry
    assert labels == labels_tl
    torch.testing.assert_close(ours, theirs, **TOL)
    torch.testing.assert_close(ours, each, **TOL)
    if normalization is not None:
        # not the run's scale: the early entries differ from the linearised reading
        linear = cache.apply_ln_to_stack(raw) + b_of(model.ln_final)
        assert not torch.allclose(linear[0], ours[0], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(linear[-1], ours[-1], **TOL)  # the run's own stream


@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("mlp_input", [False, True])
def test_a_blocks_input_is_read_at_the_runs_scale_as_in_transformer_lens(normalization, mlp_input):
    model, cache, cache_tl = both_runs(normalization)
    for layer in range(model.cfg.n_layers):
        ln = model.blocks[layer].ln2 if mlp_input else model.blocks[layer].ln1
        kw = dict(layer=layer, incl_mid=True, apply_ln=True, mlp_input=mlp_input)
        ours = cache.accumulated_resid(**kw)
        theirs = cache_tl.accumulated_resid(**kw)
        torch.testing.assert_close(ours, theirs * w_of(ln), **TOL)


@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("layer", [None, 0, 1])
def test_decompose_resid_is_linearised_as_in_transformer_lens(normalization, layer):
    model, cache, cache_tl = both_runs(normalization)
    ln = model.ln_final if layer is None else model.blocks[layer].ln1
    ours, labels = cache.decompose_resid(layer=layer, apply_ln=True, return_labels=True)
    theirs, labels_tl = cache_tl.decompose_resid(layer=layer, apply_ln=True, return_labels=True)
    assert labels == labels_tl
    torch.testing.assert_close(ours, theirs * w_of(ln), **TOL)
    # the components add up to what the norm output (its bias b aside)
    stream = cache["resid_post", -1] if layer is None else cache["resid_pre", layer]
    with torch.no_grad():
        out = ln(stream) - b_of(ln)
    torch.testing.assert_close(ours.sum(0), out, **TOL)


@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("layer", [None, 1])
def test_stack_head_results_is_linearised_as_in_transformer_lens(normalization, layer):
    model, cache, cache_tl = both_runs(normalization)
    ln = model.ln_final if layer is None else model.blocks[layer].ln1
    ours, labels = cache.stack_head_results(layer=layer, apply_ln=True, return_labels=True)
    theirs, labels_tl = cache_tl.stack_head_results(
        layer=-1 if layer is None else layer, apply_ln=True, return_labels=True
    )
    assert labels == labels_tl
    torch.testing.assert_close(ours, theirs * w_of(ln), **TOL)
