"""The cache you can trust, round three (issue 25, items 4, 5 and 15): PyTorch's own module
hooks on a hook point, a module spliced in at an attention hook point, and weight writes
that PyTorch's version counter does not see.

Expected values come from an independent computation: ``PlainTransformer`` (a plain
PyTorch model of the same math) built from an edited state dict, or the model's own
submodules called directly on a cached input.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules import module as torch_module

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg
from vecinterp.testing import PlainTransformer

ATOL = 1e-10  # float64, PlainTransformer's fused kernels vs ours: agree to ~1e-15
CLOSE = dict(atol=1e-12, rtol=0)  # float64, one computation by two routes


def plain(model: vi.HookedVectorTransformer, **scaled: float) -> PlainTransformer:
    """A plain model of ``model``'s weights, the named tensors multiplied by a factor."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, factor in scaled.items():
        sd[name.replace("__", ".")] *= factor
    return PlainTransformer(model.cfg, sd)


# -- item 4: PyTorch's module hooks on a hook point --------------------------------------------


def _attach_doubling(model: vi.HookedVectorTransformer, how: str):
    """Double what flows through ``blocks.0.hook_attn_out`` with a PyTorch module hook;
    returns the handle."""
    point = model.blocks[0].hook_attn_out
    if how == "forward_hook":
        return point.register_forward_hook(lambda module, args, out: out * 2)
    if how == "forward_pre_hook":
        return point.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    assert how == "global_forward_hook"
    return torch_module.register_module_forward_hook(
        lambda module, args, out: out * 2 if module is point else None
    )


@pytest.mark.parametrize("how", ["forward_hook", "forward_pre_hook", "global_forward_hook"])
def test_the_cache_holds_what_a_pytorch_hook_let_flow(how):
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    handle = _attach_doubling(model, how)
    try:
        y, cache = model.run_with_cache(x)
    finally:
        handle.remove()
    # doubling attn_out is doubling W_O and b_O of layer 0
    with torch.no_grad():
        want = plain(model, blocks__0__attn__W_O=2, blocks__0__attn__b_O=2)(x)
        block = model.blocks[0]
        attn_out = 2 * block.attn(block.ln1(cache["resid_pre", 0]))
    torch.testing.assert_close(y, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(cache["attn_out", 0], attn_out, **CLOSE)
    assert cache.edited_points == {"blocks.0.hook_attn_out"}
    assert "blocks.0.hook_attn_out" in cache.hooked_points
    parts = cache.decompose_resid()  # an edited component keeps the sum exact
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], **CLOSE)


def test_a_pytorch_hook_writing_in_place_leaves_the_earlier_entry_as_it_flowed():
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)

    # block 1 receives the very tensor block 0 put out, cached as resid_post of block 0
    def halve_in_place(module, args, out):
        out.mul_(0.5)  # returns None: the tensor that flowed is edited, not replaced

    handle = model.blocks[1].hook_resid_pre.register_forward_hook(halve_in_place)
    try:
        _, cache = model.run_with_cache(x)
    finally:
        handle.remove()
    with torch.no_grad():
        block_0_out = model(x, stop_at_layer=1)
    torch.testing.assert_close(cache["resid_post", 0], block_0_out, **CLOSE)
    torch.testing.assert_close(cache["resid_pre", 1], 0.5 * block_0_out, **CLOSE)
    assert cache.edited_points == {"blocks.1.hook_resid_pre"}


def test_a_pytorch_hook_on_a_relu_output_is_not_recomputed_away():
    cfg = tiny_cfg(act_fn="relu")
    model, x = random_model(cfg), random_input(cfg)
    handle = model.blocks[0].mlp.hook_post.register_forward_hook(lambda m, a, out: 3 * out)
    try:
        _, cache = model.run_with_cache(x)
    finally:
        handle.remove()
    torch.testing.assert_close(cache["post", 0], 3 * F.relu(cache["pre", 0]), **CLOSE)
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        mlp_out = (3 * F.relu(cache["pre", 0])) @ mlp.W_out + mlp.b_out
    torch.testing.assert_close(cache["mlp_out", 0], mlp_out, **CLOSE)
    assert cache.edited_points == {"blocks.0.mlp.hook_post"}


def test_a_pytorch_backward_hook_on_a_point_is_not_an_edit():
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    y_clean, clean = model.run_with_cache(x)
    point = model.blocks[0].hook_attn_out
    handle = point.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    try:
        y, cache = model.run_with_cache(x)
    finally:
        handle.remove()
    assert cache.edited_points == frozenset()
    assert torch.equal(y, y_clean)  # the same kernels on the same data
    assert torch.equal(cache["attn_out", 0], clean["attn_out", 0])


# -- item 5: a module spliced in at an attention hook point ------------------------------------


class ZeroPoint(vi.HookPoint):
    """A hook point that lets nothing through."""

    def forward(self, x):
        return torch.zeros_like(super().forward(x))


class Zero(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


@pytest.mark.parametrize("spliced", [ZeroPoint, Zero], ids=["HookPoint_subclass", "nn_Module"])
@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_a_module_spliced_in_at_an_attention_point_always_runs(spliced, positional):
    cfg = tiny_cfg(positional=positional)
    model, x = random_model(cfg), random_input(cfg)
    model.blocks[0].attn.hook_result = spliced()  # every head's result zeroed: attn_out = b_O
    with torch.no_grad():
        want = plain(model, blocks__0__attn__W_O=0)(x)
        idle = model(x)
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: None)]):
            watched = model(x)
    torch.testing.assert_close(idle, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(watched, want, atol=ATOL, rtol=0)


# -- item 15: weight writes that PyTorch's version counter does not see ----------------------

READ = ["ln_final.w", "ln_final.b", "unembed.W_U", "blocks.0.attn.b_O", "blocks.1.ln1.w"]


def _tensor(model: torch.nn.Module, name: str) -> torch.Tensor:
    return dict(model.named_parameters())[name]


@pytest.mark.parametrize("name", READ)
def test_a_data_write_into_a_weight_an_analysis_reads_is_refused(name):
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    y, cache = model.run_with_cache(x)
    targets = torch.randn_like(y)
    vi.direct_attribution(model, cache, targets)  # accepted before the write
    p = _tensor(model, name)
    version = p._version
    p.data[0] += 1.0  # bypasses the version counter
    assert p._version == version
    with pytest.raises(ValueError, match=rf"{name} \(its values: written through \.data"):
        vi.direct_attribution(model, cache, targets)
    with pytest.raises(ValueError, match=rf"{name} \(its values"):
        copy.deepcopy(cache).decompose_resid(layer=1, apply_ln=True)


def test_a_data_write_into_a_weight_no_analysis_reads_changes_no_number():
    cfg = tiny_cfg()
    model, x = random_model(cfg), random_input(cfg)
    y, cache = model.run_with_cache(x)
    targets = torch.randn_like(y)
    before = vi.direct_attribution(model, cache, targets)
    model.blocks[0].attn.W_Q.data[0] += 1.0  # not read: the cached results hold its effect
    after = vi.direct_attribution(model, cache, targets)
    assert torch.equal(after.values, before.values)  # the same kernels on the same data
