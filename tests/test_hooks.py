"""Hook points and hook management: edits, firing, shapes, removal, caching, gradients."""

import re
from collections import Counter

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg
from vecinterp.testing import PlainTransformer

F64 = torch.float64


def no_hooks_left(model: vi.HookedVectorTransformer) -> bool:
    return not any(hp.has_hooks for hp in model.hook_dict.values())


def expected_hook_shapes(
    cfg: vi.VectorTransformerConfig, batch: int, n_pos: int
) -> dict[str, tuple[int, ...]]:
    """Every hook name a model of ``cfg`` has, with the documented activation shape."""
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    resid = (batch, n_pos, d)
    shapes: dict[str, tuple[int, ...]] = {"hook_embed": resid}
    if cfg.positional in ("learned", "sinusoidal"):
        shapes["hook_pos_embed"] = resid

    def norm(prefix: str) -> None:
        if cfg.normalization is not None:
            shapes[f"{prefix}.hook_scale"] = (batch, n_pos, 1)
            shapes[f"{prefix}.hook_normalized"] = resid

    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        shapes[b + "hook_resid_pre"] = resid
        norm(b + "ln1")
        for name in ["q", "k", "v", "z"] + (
            ["rot_q", "rot_k"] if cfg.positional == "rotary" else []
        ):
            shapes[b + f"attn.hook_{name}"] = (batch, n_pos, h, dh)
        shapes[b + "attn.hook_attn_scores"] = (batch, h, n_pos, n_pos)
        shapes[b + "attn.hook_pattern"] = (batch, h, n_pos, n_pos)
        shapes[b + "attn.hook_result"] = (batch, n_pos, h, d)
        shapes[b + "hook_attn_out"] = resid
        if not cfg.attn_only:
            shapes[b + "hook_resid_mid"] = resid
            norm(b + "ln2")
            shapes[b + "mlp.hook_pre"] = (batch, n_pos, cfg.d_mlp)
            shapes[b + "mlp.hook_post"] = (batch, n_pos, cfg.d_mlp)
            shapes[b + "hook_mlp_out"] = resid
        shapes[b + "hook_resid_post"] = resid
    norm("ln_final")
    shapes["unembed.hook_out"] = (batch, n_pos, cfg.d_out)
    return shapes


HOOK_CFGS = [
    tiny_cfg(),
    tiny_cfg(attn_only=True),
    tiny_cfg(positional="rotary", normalization="RMS"),
    tiny_cfg(normalization=None, positional="none", causal=False),
    tiny_cfg(normalization="LNPre", positional="sinusoidal", n_layers=1, n_heads=3),
]


def cfg_id(cfg: vi.VectorTransformerConfig) -> str:
    return f"{cfg.normalization}-{cfg.positional}-attn_only={cfg.attn_only}-L{cfg.n_layers}"


# -- which hooks exist, fire, and with which shapes ------------------------------------


@pytest.mark.parametrize("cfg", HOOK_CFGS, ids=cfg_id)
def test_every_hook_fires_once_with_the_documented_shape(cfg):
    model = random_model(cfg)
    n_pos = cfg.n_ctx - 2
    expected = expected_hook_shapes(cfg, batch=2, n_pos=n_pos)
    assert set(model.hook_dict) == set(expected)
    calls: Counter[str] = Counter()
    shapes: dict[str, tuple[int, ...]] = {}

    def record(act, hook):
        calls[hook.name] += 1
        shapes[hook.name] = tuple(act.shape)

    model.run_with_hooks(
        random_input(cfg, batch=2, n_pos=n_pos), fwd_hooks=[(lambda n: True, record)]
    )
    assert calls == Counter({name: 1 for name in expected})
    assert shapes == expected
    assert no_hooks_left(model)


def test_hook_point_names_match_their_module_paths():
    model = random_model(tiny_cfg())
    for name, hp in model.hook_dict.items():
        assert hp.name == name
        assert model.get_submodule(name) is hp


def test_hook_names_are_in_forward_order():
    """``hook_names`` promises forward order; the cache keys follow it."""
    model = random_model(tiny_cfg())
    order: list[str] = []
    model.run_with_hooks(
        random_input(model.cfg),
        fwd_hooks=[(lambda n: True, lambda a, hook: order.append(hook.name))],
    )
    assert model.hook_names() == order


def test_embed_hooks_see_the_embeddings():
    cfg = tiny_cfg(embed_bias=True)
    model = random_model(cfg)
    x = random_input(cfg, n_pos=5)
    _, cache = model.run_with_cache(x, names_filter=["hook_embed", "hook_pos_embed"])
    expected_embed = x @ model.embed.W_E.detach() + model.embed.b_E.detach()
    torch.testing.assert_close(cache["hook_embed"], expected_embed, atol=1e-14, rtol=0)
    pos = model.pos_embed.W_pos.detach()[:5]
    assert cache["hook_pos_embed"].shape == (3, 5, cfg.d_model)
    assert torch.equal(cache["hook_pos_embed"], pos.expand(3, 5, cfg.d_model))


def test_sinusoidal_pos_embed_hook_sees_the_fixed_table():
    cfg = tiny_cfg(positional="sinusoidal")
    model = random_model(cfg)
    _, cache = model.run_with_cache(random_input(cfg, batch=1), names_filter="hook_pos_embed")
    table = cache["hook_pos_embed"][0]
    assert table[0, 0].item() == 0.0 and table[0, 1].item() == 1.0  # sin(0), cos(0)
    assert table[3, 0].item() == pytest.approx(torch.sin(torch.tensor(3.0, dtype=F64)).item())


# -- editing activations ---------------------------------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])
def test_zeroing_attn_out_equals_a_model_without_that_attention(layer):
    cfg = tiny_cfg(embed_bias=True)
    model = random_model(cfg)
    x = random_input(cfg)
    zero = lambda act, hook: torch.zeros_like(act)  # noqa: E731
    with torch.no_grad():
        y = model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.hook_attn_out", zero)])
    # manual recomputation: an independent model whose layer writes nothing from attention
    sd = model.state_dict()
    sd[f"blocks.{layer}.attn.W_O"] = torch.zeros_like(sd[f"blocks.{layer}.attn.W_O"])
    sd[f"blocks.{layer}.attn.b_O"] = torch.zeros_like(sd[f"blocks.{layer}.attn.b_O"])
    with torch.no_grad():
        expected = PlainTransformer(cfg, sd)(x)
        unhooked = model(x)
    torch.testing.assert_close(y, expected, atol=1e-10, rtol=0)
    assert (y - unhooked).abs().max() > 1e-3


def test_scaling_the_pattern_scales_the_heads_contribution():
    """One attention-only layer, no normalization: y = (resid_pre + attn_out) W_U + b_U and
    attn_out - b_O is linear in the pattern."""
    cfg = tiny_cfg(n_layers=1, attn_only=True, normalization=None)
    model = random_model(cfg)
    x = random_input(cfg)
    y, cache = model.run_with_cache(x, names_filter=["blocks.0.hook_attn_out"])
    scaled = model.run_with_hooks(
        x, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda act, hook: 2.5 * act)]
    )
    b_O, W_U = model.blocks[0].attn.b_O.detach(), model.W_U.detach()
    expected = y + 1.5 * (cache["attn_out", 0] - b_O) @ W_U
    torch.testing.assert_close(scaled, expected, atol=1e-10, rtol=0)


def test_scaling_one_heads_pattern_in_place():
    cfg = tiny_cfg(n_layers=1, attn_only=True, normalization=None)
    model = random_model(cfg)
    x = random_input(cfg)
    _, cache = model.run_with_cache(x, names_filter="blocks.0.attn.hook_result")

    def double_head_1(act, hook):
        act[:, 1] *= 2  # editing in place and returning None also works

    with torch.no_grad():
        y = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", double_head_1)])
        y0 = model(x)
    expected = y0 + cache["result", 0][:, :, 1] @ model.W_U.detach()
    torch.testing.assert_close(y, expected, atol=1e-10, rtol=0)


def test_adding_to_the_last_resid_post_shifts_the_output_by_delta_W_U():
    cfg = tiny_cfg(normalization=None)
    model = random_model(cfg)
    x = random_input(cfg)
    delta = torch.randn(
        3, cfg.n_ctx, cfg.d_model, generator=torch.Generator().manual_seed(3), dtype=F64
    )
    with torch.no_grad():
        y = model(x)
        shifted = model.run_with_hooks(
            x, fwd_hooks=[("blocks.1.hook_resid_post", lambda act, hook: act + delta)]
        )
    torch.testing.assert_close(shifted - y, delta @ model.W_U.detach(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("normalization", ["LN", "LNPre"])
def test_adding_a_constant_vector_before_layernorm_changes_nothing(normalization):
    cfg = tiny_cfg(normalization=normalization)
    model = random_model(cfg)
    x = random_input(cfg)
    delta = torch.linspace(-1, 1, cfg.d_model, dtype=F64)
    with torch.no_grad():
        y = model(x)
        shifted = model.run_with_hooks(
            x, fwd_hooks=[("blocks.1.hook_resid_post", lambda act, hook: act + 3.0)]
        )
        moved = model.run_with_hooks(
            x, fwd_hooks=[("blocks.1.hook_resid_post", lambda act, hook: act + delta)]
        )
    torch.testing.assert_close(shifted, y, atol=1e-10, rtol=0)
    assert (moved - y).abs().max() > 1e-6  # a non-constant change does get through


def test_hook_result_sums_to_attn_out_and_reading_it_changes_no_bit():
    cfg = tiny_cfg(embed_bias=True)
    model = random_model(cfg)
    x = random_input(cfg)
    y, cache = model.run_with_cache(
        x, names_filter=["blocks.1.attn.hook_result", "blocks.1.hook_attn_out"]
    )
    assert "blocks.1.attn.hook_result" in cache.cache_dict  # stored, not derived
    assert torch.equal(y, model(x))
    result = cache["result", 1]
    b_O = model.blocks[1].attn.b_O.detach()
    torch.testing.assert_close(result.sum(dim=2) + b_O, cache["attn_out", 1], atol=1e-12, rtol=0)
    # each head's result is z_h W_O[h]
    _, z_cache = model.run_with_cache(x, names_filter="blocks.1.attn.hook_z")
    W_O = model.blocks[1].attn.W_O.detach()
    for head in range(cfg.n_heads):
        expected = z_cache["z", 1][:, :, head] @ W_O[head]
        torch.testing.assert_close(result[:, :, head], expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(y, model(x), atol=1e-12, rtol=0)


def test_editing_hook_result_edits_the_output():
    cfg = tiny_cfg(n_layers=1, attn_only=True, normalization=None)
    model = random_model(cfg)
    x = random_input(cfg)
    _, cache = model.run_with_cache(x, names_filter="blocks.0.attn.hook_result")

    def drop_head_0(act, hook):
        out = act.clone()
        out[:, :, 0] = 0
        return out

    y = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_result", drop_head_0)])
    expected = model(x) - cache["result", 0][:, :, 0] @ model.W_U.detach()
    torch.testing.assert_close(y, expected, atol=1e-10, rtol=0)


def test_hook_point_without_hooks_returns_its_input_object():
    hp = vi.HookPoint()
    x = torch.randn(2, 3)
    assert hp(x) is x
    model = random_model(tiny_cfg())
    act = torch.randn(1, 2, 8, dtype=F64)
    assert model.blocks[0].hook_resid_pre(act) is act
    hp.add_hook(lambda t, hook: None)
    assert hp(x) is x  # a hook returning None keeps the activation


def test_pytorch_module_hooks_on_a_hook_point_still_fire():
    # HookPoint.__call__ skips nn.Module's dispatch only when nothing at all is attached
    model = random_model(tiny_cfg())
    x = random_input(model.cfg, batch=2)
    clean = model(x)
    point = model.blocks[0].hook_attn_out
    seen: list[str] = []
    handles = [
        point.register_forward_pre_hook(lambda mod, args: seen.append("pre")),
        point.register_forward_hook(lambda mod, args, out: out * 2),
    ]
    doubled = model(x)
    assert seen == ["pre"]
    assert not torch.equal(doubled, clean)
    for h in handles:
        h.remove()
    assert torch.equal(model(x), clean)
    grads: list[torch.Tensor] = []
    h = point.register_full_backward_hook(lambda mod, gin, gout: grads.append(gout[0]))
    model(x.requires_grad_(True)).sum().backward()
    h.remove()
    assert len(grads) == 1 and grads[0].shape == (2, x.shape[1], model.cfg.d_model)
    calls: list[str] = []
    g = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: calls.append(type(mod).__name__)
    )
    try:
        model(x.detach())
    finally:
        g.remove()
    assert calls.count("HookPoint") == len(model.hook_dict)


# -- adding and removing hooks --------------------------------------------------------------


def test_run_with_hooks_removes_its_hooks():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    seen = []
    model.run_with_hooks(
        x,
        fwd_hooks=[("hook_embed", lambda a, hook: seen.append(hook.name))],
        bwd_hooks=[("unembed.hook_out", lambda g, hook: None)],
    )
    assert seen == ["hook_embed"]
    assert no_hooks_left(model)
    model(x)
    assert seen == ["hook_embed"]


def test_run_with_hooks_removes_its_hooks_when_the_forward_raises():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)

    def boom(act, hook):
        raise RuntimeError("boom from a hook")

    with pytest.raises(RuntimeError, match="boom from a hook"):
        model.run_with_hooks(
            x,
            fwd_hooks=[("hook_embed", lambda a, hook: None), ("blocks.1.attn.hook_pattern", boom)],
            bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: None)],
        )
    assert no_hooks_left(model)
    with pytest.raises(ValueError, match="n_ctx"):
        model.run_with_hooks(
            random_input(model.cfg, n_pos=9), fwd_hooks=[("hook_embed", lambda a, hook: None)]
        )
    assert no_hooks_left(model)
    model(x)  # the model still works


def test_hooks_context_removes_its_hooks_when_the_block_raises():
    model = random_model(tiny_cfg())
    with pytest.raises(KeyError):
        with model.hooks(fwd_hooks=[("hook_embed", lambda a, hook: None)]):
            assert model.hook_dict["hook_embed"].has_hooks
            raise KeyError("inside the block")
    assert no_hooks_left(model)


def test_nested_hook_contexts_remove_only_their_own_hooks():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    calls: list[str] = []
    outer = ("hook_embed", lambda a, hook: calls.append("outer"))
    inner = [
        ("hook_embed", lambda a, hook: calls.append("inner")),
        ("blocks.0.attn.hook_pattern", lambda a, hook: calls.append("pattern")),
    ]
    with model.hooks(fwd_hooks=[outer]):
        with model.hooks(fwd_hooks=inner):
            model(x)
            assert calls == ["outer", "inner", "pattern"]  # in the order added
        calls.clear()
        model(x)
        assert calls == ["outer"]
        assert not model.hook_dict["blocks.0.attn.hook_pattern"].has_hooks
    calls.clear()
    model(x)
    assert calls == []
    assert no_hooks_left(model)


def test_permanent_hooks_survive_reset_hooks():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    calls: list[str] = []
    model.add_hook("hook_embed", lambda a, hook: calls.append("permanent"), is_permanent=True)
    model.add_hook("blocks.0.hook_resid_post", lambda a, hook: calls.append("temporary"))
    model(x)
    assert calls == ["permanent", "temporary"]
    model.reset_hooks()
    calls.clear()
    model(x)
    assert calls == ["permanent"]
    model.run_with_hooks(x, fwd_hooks=[("hook_embed", lambda a, hook: calls.append("call"))])
    assert calls == ["permanent", "permanent", "call"]  # the call's exit keeps it too
    model.reset_hooks(including_permanent=True)
    calls.clear()
    model(x)
    assert calls == []
    assert no_hooks_left(model)


def test_add_hook_returns_handles_that_remove_the_hook():
    model = random_model(tiny_cfg())
    calls: list[str] = []
    handles = model.add_hook(
        lambda n: n.endswith("hook_resid_pre"), lambda a, hook: calls.append(hook.name)
    )
    assert len(handles) == model.cfg.n_layers
    model(random_input(model.cfg))
    assert calls == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    for handle in handles:
        handle.remove()
        handle.remove()  # twice is harmless
    assert no_hooks_left(model)


def test_a_name_filter_in_fwd_hooks_attaches_to_every_match():
    cfg = tiny_cfg(n_layers=3)
    model = random_model(cfg)
    seen: list[tuple[str, tuple[int, ...]]] = []
    model.run_with_hooks(
        random_input(cfg, batch=2),
        fwd_hooks=[
            (
                lambda n: n.endswith("hook_pattern"),
                lambda a, hook: seen.append((hook.name, a.shape)),
            )
        ],
    )
    shape = (2, cfg.n_heads, cfg.n_ctx, cfg.n_ctx)
    assert seen == [(f"blocks.{layer}.attn.hook_pattern", shape) for layer in range(3)]
    assert no_hooks_left(model)


def test_unknown_hook_name_lists_close_matches():
    model = random_model(tiny_cfg())
    with pytest.raises(ValueError, match=re.escape("'blocks.0.attn.hook_pattern'")) as err:
        model.run_with_hooks(
            random_input(model.cfg), fwd_hooks=[("blocks.0.attn.hook_patern", lambda a, hook: None)]
        )
    assert "unknown hook name 'blocks.0.attn.hook_patern'" in str(err.value)
    assert no_hooks_left(model)


def test_a_hook_returning_a_wrong_shape_raises_and_is_removed():
    model = random_model(tiny_cfg())
    bad = lambda act, hook: act[:, :-1]  # noqa: E731
    with pytest.raises(ValueError, match=r"blocks\.0\.hook_attn_out.*shape \(3, 7, 8\)"):
        model.run_with_hooks(random_input(model.cfg), fwd_hooks=[("blocks.0.hook_attn_out", bad)])
    with pytest.raises(ValueError, match="must return None or a tensor"):
        model.run_with_hooks(
            random_input(model.cfg), fwd_hooks=[("hook_embed", lambda act, hook: 1.0)]
        )
    assert no_hooks_left(model)


# -- run_with_cache -------------------------------------------------------------------------


def test_names_filter_forms_select_exactly_those_names():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    _, cache = model.run_with_cache(x)
    # None: every hook (a relu MLP's hook_post is listed, recomputed when first read)
    assert list(cache.keys()) == list(model.hook_dict)
    _, cache = model.run_with_cache(x, names_filter=lambda n: True)
    assert set(cache.keys()) == set(model.hook_dict)
    _, cache = model.run_with_cache(x, names_filter="blocks.1.attn.hook_q")
    assert list(cache.keys()) == ["blocks.1.attn.hook_q"]
    names = ["blocks.0.hook_resid_post", "hook_embed", "blocks.1.mlp.hook_post"]
    _, cache = model.run_with_cache(x, names_filter=names)
    assert set(cache.keys()) == set(names)
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_scale"))
    assert set(cache.keys()) == {
        "blocks.0.ln1.hook_scale",
        "blocks.0.ln2.hook_scale",
        "blocks.1.ln1.hook_scale",
        "blocks.1.ln2.hook_scale",
        "ln_final.hook_scale",
    }
    _, cache = model.run_with_cache(x, names_filter=[])
    assert len(cache) == 0
    with pytest.raises(ValueError, match="unknown hook name 'blocks.1.hook_resid_psot'"):
        model.run_with_cache(x, names_filter=["hook_embed", "blocks.1.hook_resid_psot"])
    assert no_hooks_left(model)


def test_cached_activations_are_detached_and_equal_what_a_hook_sees():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    seen: dict[str, torch.Tensor] = {}

    def keep(act, hook):
        seen[hook.name] = act.detach().clone()

    model.run_with_hooks(x, fwd_hooks=[(lambda n: True, keep)])
    _, cache = model.run_with_cache(x, names_filter=lambda n: True)
    assert set(cache.keys()) == set(seen) == set(model.hook_dict)
    for name, act in cache.items():
        assert not act.requires_grad, name
        assert torch.equal(act, seen[name]), name


def test_run_with_cache_output_equals_the_plain_forward():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    with torch.no_grad():
        y = model(x)
    y_cached, _ = model.run_with_cache(x)
    assert torch.equal(y_cached, y)
    y_cached, _ = model.run_with_cache(x, names_filter=["hook_embed", "blocks.1.hook_attn_out"])
    assert torch.equal(y_cached, y)
    # the layer always sums the per-head results the same way, hooked or not
    y_all, _ = model.run_with_cache(x, names_filter=lambda n: True)
    assert torch.equal(y_all, y)
    loss, _ = model.run_with_cache(x, targets=torch.zeros_like(y), return_type="loss")
    torch.testing.assert_close(loss, y.pow(2).mean(), atol=1e-12, rtol=0)


def test_run_with_cache_sees_the_edits_of_its_fwd_hooks():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    zero = lambda act, hook: torch.zeros_like(act)  # noqa: E731
    y, cache = model.run_with_cache(x, fwd_hooks=[("blocks.0.hook_mlp_out", zero)])
    assert torch.equal(cache["mlp_out", 0], torch.zeros(3, 7, 8, dtype=F64))
    assert torch.equal(cache["resid_post", 0], cache["resid_mid", 0])
    torch.testing.assert_close(
        y, model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_mlp_out", zero)]), atol=1e-12, rtol=0
    )
    assert no_hooks_left(model)


# -- backward hooks and gradients ---------------------------------------------------------

GRAD_NAMES = [
    "hook_embed",
    "hook_pos_embed",
    "blocks.0.ln1.hook_scale",
    "blocks.0.attn.hook_pattern",
    "blocks.0.attn.hook_v",
    "blocks.1.hook_resid_pre",
    "blocks.1.mlp.hook_post",
    "unembed.hook_out",
]


def loss_of(y: torch.Tensor) -> torch.Tensor:
    targets = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    return vi.masked_mse(y, targets)


def autograd_grads(model, x, names):
    acts: dict[str, torch.Tensor] = {}

    def keep(act, hook):
        acts[hook.name] = act

    y = model.run_with_hooks(x, fwd_hooks=[(n, keep) for n in names])
    grads = torch.autograd.grad(loss_of(y), [acts[n] for n in names])
    return dict(zip(names, grads, strict=True))


def test_bwd_hooks_fire_at_a_later_backward_with_the_autograd_gradient():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    expected = autograd_grads(model, x, GRAD_NAMES)
    seen: dict[str, torch.Tensor] = {}

    def keep_grad(grad, hook):
        seen[hook.name] = grad.clone()

    y = model.run_with_hooks(x, bwd_hooks=[(n, keep_grad) for n in GRAD_NAMES])
    assert seen == {}  # nothing before backward
    assert no_hooks_left(model)  # the hook points are free again, the tensors keep theirs
    loss_of(y).backward()
    assert set(seen) == set(GRAD_NAMES)
    for name in GRAD_NAMES:
        assert seen[name].shape == expected[name].shape, name
        torch.testing.assert_close(seen[name], expected[name], atol=1e-12, rtol=0)
        assert seen[name].abs().max() > 0, name
    model.zero_grad(set_to_none=True)


def test_bwd_hooks_see_the_same_gradient_as_retain_grad():
    model = random_model(tiny_cfg(positional="rotary"))
    x = random_input(model.cfg)
    names = ["blocks.0.attn.hook_rot_q", "blocks.1.hook_attn_out", "ln_final.hook_normalized"]
    acts: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}

    def retain(act, hook):
        act.retain_grad()
        acts[hook.name] = act

    def keep_grad(grad, hook):
        grads[hook.name] = grad.clone()

    y = model.run_with_hooks(
        x, fwd_hooks=[(n, retain) for n in names], bwd_hooks=[(n, keep_grad) for n in names]
    )
    loss_of(y).backward()
    for name in names:
        assert acts[name].grad is not None
        assert torch.equal(grads[name], acts[name].grad), name
    model.zero_grad(set_to_none=True)


def test_a_bwd_hook_can_replace_the_gradient():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    y = model.run_with_hooks(
        x, bwd_hooks=[("blocks.1.hook_resid_pre", lambda g, hook: torch.zeros_like(g))]
    )
    loss_of(y).backward()
    # everything before block 1 only reaches the loss through its resid_pre
    assert torch.equal(model.embed.W_E.grad, torch.zeros_like(model.embed.W_E))
    assert model.blocks[1].mlp.W_in.grad.abs().max() > 0
    model.zero_grad(set_to_none=True)


def test_incl_bwd_caches_autograd_gradients_and_leaves_parameter_grads_alone():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    expected = autograd_grads(model, x, GRAD_NAMES)
    y, cache = model.run_with_cache(x, names_filter=GRAD_NAMES, incl_bwd=True, loss_fn=loss_of)
    assert set(cache.keys()) == set(GRAD_NAMES) | {n + "_grad" for n in GRAD_NAMES}
    for name in GRAD_NAMES:
        grad = cache[name + "_grad"]
        assert grad.shape == cache[name].shape
        assert not grad.requires_grad
        torch.testing.assert_close(grad, expected[name], atol=1e-12, rtol=0)
    assert all(p.grad is None for p in model.parameters())
    torch.testing.assert_close(y, model(x), atol=1e-12, rtol=0)
    assert no_hooks_left(model)


def test_incl_bwd_over_every_hook():
    model = random_model(tiny_cfg(attn_only=True, n_layers=1))
    _, cache = model.run_with_cache(
        random_input(model.cfg), names_filter=lambda n: True, incl_bwd=True, loss_fn=loss_of
    )
    names = set(model.hook_dict)
    assert set(cache.keys()) == names | {n + "_grad" for n in names}
    # d loss / d output of the MSE, by hand
    out = cache["unembed.hook_out"]
    targets = torch.linspace(-1, 1, out.numel(), dtype=F64).reshape(out.shape)
    torch.testing.assert_close(
        cache["unembed.hook_out_grad"], 2 * (out - targets) / out.numel(), atol=1e-14, rtol=0
    )
    assert all(p.grad is None for p in model.parameters())


def test_incl_bwd_without_loss_fn_raises():
    model = random_model(tiny_cfg())
    with pytest.raises(ValueError, match="incl_bwd=True needs loss_fn"):
        model.run_with_cache(random_input(model.cfg), incl_bwd=True)
    assert no_hooks_left(model)


def test_incl_bwd_with_stop_at_layer_caches_the_hooks_that_ran():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    resid, cache = model.run_with_cache(
        x, incl_bwd=True, loss_fn=lambda r: r.pow(2).sum(), stop_at_layer=1
    )
    ran = {n for n in model.hook_dict if not n.startswith(("blocks.1.", "ln_final", "unembed"))}
    # with incl_bwd nothing is left out: gradients cannot be recomputed from other entries
    assert set(cache.keys()) == ran | {n + "_grad" for n in ran}
    assert torch.equal(cache["blocks.0.hook_resid_post"], resid)
    torch.testing.assert_close(
        cache["blocks.0.hook_resid_post_grad"], 2 * resid, atol=1e-12, rtol=0
    )
