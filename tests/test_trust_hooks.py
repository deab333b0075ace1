"""Hooks you can trust: threads, copies, and what a hook may return.

Scoped hooks (``hooks()``, ``run_with_hooks``, ``run_with_cache``) are seen only by the
thread that added them; global hooks (``add_hook``) by every thread. A deep copy carries
the global hooks and none of the scoped ones. A hook's replacement must match the
activation's (or gradient's) shape, dtype and device; a backward hook may return
``(grad,)`` as in TransformerLens.
"""

import copy
import pickle
import re
import threading
from collections.abc import Callable

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg

TIMEOUT = 30  # seconds a barrier waits before the test fails instead of hanging


def no_hooks_left(model: vi.HookedVectorTransformer) -> bool:
    return not any(hp.has_hooks for hp in model.hook_dict.values())


def run_threads(*targets: Callable[[], None]) -> None:
    """Run each target in its own thread, named after it; re-raise the first error."""
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - handed to the main thread
                errors.append(err)

        return run

    threads = [threading.Thread(target=wrap(t), name=t.__name__) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 4)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def zero_head(head: int) -> Callable[[torch.Tensor, object], torch.Tensor]:
    def fn(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = 0
        return z

    return fn


def scale(factor: float) -> Callable[[torch.Tensor, object], torch.Tensor]:
    return lambda act, hook: factor * act


def assert_same_cache(got: vi.ActivationCache, want: vi.ActivationCache, who: str) -> None:
    for layer in range(got.model.cfg.n_layers):  # entries the cache may derive on reading
        assert torch.equal(got["result", layer], want["result", layer]), who
        assert torch.equal(got["post", layer], want["post", layer]), who
    assert sorted(got.keys()) == sorted(want.keys()), who
    for key in want.keys():
        assert torch.equal(got[key], want[key]), f"{who}: {key}"


# -- threads ------------------------------------------------------------------------------
def test_two_threads_caching_with_different_edits_each_get_their_own_result():
    model = random_model(tiny_cfg())
    x_a = random_input(model.cfg, seed=1)
    x_b = random_input(model.cfg, seed=2)
    hooks_a = [("blocks.0.attn.hook_z", zero_head(0))]
    hooks_b = [("blocks.1.hook_resid_mid", scale(2.0)), ("blocks.0.mlp.hook_post", scale(0.0))]
    want_a = model.run_with_cache(x_a, fwd_hooks=hooks_a)
    with model.hooks(fwd_hooks=hooks_b):
        want_b = model.run_with_cache(x_b)
    assert not torch.equal(want_a[0], model(x_a))  # the edits change the outputs
    assert not torch.equal(want_b[0], model(x_b))
    # both threads wait for each other inside their forward pass, every iteration: each
    # passes blocks.0.hook_resid_pre while the other has its hooks attached
    meet = threading.Barrier(2, timeout=TIMEOUT)

    def wait(act: torch.Tensor, hook: object) -> None:
        meet.wait()

    met = [("blocks.0.hook_resid_pre", wait)]
    n_iter = 25

    def thread_a() -> None:
        for _ in range(n_iter):
            y, cache = model.run_with_cache(x_a, fwd_hooks=met + hooks_a)
            assert torch.equal(y, want_a[0])
            assert_same_cache(cache, want_a[1], "thread a")

    def thread_b() -> None:
        for _ in range(n_iter):
            with model.hooks(fwd_hooks=met + hooks_b):
                y, cache = model.run_with_cache(x_b)
            assert torch.equal(y, want_b[0])
            assert_same_cache(cache, want_b[1], "thread b")

    run_threads(thread_a, thread_b)
    assert no_hooks_left(model)


def test_a_plain_forward_in_another_thread_sees_no_scoped_hook_but_every_global_one():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    want = model(x)
    opened, done = threading.Event(), threading.Event()
    scoped_calls: list[str] = []
    global_calls: list[str] = []

    def spy(act: torch.Tensor, hook: object) -> torch.Tensor:
        scoped_calls.append(threading.current_thread().name)
        return torch.zeros_like(act)

    def holder() -> None:
        with model.hooks(fwd_hooks=[(lambda name: True, spy)]):
            opened.set()
            assert done.wait(TIMEOUT)
            model(x)  # the holder's own forward still sees its hooks

    def plain() -> None:
        assert opened.wait(TIMEOUT)
        try:
            for _ in range(3):
                assert torch.equal(model(x), want)
                y, cache = model.run_with_cache(x)
                assert torch.equal(y, want)
                assert torch.equal(cache["hook_embed"], model.embed(x))
        finally:
            done.set()

    handles = model.add_hook(
        "hook_embed", lambda act, hook: global_calls.append(threading.current_thread().name)
    )
    run_threads(holder, plain)
    assert set(scoped_calls) == {"holder"}
    assert len(scoped_calls) == len(model.hook_dict)
    assert global_calls.count("plain") == 6 and global_calls.count("holder") == 1
    for handle in handles:
        handle.remove()
    assert no_hooks_left(model)


def test_scoped_hooks_are_removed_on_error_in_each_thread_without_touching_the_other():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    want = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_attn_out", scale(0.0))])
    meet = threading.Barrier(2, timeout=TIMEOUT)
    failed = threading.Event()

    def failing() -> None:
        def boom(act: torch.Tensor, hook: object) -> None:
            raise RuntimeError("boom from a hook")

        with pytest.raises(RuntimeError, match="boom from a hook"):
            with model.hooks(fwd_hooks=[("hook_embed", lambda a, hook: None)]):
                meet.wait()
                model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_mlp_out", boom)])
        failed.set()

    def holding() -> None:
        with model.hooks(fwd_hooks=[("blocks.1.hook_attn_out", scale(0.0))]):
            meet.wait()
            assert failed.wait(TIMEOUT)
            # the other thread's error and clean-up left this context's hooks alone,
            assert torch.equal(model(x), want)
            # and so does a reset_hooks() called by another thread
            reset = threading.Thread(target=model.reset_hooks)
            reset.start()
            reset.join(TIMEOUT)
            assert torch.equal(model(x), want)
            assert model.hook_dict["blocks.1.hook_attn_out"].has_hooks
            assert not model.hook_dict["hook_embed"].has_hooks
            assert not model.hook_dict["blocks.0.hook_mlp_out"].has_hooks

    run_threads(failing, holding)
    assert no_hooks_left(model)


def test_reset_hooks_removes_the_callers_scoped_hooks_and_those_of_ended_threads():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    want = model(x)
    # a context left open by a thread that ended (a generator suspended inside hooks())
    contexts = []

    def leave_open() -> None:
        ctx = model.hooks(fwd_hooks=[("hook_embed", scale(0.0))])
        ctx.__enter__()
        contexts.append(ctx)

    run_threads(leave_open)
    assert model.hook_dict["hook_embed"].has_hooks
    assert torch.equal(model(x), want)  # invisible here: its thread owns it
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", scale(0.0))]):
        model.reset_hooks()
        assert torch.equal(model(x), want)
    assert no_hooks_left(model)


# -- copies ---------------------------------------------------------------------------------
CALLS: list = []  # what record_hook_point saw; module level, so the hook pickles


def record_hook_point(act: torch.Tensor, hook: vi.hooks.HookPoint) -> None:
    CALLS.append(hook)


def test_a_deepcopy_taken_inside_a_hooks_context_carries_no_scoped_hooks():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    want = model(x)
    CALLS.clear()
    model.add_hook("hook_embed", record_hook_point, is_permanent=True)
    zero = ("blocks.0.hook_attn_out", scale(0.0))
    with model.hooks(fwd_hooks=[zero], bwd_hooks=[zero]):
        clone = copy.deepcopy(model)
        y_inside = clone(x)
        pickled = pickle.loads(pickle.dumps(model))
    assert torch.equal(y_inside, want)
    assert torch.equal(clone(x), want)
    assert torch.equal(pickled(x), want)
    for m in (clone, pickled):
        assert not m.hook_dict["blocks.0.hook_attn_out"].has_hooks
        assert [h.is_permanent for h in m.hook_dict["hook_embed"]._fwd] == [True]
    # the global hook travels with the copies and is called with the copy's hook point
    assert CALLS == [clone.hook_dict["hook_embed"]] * 2 + [pickled.hook_dict["hook_embed"]]
    clone.reset_hooks(including_permanent=True)
    assert no_hooks_left(clone)
    CALLS.clear()
    model(x)
    assert CALLS == [model.hook_dict["hook_embed"]]  # the original keeps its own
    model.reset_hooks(including_permanent=True)


# -- what a hook returns ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hook_embed", "blocks.0.attn.hook_pattern"])
def test_a_forward_hook_returning_another_dtype_is_refused_naming_the_point(name):
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    msg = rf"{re.escape(repr(name))}.*dtype torch\.float64.*got dtype torch\.float32"
    with pytest.raises(ValueError, match=msg):
        model.run_with_hooks(x, fwd_hooks=[(name, lambda act, hook: act.float())])
    with pytest.raises(ValueError, match=msg):
        model.run_with_cache(x, fwd_hooks=[(name, lambda act, hook: act.float())])
    assert no_hooks_left(model)


def test_a_forward_hook_returning_another_device_is_refused_naming_the_point():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    other = "meta" if not torch.cuda.is_available() else "cuda"
    msg = rf"'blocks\.1\.hook_resid_mid'.*device cpu.*got device {other}"
    with pytest.raises(ValueError, match=msg):
        model.run_with_hooks(
            x, fwd_hooks=[("blocks.1.hook_resid_mid", lambda act, hook: act.to(other))]
        )
    assert no_hooks_left(model)


def test_a_backward_hook_may_return_a_one_tuple_as_in_transformer_lens():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    grads = {}
    for form in ("tensor", "tuple"):
        if form == "tensor":
            fn = lambda g, hook: 3.0 * g  # noqa: E731
        else:
            fn = lambda g, hook: (3.0 * g,)  # noqa: E731
        y = model.run_with_hooks(x, bwd_hooks=[("blocks.1.hook_resid_pre", fn)])
        y.pow(2).sum().backward()
        grads[form] = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
    y = model(x)
    y.pow(2).sum().backward()
    plain = model.embed.W_E.grad.clone()
    model.zero_grad(set_to_none=True)
    for name in grads["tensor"]:
        assert torch.equal(grads["tuple"][name], grads["tensor"][name]), name
    # block 1 and later see the plain gradient, everything before it three times that
    torch.testing.assert_close(grads["tuple"]["embed.W_E"], 3.0 * plain, rtol=1e-12, atol=0)


def test_a_backward_hook_returning_a_wrong_replacement_is_refused_naming_the_point():
    model = random_model(tiny_cfg())
    x = random_input(model.cfg)
    cases = {
        r"dtype torch\.float64.*got dtype torch\.float32": lambda g, hook: (g.float(),),
        r"shape \(3, 7, 8\).*got shape \(3, 7\)": lambda g, hook: g[..., 0],
        r"got str": lambda g, hook: "grad",
        r"got tuple": lambda g, hook: (g, g),
    }
    for msg, fn in cases.items():
        y = model.run_with_hooks(x, bwd_hooks=[("blocks.1.hook_resid_pre", fn)])
        with pytest.raises(
            ValueError, match=r"backward hook .*'blocks\.1\.hook_resid_pre'.*" + msg
        ):
            y.sum().backward()
        model.zero_grad(set_to_none=True)
    assert no_hooks_left(model)


# -- replacing modules: hooks by name reach the point that runs -----------------------------


def _zero_pattern(pattern, hook):
    return torch.zeros_like(pattern)


@pytest.mark.parametrize("how", ["setattr", "modulelist_item", "hook_point"])
def test_hooks_by_name_reach_a_replaced_modules_points(how):
    cfg = tiny_cfg()
    model, donor = random_model(cfg, seed=0), random_model(cfg, seed=1)
    x = random_input(cfg)
    before = model.hook_dict
    if how == "setattr":  # a transplant: layer 0's attention from another model
        model.blocks[0].attn = copy.deepcopy(donor.blocks[0].attn)
    elif how == "modulelist_item":
        model.blocks[0] = copy.deepcopy(donor.blocks[0])
    else:
        model.blocks[0].attn.hook_pattern = vi.HookPoint()
    point = model.blocks[0].attn.hook_pattern
    assert model.hook_dict["blocks.0.attn.hook_pattern"] is point
    assert point.name == "blocks.0.attn.hook_pattern"
    assert model.hook_dict is not before
    # the ablation takes effect, and equals the same ablation on a model built that way
    built = copy.deepcopy(model)
    built.setup_hooks()
    ablated = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", _zero_pattern)])
    want = built.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", _zero_pattern)])
    assert not torch.equal(ablated, model(x))
    assert torch.equal(ablated, want)
    _, cache = model.run_with_cache(x)
    _, cache_built = built.run_with_cache(x)
    assert list(cache.keys()) == list(cache_built.keys())
    name = "blocks.0.attn.hook_pattern"
    assert torch.equal(cache[name], cache_built[name])


def test_the_hook_point_record_is_kept_while_no_module_is_registered():
    model = random_model(tiny_cfg())
    first = model.hook_dict
    x = random_input(model.cfg)
    model(x, start_at_layer=None, stop_at_layer=1)  # slicing blocks would build a ModuleList
    model.run_with_cache(x)
    model.load_state_dict(model.state_dict())
    model.to(torch.float64)
    assert model.hook_dict is first
    vi.HookedVectorTransformer(tiny_cfg())  # building any module anywhere: one rebuild
    second = model.hook_dict
    assert second == first and model.hook_dict is second
