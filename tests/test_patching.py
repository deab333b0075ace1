"""Activation patching (batched == looped, clean cache restores the clean run, causality,
positions from clean_x.shape[1]) and the pseudoinverse QK patch."""

import pytest
import torch

from helpers import random_input, random_model, tiny_cfg
from vecinterp.analysis.patching import activation_patching, patch_hook, patch_qk_identity

# Batched (tiled) and looped runs agree to float64 rounding, not bit for bit: a batched
# matrix product may sum in another order depending on how many rows it is given, so a
# row's last bit can depend on the batch size. assert_same allows 1e-12.
BATCH, N_POS = 1, 4


def assert_same(
    a,
    b,
):
    """Equal up to float64 rounding of differently batched matrix products."""
    b = b.reshape(a.shape) if hasattr(b, "reshape") and b.numel() == a.numel() else b
    assert a.shape == b.shape
    assert a.numel() == 0 or (a.detach() - b.detach()).abs().max() <= 1e-12


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_cfg()  # d_in=3, n_ctx=7, 2 layers, 2 heads
    model = random_model(cfg)
    clean = random_input(cfg, batch=BATCH, n_pos=N_POS, seed=1)
    corrupted = random_input(cfg, batch=BATCH, n_pos=N_POS, seed=2)
    weights = torch.randn(BATCH, N_POS, cfg.d_out, generator=torch.Generator().manual_seed(3))
    metric = lambda y: (y * weights.to(y)).sum()  # noqa: E731
    return model, clean, corrupted, metric


def per_position_metric(q: int):
    gen = torch.Generator().manual_seed(10 + q)
    w = torch.randn(BATCH, 5, generator=gen, dtype=torch.float64)
    return lambda y: (y[:, q] * w).sum()


# -- the looped reference: one run_with_hooks per cell, indices written out by hand --
def cell_indices(hook_name: str, by: str, n_heads: int, n_pos: int) -> list:
    every = slice(None)
    dest = hook_name in ("pattern", "attn_scores")
    per_head = dest or hook_name in ("q", "k", "v", "z", "result", "rot_q", "rot_k")
    if by == "layer":
        return [(every,)]
    if by == "layer_pos":
        return [(every, every, p) if dest else (every, p) for p in range(n_pos)]
    assert per_head
    if by == "head":
        return [(every, h) if dest else (every, every, h) for h in range(n_heads)]
    return [(every, h, p) if dest else (every, p, h) for h in range(n_heads) for p in range(n_pos)]


def looped(model, clean, corrupted, metric, hook_name, by):
    key = (model, hook_name, by)  # holding the model keeps its id from being reused
    if key not in _LOOPED:
        _LOOPED[key] = _looped(model, clean, corrupted, metric, hook_name, by)
    return _LOOPED[key]


_LOOPED: dict = {}  # the reference is computed once per case, not once per chunk size


def _looped(model, clean, corrupted, metric, hook_name, by):
    _, cache = model.run_with_cache(clean)
    out = []
    for layer in range(model.cfg.n_layers):
        full = f"blocks.{layer}.attn.hook_{hook_name}"
        if full not in model.hook_dict:
            full = f"blocks.{layer}.hook_{hook_name}"
        row = []
        for idx in cell_indices(hook_name, by, model.cfg.n_heads, clean.shape[1]):

            def hook(act, hook, idx=idx, full=full):
                act = act.clone()
                act[idx] = cache[full][idx]
                return act

            y = model.run_with_hooks(corrupted, fwd_hooks=[(full, hook)])
            row.append(metric(y))
        out.append(torch.stack(row))
    return torch.stack(out)


CHUNKED_CASES = [
    ("resid_pre", "layer_pos"),
    ("z", "head"),
    ("pattern", "head_pos"),
]
OTHER_CASES = [
    ("resid_mid", "layer_pos"),
    ("attn_out", "layer"),
    ("mlp_out", "layer_pos"),
    ("z", "head_pos"),
    ("z", "layer_pos"),
    ("pattern", "head"),
    ("pattern", "layer_pos"),
    ("q", "head_pos"),
    ("v", "head"),
    ("attn_scores", "head"),
]


@pytest.mark.parametrize(
    "hook_name, by, chunk",
    [(*case, chunk) for case in CHUNKED_CASES for chunk in (1, 2, "all")]
    + [("result", "head_pos", 2), ("result", "head_pos", "all")]
    + [(*case, "all") for case in OTHER_CASES],
)
def test_batched_equals_looped_exactly(setup, hook_name, by, chunk):
    model, clean, corrupted, metric = setup
    n_cells = {"layer": 1, "layer_pos": N_POS, "head": 2, "head_pos": 2 * N_POS}[by]
    chunk_size = n_cells if chunk == "all" else chunk
    got = activation_patching(
        model, clean, corrupted, metric, hook_name, by=by, chunk_size=chunk_size, progress=False
    )
    want = looped(model, clean, corrupted, metric, hook_name, by)
    if by == "layer":
        want = want[:, 0]
    elif by == "head_pos":
        want = want.reshape(2, 2, N_POS)
    assert got.shape == want.shape
    assert_same(got, want)


def test_default_chunk_batch_of_two_and_rotary_hooks_equal_looped():
    cfg = tiny_cfg(positional="rotary", normalization="RMS")
    model = random_model(cfg, seed=4)
    clean = random_input(cfg, batch=2, n_pos=2, seed=5)
    corrupted = random_input(cfg, batch=2, n_pos=2, seed=6)
    w = torch.randn(2, 2, cfg.d_out, generator=torch.Generator().manual_seed(7))
    metric = lambda y: (y * w.to(y)).sum()  # noqa: E731
    for hook_name, by in [("rot_k", "head_pos"), ("resid_post", "layer_pos")]:
        got = activation_patching(model, clean, corrupted, metric, hook_name, by=by, progress=False)
        want = looped(model, clean, corrupted, metric, hook_name, by)
        assert_same(got, want.reshape(got.shape))


def test_full_name_sweeps_one_hook_point(setup):
    model, clean, corrupted, metric = setup
    all_layers = activation_patching(
        model, clean, corrupted, metric, "z", by="head_pos", progress=False
    )
    one = activation_patching(
        model, clean, corrupted, metric, "blocks.1.attn.hook_z", by="head_pos", progress=False
    )
    assert one.shape == (2, N_POS)
    assert_same(one, all_layers[1])
    embed = activation_patching(model, clean, corrupted, metric, "hook_embed")  # with a bar
    assert embed.shape == (N_POS,)


def test_patch_hook_matches_one_cell(setup):
    model, clean, corrupted, metric = setup
    _, cache = model.run_with_cache(clean)
    name = "blocks.0.attn.hook_pattern"
    y = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch_hook(cache[name], (1, 3)))])
    grid = activation_patching(model, clean, corrupted, metric, name, by="head_pos", progress=False)
    assert_same(grid[1, 3], metric(y))


def test_patch_hook_rejects_wrong_shape(setup):
    model, clean, corrupted, _ = setup
    hook = patch_hook(torch.zeros(BATCH, N_POS, 3), (0,))
    with pytest.raises(ValueError, match="clean activation has shape"):
        model.run_with_hooks(corrupted, fwd_hooks=[("blocks.0.hook_resid_pre", hook)])


# -- invariants -----------------------------------------------------------------------
@pytest.mark.parametrize("hook_name", ["resid_pre", "resid_post"])
def test_patching_a_whole_residual_layer_restores_the_clean_metric(setup, hook_name):
    model, clean, corrupted, metric = setup
    clean_metric = metric(model(clean))
    got = activation_patching(
        model, clean, corrupted, metric, hook_name, by="layer", progress=False
    )
    assert_same(got, clean_metric.expand(2))
    assert metric(model(corrupted)) != clean_metric  # so the check above means something


def test_patching_one_position_only_changes_what_causality_allows(setup):
    model, clean, corrupted, _ = setup
    _, cache = model.run_with_cache(clean)
    y_clean, y_corrupted = model(clean), model(corrupted)
    for q in range(N_POS):
        metric = per_position_metric(q)
        grid = activation_patching(
            model, clean, corrupted, metric, "resid_pre", clean_cache=cache, progress=False
        )
        later, upto = grid[:, q + 1 :], grid[:, : q + 1]
        assert_same(later, metric(y_corrupted).expand_as(later))
        assert bool((upto != metric(y_corrupted)).all())
        # the last resid_post at q feeds only output q (ln_final and W_U are per position)
        post = activation_patching(
            model,
            clean,
            corrupted,
            metric,
            "blocks.1.hook_resid_post",
            clean_cache=cache,
            progress=False,
        )
        assert_same(post[q], metric(y_clean))


def test_given_clean_cache_equals_computed(setup):
    model, clean, corrupted, metric = setup
    _, cache = model.run_with_cache(clean)
    for name, by in [("resid_mid", "layer_pos"), ("pattern", "head")]:
        a = activation_patching(
            model, clean, corrupted, metric, name, by=by, clean_cache=cache, progress=False
        )
        b = activation_patching(model, clean, corrupted, metric, name, by=by, progress=False)
        assert_same(a, b)
    as_dict = activation_patching(
        model, clean, corrupted, metric, "z", clean_cache=dict(cache), progress=False
    )
    assert_same(as_dict, activation_patching(model, clean, corrupted, metric, "z", progress=False))


def test_model_has_no_hooks_left_even_after_an_error(setup):
    model, clean, corrupted, _ = setup

    def bad_metric(y):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        activation_patching(model, clean, corrupted, bad_metric, "z", progress=False)
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


# -- shapes: positions come from clean_x.shape[1], never from d_in ---------------------
@pytest.mark.parametrize("d_in, n_pos", [(3, 6), (5, 5), (5, 4)])
def test_shapes_use_the_position_axis(d_in, n_pos):
    cfg = tiny_cfg(d_in=d_in, n_heads=3, n_layers=2)
    model = random_model(cfg)
    clean = random_input(cfg, batch=1, n_pos=n_pos, seed=1)
    corrupted = random_input(cfg, batch=1, n_pos=n_pos, seed=2)
    metric = lambda y: y.sum()  # noqa: E731
    _, cache = model.run_with_cache(clean)
    want = {
        ("resid_pre", "layer_pos"): (2, n_pos),
        ("mlp_out", "layer"): (2,),
        ("z", "head"): (2, 3),
        ("z", "head_pos"): (2, 3, n_pos),
        ("k", "layer_pos"): (2, n_pos),
        ("pattern", "head_pos"): (2, 3, n_pos),
        ("pattern", "layer_pos"): (2, n_pos),
        ("blocks.0.attn.hook_result", "head_pos"): (3, n_pos),
        ("blocks.1.hook_attn_out", "layer"): (),
    }
    for (name, by), shape in want.items():
        got = activation_patching(
            model, clean, corrupted, metric, name, by=by, clean_cache=cache, progress=False
        )
        assert got.shape == shape, (name, by)


# -- errors ---------------------------------------------------------------------------
def test_error_mismatched_shapes(setup):
    model, clean, corrupted, metric = setup
    with pytest.raises(ValueError, match="same shape"):
        activation_patching(model, clean, corrupted[:, :-1], metric, "resid_pre")
    with pytest.raises(ValueError, match="same shape"):
        activation_patching(model, clean, corrupted.repeat(2, 1, 1), metric, "resid_pre")


def test_error_unknown_hook_name(setup):
    model, clean, corrupted, metric = setup
    with pytest.raises(ValueError, match="unknown hook name 'resid_prex'"):
        activation_patching(model, clean, corrupted, metric, "resid_prex")
    with pytest.raises(ValueError, match="unknown hook name 'blocks.0.hook_resid_pr'"):
        activation_patching(model, clean, corrupted, metric, "blocks.0.hook_resid_pr")


def test_error_short_name_missing_in_attn_only_model():
    cfg = tiny_cfg(attn_only=True)
    model = random_model(cfg)
    x = random_input(cfg, batch=1, n_pos=4)
    with pytest.raises(ValueError, match="unknown hook name 'blocks.0.hook_mlp_out'"):
        activation_patching(model, x, x, lambda y: y.sum(), "mlp_out")


def test_error_head_cells_on_a_residual_hook(setup):
    model, clean, corrupted, metric = setup
    with pytest.raises(ValueError, match="by='head' needs a per-head hook point"):
        activation_patching(model, clean, corrupted, metric, "resid_pre", by="head")
    with pytest.raises(ValueError, match="by='head_pos' needs a per-head hook point"):
        activation_patching(model, clean, corrupted, metric, "blocks.0.hook_mlp_out", by="head_pos")


def test_error_bad_by_and_chunk_size(setup):
    model, clean, corrupted, metric = setup
    with pytest.raises(ValueError, match="by must be one of"):
        activation_patching(model, clean, corrupted, metric, "z", by="heads")
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        activation_patching(model, clean, corrupted, metric, "z", chunk_size=0)


def test_error_bad_metric(setup):
    model, clean, corrupted, _ = setup
    with pytest.raises(ValueError, match="metric must return a scalar"):
        activation_patching(model, clean, corrupted, lambda y: y[:, 0], "z", progress=False)


def test_error_clean_cache_missing_the_hook(setup):
    model, clean, corrupted, metric = setup
    _, cache = model.run_with_cache(clean, names_filter="blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match="clean_cache has no activation for 'blocks.1"):
        activation_patching(model, clean, corrupted, metric, "resid_pre", clean_cache=cache)


def test_error_clean_cache_from_another_batch(setup):
    model, clean, corrupted, metric = setup
    _, cache = model.run_with_cache(clean.repeat(2, 1, 1))
    with pytest.raises(ValueError, match="the clean activation at 'blocks.0.hook_resid_pre'"):
        activation_patching(
            model, clean, corrupted, metric, "resid_pre", clean_cache=cache, progress=False
        )


# -- the pseudoinverse QK patch -----------------------------------------------------------
@pytest.fixture(scope="module")
def qk_model():
    return random_model(tiny_cfg(d_model=12, d_head=3, n_heads=3, n_layers=2))


def test_patched_qk_is_a_rank_d_head_projection(qk_model):
    patched = patch_qk_identity(qk_model, layer=1, heads=[0, 2], seed=7)
    for h in (0, 2):
        P = patched.QK[1, h].AB
        assert torch.allclose(P @ P, P, atol=1e-12)
        assert torch.allclose(P, P.T, atol=1e-12)
        assert int(torch.linalg.matrix_rank(P)) == 3
        assert torch.allclose(torch.trace(P), torch.tensor(3.0, dtype=P.dtype), atol=1e-12)


def test_qk_patch_leaves_everything_else_alone(qk_model):
    before = {k: v.clone() for k, v in qk_model.state_dict().items()}
    patched = patch_qk_identity(qk_model, layer=-1, heads=1)
    assert patched is not qk_model
    after_input = qk_model.state_dict()
    assert all(torch.equal(before[k], after_input[k]) for k in before)  # input untouched
    new = patched.state_dict()
    assert new.keys() == before.keys()
    for key, value in before.items():
        if key in ("blocks.1.attn.W_Q", "blocks.1.attn.W_K"):
            assert torch.equal(new[key][[0, 2]], value[[0, 2]])
            assert not torch.equal(new[key][1], value[1])
        else:
            assert torch.equal(new[key], value), key
    x = random_input(qk_model.cfg, batch=1)
    assert not torch.allclose(patched(x), qk_model(x))


def test_qk_patch_is_seeded_and_per_head(qk_model):
    a = patch_qk_identity(qk_model, 0, [0, 1], seed=3)
    b = patch_qk_identity(qk_model, 0, [0, 1], seed=3)
    c = patch_qk_identity(qk_model, 0, [0, 1], seed=4)
    only_1 = patch_qk_identity(qk_model, 0, 1, seed=3)
    W_Q = lambda m: m.blocks[0].attn.W_Q  # noqa: E731
    assert torch.equal(W_Q(a), W_Q(b))
    assert not torch.equal(W_Q(a)[1], W_Q(c)[1])
    assert torch.equal(W_Q(a)[1], W_Q(only_1)[1])


def test_qk_patch_scale_and_biases(qk_model):
    plain = patch_qk_identity(qk_model, 1, "all", seed=1)
    scaled = patch_qk_identity(qk_model, 1, "all", seed=1, scale=2.5, zero_biases=True)
    assert torch.allclose(scaled.QK[1].AB, 2.5 * plain.QK[1].AB, atol=1e-12)
    attn, ref = scaled.blocks[1].attn, qk_model.blocks[1].attn
    assert torch.equal(plain.blocks[1].attn.b_Q, ref.b_Q)  # kept by default
    assert torch.equal(plain.blocks[1].attn.b_K, ref.b_K)
    assert bool((attn.b_Q == 0).all()) and bool((attn.b_K == 0).all())
    assert torch.equal(attn.b_V, ref.b_V)
    # with zero biases the head's score is exactly the projection's bilinear form
    x = random_input(qk_model.cfg, batch=1, n_pos=5)
    _, cache = scaled.run_with_cache(x)
    ln1 = scaled.blocks[1].ln1
    u = cache["normalized", 1, "ln1"] * ln1.w + ln1.b
    want = torch.einsum("bqd,hde,bke->bhqk", u, scaled.QK[1].AB, u) / 3**0.5
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.allclose(cache["attn_scores", 1][..., mask], want[..., mask], atol=1e-10)


def test_qk_patch_with_d_head_above_d_model_is_the_identity():
    model = random_model(tiny_cfg(d_model=4, d_head=6, n_heads=1))
    P = patch_qk_identity(model, 0, 0).QK[0, 0].AB
    assert torch.allclose(P, torch.eye(4, dtype=P.dtype), atol=1e-12)


def test_qk_patch_errors(qk_model):
    with pytest.raises(ValueError, match=r"layer must be an int in \[-2, 1\]"):
        patch_qk_identity(qk_model, 2, 0)
    with pytest.raises(ValueError, match=r"head must be an int in \[-3, 2\]"):
        patch_qk_identity(qk_model, 0, [0, 3])
    with pytest.raises(ValueError, match="heads must be a head index"):
        patch_qk_identity(qk_model, 0, "some")
    with pytest.raises(ValueError, match="no heads selected"):
        patch_qk_identity(qk_model, 0, [])
