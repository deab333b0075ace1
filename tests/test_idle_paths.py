"""The paths a forward pass takes when nothing watches a hook point compute the same bits
as the hooked path: every analysis compares a clean run (often with no hook at all) with
a patched one (hooks somewhere), so the two must not differ by kernel choice."""

import threading

import pytest
import torch

import vecinterp as vi
from helpers import all_option_cfgs, random_input, random_model, tiny_cfg
from vecinterp.model.components import attention as attention_module
from vecinterp.model.components.rotary import Rotary

CFGS = list(all_option_cfgs())


@pytest.fixture
def idle_calls(monkeypatch):
    """Counts the attention layers that took the idle path."""
    calls = []
    original = attention_module.Attention._forward_idle

    def counted(self, x):
        calls.append(self)
        return original(self, x)

    monkeypatch.setattr(attention_module.Attention, "_forward_idle", counted)
    return calls


def _watch_everything(model):
    """A read-only hook on every hook point: the hooked path everywhere, no value edited."""
    return model.hooks(fwd_hooks=[(lambda name: True, lambda t, hook: None)])


def _run(model, x, targets):
    model.zero_grad(set_to_none=True)
    out, loss = model(x, targets=targets, return_type="both")
    loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("index", range(0, len(CFGS), 3))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_idle_and_hooked_paths_agree_to_the_bit_outputs_and_gradients(index, dtype, idle_calls):
    cfg = CFGS[index]
    model = random_model(cfg, seed=index, dtype=dtype)
    for batch, n_pos in [(3, cfg.n_ctx), (1, 1), (2, 4)]:
        x = random_input(cfg, batch=batch, n_pos=n_pos, seed=index, dtype=dtype)
        targets = random_input(cfg, batch=batch, n_pos=n_pos, seed=index + 1, dtype=dtype)[
            ..., :1
        ].expand(-1, -1, cfg.d_out)
        idle_calls.clear()
        out_idle, grads_idle = _run(model, x, targets)
        assert len(idle_calls) == cfg.n_layers
        idle_calls.clear()
        with _watch_everything(model):
            out_hooked, grads_hooked = _run(model, x, targets)
        assert idle_calls == []
        assert torch.equal(out_idle, out_hooked)
        for name, grad in grads_idle.items():
            assert torch.equal(grad, grads_hooked[name]), name


def test_a_hook_in_one_layer_leaves_the_other_layers_idle_and_their_bits_unchanged(idle_calls):
    cfg = tiny_cfg(n_layers=3)
    model = random_model(cfg)
    x = random_input(cfg)
    _, clean = model.run_with_cache(x)
    doubled = []

    def double(pattern, hook):
        doubled.append(hook.name)
        return pattern * 2

    idle_calls.clear()
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", double)]):
        patched = model(x, stop_at_layer=2)
    assert doubled == ["blocks.1.attn.hook_pattern"]
    assert idle_calls == [model.blocks[0].attn]  # layer 2 is not run
    with _watch_everything(model):
        with model.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", double)]):
            patched_hooked = model(x, stop_at_layer=2)
    assert torch.equal(patched, patched_hooked)
    assert not torch.equal(patched, clean["blocks.1.hook_resid_post"])


def test_run_with_cache_records_every_attention_activation(idle_calls):
    cfg = tiny_cfg(positional="rotary")
    model = random_model(cfg)
    x = random_input(cfg)
    idle_calls.clear()
    out, cache = model.run_with_cache(x)
    assert idle_calls == []
    for name in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z"):
        assert f"blocks.0.attn.hook_{name}" in cache
    assert torch.equal(out, model(x))


def test_caching_only_the_residual_stream_leaves_attention_idle_with_the_same_bits(idle_calls):
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    _, everything = model.run_with_cache(x)
    idle_calls.clear()
    out, resid = model.run_with_cache(x, names_filter=lambda name: "resid" in name)
    assert idle_calls == [block.attn for block in model.blocks]
    assert set(resid.keys()) == {k for k in everything.keys() if "resid" in k}
    for key in resid.keys():
        assert torch.equal(resid[key], everything[key]), key
    assert torch.equal(out, model(x))


@pytest.mark.parametrize(
    "register",
    [
        lambda point, seen: point.register_forward_hook(lambda m, a, o: seen.append(o.shape)),
        lambda point, seen: point.register_forward_pre_hook(lambda m, a: seen.append(1)),
        lambda point, seen: torch.nn.modules.module.register_module_forward_hook(
            lambda m, a, o: seen.append(1) if m is point else None
        ),
    ],
    ids=["forward_hook", "forward_pre_hook", "global_forward_hook"],
)
def test_pytorch_module_hooks_on_an_attention_hook_point_are_called(register, idle_calls, request):
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    seen: list = []
    handle = register(model.blocks[1].attn.hook_pattern, seen)
    try:
        idle_calls.clear()
        model(x)
    finally:
        handle.remove()
    assert len(seen) == 1
    # a global hook watches every module: no layer is idle then
    idle_layers = [] if "global" in request.node.callspec.id else [model.blocks[0].attn]
    assert idle_calls == idle_layers


def test_another_threads_scoped_hook_takes_this_thread_off_the_idle_path_but_is_not_called(
    idle_calls,
):
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    clean = model(x)
    called, entered, release = [], threading.Event(), threading.Event()

    def other_thread():
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: called.append(1))]):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert entered.wait(10)
        idle_calls.clear()
        out = model(x)
    finally:
        release.set()
        thread.join()
    assert called == []
    assert idle_calls == [model.blocks[1].attn]
    assert torch.equal(out, clean)


def _tables_by_definition(cfg, n_pos, dtype):
    half = cfg.d_head // 2
    inv = cfg.rotary_base ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.d_head)
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float64), inv).repeat(1, 2)
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotary_tables_are_the_definition_rounded_once_and_kept(dtype):
    cfg = tiny_cfg(positional="rotary", d_head=6, rotary_base=500.0)
    rotary = Rotary(cfg)
    for n_pos in (1, 5, cfg.n_ctx):
        cos, sin = rotary.tables(n_pos, torch.device("cpu"), dtype)
        want_cos, want_sin = _tables_by_definition(cfg, n_pos, dtype)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        assert rotary.tables(n_pos, torch.device("cpu"), dtype)[0] is cos
    # rotating by hand with the definition's tables: the same bits
    x = torch.randn(2, 5, 3, 6, dtype=torch.float64).to(dtype)
    cos, sin = _tables_by_definition(cfg, 5, dtype)
    by_hand = x * cos + torch.cat([-x[..., 3:], x[..., :3]], dim=-1) * sin
    assert torch.equal(rotary(x), by_hand)


def test_rotary_tables_first_made_under_inference_mode_serve_a_later_backward():
    cfg = tiny_cfg(positional="rotary")
    model = random_model(cfg)
    x = random_input(cfg)
    with torch.inference_mode():
        model(x)
    loss = model(x, targets=torch.zeros(3, cfg.n_ctx, cfg.d_out, dtype=x.dtype), return_type="loss")
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_rotary_model_moved_to_another_dtype_uses_tables_of_that_dtype():
    cfg = tiny_cfg(positional="rotary")
    model = random_model(cfg, dtype=torch.float64)
    x = random_input(cfg)
    model(x)
    fresh = vi.HookedVectorTransformer(cfg, dtype=torch.float32)
    fresh.load_state_dict(model.state_dict())
    model.to(torch.float32)
    assert torch.equal(model(x.float()), fresh(x.float()))
