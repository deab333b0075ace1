"""Hook names you can trust: they follow the live module tree, whatever edited it, and a
hook point has one name (issue 25, items 1 and 2; issue 24's hook-name errors).

Each hooked result is compared with an independent computation: ``PlainTransformer`` (a
plain PyTorch model of the same math) built from the edited model's state dict, or
PyTorch's own ``named_modules()`` walk for the names.
"""

import copy
import gc

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg
from vecinterp.testing import PlainTransformer

ATOL = 1e-10  # float64, PlainTransformer's fused kernels vs ours: agree to ~1e-15


def _zero(act, hook):
    return torch.zeros_like(act)


def plain_without_attention(model: vi.HookedVectorTransformer, layer: int) -> PlainTransformer:
    """A plain model of ``model``'s weights in which block ``layer``'s attention writes
    nothing (what zeroing its ``hook_attn_out`` does)."""
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd[f"blocks.{layer}.attn.W_O"].zero_()
    sd[f"blocks.{layer}.attn.b_O"].zero_()
    return PlainTransformer(model.cfg, sd)


def walked_points(model: torch.nn.Module) -> dict[str, vi.HookPoint]:
    """The hook points by name as PyTorch's own walk of the module tree finds them."""
    return {n: m for n, m in model.named_modules() if isinstance(m, vi.HookPoint)}


# -- item 2: the names follow the tree, whatever edited it ---------------------------------


def test_a_layer_swap_by_pop_and_insert_moves_hooks_and_cache_entries_by_name():
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    model.hook_dict  # names given before the swap
    first = model.blocks.pop(0)
    model.blocks.insert(1, first)  # the two layers swapped
    for layer in range(cfg.n_layers):
        with torch.no_grad():
            y = model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.hook_attn_out", _zero)])
            want = plain_without_attention(model, layer)(x)
        torch.testing.assert_close(y, want, atol=ATOL, rtol=0)
    _, cache = model.run_with_cache(x)
    with torch.no_grad():
        entering_1 = model(x, stop_at_layer=1)  # what block 0 (the former block 1) puts out
    torch.testing.assert_close(cache["resid_post", 0], entering_1, atol=ATOL, rtol=0)
    assert len(cache) == len(walked_points(model))
    assert first.attn.hook_z.name == "blocks.1.attn.hook_z"


def _edit(model: vi.HookedVectorTransformer, how: str, donor: vi.HookedVectorTransformer) -> None:
    if how == "del":
        del model.blocks[0]
    elif how == "pop":
        model.blocks.pop(0)
    elif how == "insert":
        model.blocks.insert(0, copy.deepcopy(donor.blocks[1]))
    elif how == "delattr":
        del model.blocks[1].attn.hook_z
    elif how == "modules_dict":  # a write into PyTorch's private dict: no method at all
        model.blocks[0].attn._modules["hook_z"] = vi.HookPoint()
    elif how == "point_gains_a_child":
        model.blocks[0].hook_resid_pre.add_module("extra", vi.HookPoint())
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["del", "pop", "insert", "delattr", "modules_dict", "point_gains_a_child"]
)
def test_hook_dict_is_the_live_tree_after_any_edit(how):
    model, donor = random_model(tiny_cfg()), random_model(tiny_cfg(), seed=7)
    before = dict(model.hook_dict)  # names given after every module was built
    _edit(model, how, donor)
    assert model.hook_dict == walked_points(model) != before
    for name, point in model.hook_dict.items():
        assert point.name == name


def test_after_a_block_is_deleted_the_forward_and_an_ablation_refuse():
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    model.hook_dict
    del model.blocks[0]
    assert model.hook_dict["blocks.0.attn.hook_z"] is model.blocks[0].attn.hook_z
    with pytest.raises(ValueError, match=r"model\.blocks holds 1 blocks but cfg\.n_layers is 2"):
        model(x)
    with pytest.raises(ValueError, match=r"cfg\.n_layers is 2"):
        vi.ablate_heads(model, x, [(0, 0)], kind="zero")


# -- item 1 and its kin: a hook point has one name -----------------------------------------


def test_a_module_placed_twice_in_one_model_is_refused_by_name_and_runs_plainly():
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    model.blocks[1].attn = model.blocks[0].attn
    twice = r"both as 'blocks\.0\.attn' and as 'blocks\.1\.attn'"
    with pytest.raises(ValueError, match=twice):
        model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_z", _zero)])
    with pytest.raises(ValueError, match=twice):
        model.run_with_cache(x)
    with pytest.raises(ValueError, match=twice):
        model.hook_dict
    sd = {k: v.clone() for k, v in model.state_dict().items()}  # the state dict has both
    with torch.no_grad():
        torch.testing.assert_close(model(x), PlainTransformer(cfg, sd)(x), atol=ATOL, rtol=0)


def test_a_module_shared_between_two_models_is_refused_by_both_until_copied():
    cfg = tiny_cfg()
    a, b, x = random_model(cfg, seed=0), random_model(cfg, seed=1), random_input(cfg)
    a.blocks[0].attn = b.blocks[1].attn  # by reference, no deepcopy
    for _ in range(2):  # the loop: the same analyses on both models, twice
        with pytest.raises(ValueError, match=r"'blocks\.0\.attn\.hook_q' of this .* also "):
            a.run_with_cache(x)
        with pytest.raises(ValueError, match=r"'blocks\.1\.attn\.hook_q' of this .* also "):
            b.run_with_cache(x)
        with pytest.raises(ValueError, match="copy.deepcopy"):
            vi.ablate_heads(a, x, [(0, 0)], kind="zero")
        with pytest.raises(ValueError, match="copy.deepcopy"):
            vi.ablate_heads(b, x, [(1, 0)], kind="zero")
    a.blocks[0].attn = copy.deepcopy(b.blocks[1].attn)
    for model, layer in ((a, 0), (b, 1), (a, 0)):
        _, cache = model.run_with_cache(x)
        assert list(cache) == list(walked_points(model))
        with torch.no_grad():
            y = model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.hook_attn_out", _zero)])
            want = plain_without_attention(model, layer)(x)
        torch.testing.assert_close(y, want, atol=ATOL, rtol=0)


def test_the_model_that_gave_a_shared_module_keeps_its_own_names_until_the_other_looks():
    cfg = tiny_cfg()
    a, b, x = random_model(cfg, seed=0), random_model(cfg, seed=1), random_input(cfg)
    a.blocks[0].attn = b.blocks[1].attn
    with torch.no_grad():  # b has not seen the sharing yet: its names are its own, right
        y = b.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_attn_out", _zero)])
        want = plain_without_attention(b, 1)(x)
    torch.testing.assert_close(y, want, atol=ATOL, rtol=0)
    assert b.blocks[1].attn.hook_z.name == "blocks.1.attn.hook_z"
    with pytest.raises(ValueError, match="copy.deepcopy"):
        a.hook_dict
    with pytest.raises(ValueError, match=r"'blocks\.1\.attn\.hook_q' of this .* also "):
        b.hook_dict  # from a's first lookup on, b refuses too


def test_a_module_taken_from_a_model_that_is_gone_names_its_points_anew():
    cfg = tiny_cfg()
    a, x = random_model(cfg), random_input(cfg)
    b = random_model(cfg, seed=1)
    b.hook_dict
    a.blocks[0].attn = b.blocks[1].attn
    del b
    gc.collect()
    with torch.no_grad():
        y = a.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_attn_out", _zero)])
        want = plain_without_attention(a, 0)(x)
    torch.testing.assert_close(y, want, atol=ATOL, rtol=0)
    assert a.blocks[0].attn.hook_z.name == "blocks.0.attn.hook_z"


def test_a_deep_copy_names_its_own_points():
    model = random_model(tiny_cfg())
    model.hook_dict
    twin = copy.deepcopy(model)
    assert twin.hook_dict == walked_points(twin)
    assert not set(map(id, twin.hook_dict.values())) & set(map(id, model.hook_dict.values()))
    model.run_with_cache(random_input(model.cfg))  # neither refuses the other
    twin.run_with_cache(random_input(model.cfg))


# -- issue 24: what an unknown name is told --------------------------------------------------


def test_a_block_that_does_not_exist_is_named_as_such():
    model = random_model(tiny_cfg())
    with pytest.raises(ValueError, match=r"this model has no block 5, its blocks are 0\.\.1"):
        model.run_with_hooks(random_input(model.cfg), fwd_hooks=[("blocks.5.attn.hook_z", _zero)])


def test_a_bare_leaf_name_lists_its_full_names():
    model = random_model(tiny_cfg())
    with pytest.raises(ValueError) as err:
        model.hook_point("hook_z")
    message = str(err.value)
    assert "'blocks.0.attn.hook_z'" in message and "'blocks.1.attn.hook_z'" in message
    assert "blocks.{l}.attn.hook_z" in message and "hook_embed" not in message
