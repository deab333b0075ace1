"""What ``run_with_cache`` keeps between calls to save host time cannot go stale.

``run_with_cache`` reuses, from one call to the next: the weights record (checked column
by column), the storage addresses of the weights (to copy the activations that are views
of them), and the names of ``forward``'s arguments; it attaches its caching hooks in bulk.
Each is checked here against what a fresh model (a deep copy, which shares none of it)
computes, after every kind of change to the model between two runs: a cache made after
the change holds the same bits, copies what views the new weights, and refuses once the
weights change again.
"""

import copy
import threading

import pytest
import torch
from torch import nn

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.cache.weights_record import (
    _changed_rows,
    _changed_weights,
    _record_weights,
    _unchanged,
    _walk_weights,
)
from vecinterp.hooks.hook_point import _add_all, _remove_all

TIMEOUT = 60


def setup(seed=3):
    cfg = tiny_cfg(normalization="LN", positional="learned")
    return random_model(cfg, seed=seed), random_input(cfg, batch=3, n_pos=6, seed=4)


# -- changes between two runs (each returns a weight name the record must report) ---------
def nothing(model):
    return None


def param_in_place(model):
    with torch.no_grad():
        model.blocks[0].attn.W_O.mul_(1.5)
    return "blocks.0.attn.W_O"


def buffer_in_place(model):
    model.blocks[1].attn.mask_bias.zero_()
    return "blocks.1.attn.mask_bias"


def new_parameter(model):
    model.pos_embed.W_pos = nn.Parameter(model.pos_embed.W_pos.detach() * 2)
    return "pos_embed.W_pos"


def data_assignment(model):
    model.pos_embed.W_pos.data = model.pos_embed.W_pos.data * 2  # no version bump
    return "pos_embed.W_pos"


def data_becomes_inference(model):
    with torch.inference_mode():
        new = model.ln_final.w.detach() * 2
    model.ln_final.w.data = new  # the parameter loses its version counter
    return "ln_final.w"


def to_dtype(model):
    model.to(torch.float32)
    return "pos_embed.W_pos"


def load_state_dict(model):
    model.load_state_dict(random_model(model.cfg, seed=11).state_dict())
    return "pos_embed.W_pos"


def new_module(model):
    model.embed = copy.deepcopy(model.embed)  # equal weights, another module
    return "embed"


def added_module(model):
    model.blocks[0].extra = nn.Linear(2, 2)  # not used by forward, but a weight all the same
    return "blocks.0 (a parameter, buffer or submodule added or removed)"


def removed_parameter(model):
    del model.unembed.b_U
    model.unembed.register_parameter("b_U", None)
    return "unembed.b_U"


CHANGES = [
    nothing,
    param_in_place,
    buffer_in_place,
    new_parameter,
    data_assignment,
    data_becomes_inference,
    to_dtype,
    load_state_dict,
    new_module,
    added_module,
]


@pytest.mark.parametrize("change", [*CHANGES, removed_parameter])
def test_the_column_check_agrees_with_the_row_by_row_definition(change):
    model, _ = setup()
    record = _walk_weights(model)
    assert _unchanged(record) is True and _changed_rows(record) == []
    name = change(model)
    rows = _changed_rows(record)
    assert bool(_unchanged(record)) == (rows == []), rows
    assert _changed_weights(record) == rows
    if name is not None:
        assert name in rows


@pytest.mark.parametrize("change", CHANGES)
def test_a_cache_made_after_a_change_is_that_of_a_fresh_model_and_is_checked(change):
    if change is removed_parameter:  # forward needs b_U
        return
    model, x = setup()
    _, before = model.run_with_cache(x)  # fills what later calls reuse
    change(model)
    x = x.to(model.W_E.dtype)
    with torch.no_grad():  # an inference tensor cannot enter a graph
        y, cache = model.run_with_cache(x)
        fresh = copy.deepcopy(model)  # shares no tensor, record or memo with model
        y_fresh, want = fresh.run_with_cache(x)
    assert torch.equal(y, y_fresh)
    assert list(cache) == list(want)
    for name in want:
        assert torch.equal(cache[name], want[name]), name
    # the entry that views W_pos was copied from the weights the run used, not from
    # a remembered set of storages: it shares nothing with the model's tensors now
    weights = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    assert all(t.untyped_storage().data_ptr() not in weights for t in cache.cache_dict.values())
    cache.decompose_resid(apply_ln=True)  # the weights are as this run found them
    if change is not nothing:  # ... and not as the first run found them
        with pytest.raises(ValueError, match="changed after this cache was made"):
            before.decompose_resid(apply_ln=True)
    pos = cache["hook_pos_embed"].clone()
    with torch.no_grad():
        model.pos_embed.W_pos.add_(1.0)
    assert torch.equal(cache["hook_pos_embed"], pos)  # the copy does not follow W_pos
    with pytest.raises(ValueError, match=r"pos_embed\.W_pos changed"):
        cache.decompose_resid(apply_ln=True)


def test_a_record_is_reused_only_while_nothing_changed():
    model, _ = setup()
    record = _record_weights(model)
    assert _record_weights(model) is record
    new_parameter(model)
    again = _record_weights(model)
    assert again is not record
    assert _changed_weights(record) == ["pos_embed.W_pos"]
    assert _changed_weights(again) == []


def test_two_models_and_a_deep_copy_keep_their_own_records():
    a, x = setup(seed=3)
    b, _ = setup(seed=5)
    _, cache_a = a.run_with_cache(x)
    _, cache_b = b.run_with_cache(x)
    c = copy.deepcopy(a)
    _, cache_c = c.run_with_cache(x)
    assert torch.equal(cache_c["resid_post", -1], cache_a["resid_post", -1])
    _, again_a = a.run_with_cache(x)
    for cache, model in [(cache_a, a), (again_a, a), (cache_b, b), (cache_c, c)]:
        assert all(
            t.untyped_storage().data_ptr() != model.pos_embed.W_pos.untyped_storage().data_ptr()
            for t in cache.cache_dict.values()
        )
    param_in_place(c)  # the copy's weights: the original's caches are unaffected
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.W_O changed"):
        cache_c.decompose_resid(apply_ln=True)
    for cache in (cache_a, again_a, cache_b):
        cache.decompose_resid(apply_ln=True)
    param_in_place(b)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.W_O changed"):
        cache_b.decompose_resid(apply_ln=True)
    cache_a.decompose_resid(apply_ln=True)


# -- forward's arguments ------------------------------------------------------------------
class Scaled(vi.HookedVectorTransformer):
    """A subclass whose forward takes one more argument."""

    def forward(self, x, *, factor=1.0, **kwargs):
        return super().forward(x, **kwargs) * factor


def test_forwards_arguments_are_those_of_the_models_own_forward():
    model, x = setup()
    scaled = Scaled(model.cfg, seed=0, dtype=torch.float64)
    scaled.load_state_dict(model.state_dict())
    for _ in range(2):  # the second time from what the first remembered
        with pytest.raises(TypeError, match="unexpected keyword argument 'factor'"):
            model.run_with_cache(x, factor=2.0)
        y, _ = scaled.run_with_cache(x, factor=2.0)
        assert torch.equal(y, 2.0 * model(x))
        with pytest.raises(TypeError, match="unexpected keyword argument 'scale'"):
            scaled.run_with_cache(x, scale=2.0)
    original = model.forward
    model.forward = lambda x, *, shift=0.0: original(x) + shift  # an instance's own forward
    y, _ = model.run_with_cache(x, shift=1.0)
    assert torch.equal(y, scaled(x) + 1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'return_type'"):
        model.run_with_cache(x, return_type="output")


# -- hooks attached in bulk ---------------------------------------------------------------
def test_bulk_attach_and_remove_are_point_by_point_add_and_remove():
    model, x = setup()
    points = list(model.hook_dict.values())
    state = model.state_dict()
    first = model.add_hook(lambda name: True, lambda act, hook: None)  # one per point
    calls = []
    handles = _add_all(points, lambda act, hook: calls.append(hook.name), "fwd", False, None)
    assert [h.hook_point for h in handles] == points
    assert all(p._fwd == [f, h] for p, f, h in zip(points, first, handles, strict=True))
    model(x)
    assert calls == [name for name in model.hook_dict if name in set(calls)]  # in firing order
    _remove_all(handles + handles)  # removing twice is harmless
    assert all(p._fwd == [f] for p, f in zip(points, first, strict=True))
    for handle in first:
        handle.remove()
    assert not any(p.has_hooks for p in points)
    # plain attributes, not parameters, buffers or submodules
    assert model.state_dict().keys() == state.keys()
    assert all("_fwd" not in p._modules and "_fwd" not in p._parameters for p in points)
    with unchecked():
        with pytest.raises(TypeError, match=f"hook for {points[0].name!r} must be callable"):
            _add_all(points, 3, "fwd", False, None)
        with pytest.raises(ValueError, match="'fwd' or 'bwd'"):
            _add_all(points, print, "up", False, None)
        assert not any(p.has_hooks for p in points)
        assert _add_all([], 3, "up", False, None) == []  # nothing selected: nothing refused
        assert model.add_hook(lambda name: False, 3) == []


def test_two_threads_caching_at_once_get_their_own_names_and_values():
    model, x = setup()
    names_b = ["blocks.1.hook_resid_mid", "blocks.0.attn.hook_pattern"]
    want_a = model.run_with_cache(x)
    want_b = model.run_with_cache(x, names_filter=names_b)
    meet = threading.Barrier(2, timeout=TIMEOUT)

    def wait(act, hook):
        meet.wait()

    met = [("blocks.0.hook_resid_pre", wait)]
    errors = []

    def run(names_filter, want):
        try:
            for _ in range(10):  # each passes resid_pre while the other's hooks are on
                y, cache = model.run_with_cache(x, names_filter=names_filter, fwd_hooks=met)
                assert torch.equal(y, want[0])
                assert list(cache) == list(want[1])
                for name in want[1]:
                    assert torch.equal(cache[name], want[1][name]), name
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)
            meet.abort()

    threads = [
        threading.Thread(target=run, args=(None, want_a)),
        threading.Thread(target=run, args=(names_b, want_b)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not errors, errors
    assert not any(p.has_hooks for p in model.hook_dict.values())
