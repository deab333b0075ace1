"""Attribution patching: equal to activation patching wherever the metric is affine in the
patched activation (every ``by``), hand-worked values, invariants (zero for clean ==
corrupted, cell sums, linearity in the difference, batched == looped, agreement to
O(eps^2) for small differences), its cost (two forward passes, one backward), and bad
inputs refused."""

import re
from pathlib import Path

import pytest
import torch

from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.analysis.attribution_patching import attribution_patching
from vecinterp.analysis.patching import activation_patching

BATCH, N_POS = 2, 4
ALL_BY = ("layer_pos", "layer", "head", "head_pos")
PER_HEAD = ("q", "k", "v", "z", "result", "pattern", "attn_scores")


def linear_metric(d_out: int, seed: int = 3):
    w = torch.randn(BATCH, N_POS, d_out, generator=torch.Generator().manual_seed(seed))
    return lambda y: (y * w.to(y)).sum() + 0.25  # noqa: E731


def patched_change(model, clean, corrupted, metric, hook_name, by, **kwargs):
    """activation_patching as a change from the corrupted run's metric."""
    patched = activation_patching(
        model, clean, corrupted, metric, hook_name, by=by, progress=False, **kwargs
    )
    with torch.no_grad():
        return patched - metric(model(corrupted))


def inputs(cfg, seed=1):
    return (
        random_input(cfg, batch=BATCH, n_pos=N_POS, seed=seed),
        random_input(cfg, batch=BATCH, n_pos=N_POS, seed=seed + 1),
    )


def bys(hook_name: str):
    per_head = hook_name.rsplit(".", 1)[-1].removeprefix("hook_") in PER_HEAD
    return ALL_BY if per_head else ("layer_pos", "layer")


# -- exact where the metric is affine in the patched activation ---------------------------
# With normalization=None nothing but linear maps follows these points (attention-only
# model: a last block's heads and residual stream; MLP model: what the last MLP puts out),
# and the metric is affine in the output, so the first-order term is the whole change.
ATTN_ONLY_LAST = [
    "blocks.1.attn.hook_v",
    "blocks.1.attn.hook_pattern",
    "blocks.1.attn.hook_z",
    "blocks.1.attn.hook_result",
    "blocks.1.hook_attn_out",
    "blocks.1.hook_resid_post",
    "unembed.hook_out",
]
MLP_LAST = ["blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"]
ONE_LAYER_SHORT = ["v", "pattern", "z", "result", "attn_out", "resid_post"]


@pytest.mark.parametrize(
    "attn_only, n_layers, hook_name, by",
    [(True, 2, h, by) for h in ATTN_ONLY_LAST for by in bys(h)]
    + [(False, 2, h, by) for h in MLP_LAST for by in bys(h)]
    + [(True, 1, h, by) for h in ONE_LAYER_SHORT for by in bys(h)],
)
def test_exact_where_the_metric_is_affine_in_the_activation(attn_only, n_layers, hook_name, by):
    cfg = tiny_cfg(normalization=None, attn_only=attn_only, n_layers=n_layers)
    model = random_model(cfg, seed=5)
    clean, corrupted = inputs(cfg)
    metric = linear_metric(cfg.d_out)
    got = attribution_patching(model, clean, corrupted, metric, hook_name, by=by)
    want = patched_change(model, clean, corrupted, metric, hook_name, by)
    assert got.shape == want.shape
    assert want.abs().max() > 1e-2  # the patches do change the metric
    assert (got - want).abs().max() <= 1e-12 * max(1.0, float(want.abs().max()))


def test_not_exact_where_a_nonlinearity_follows():
    cfg = tiny_cfg(normalization=None, attn_only=True)
    model = random_model(cfg, seed=5)
    clean, corrupted = inputs(cfg)
    metric = linear_metric(cfg.d_out)
    got = attribution_patching(model, clean, corrupted, metric, "blocks.0.attn.hook_z", by="head")
    want = patched_change(model, clean, corrupted, metric, "blocks.0.attn.hook_z", "head")
    assert (got - want).abs().max() > 1e-3  # layer 1's softmax reads layer 0's z


# -- hand-worked values --------------------------------------------------------------------
@pytest.fixture(scope="module")
def averaging_model():
    """One attention-only block with every width 1: W_E = W_V = W_O = W_U = 1 and
    W_Q = W_K = 0, no biases and no normalization, so the head attends uniformly and
    ``y_p = x_p + mean(x_0 .. x_p)``."""
    cfg = tiny_cfg(
        d_in=1, d_out=1, d_model=1, d_head=1, n_heads=1, n_layers=1, n_ctx=3,
        attn_only=True, normalization=None, positional="none",
    )  # fmt: skip
    model = random_model(cfg)
    ones = {"embed.W_E", "blocks.0.attn.W_V", "blocks.0.attn.W_O", "unembed.W_U"}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if name in ones else 0.0)
    return model


def test_hand_worked_values(averaging_model):
    model = averaging_model
    clean = torch.tensor([[[1.0], [2.0], [3.0]]], dtype=torch.float64)
    corrupted = torch.ones(1, 3, 1, dtype=torch.float64)
    metric = lambda y: y[0, 2, 0] ** 2  # noqa: E731
    # corrupted: y_2 = 1 + 1 = 2; d metric / d resid_pre_p = 2 y_2 (1[p = 2] + 1/3)
    # a_clean - a_corr = (0, 1, 2), so the estimate is (0, 4/3, 2 * 16/3)
    got = attribution_patching(model, clean, corrupted, metric, "blocks.0.hook_resid_pre")
    want = torch.tensor([0.0, 4 / 3, 32 / 3], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=0, atol=1e-14)
    # patching x_1 = 2: y_2 = 1 + 4/3, change 49/9 - 4 = 13/9; x_2 = 3: y_2 = 3 + 5/3, change
    # 196/9 - 4 = 160/9. The metric is quadratic in y_2, so the first-order estimate misses
    # exactly (delta y_2)^2: (0, 1/3, 8/3)^2
    exact = patched_change(model, clean, corrupted, metric, "blocks.0.hook_resid_pre", "layer_pos")
    miss = torch.tensor([0.0, 1 / 9, 64 / 9], dtype=torch.float64)
    assert torch.allclose(exact - got, miss, rtol=0, atol=1e-13)
    # z at the corrupted run is the mean, 1 everywhere; clean z = (1, 1.5, 2); only z_2
    # reaches y_2, with d metric / d z_2 = 2 y_2 = 4: estimate 4 at position 2, exact change
    # (1 + 2)^2 - 4 = 5 = 4 + 1^2
    z = attribution_patching(model, clean, corrupted, metric, "z", by="head_pos")
    assert torch.allclose(z, torch.tensor([[[0.0, 0.0, 4.0]]], dtype=torch.float64), atol=1e-14)
    z_exact = patched_change(model, clean, corrupted, metric, "z", "head_pos")
    assert torch.allclose(z_exact, torch.tensor([[[0.0, 0.0, 5.0]]], dtype=torch.float64))


# -- invariants ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup():
    cfg = tiny_cfg()  # LN, MLPs, learned positions: nothing is linear
    model = random_model(cfg)
    clean, corrupted = inputs(cfg)
    metric = lambda y: (y[:, -1] ** 2).sum() + y.sum()  # noqa: E731
    return model, clean, corrupted, metric


@pytest.mark.parametrize(
    "hook_name", ["resid_pre", "mlp_out", "hook_embed", "z", "pattern", "attn_scores"]
)
def test_zero_when_clean_equals_corrupted(setup, hook_name):
    model, clean, _, metric = setup
    for by in bys(hook_name):
        got = attribution_patching(model, clean, clean.clone(), metric, hook_name, by=by)
        assert torch.equal(got, torch.zeros_like(got)), (hook_name, by)


@pytest.mark.parametrize("hook_name", ["z", "pattern", "attn_scores", "q", "result"])
def test_cells_sum_to_the_whole_layer(setup, hook_name):
    model, clean, corrupted, metric = setup
    got = {
        by: attribution_patching(model, clean, corrupted, metric, hook_name, by=by) for by in ALL_BY
    }
    assert got["layer"].abs().min() > 0
    for total in (
        got["layer_pos"].sum(-1),
        got["head"].sum(-1),
        got["head_pos"].sum((-2, -1)),
    ):
        assert torch.allclose(total, got["layer"], rtol=1e-12, atol=1e-12)
    assert torch.allclose(got["head_pos"].sum(-1), got["head"], rtol=1e-12, atol=1e-12)
    assert torch.allclose(got["head_pos"].sum(-2), got["layer_pos"], rtol=1e-12, atol=1e-12)


def test_linear_in_the_difference(setup):
    """With clean activations a_corr + t D (a clean_cache), the estimate is linear in t D."""
    model, clean, corrupted, metric = setup
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(2)]
    _, corr_cache = model.run_with_cache(corrupted, names_filter=names)
    _, clean_cache = model.run_with_cache(clean, names_filter=names)
    gen = torch.Generator().manual_seed(9)
    D1 = {n: clean_cache[n] - corr_cache[n] for n in names}
    D2 = {n: torch.randn(D1[n].shape, generator=gen, dtype=torch.float64) for n in names}

    def estimate(t1, t2):
        cache = {n: corr_cache[n] + t1 * D1[n] + t2 * D2[n] for n in names}
        return attribution_patching(
            model, clean, corrupted, metric, "z", by="head_pos", clean_cache=cache
        )

    one, two = estimate(1.0, 0.0), estimate(0.0, 1.0)
    assert torch.allclose(estimate(-2.5, 0.0), -2.5 * one, atol=1e-12)
    assert torch.allclose(estimate(1.0, 1.0), one + two, atol=1e-12)
    # and the clean cache given equals the one computed from clean_x
    computed = attribution_patching(model, clean, corrupted, metric, "z", by="head_pos")
    assert torch.allclose(one, computed, atol=1e-12)


def test_batched_equals_looped(setup):
    model, clean, corrupted, _ = setup
    w = torch.randn(BATCH, N_POS, 5, generator=torch.Generator().manual_seed(4)).double()

    def metric_of(rows):
        return lambda y: ((y - w[rows]) ** 2).sum()

    for hook_name, by in [("resid_mid", "layer_pos"), ("pattern", "head_pos"), ("v", "head")]:
        batched = attribution_patching(
            model, clean, corrupted, metric_of(slice(None)), hook_name, by=by
        )
        looped = sum(
            attribution_patching(
                model,
                clean[b : b + 1],
                corrupted[b : b + 1],
                metric_of(slice(b, b + 1)),
                hook_name,
                by=by,
            )  # fmt: skip
            for b in range(BATCH)
        )
        assert torch.allclose(batched, looped, rtol=1e-12, atol=1e-12), hook_name


@pytest.mark.parametrize(
    "hook_name, by",
    [("resid_pre", "layer_pos"), ("z", "head_pos"), ("attn_scores", "head"), ("post", "layer")],
)
def test_agrees_with_activation_patching_to_second_order(setup, hook_name, by):
    """corrupted = clean + eps * noise: the estimate's error shrinks like eps^2 while the
    change itself shrinks like eps, and the two correlate almost perfectly."""
    model, clean, _, metric = setup
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(8), dtype=clean.dtype)
    errors, scales = [], []
    for eps in (1e-2, 1e-3):
        corrupted = clean + eps * noise
        got = attribution_patching(model, clean, corrupted, metric, hook_name, by=by)
        want = patched_change(model, clean, corrupted, metric, hook_name, by)
        errors.append(float((got - want).abs().max()))
        scales.append(float(want.abs().max()))
        if got.numel() > 2:
            r = torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1]
            assert r > 0.99, (eps, float(r))
    assert 30 < errors[0] / errors[1] < 300  # eps^2: 100x for 10x smaller eps
    assert 5 < scales[0] / scales[1] < 20  # the change itself: 10x
    assert errors[1] < 0.05 * scales[1]  # relative error O(eps)


# -- the model and its hooks ---------------------------------------------------------------
def test_no_weight_grad_or_hook_changed(setup):
    model, clean, corrupted, metric = setup
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attribution_patching(model, clean, corrupted, metric, "z", by="head_pos")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not any(hp.has_hooks for hp in model.hook_dict.values())

    def bad_metric(y):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        attribution_patching(model, clean, corrupted, bad_metric, "z")
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


def test_frozen_weights_and_inference_mode_give_the_same_result():
    cfg = tiny_cfg()
    model = random_model(cfg, seed=2)
    clean, corrupted = inputs(cfg)
    metric = lambda y: (y**2).sum()  # noqa: E731
    want = attribution_patching(model, clean, corrupted, metric, "resid_mid")
    with torch.inference_mode():
        assert torch.equal(attribution_patching(model, clean, corrupted, metric, "resid_mid"), want)
    model.requires_grad_(False)
    assert torch.equal(attribution_patching(model, clean, corrupted, metric, "resid_mid"), want)


def test_a_user_forward_hook_is_part_of_the_model_in_every_run():
    """As in activation patching: the estimate is for the model with the user's hook, and
    stays exact where that model is affine in the patched activation."""
    cfg = tiny_cfg(normalization=None, attn_only=True)
    model = random_model(cfg, seed=5)
    clean, corrupted = inputs(cfg)
    metric = linear_metric(cfg.d_out)
    name = "blocks.1.attn.hook_z"

    def triple_head_0(z, hook):
        z = z.clone()
        z[:, :, 0] *= 3.0
        return z

    plain = attribution_patching(model, clean, corrupted, metric, name, by="head")
    with model.hooks(fwd_hooks=[(name, triple_head_0)]):
        got = attribution_patching(model, clean, corrupted, metric, name, by="head")
        want = patched_change(model, clean, corrupted, metric, name, "head")
        assert len(model.hook_dict[name]._fwd) == 1  # the user's hook, and only it
    assert (got - want).abs().max() <= 1e-12
    # what leaves the point differs 3x as much between the runs; what follows is unchanged
    assert torch.allclose(got[0], 3 * plain[0], atol=1e-12)
    assert torch.allclose(got[1], plain[1], atol=1e-12)


def test_cost_is_two_forwards_and_one_backward(setup, monkeypatch):
    model, clean, corrupted, metric = setup
    calls: dict[str, int] = {"grad": 0, "backward": 0}
    for fn_name in calls:
        original = getattr(torch.autograd, fn_name)

        def counted_fn(*args, fn_name=fn_name, original=original, **kwargs):
            calls[fn_name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(torch.autograd, fn_name, counted_fn)
    runs: dict[str, int] = {}

    def count(act, hook):
        runs[hook.name] = runs.get(hook.name, 0) + 1

    # the input's embedding, each block's start and the output: once per forward pass
    counted = [
        "hook_embed",
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_pre",
        "unembed.hook_out",
    ]
    for hook_name, by, cache, n_runs in [
        ("z", "head_pos", None, 2),  # 2 layers x 2 heads x 4 positions = 16 cells
        ("resid_pre", "layer_pos", None, 2),
        ("pattern", "head", model.run_with_cache(clean)[1], 1),  # clean run given
    ]:
        runs.clear()
        calls.update(grad=0, backward=0)
        with model.hooks(fwd_hooks=[(n, count) for n in counted]):
            attribution_patching(
                model, clean, corrupted, metric, hook_name, by=by, clean_cache=cache
            )
        assert runs == dict.fromkeys(counted, n_runs), (hook_name, runs)
        assert calls == {"grad": 1, "backward": 0}


# -- bad inputs ----------------------------------------------------------------------------
def test_errors_shared_with_activation_patching(setup):
    model, clean, corrupted, metric = setup
    cases = [
        (dict(corrupted_x=corrupted[:, :-1]), ValueError, "same shape"),
        (dict(hook_name="resid_prex"), ValueError, "unknown hook name 'resid_prex'"),
        (dict(by="heads"), ValueError, "by must be one of"),
        (dict(hook_name="resid_pre", by="head"), ValueError, "by='head' needs a per-head"),
        (dict(chunk_size=0), ValueError, "chunk_size must be a positive int"),
        (dict(metric=3), TypeError, "metric must be callable"),
    ]
    for change, error, message in cases:
        kwargs = dict(
            model=model, clean_x=clean, corrupted_x=corrupted, metric=metric, hook_name="z"
        )
        kwargs.update(change)
        with unchecked():
            for fn in (attribution_patching, activation_patching):
                with pytest.raises(error, match=message):
                    fn(**kwargs)


def test_error_non_finite_inputs_and_cache(setup):
    model, clean, corrupted, metric = setup
    bad = corrupted.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="corrupted_x contains NaN"):
        attribution_patching(model, clean, bad, metric, "z")
    with pytest.raises(ValueError, match="clean_x contains NaN"):
        attribution_patching(model, bad, corrupted, metric, "z")
    _, cache = model.run_with_cache(clean)
    cache = dict(cache)
    cache["blocks.1.hook_resid_pre"] = cache["blocks.1.hook_resid_pre"].clone()
    cache["blocks.1.hook_resid_pre"][0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="'blocks.1.hook_resid_pre' contains NaN or inf"):
        attribution_patching(model, clean, corrupted, metric, "resid_pre", clean_cache=cache)


def test_error_cache_missing_or_from_another_batch(setup):
    model, clean, corrupted, metric = setup
    _, partial = model.run_with_cache(clean, names_filter="blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match="clean_cache has no activation for 'blocks.1"):
        attribution_patching(model, clean, corrupted, metric, "resid_pre", clean_cache=partial)
    _, doubled = model.run_with_cache(clean.repeat(2, 1, 1))
    with pytest.raises(ValueError, match="the clean activation at 'blocks.0.hook_resid_pre'"):
        attribution_patching(model, clean, corrupted, metric, "resid_pre", clean_cache=doubled)


def test_a_clean_cache_of_another_input_is_refused(setup):
    model, clean, corrupted, metric = setup
    w_e = model.embed.W_E.detach()
    shifted = clean.clone()
    shifted[:, 2] += 1.0  # one position of clean_x changed
    for other in (corrupted, shifted):
        _, cache = model.run_with_cache(other)
        # the largest difference of the embeddings, computed apart: (other - clean) W_E
        gap = ((other - clean) @ w_e).abs().max().item()
        for fn in (attribution_patching, activation_patching):
            with pytest.raises(ValueError, match="clean_cache was not made from clean_x") as info:
                fn(model, clean, corrupted, metric, "z", clean_cache=cache)
            said = float(re.search(r"by up to (\S+) ", str(info.value)).group(1))
            assert said == pytest.approx(gap, rel=5e-3)  # printed to 3 digits
            with pytest.raises(ValueError, match="clean_cache was not made from clean_x"):
                fn(model, clean, corrupted, metric, "z", clean_cache=dict(cache))


def test_a_clean_cache_of_clean_x_is_accepted_with_hooks_and_filters(setup):
    model, clean, corrupted, metric = setup
    # a hook that edits hook_embed, attached while the cache is made and while patching:
    # the cached hook_embed is then not W_E x + b_E, and it is no reason to refuse
    double = [("hook_embed", lambda act, hook: 2 * act)]
    with model.hooks(fwd_hooks=double):
        _, cache = model.run_with_cache(clean)
        given = attribution_patching(model, clean, corrupted, metric, "z", clean_cache=cache)
        computed = attribution_patching(model, clean, corrupted, metric, "z")
    torch.testing.assert_close(given, computed, rtol=1e-12, atol=1e-12)
    # a cache without hook_embed cannot be checked, and is taken as given
    _, partial = model.run_with_cache(corrupted, names_filter=lambda n: n.endswith("hook_z"))
    attribution_patching(model, clean, corrupted, metric, "z", clean_cache=partial)


def test_a_non_finite_difference_names_the_run_it_comes_from():
    # W_E = 10 and inputs of 1e307: the embedding overflows to inf in the clean run, with
    # finite inputs and weights and no clean_cache passed
    cfg = tiny_cfg(normalization=None)
    model = random_model(cfg)
    with torch.no_grad():
        model.embed.W_E.fill_(10.0)
    huge = torch.full((BATCH, N_POS, cfg.d_in), 1e307, dtype=torch.float64)
    _, small = inputs(cfg)
    metric = lambda y: y.sum()  # noqa: E731
    n = BATCH * N_POS * cfg.d_model  # every entry of hook_embed is inf
    with pytest.raises(ValueError, match=f"{n} entries: the clean run on clean_x holds") as info:
        attribution_patching(model, huge, small, metric, "hook_embed", by="layer")
    assert "clean_cache" not in str(info.value)
    with pytest.raises(ValueError, match=f"{n} entries: the corrupted run on corrupted_x in {n}"):
        attribution_patching(model, small, huge, metric, "hook_embed", by="layer")


@pytest.mark.parametrize(
    "metric, message",
    [
        (lambda y: y[:, 0].sum(-1), "metric must return a scalar"),
        (lambda y: 1.5, "metric must return a scalar"),
        (lambda y: y.sum().detach(), "does not depend on the output through autograd"),
    ],
)
def test_error_bad_metric(setup, metric, message):
    model, clean, corrupted, _ = setup
    with pytest.raises(ValueError, match=message):
        attribution_patching(model, clean, corrupted, metric, "z")
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


def test_error_backward_hook_attached(setup):
    model, clean, corrupted, metric = setup
    double = lambda grad, hook: 2 * grad  # noqa: E731 - would silently double the estimate
    with model.hooks(bwd_hooks=[("blocks.1.hook_resid_post", double)]):
        with pytest.raises(ValueError, match="backward hook is attached at"):
            attribution_patching(model, clean, corrupted, metric, "resid_pre")
    [handle] = model.add_hook("blocks.0.attn.hook_z", double, dir="bwd")
    try:
        with pytest.raises(ValueError, match=r"\['blocks.0.attn.hook_z'\]"):
            attribution_patching(model, clean, corrupted, metric, "z")
    finally:
        handle.remove()
    with unchecked(), pytest.raises(TypeError, match="progress must be True or False"):
        attribution_patching(model, clean, corrupted, metric, "z", progress="yes")


# -- the how-to page -------------------------------------------------------------------------
def test_howto_page_snippets_run():
    page = Path(__file__).resolve().parents[1] / "docs" / "howto_attribution_patching.rst"
    text = page.read_text()
    blocks = re.findall(r"^\.\. code-block:: python\n((?:\n|   .*\n)+)", text, flags=re.M)
    assert len(blocks) == 2
    namespace: dict = {}
    for i, block in enumerate(blocks):
        code = "\n".join(line[3:] for line in block.splitlines()) + "\n"
        exec(compile(code, f"{page.name}[{i}]", "exec"), namespace)  # asserts the exact case
    assert namespace["exact"].shape == (2, 4, 16)
    assert namespace["estimate"].shape == (4, 16)  # one hook point: no layer axis
    assert bool(namespace["r"].isfinite())
