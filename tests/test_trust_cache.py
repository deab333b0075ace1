"""The cache returns what flowed through each hook point in that run (hook edits
included, later weight changes ignored), lists exactly what it can return, and its
decompositions read a stack as layer ``l`` reads it (TransformerLens's convention)."""

import pytest
import torch
import torch.nn.functional as F

from helpers import random_input, random_model, tiny_cfg
from vecinterp.analysis.attribution import direct_attribution

IDENTITY = 1e-10  # float64: Σ attributions vs ⟨y − b_U, t⟩
EXACT = 1e-12

ACTS = ["relu", "gelu"]


def setup(act_fn="relu", normalization="LN", n_layers=2, **overrides):
    cfg = tiny_cfg(act_fn=act_fn, normalization=normalization, n_layers=n_layers, **overrides)
    model = random_model(cfg, seed=3)
    x = random_input(cfg, batch=3, n_pos=6, seed=4)
    return cfg, model, x


def zero_head_0(result, hook):
    result = result.clone()
    result[:, :, 0] = 0.0
    return result


def zero(act, hook):
    return torch.zeros_like(act)


def triple_head_1(z, hook):
    z = z.clone()
    z[:, :, 1] *= 3.0
    return z


EDITS = [
    ("blocks.0.attn.hook_result", zero_head_0),
    ("blocks.1.mlp.hook_post", zero),
    ("blocks.1.attn.hook_z", triple_head_1),
]


# ---------------------------------------------------------------- hook edits are kept


@pytest.mark.parametrize("act_fn", ACTS)
def test_zeroed_head_result_is_cached_as_zero(act_fn):
    _, model, x = setup(act_fn)
    _, cache = model.run_with_cache(x, fwd_hooks=[EDITS[0]])
    assert bool((cache["result", 0][:, :, 0] == 0).all())
    assert float(cache["result", 0][:, :, 1].abs().max()) > 0
    b_O = model.blocks[0].attn.b_O.detach()
    heads_sum = cache["result", 0].sum(-2) + b_O
    assert float((heads_sum - cache["attn_out", 0]).abs().max()) <= EXACT


@pytest.mark.parametrize("act_fn", ACTS)
def test_zeroed_mlp_post_is_cached_as_zero(act_fn):
    _, model, x = setup(act_fn)
    _, cache = model.run_with_cache(x, fwd_hooks=[EDITS[1]])
    assert "blocks.1.mlp.hook_post" in cache
    assert bool((cache["post", 1] == 0).all())
    assert float(cache["pre", 1].clamp(min=0).max()) > 0  # the edit is what made it zero
    mlp_out = cache["mlp_out", 1]
    assert torch.equal(mlp_out, model.blocks[1].mlp.b_out.detach().expand_as(mlp_out))


def test_edited_z_gives_consistent_results_that_later_weight_changes_leave_alone():
    _, model, x = setup()
    _, cache = model.run_with_cache(x, fwd_hooks=[EDITS[2]])
    W_O = model.blocks[1].attn.W_O.detach().clone()
    model.blocks[1].attn.W_O.data.mul_(2)  # after the run: must not reach the cache
    z, result = cache["z", 1], cache["result", 1]
    for h in range(model.cfg.n_heads):
        assert float((result[:, :, h] - z[:, :, h] @ W_O[h]).abs().max()) <= EXACT
    _, plain = model.run_with_cache(x)  # z is computed before W_O: the same in both
    assert torch.allclose(z[:, :, 1], 3 * plain["z", 1][:, :, 1], rtol=0, atol=EXACT)


# ---------------------------------------------------------------- weights changed afterwards


def change_in_place(model, other):
    model.blocks[0].attn.W_O.data.mul_(2)
    model.pos_embed.W_pos.data.add_(1)  # hook_pos_embed is W_pos broadcast over the batch
    model.blocks[1].mlp.W_out.data.mul_(-1)


def change_by_load_state_dict(model, other):
    model.load_state_dict(other.state_dict())


def change_act_fn(model, other):
    for block in model.blocks:
        block.mlp.act_fn = F.gelu


@pytest.mark.parametrize("change", [change_in_place, change_by_load_state_dict, change_act_fn])
@pytest.mark.parametrize("act_fn", ACTS)
def test_cache_values_do_not_follow_later_weight_changes(change, act_fn):
    cfg, model, x = setup(act_fn)
    _, cache = model.run_with_cache(x)  # default names_filter: nothing read yet
    _, full = model.run_with_cache(x, names_filter=lambda name: True)
    flowed = {name: t.clone() for name, t in full.cache_dict.items()}
    change(model, random_model(cfg, seed=11))
    assert list(cache) == list(flowed)
    for name in flowed:  # first read after the change
        assert torch.equal(cache[name], flowed[name]), name


# ---------------------------------------------------------------- the identity under hooks


@pytest.mark.parametrize("normalization", ["LN", "RMS"])
@pytest.mark.parametrize("act_fn", ACTS)
def test_direct_attribution_identity_holds_under_hook_edits(act_fn, normalization):
    _, model, x = setup(act_fn, normalization, d_out=3)
    with torch.no_grad():
        y, cache = model.run_with_cache(x, fwd_hooks=EDITS)
    t = random_input(model.cfg.replace(d_in=3), batch=3, n_pos=6, seed=8)
    attr = direct_attribution(model, cache, t)
    rhs = ((y - model.unembed.b_U.detach()) * t).sum(-1)
    assert float((attr.total() - rhs).abs().max()) <= IDENTITY
    assert bool((attr["L0H0"] == 0).all())  # the zeroed head contributes nothing


# ---------------------------------------------------------------- the mapping agrees with itself


def assert_consistent(model, cache):
    keys = list(cache.keys())
    assert keys == list(cache) and len(keys) == len(cache) == len(set(keys))
    for name in keys:
        assert name in cache
        assert isinstance(cache[name], torch.Tensor)
    assert [name for name, _ in cache.items()] == keys
    for name in model.hook_dict:
        for key in (name, name + "_grad"):
            if key in cache:
                assert key in keys
            else:
                assert key not in keys
                with pytest.raises(KeyError):
                    cache[key]


FILTERS = {
    "default": None,
    "all": lambda name: True,
    "pre only": lambda name: name.endswith("mlp.hook_pre"),
    "one post": "blocks.0.mlp.hook_post",
    "list": ["blocks.1.mlp.hook_pre", "blocks.1.attn.hook_z", "blocks.0.hook_resid_post"],
}


@pytest.mark.parametrize("act_fn", ACTS)
@pytest.mark.parametrize("names_filter", FILTERS.values(), ids=FILTERS.keys())
def test_keys_len_in_iteration_agree_with_indexing(names_filter, act_fn):
    _, model, x = setup(act_fn)
    _, cache = model.run_with_cache(x, names_filter=names_filter)
    selected = model.hook_names(names_filter)
    assert list(cache) == selected  # in hook order, nothing hidden, nothing extra
    assert_consistent(model, cache)
    # after reading everything: the same list
    assert list(cache) == selected
    assert_consistent(model, cache)


def test_relu_post_is_recomputed_bit_for_bit_and_gelu_post_is_stored():
    for act_fn in ACTS:
        _, model, x = setup(act_fn)
        _, cache = model.run_with_cache(x)
        _, full = model.run_with_cache(x, names_filter=lambda name: True)
        stored = "blocks.0.mlp.hook_post" in cache.cache_dict
        assert stored == (act_fn != "relu")
        assert "blocks.0.attn.hook_result" in cache.cache_dict  # never recomputed
        for ell in range(2):
            assert torch.equal(cache["post", ell], full["post", ell])
            assert torch.equal(cache["result", ell], full["result", ell])
        moved = model.run_with_cache(x)[1].to("cpu")
        assert list(moved) == list(cache) and torch.equal(moved["post", 1], full["post", 1])


def test_incl_bwd_caches_every_activation_and_its_gradient():
    _, model, x = setup()
    halve = ("blocks.1.mlp.hook_post", lambda act, hook: act / 2)
    _, cache = model.run_with_cache(
        x, incl_bwd=True, loss_fn=lambda y: y.pow(2).sum(), fwd_hooks=[halve]
    )
    assert_consistent(model, cache)
    for name in model.hook_dict:
        assert name in cache.cache_dict and name + "_grad" in cache
    _, plain = model.run_with_cache(x)
    assert torch.equal(cache["post", 1], plain["post", 1] / 2)
    assert cache["blocks.1.mlp.hook_post_grad"].shape == cache["post", 1].shape


def test_start_at_layer_lists_only_what_ran():
    _, model, x = setup()
    _, full = model.run_with_cache(x)
    _, cache = model.run_with_cache(full["resid_pre", 1], start_at_layer=1)
    assert list(cache) == [n for n in model.hook_dict if not n.startswith(("hook_", "blocks.0"))]
    assert_consistent(model, cache)
    assert torch.equal(cache["post", 1], full["post", 1])


# ---------------------------------------------------------------- apply_ln: as layer l reads it


def by_hand(model, x, ell, mlp_input=False):
    """Block ``ell``'s ln1 (ln2) scale and w of the stream ``x``, computed from scratch."""
    ln = model.blocks[ell].ln2 if mlp_input else model.blocks[ell].ln1
    kind = model.cfg.normalization
    centred = x - x.mean(-1, keepdim=True) if kind in ("LN", "LNPre") else x
    scale = (centred.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    w = ln.w.detach() if kind in ("LN", "RMS") else torch.ones(model.cfg.d_model).double()
    b = ln.b.detach() if kind == "LN" else torch.zeros(model.cfg.d_model).double()
    return scale, w, b


def read(stack, scale, w, centre):
    if centre:
        stack = stack - stack.mean(-1, keepdim=True)
    return stack / scale * w


@pytest.mark.parametrize("normalization", ["LN", "LNPre", "RMS", "RMSPre"])
def test_apply_ln_reads_the_stack_as_block_l_reads_it(normalization):
    cfg, model, x = setup(normalization=normalization, n_layers=3)
    _, cache = model.run_with_cache(x)
    centre = normalization.startswith("LN")
    for ell in range(cfg.n_layers):
        scale, w, b = by_hand(model, cache["resid_pre", ell], ell)
        with torch.no_grad():
            ln1_out = model.blocks[ell].ln1(cache["resid_pre", ell])
        parts = cache.decompose_resid(layer=ell, apply_ln=True)
        expected = read(cache.decompose_resid(layer=ell), scale, w, centre)
        assert float((parts - expected).abs().max()) <= EXACT
        assert float((parts.sum(0) + b - ln1_out).abs().max()) <= EXACT
        acc = cache.accumulated_resid(layer=ell, incl_mid=True, apply_ln=True)
        expected = read(cache.accumulated_resid(layer=ell, incl_mid=True), scale, w, centre)
        assert float((acc - expected).abs().max()) <= EXACT
        assert float((acc[-1] + b - ln1_out).abs().max()) <= EXACT
        heads = cache.stack_head_results(layer=ell, apply_ln=True)
        expected = read(cache.stack_head_results(layer=ell), scale, w, centre)
        assert heads.shape[0] == ell * cfg.n_heads
        assert torch.allclose(heads, expected, rtol=0, atol=EXACT)
        # the MLP's input: ln2 of block ell, over the stream that ends with attn_out
        scale2, w2, b2 = by_hand(model, cache["resid_mid", ell], ell, mlp_input=True)
        with torch.no_grad():
            ln2_out = model.blocks[ell].ln2(cache["resid_mid", ell])
        parts, labels = cache.decompose_resid(
            layer=ell, apply_ln=True, mlp_input=True, return_labels=True
        )
        assert labels[-1] == f"{ell}_attn_out"
        raw = cache.decompose_resid(layer=ell, mlp_input=True)
        assert float((parts - read(raw, scale2, w2, centre)).abs().max()) <= EXACT
        assert float((parts.sum(0) + b2 - ln2_out).abs().max()) <= EXACT
        acc, labels = cache.accumulated_resid(
            layer=ell, apply_ln=True, mlp_input=True, return_labels=True
        )
        assert labels[-2:] == [f"{ell}_pre", f"{ell}_mid"]
        assert float((acc[-1] + b2 - ln2_out).abs().max()) <= EXACT
    # the final stream is still read through ln_final, ready for W_U
    y = cache["out"]
    for layer in (None, -1, cfg.n_layers):
        parts = cache.decompose_resid(layer=layer, apply_ln=True)
        normed = parts.sum(0) + (model.ln_final.b.detach() if normalization == "LN" else 0)
        out = normed @ model.unembed.W_U.detach() + model.unembed.b_U.detach()
        assert float((out - y).abs().max()) <= EXACT


def test_no_head_before_block_0_is_an_empty_stack():
    cfg, model, x = setup()
    _, cache = model.run_with_cache(x)
    for apply_ln in (False, True):
        stack, labels = cache.stack_head_results(layer=0, apply_ln=apply_ln, return_labels=True)
        assert stack.shape == (0, 3, 6, cfg.d_model) and labels == []
        stack, labels = cache.decompose_resid(
            layer=0, incl_embeds=False, apply_ln=apply_ln, return_labels=True
        )
        assert stack.shape == (0, 3, 6, cfg.d_model) and labels == []


def test_mlp_input_needs_a_block_with_an_mlp():
    _, model, x = setup()
    _, cache = model.run_with_cache(x)
    with pytest.raises(ValueError, match="mlp_input.*layer must be a block 0..1"):
        cache.decompose_resid(mlp_input=True)
    cfg, model, x = setup(attn_only=True)
    _, cache = model.run_with_cache(x)
    with pytest.raises(ValueError, match="attn_only"):
        cache.accumulated_resid(layer=0, mlp_input=True)


# ---------------------------------------------------------------- one label scheme


@pytest.mark.parametrize("attn_only", [False, True])
def test_direct_attribution_labels_are_the_decomposition_labels(attn_only):
    cfg, model, x = setup(attn_only=attn_only, d_out=3)
    y, cache = model.run_with_cache(x)
    t = torch.ones_like(y)
    _, resid_labels = cache.decompose_resid(return_labels=True)
    _, head_labels = cache.stack_head_results(return_labels=True)
    layers = direct_attribution(model, cache, t, components="layers")
    assert list(layers.labels) == [*resid_labels, "ln_final_b"]
    heads = direct_attribution(model, cache, t, components="heads")
    assert list(heads.labels) == head_labels
    full = direct_attribution(model, cache, t)
    assert full.by_layer().labels == layers.labels
    assert torch.allclose(full.by_layer().values, layers.values, rtol=0, atol=EXACT)
    assert [label for label in full.labels if label.endswith("_b_O")] == ["0_b_O", "1_b_O"]


def test_old_attribution_labels_still_index_with_a_warning():
    _, model, x = setup(d_out=3)
    y, cache = model.run_with_cache(x)
    attr = direct_attribution(model, cache, torch.ones_like(y))
    layers = attr.by_layer()
    for old, new, result in [
        ("L1_mlp", "1_mlp_out", attr),
        ("L0_b_O", "0_b_O", attr),
        ("L0_attn", "0_attn_out", layers),
    ]:
        with pytest.warns(DeprecationWarning, match=f"'{old}' is now '{new}'"):
            assert torch.equal(result[old], result[new])


# ---------------------------------------------------------------- messages


def test_messages_name_what_is_wrong():
    _, model, x = setup()
    _, cache = model.run_with_cache(x)
    with pytest.raises(KeyError, match=r"needs a layer index: use cache\['pattern', 0\]"):
        cache["pattern"]
    with pytest.raises(
        ValueError, match=r"layer 5 out of range for a 2-layer model; use 0\.\.1 or -2\.\.-1"
    ):
        cache["pattern", 5]
    with pytest.raises(KeyError, match=r"no such hook point"):
        cache["rot_q", 0]
    with pytest.raises(
        TypeError, match=r"run_with_cache\(\) got an unexpected keyword argument 'remove_batch_dim'"
    ):
        model.run_with_cache(x, remove_batch_dim=True)
