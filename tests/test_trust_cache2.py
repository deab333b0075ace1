"""What the cache's analyses assume about the run is checked, not trusted.

- The weights: analyses that read the model's weights to interpret cached activations
  (``apply_ln_to_stack``, the decompositions with ``apply_ln=True``,
  ``direct_attribution``) refuse, naming the weight, once a parameter or buffer changed
  after the run (in place, ``load_state_dict``, an optimizer step, a new ``Parameter``,
  ``p.data = ...``, a replaced module); anything that leaves the weights alone leaves
  their results bit for bit as they were.
- The hooks: ``run_with_cache`` records which points had a hook and which a hook edited
  (replaced or wrote into); a decomposition or attribution whose sum an edit breaks
  refuses naming the point, and every one that does not refuse is exact (float64, 1e-10).
- An entry is what flowed at its point even when a later hook writes into a tensor it
  shares (``resid_post`` of block ``l`` is ``resid_pre`` of ``l + 1``).
"""

import copy
import threading

import pytest
import torch
from torch import nn

from helpers import random_input, random_model, tiny_cfg
from vecinterp.analysis.attribution import direct_attribution

IDENTITY = 1e-10  # float64: Σ attributions vs ⟨y − b_U, t⟩, components vs the stream


def setup(normalization="LN", positional="learned", n_layers=2):
    cfg = tiny_cfg(normalization=normalization, positional=positional, n_layers=n_layers)
    model = random_model(cfg, seed=3)
    x = random_input(cfg, batch=3, n_pos=6, seed=4)
    targets = random_input(cfg.replace(d_in=cfg.d_out), batch=3, n_pos=6, seed=5)
    return model, x, targets


def gap(a, b):
    return float((a - b).abs().max())


def rhs(model, y, targets):
    """⟨y − b_U, t⟩, the attribution identity's right-hand side."""
    return ((y - model.unembed.b_U.detach()) * targets).sum(-1)


# ---------------------------------------------------------------- the weights

ANALYSES = {
    "apply_ln_to_stack": lambda m, c, t: c.apply_ln_to_stack(c.decompose_resid()),
    "accumulated_resid": lambda m, c, t: c.accumulated_resid(apply_ln=True),
    "accumulated_resid(layer=1)": lambda m, c, t: c.accumulated_resid(layer=1, apply_ln=True),
    "decompose_resid": lambda m, c, t: c.decompose_resid(apply_ln=True),
    "decompose_resid(mlp_input)": lambda m, c, t: c.decompose_resid(
        layer=1, mlp_input=True, apply_ln=True
    ),
    "stack_head_results": lambda m, c, t: c.stack_head_results(apply_ln=True),
    "direct_attribution(all)": lambda m, c, t: direct_attribution(m, c, t).values,
    "direct_attribution(layers)": lambda m, c, t: (
        direct_attribution(m, c, t, components="layers").values
    ),
    "direct_attribution(heads)": lambda m, c, t: (
        direct_attribution(m, c, t, components="heads").values
    ),
}


def in_place(model):
    with torch.no_grad():
        model.blocks[0].attn.W_O.mul_(1.5)
    return "blocks.0.attn.W_O"


def by_load_state_dict(model):
    model.load_state_dict(random_model(model.cfg, seed=11).state_dict())
    return "changed after this cache was made"  # every weight: the message names one


def by_new_parameter(model):
    attn = model.blocks[1].attn
    attn.W_O = nn.Parameter(attn.W_O.detach().clone())  # the same values, a new tensor
    return "blocks.1.attn.W_O"


def by_data_assignment(model):
    w = model.ln_final.w
    w.data = w.data * 2  # no version bump: a new storage
    return "ln_final.w"


def by_dtype(model):
    model.float()
    return "changed after this cache was made"


def by_new_module(model):
    model.ln_final = copy.deepcopy(model.ln_final)  # equal weights, another module
    return "ln_final"


def by_optimizer_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(random_input(model.cfg, batch=2, seed=9)).pow(2).sum().backward()
    opt.step()
    return "changed after this cache was made"


def buffer_in_place(model):
    model.blocks[1].attn.mask_bias.zero_()
    return "blocks.1.attn.mask_bias"


CHANGES = [
    in_place,
    by_load_state_dict,
    by_new_parameter,
    by_data_assignment,
    by_dtype,
    by_new_module,
    by_optimizer_step,
    buffer_in_place,
]


@pytest.mark.parametrize("change", CHANGES)
def test_weights_changed_after_the_run_are_refused_by_every_analysis(change):
    model, x, targets = setup()
    _, cache = model.run_with_cache(x)
    plain = cache.decompose_resid()
    for analysis in ANALYSES.values():  # fine before the change
        analysis(model, cache, targets)
    named = change(model)
    for what, analysis in ANALYSES.items():
        with pytest.raises(ValueError, match="re-run run_with_cache") as err:
            analysis(model, cache, targets)
        assert named in str(err.value), (what, str(err.value))
        assert what.split("(")[0] in str(err.value)  # the refusing analysis is named
    # what needs no weight still answers, with what flowed
    assert torch.equal(cache.decompose_resid(), plain)
    assert torch.equal(cache.accumulated_resid(), cache.accumulated_resid())


def test_the_message_names_the_changed_weight_exactly():
    model, x, _ = setup()
    _, cache = model.run_with_cache(x)
    with torch.no_grad():
        model.blocks[0].attn.W_O.add_(1.0)
    with pytest.raises(ValueError) as err:
        cache.decompose_resid(apply_ln=True)
    assert str(err.value) == (
        "decompose_resid(apply_ln=True) reads the model's weights, but blocks.0.attn.W_O "
        "changed after this cache was made (in place or replaced); re-run run_with_cache to "
        "analyse the model as it is now"
    )


def no_change(model, x):
    """Everything here leaves the weights as they are."""
    model(x)
    model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_mid", lambda a, hook: 2 * a)])
    model.run_with_cache(x, fwd_hooks=[("blocks.1.hook_resid_pre", lambda a, hook: a.mul_(2))])
    model.eval()
    model.train()
    model.requires_grad_(False)
    model.requires_grad_(True)
    model.state_dict()
    copy.deepcopy(model)
    model(x).pow(2).sum().backward()  # fills .grad, not the weights
    model.zero_grad()
    model.to(torch.float64)  # already float64: nothing moves


def test_analyses_refuse_exactly_when_the_weights_change():
    model, x, targets = setup()
    _, cache = model.run_with_cache(x)
    before = {what: analysis(model, cache, targets) for what, analysis in ANALYSES.items()}
    no_change(model, x)
    for what, analysis in ANALYSES.items():
        assert torch.equal(analysis(model, cache, targets), before[what]), what
    with torch.no_grad():
        model.blocks[1].ln1.w.mul_(1.0)  # a write, even of equal values, is a change
    for analysis in ANALYSES.values():
        with pytest.raises(ValueError, match=r"blocks\.1\.ln1\.w changed"):
            analysis(model, cache, targets)


def test_a_moved_cache_keeps_the_runs_record():
    model, x, targets = setup()
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    moved = cache.to("cpu")  # a copy of the activations keeps the run's record
    model.load_state_dict(model.state_dict())  # copies in place: versions move
    with pytest.raises(ValueError, match="re-run run_with_cache"):
        moved.decompose_resid(apply_ln=True)
    _, fresh = model.run_with_cache(x)  # a new run is fine
    attr = direct_attribution(model, fresh, targets)
    assert gap(attr.total(), rhs(model, fresh["out"], targets)) <= IDENTITY
    with torch.no_grad():
        model.unembed.W_U.neg_()  # and refused in turn once the weights change again
    with pytest.raises(ValueError, match=r"unembed\.W_U changed"):
        direct_attribution(model, fresh, targets)


def test_a_copied_cache_checks_its_copied_model():
    model, x, targets = setup()
    _, cache = model.run_with_cache(x)
    before = direct_attribution(model, cache, targets).values
    twin = copy.deepcopy(cache)  # a copy of the model comes along, with new tensors
    assert twin.model is not model
    assert torch.equal(direct_attribution(twin.model, twin, targets).values, before)
    assert torch.equal(twin.decompose_resid(apply_ln=True), cache.decompose_resid(apply_ln=True))
    with torch.no_grad():
        twin.model.blocks[0].ln1.w.mul_(2.0)
    with pytest.raises(ValueError, match=r"blocks\.0\.ln1\.w changed"):
        twin.accumulated_resid(layer=0, apply_ln=True)
    cache.accumulated_resid(layer=0, apply_ln=True)  # the original's model is untouched
    with torch.no_grad():
        model.blocks[1].ln2.w.mul_(2.0)
    stale = copy.deepcopy(cache)  # copied after the change: still refused
    with pytest.raises(ValueError, match=r"blocks\.1\.ln2\.w changed"):
        stale.decompose_resid(apply_ln=True)
    with pytest.raises(ValueError, match=r"blocks\.1\.ln2\.w changed"):
        stale.to("cpu").decompose_resid(apply_ln=True)


# ---------------------------------------------------------------- hook edits


def replace(act, hook):
    return 1.5 * act + 0.25


def write_into(act, hook):
    act.mul_(1.5).add_(0.25)  # returns None: an edit all the same


def read_only(act, hook):
    float(act.detach().sum())  # returns None, writes nothing


def same_tensor(act, hook):
    return act  # returned unchanged: no edit


# point -> what an edit there breaks: "decompose" (decompose_resid() of the final stream),
# "ln" (that decomposition read through ln_final), "all" / "layers" (direct_attribution's
# identity). Everything not listed must stay exact.
BREAKS = {
    "hook_embed": set(),
    "hook_pos_embed": set(),
    "blocks.0.hook_resid_pre": {"decompose", "ln", "all", "layers"},
    "blocks.0.ln1.hook_scale": set(),
    "blocks.0.ln1.hook_normalized": set(),
    "blocks.0.attn.hook_v": set(),
    "blocks.0.attn.hook_pattern": set(),
    "blocks.0.attn.hook_z": set(),
    "blocks.0.attn.hook_result": set(),
    "blocks.0.hook_attn_out": {"all"},
    "blocks.0.hook_resid_mid": {"decompose", "ln", "all", "layers"},
    "blocks.1.ln2.hook_scale": set(),
    "blocks.1.mlp.hook_pre": set(),
    "blocks.1.mlp.hook_post": set(),
    "blocks.1.hook_mlp_out": set(),
    "blocks.1.hook_resid_post": {"decompose", "ln", "all", "layers"},
    "ln_final.hook_scale": set(),
    "ln_final.hook_normalized": {"ln", "all", "layers"},
    "unembed.hook_out": {"all", "layers"},
}


def outcomes(model, cache, targets):
    """Each analysis's gap to what flowed, or the refusal's message."""
    y = cache["out"]
    final = cache["resid_post", -1]
    ln = model.ln_final
    # what ln_final put out in this run: its cached hook_normalized, then w and b
    flowed_ln = cache["normalized"] * ln.w.detach() + ln.b.detach()
    checks = {
        "decompose": lambda: gap(cache.decompose_resid().sum(0), final),
        "ln": lambda: gap(cache.decompose_resid(apply_ln=True).sum(0) + ln.b.detach(), flowed_ln),
        "all": lambda: gap(
            direct_attribution(model, cache, targets).total(), rhs(model, y, targets)
        ),
        "layers": lambda: gap(
            direct_attribution(model, cache, targets, components="layers").total(),
            rhs(model, y, targets),
        ),
    }
    out = {}
    for key, check in checks.items():
        try:
            out[key] = check()
        except ValueError as err:
            out[key] = str(err)
    return out


@pytest.mark.parametrize("edit", [replace, write_into])
@pytest.mark.parametrize("point", BREAKS)
def test_each_hook_edit_is_exact_or_refused_naming_the_point(point, edit):
    model, x, targets = setup()
    if point == "hook_pos_embed" and edit is write_into:
        edit = replace  # W_pos broadcast over the batch: PyTorch refuses to write into it
    _, cache = model.run_with_cache(x, fwd_hooks=[(point, edit)])
    assert cache.hooked_points == {point}
    assert cache.edited_points == {point}
    for key, result in outcomes(model, cache, targets).items():
        if key in BREAKS[point]:
            assert isinstance(result, str) and repr(point) in result, (key, result)
            assert "edited it in this run" in result
        else:
            assert isinstance(result, float) and result <= IDENTITY, (key, result)
    # the heads alone claim no sum: never refused for a hook
    direct_attribution(model, cache, targets, components="heads")
    cache.stack_head_results(apply_ln=True)
    cache.accumulated_resid(apply_ln=True)


@pytest.mark.parametrize("hook", [read_only, same_tensor])
def test_hooks_that_do_not_edit_are_recorded_and_refuse_nothing(hook):
    model, x, targets = setup()
    everywhere = [(name, hook) for name in model.hook_dict]
    _, cache = model.run_with_cache(x, fwd_hooks=everywhere)
    assert cache.hooked_points == set(model.hook_dict)
    assert cache.edited_points == frozenset()
    for key, result in outcomes(model, cache, targets).items():
        assert isinstance(result, float) and result <= IDENTITY, (key, result)
    _, plain = model.run_with_cache(x)
    assert plain.hooked_points == plain.edited_points == frozenset()
    for name in plain:
        assert torch.equal(cache[name], plain[name]), name


def test_a_residual_edit_refuses_only_the_streams_after_it():
    model, x, _ = setup(n_layers=3)
    point = "blocks.1.hook_resid_mid"
    _, cache = model.run_with_cache(x, fwd_hooks=[(point, write_into)])
    # (layer, mlp_input): the stream decomposed, and the cached value it must sum to
    streams = {
        (0, False): ("resid_pre", 0),
        (0, True): ("resid_mid", 0),
        (1, False): ("resid_pre", 1),
        (1, True): ("resid_mid", 1),
        (2, False): ("resid_pre", 2),
        (2, True): ("resid_mid", 2),
        (None, False): ("resid_post", 2),
    }
    after = {(1, True), (2, False), (2, True), (None, False)}
    for (layer, mlp_input), key in streams.items():
        if (layer, mlp_input) in after:
            with pytest.raises(ValueError, match=r"'blocks\.1\.hook_resid_mid'"):
                cache.decompose_resid(layer=layer, mlp_input=mlp_input)
        else:
            parts = cache.decompose_resid(layer=layer, mlp_input=mlp_input)
            assert gap(parts.sum(0), cache[key]) <= IDENTITY


def test_a_norm_output_edit_refuses_only_the_reading_through_that_norm():
    model, x, _ = setup()
    point = "blocks.1.ln2.hook_normalized"
    _, cache = model.run_with_cache(x, fwd_hooks=[(point, replace)])
    raw = cache.decompose_resid(layer=1, mlp_input=True)
    assert gap(raw.sum(0), cache["resid_mid", 1]) <= IDENTITY  # the sum itself holds
    with pytest.raises(ValueError, match=r"apply_ln=True assumes 'blocks\.1\.ln2\.hook_norm"):
        cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True)
    read = cache.decompose_resid(layer=1, apply_ln=True)  # ln1 of block 1 is unedited
    ln1 = model.blocks[1].ln1
    flowed = cache["normalized", 1, "ln1"] * ln1.w.detach() + ln1.b.detach()
    assert gap(read.sum(0) + ln1.b.detach(), flowed) <= IDENTITY


def test_attention_output_edits_keep_layers_exact_and_name_the_fix_for_all():
    model, x, targets = setup()
    _, cache = model.run_with_cache(x, fwd_hooks=[("blocks.1.hook_attn_out", replace)])
    with pytest.raises(ValueError, match="components='layers'"):
        direct_attribution(model, cache, targets)
    attr = direct_attribution(model, cache, targets, components="layers")
    assert gap(attr.total(), rhs(model, cache["out"], targets)) <= IDENTITY


def test_a_later_write_into_a_shared_tensor_does_not_reach_earlier_entries():
    for positional in ("learned", "rotary"):  # rotary: resid_pre of block 0 is the embedding
        model, x, _ = setup(positional=positional)
        _, clean = model.run_with_cache(x)
        hooks = [
            ("blocks.0.hook_resid_pre", write_into),
            ("blocks.1.hook_resid_pre", lambda act, hook: act.zero_()),
        ]
        _, cache = model.run_with_cache(x, fwd_hooks=hooks)
        assert cache.edited_points == {"blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"}
        assert torch.equal(cache["embed"], clean["embed"])  # written into after it flowed
        assert gap(cache["resid_pre", 0], 1.5 * (clean["resid_pre", 0]) + 0.25) <= IDENTITY
        assert bool((cache["resid_pre", 1] == 0).all())
        # block 0's output as it flowed, not what block 1's hook made of it
        resid_post = cache["resid_post", 0]
        assert float(resid_post.abs().min()) > 0
        assert torch.equal(resid_post, cache["resid_mid", 0] + cache["mlp_out", 0])


def test_gradients_are_of_what_flowed_or_refused():
    model, x, _ = setup()
    loss_fn = lambda y: y.pow(2).sum()  # noqa: E731
    double = ("blocks.1.hook_resid_pre", lambda act, hook: 2 * act)
    _, cache = model.run_with_cache(x, incl_bwd=True, loss_fn=loss_fn, fwd_hooks=[double])
    grad_pre = cache["blocks.1.hook_resid_pre_grad"]
    assert gap(cache["blocks.0.hook_resid_post_grad"], 2 * grad_pre) <= IDENTITY
    assert torch.equal(cache["resid_pre", 1], 2 * cache["resid_post", 0])
    # written in place: autograd would give block 0's output block 1's gradient
    in_place = ("blocks.1.hook_resid_pre", lambda act, hook: act.mul_(2.0))
    with pytest.raises(ValueError, match=r"after 'blocks\.0\.hook_resid_post' wrote in place"):
        model.run_with_cache(x, incl_bwd=True, loss_fn=loss_fn, fwd_hooks=[in_place])
    _, cache = model.run_with_cache(  # without the earlier point, nothing is at stake
        x,
        "blocks.1.hook_resid_pre",
        incl_bwd=True,
        loss_fn=loss_fn,
        fwd_hooks=[in_place],
    )
    assert gap(cache["blocks.1.hook_resid_pre_grad"], grad_pre) <= IDENTITY


def test_hooks_of_every_thread_count_and_another_threads_scoped_hooks_do_not():
    model, x, targets = setup()
    handle = model.add_hook("blocks.0.hook_resid_mid", read_only)  # every thread's
    try:
        _, cache = model.run_with_cache(x)
        assert cache.hooked_points == {"blocks.0.hook_resid_mid"}
        assert cache.edited_points == frozenset()
    finally:
        handle[0].remove()
    opened, done = threading.Event(), threading.Event()

    def other():
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", replace)]):
            opened.set()
            done.wait(30)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert opened.wait(30)
        _, cache = model.run_with_cache(x)
    finally:
        done.set()
        thread.join()
    assert cache.hooked_points == cache.edited_points == frozenset()
    attr = direct_attribution(model, cache, targets)
    assert gap(attr.total(), rhs(model, cache["out"], targets)) <= IDENTITY


def test_inference_mode_counts_every_hooked_point_as_edited():
    model, x, targets = setup()
    with torch.inference_mode():
        _, plain = model.run_with_cache(x)
        _, hooked = model.run_with_cache(x, fwd_hooks=[("blocks.0.hook_resid_mid", read_only)])
    # no version counters there: a write cannot be told from a read, so it is refused
    assert hooked.edited_points == {"blocks.0.hook_resid_mid"}
    with pytest.raises(ValueError, match="blocks.0.hook_resid_mid"):
        hooked.decompose_resid()
    assert plain.edited_points == frozenset()
    attr = direct_attribution(model, plain, targets)
    assert gap(attr.total(), rhs(model, plain["out"], targets)) <= IDENTITY
    with torch.no_grad():
        model.blocks[0].attn.W_O.mul_(2.0)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.W_O changed"):
        direct_attribution(model, plain, targets)


def test_constructor_arguments_are_checked():
    model, x, _ = setup()
    _, cache = model.run_with_cache(x)
    cls = type(cache)
    with pytest.raises(ValueError, match="edited_points"):
        cls(cache.cache_dict, model, edited_points=["blocks.9.hook_resid_mid"])
    with pytest.raises(TypeError, match="hooked_points"):
        cls(cache.cache_dict, model, hooked_points="blocks.0.hook_resid_mid")
    by_hand = cls(cache.cache_dict, model, edited_points=["blocks.0.hook_resid_mid"])
    with pytest.raises(ValueError, match="blocks.0.hook_resid_mid"):
        by_hand.decompose_resid()
    assert (
        gap(cls(cache.cache_dict, model).decompose_resid().sum(0), cache["resid_post", -1])
        <= IDENTITY
    )
