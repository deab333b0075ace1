"""Ablation: hand-written hooks as references, the batched sweep against the loop, pattern
ablation on a planted previous-position head, and one test per bad input."""

import math

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.analysis.ablation import (
    ablate,
    ablate_heads,
    ablate_patterns,
    head_ablation_sweep,
    mean_ablation_hook,
    mean_activations,
    pattern_ablation_hook,
    resample_ablation_hook,
    zero_ablation_hook,
)

N_POS = 5  # inputs are shorter than the population (7 positions): the first 5 means are used


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_cfg())


@pytest.fixture(scope="module")
def x():
    return random_input(tiny_cfg(), batch=3, n_pos=N_POS, seed=1)


@pytest.fixture(scope="module")
def pop():
    return random_input(tiny_cfg(), batch=10, seed=2)


def replace_heads(heads, value):
    """A hand-written hook: ``act[:, :, h] = value[..., h]`` for h in heads."""

    def hook(act, hook):
        act = act.clone()
        act[:, :, heads] = value.expand_as(act)[:, :, heads]
        return act

    return hook


def no_hooks(model):
    return not any(hp.has_hooks for hp in model.hook_dict.values())


# ------------------------------------------------------------------------------ equivalences


@pytest.mark.parametrize("hook", ["z", "result"])
def test_mean_ablation_equals_hand_written_hook(model, x, pop, hook):
    _, cache = model.run_with_cache(pop)
    mean0, mean1 = (cache[hook, layer].mean(0)[:N_POS] for layer in (0, 1))
    expected = model.run_with_hooks(
        x,
        fwd_hooks=[
            (f"blocks.0.attn.hook_{hook}", replace_heads([1], mean0)),
            (f"blocks.1.attn.hook_{hook}", replace_heads([0, 1], mean1)),
        ],
    )
    heads = {0: [1], 1: [0, 1]}
    got = ablate_heads(model, x, heads, kind="mean", population=pop, hook=hook)
    assert torch.equal(got, expected)
    assert not torch.equal(got, model(x))
    names = [f"blocks.{layer}.attn.hook_{hook}" for layer in (0, 1)]
    means = mean_activations(model, pop, names)
    assert torch.equal(ablate_heads(model, x, heads, "mean", population=means, hook=hook), got)


def test_mean_ablation_over_a_population_of_the_input_itself_changes_nothing(model, x):
    one = x[:1]
    out = ablate_heads(model, one, "all", kind="mean", population=one)
    assert torch.equal(out, model(one))


@pytest.mark.parametrize("hook", ["z", "result"])
def test_zero_ablating_every_head_of_a_layer_leaves_attn_out_equal_to_b_O(model, x, hook):
    b_O = model.blocks[0].attn.b_O
    expected = model.run_with_hooks(
        x, fwd_hooks=[("blocks.0.hook_attn_out", lambda act, hook: b_O.expand_as(act))]
    )
    got = ablate_heads(model, x, [(0, 0), (0, 1)], kind="zero", hook=hook)
    assert torch.equal(got, expected)


def test_resampling_from_the_input_itself_changes_nothing(model, x):
    clean = model(x)
    assert torch.equal(ablate_heads(model, x, "all", "resample", resample_source=x), clean)
    got = ablate(model, x, [("mlp_out", 0), ("resid_pre", 1)], "resample", resample_source=x)
    assert torch.equal(got, clean)


def test_resampling_from_a_population_draws_a_seeded_permutation(model, x, pop):
    order = torch.randperm(10, generator=torch.Generator().manual_seed(3))[:3]
    _, cache = model.run_with_cache(pop[order, :N_POS])
    expected = model.run_with_hooks(
        x, fwd_hooks=[("blocks.0.attn.hook_z", replace_heads([1], cache["z", 0]))]
    )
    got = ablate_heads(model, x, (0, 1), "resample", population=pop, seed=3)
    assert torch.equal(got, expected)


def test_mean_ablation_of_an_mlp_equals_hand_written_hook(model, x, pop):
    _, cache = model.run_with_cache(pop)
    mean = cache["mlp_out", 1].mean(0)[:N_POS]
    expected = model.run_with_hooks(
        x, fwd_hooks=[("blocks.1.hook_mlp_out", lambda act, hook: mean.expand_as(act))]
    )
    assert torch.equal(ablate(model, x, ("mlp_out", 1), "mean", population=pop), expected)
    assert torch.equal(ablate(model, x, "blocks.1.hook_mlp_out", "mean", population=pop), expected)


def test_zero_ablating_the_last_layer_reads_out_its_input(model, x):
    resid = model(x, stop_at_layer=1)
    expected = model.unembed(model.ln_final(resid))
    assert torch.equal(ablate(model, x, [("attn_out", 1), ("mlp_out", 1)]), expected)


def test_ablating_positions_changes_only_those_and_later_outputs(model, x):
    def zero_pos_2(act, hook):
        act = act.clone()
        act[:, 2] = 0
        return act

    expected = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_pre", zero_pos_2)])
    got = ablate(model, x, ("resid_pre", 1), "zero", positions=[2])
    assert torch.equal(got, expected)
    clean = model(x)
    assert torch.equal(got[:, :2], clean[:, :2])  # causal: earlier positions untouched
    assert not torch.equal(got[:, 2], clean[:, 2])


def test_head_ablation_at_some_positions_equals_hand_written_hook(model, x, pop):
    _, cache = model.run_with_cache(pop)
    mean = cache["z", 1].mean(0)[:N_POS]

    def hook(act, hook):
        act = act.clone()
        for p in (0, 3):
            act[:, p, 1] = mean[p, 1]
        return act

    expected = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", hook)])
    got = ablate_heads(model, x, (1, 1), "mean", population=pop, positions=[0, -2])
    assert torch.equal(got, expected)


def test_hook_factories_replace_only_the_selection():
    act = torch.arange(24.0).reshape(1, 3, 2, 4)
    mean = -torch.ones(4, 2, 4)  # one more position than act
    out = mean_ablation_hook(mean, heads=[1], positions=2)(act, vi.HookPoint())
    expected = act.clone()
    expected[0, 2, 1] = -1
    assert torch.equal(out, expected)
    out = zero_ablation_hook(heads=0)(act, vi.HookPoint())
    assert out[:, :, 0].abs().sum() == 0 and torch.equal(out[:, :, 1], act[:, :, 1])
    out = resample_ablation_hook(-act, positions=[0, 1])(act, vi.HookPoint())
    assert torch.equal(out[:, :2], -act[:, :2]) and torch.equal(out[:, 2], act[:, 2])


# -------------------------------------------------------------------------- pattern ablation


def cached_patterns(model, x, layer, head, kind):
    hook = pattern_ablation_hook(kind, heads=head, causal=model.cfg.causal)
    name = f"blocks.{layer}.attn.hook_pattern"
    _, cache = model.run_with_cache(x, names_filter=name, fwd_hooks=[(name, hook)])
    return cache[name]


def test_pattern_ablation_writes_the_expected_patterns(model):
    x = random_input(model.cfg, batch=2, n_pos=4, seed=3)
    uniform = torch.tensor(
        [[1, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [1 / 4] * 4],
        dtype=torch.float64,
    )
    previous = torch.tensor(
        [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.float64
    )
    given = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    given = given / given.sum(-1, keepdim=True)  # any row-stochastic map, one per sequence
    clean = model.run_with_cache(x)[1]["pattern", 1]
    for kind, expected in [
        ("uniform", uniform),
        ("identity", torch.eye(4, dtype=torch.float64)),
        ("previous", previous),
        (given[0], given[0]),
        (given, given),
    ]:
        pattern = cached_patterns(model, x, 1, 0, kind)
        assert torch.equal(pattern[:, 0], expected.expand(2, 4, 4)), kind
        assert torch.equal(pattern[:, 1], clean[:, 1])  # the other head is left alone


def test_uniform_pattern_of_a_non_causal_model_covers_every_position():
    model = random_model(tiny_cfg(causal=False))
    x = random_input(model.cfg, batch=2, n_pos=4)
    pattern = cached_patterns(model, x, 0, 1, "uniform")
    assert torch.equal(pattern[:, 1], torch.full((2, 4, 4), 0.25, dtype=torch.float64))

    def by_hand(act, hook):
        act = act.clone()
        act[:, 1] = 0.25
        return act

    expected = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", by_hand)])
    assert torch.equal(ablate_patterns(model, x, {(0, 1): "uniform"}), expected)


def planted_previous_head_model():
    """Layer 0 head 0 attends to the previous position with a softmax margin so large that
    its pattern is exactly one-hot: scores ``R² cos(θ(d - 1 - s)) / sqrt(d_head)`` from a
    rotating positional code on residual dims 0-1, read by a rotated W_Q and plain W_K."""
    cfg = tiny_cfg(normalization=None)
    model = random_model(cfg)
    theta, radius = math.pi / 8, 400.0
    angles = theta * torch.arange(cfg.n_ctx, dtype=torch.float64)
    rot = torch.tensor(
        [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
        dtype=torch.float64,
    )
    attn = model.blocks[0].attn
    with torch.no_grad():
        model.embed.W_E[:, :2] = 0
        model.pos_embed.W_pos[:, 0] = radius * angles.cos()
        model.pos_embed.W_pos[:, 1] = radius * angles.sin()
        for p in (attn.W_Q, attn.W_K, attn.b_Q, attn.b_K):
            p[0] = 0
        attn.W_Q[0, :2, :2] = rot  # (cos θd, sin θd) @ rot = (cos θ(d-1), sin θ(d-1))
        attn.W_K[0, :2, :2] = torch.eye(2, dtype=torch.float64)
    return model


def test_one_hot_map_of_a_heads_own_argmax_leaves_outputs_unchanged():
    model = planted_previous_head_model()
    x = random_input(model.cfg, batch=3, n_pos=6, seed=4)
    clean, cache = model.run_with_cache(x)
    pattern = cache["pattern", 0][:, 0]
    one_hot = torch.nn.functional.one_hot(pattern[0].argmax(-1), 6).to(torch.float64)
    assert torch.equal(pattern, one_hot.expand(3, 6, 6))  # the plant is exactly one-hot
    assert torch.equal(ablate_patterns(model, x, {(0, 0): one_hot}), clean)
    assert torch.equal(ablate_patterns(model, x, {(0, 0): "previous"}), clean)
    assert not torch.allclose(ablate_patterns(model, x, {(0, 0): "uniform"}), clean)


# ------------------------------------------------------------------------------------ sweep


def looped_sweep(model, x, targets, kind, metric, **kwargs):
    cfg = model.cfg
    scores = torch.full((cfg.n_layers, cfg.n_heads), float("nan"), dtype=torch.float64)
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            out = ablate_heads(model, x, (layer, head), kind=kind, **kwargs)
            scores[layer, head] = metric(out, targets)
    return scores


@pytest.fixture(scope="module")
def sweep_model():
    return random_model(tiny_cfg(n_layers=3))  # 6 heads: chunks of 3 and 4 span layers


# The batched and looped sweeps do the same arithmetic per copy, but a matrix product over
# k * batch rows may round differently in the last bit than one over batch rows (and with
# hook="result" a layer sums per-head outputs for copies ablating another layer); in
# float64 that stays far below 1e-12.
@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 6, None])
def test_batched_sweep_equals_looped(sweep_model, kind, chunk_size):
    model = sweep_model
    x = random_input(model.cfg, batch=3, n_pos=N_POS, seed=5)
    targets = random_input(tiny_cfg(d_in=5), batch=3, n_pos=N_POS, seed=6)
    pop = random_input(model.cfg, batch=8, seed=7)
    scores, baseline = head_ablation_sweep(
        model, x, targets, kind=kind, population=pop, chunk_size=chunk_size,
        progress=False, seed=2, return_baseline=True,
    )  # fmt: skip
    expected = looped_sweep(model, x, targets, kind, vi.masked_mse, population=pop, seed=2)
    assert scores.shape == (3, 2)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-12)
    assert baseline == vi.masked_mse(model(x), targets)
    assert (scores != baseline).all()


def test_batched_sweep_with_result_hook_metric_and_head_subset(sweep_model):
    model = sweep_model
    x = random_input(model.cfg, batch=2, n_pos=N_POS, seed=8)
    targets = random_input(tiny_cfg(d_in=5), batch=2, n_pos=N_POS, seed=9)

    def metric(out, t):
        return (out[:, -1] - t[:, -1]).abs().mean()

    scores = head_ablation_sweep(
        model, x, targets, kind="resample", population=x.flip(0), metric=metric,
        heads={1: [1], 2: [0, 1]}, hook="result", chunk_size=2, progress=False,
    )  # fmt: skip
    expected = looped_sweep(
        model, x, targets, "resample", metric, resample_source=x.flip(0), hook="result"
    )
    assert scores[0].isnan().all() and scores[1, 0].isnan()
    torch.testing.assert_close(scores[1:, 1], expected[1:, 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(scores[2], expected[2], rtol=0, atol=1e-12)


def test_sweep_default_metric_uses_the_loss_mask(sweep_model):
    model = sweep_model
    x = random_input(model.cfg, batch=2, n_pos=N_POS, seed=10)
    targets = random_input(tiny_cfg(d_in=5), batch=2, n_pos=N_POS, seed=11)
    mask = torch.tensor([False, False, True, True, True])

    def metric(out, t):
        return vi.masked_mse(out, t, mask)

    scores = head_ablation_sweep(model, x, targets, "zero", loss_mask=mask, progress=False)
    expected = looped_sweep(model, x, targets, "zero", metric)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------- the model is left alone


def test_model_is_unchanged_and_hookless_afterwards_even_after_errors(model, x, pop):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    targets = random_input(tiny_cfg(d_in=5), batch=3, n_pos=N_POS)
    ablate_heads(model, x, "all", "mean", population=pop)
    ablate(model, x, ("mlp_out", 0), "resample", population=pop)
    ablate_patterns(model, x, {(1, 1): "identity"})
    head_ablation_sweep(model, x, targets, "mean", population=pop, progress=False)

    def failing(out, t):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        head_ablation_sweep(model, x, targets, "mean", population=pop, metric=failing,
                            progress=False)  # fmt: skip
    bad_means = {"blocks.0.attn.hook_z": torch.zeros(N_POS, 2, 3)}  # d_head is 4
    with pytest.raises(ValueError, match=r"must have shape \[pos, 2, 4\]"):
        ablate_heads(model, x, (0, 0), "mean", population=bad_means)
    assert no_hooks(model)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name


# ------------------------------------------------------------------------------ bad inputs


def call_ablate_heads(**overrides):
    cfg = tiny_cfg()
    kwargs = dict(
        model=random_model(cfg),
        x=random_input(cfg, batch=3, n_pos=N_POS),
        heads=(0, 0),
        kind="mean",
        population=random_input(cfg, batch=4),
    )
    kwargs.update(overrides)
    return ablate_heads(**kwargs)


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(heads=(2, 0)), ValueError, "layer must be an int in"),
        (dict(heads=(0, 2)), ValueError, "head must be an int in"),
        (dict(population=torch.zeros(4, 7, 4, dtype=torch.float64)), ValueError, "d_in=3"),
        (dict(population=torch.zeros(7, 3, dtype=torch.float64)), ValueError, "d_in=3"),
        (dict(population=torch.zeros(4, 4, 3, dtype=torch.float64)), ValueError, "4 positions"),
        # without the test suite's beartype hook, our own message ("population must be ...")
        (dict(population=[[0.0]]), TypeError, "parameter 'population'|population must be"),
        (dict(population=None), ValueError, "kind='mean' needs population"),
        (dict(population={}), ValueError, "population means lack"),
        (dict(population={"blocks.0.attn.hook_z": torch.zeros(4, 2, 4)}), ValueError, "covers"),
        (dict(kind="median"), ValueError, "kind must be one of"),
        (dict(hook="q"), ValueError, "hook must be one of"),
        (dict(positions=[9]), ValueError, r"positions \[9\] out of range"),
        (dict(positions=[]), ValueError, "positions is empty"),
        (dict(kind="resample", population=None), ValueError, "kind='resample' needs"),
        (dict(kind="resample", resample_source=torch.zeros(1, 5, 3)), ValueError, "x's shape"),
        (dict(kind="resample", population=torch.zeros(2, 7, 3)), ValueError, "at least 3"),
    ],
)
def test_ablate_heads_rejects(overrides, error, match):
    with pytest.raises(error, match=match):
        call_ablate_heads(**overrides)


@pytest.mark.parametrize(
    "patterns, error, match",
    [
        ({(0, 0): torch.eye(4)}, ValueError, r"must be \[5, 5\]"),
        ({(0, 0): torch.ones(5, 4) / 4}, ValueError, "dest_pos == src_pos"),
        ({(0, 0): torch.ones(5, 5, 5, 5)}, ValueError, "dest_pos == src_pos"),
        ({(0, 0): torch.ones(2, 5, 5) / 5}, ValueError, r"or \[3, 5, 5\]"),
        ({(0, 0): 0.5 * torch.eye(5)}, ValueError, "must sum to 1"),
        ({(0, 0): 2 * torch.eye(5) - torch.ones(5, 5) / 5}, ValueError, "non-negative"),
        ({(0, 0): torch.eye(5, dtype=torch.int64)}, TypeError, "floating point"),
        ({(0, 0): "random"}, ValueError, "pattern kind must be one of"),
        ({(3, 0): "uniform"}, ValueError, "layer must be an int in"),
        ({(0, 5): "uniform"}, ValueError, "head must be an int in"),
        ({0: "uniform"}, TypeError, r"parameter 'patterns'|\(layer, head\) pair"),
        ({}, ValueError, "patterns is empty"),
    ],
)
def test_ablate_patterns_rejects(model, x, patterns, error, match):
    with pytest.raises(error, match=match):
        ablate_patterns(model, x, patterns)


def test_pattern_hook_rejects_maps_of_the_wrong_size_at_run_time(model, x):
    hook = pattern_ablation_hook(torch.eye(4), heads=0)
    with pytest.raises(ValueError, match=r"must be \[5, 5\]"):
        model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", hook)])
    assert no_hooks(model)


@pytest.mark.parametrize(
    "components, error, match",
    [
        (("pattern", 0), ValueError, "ablate_patterns"),
        ("blocks.0.hook_mlp_outt", ValueError, "unknown hook name"),
        ([], ValueError, "components is empty"),
        ([3], TypeError, "each component must be"),
        (("mlp_out", 5), ValueError, "layer must be an int in"),
    ],
)
def test_ablate_rejects(model, x, components, error, match):
    with pytest.raises(error, match=match):
        ablate(model, x, components)


def test_head_selection_on_an_activation_without_heads_is_rejected(model, x):
    hook = zero_ablation_hook(heads=0)
    with pytest.raises(ValueError, match="needs an activation with a head axis"):
        model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_mlp_out", hook)])


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(chunk_size=0), ValueError, "chunk_size must be a positive int"),
        (dict(metric=lambda out, t: out.mean(0)), ValueError, "metric must return a scalar"),
        (dict(metric="mse"), TypeError, "parameter 'metric'|metric must be callable"),
        (
            dict(metric=vi.masked_mse, loss_mask=torch.ones(N_POS, dtype=torch.bool)),
            ValueError,
            "loss_mask is used by the default metric only",
        ),
        (dict(targets=torch.zeros(3, N_POS, 4)), ValueError, "targets must be"),
        (dict(kind="mean", population=None), ValueError, "needs population"),
    ],
)
def test_head_ablation_sweep_rejects(model, x, overrides, error, match):
    kwargs = dict(targets=torch.zeros(3, N_POS, 5, dtype=torch.float64), kind="zero")
    kwargs.update(overrides)
    with pytest.raises(error, match=match):
        head_ablation_sweep(model, x, progress=False, **kwargs)
    assert no_hooks(model)


# ------------------------------------------------------------- mean_activations' passes


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 10, 64])
def test_mean_activations_chunked_equals_one_cached_run(model, pop, chunk_size):
    names = ["blocks.0.attn.hook_z", "blocks.1.hook_resid_mid", "blocks.0.mlp.hook_post"]
    _, cache = model.run_with_cache(pop, names_filter=names)
    means = mean_activations(model, pop, names, chunk_size=chunk_size)
    assert sorted(means) == sorted(names)
    for name in names:
        assert means[name].dtype == cache[name].dtype
        torch.testing.assert_close(means[name], cache[name].mean(0), rtol=0, atol=1e-14)


def test_mean_activations_is_the_exact_mean_rounded_once():
    # float32 activations of one pass: the float64 sum, divided once, is their exact mean
    # rounded to float32 (a float32 .mean(0) rounds at every addition)
    m = random_model(tiny_cfg(), dtype=torch.float32)
    pop32 = random_input(tiny_cfg(), batch=37, seed=5, dtype=torch.float32)
    name = "blocks.1.hook_resid_post"
    _, cache = m.run_with_cache(pop32, names_filter=name)
    exact = cache[name].double().mean(0).float()
    assert torch.equal(mean_activations(m, pop32, name, chunk_size=37)[name], exact)
    for chunk in (1, 5):  # smaller passes: a matrix product may round differently per shape
        torch.testing.assert_close(
            mean_activations(m, pop32, name, chunk_size=chunk)[name], exact, rtol=1e-6, atol=1e-6
        )


def test_mean_activations_stops_after_the_last_requested_activation(model, pop):
    calls = []
    later = "blocks.1.mlp.hook_pre"  # after blocks.1.attn.hook_z
    model.add_hook(later, lambda act, hook: calls.append(1))
    try:
        mean_activations(model, pop, "blocks.1.attn.hook_z", chunk_size=4)
        assert calls == []
        mean_activations(model, pop, [later, "blocks.0.attn.hook_z"], chunk_size=4)
        assert len(calls) == 3  # 10 sequences in passes of 4: ran up to `later` each time
    finally:
        model.reset_hooks()


def test_mean_activations_sees_what_an_editing_hook_wrote(model, pop):
    name = "blocks.0.hook_resid_post"
    model.add_hook(name, lambda act, hook: act * 0 + 2.5)
    try:
        mean = mean_activations(model, pop, name, chunk_size=3)[name]
    finally:
        model.reset_hooks()
    assert torch.equal(mean, torch.full_like(mean, 2.5))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_mean_activations_rejects_bad_chunk_size(model, pop, bad):
    with unchecked(), pytest.raises(ValueError, match="chunk_size must be a positive int"):
        mean_activations(model, pop, "blocks.0.attn.hook_z", chunk_size=bad)
