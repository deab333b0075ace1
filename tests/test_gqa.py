"""Grouped-query attention (``n_key_value_heads < n_heads``): the forward pass against
independent implementations, the parameters and hooks as TransformerLens stores them, and
every analysis that reads keys and values per query head."""

import math

import pytest
import torch
import torch.nn.functional as F

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.analysis import ov_circuit, qk_circuit
from vecinterp.model.components import Attention, GroupedQueryAttention
from vecinterp.testing import PlainTransformer

F64_TOL = 1e-12


def gqa_cfg(**overrides) -> vi.VectorTransformerConfig:
    kwargs: dict = dict(n_heads=4, n_key_value_heads=2, n_ctx=5)
    kwargs.update(overrides)
    return tiny_cfg(**kwargs)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


# -- config -------------------------------------------------------------------------------


def test_none_means_n_heads_and_equals_an_explicit_count():
    plain, explicit = tiny_cfg(), tiny_cfg(n_key_value_heads=2)
    assert plain.n_key_value_heads == 2 and plain == explicit and not plain.is_gqa
    old = plain.to_dict()
    del old["n_key_value_heads"], old["gated_mlp"]  # a config saved before the fields
    assert vi.VectorTransformerConfig.from_dict(old) == plain
    # replace keeps ordinary attention ordinary when n_heads changes, and a GQA count fixed
    assert plain.replace(n_heads=4).n_key_value_heads == 4
    assert gqa_cfg().replace(n_heads=8).n_key_value_heads == 2
    assert vi.VectorTransformerConfig.from_dict(gqa_cfg().to_dict()) == gqa_cfg()


@pytest.mark.parametrize("bad", [3, 0, -1, 2.0, True, "2"])
def test_bad_key_value_head_counts_are_refused(bad):
    with unchecked(), pytest.raises(ValueError, match="n_key_value_heads"):
        tiny_cfg(n_heads=4, n_key_value_heads=bad)


def test_parameters_and_hooks_have_transformer_lens_names_and_shapes():
    model = random_model(gqa_cfg())
    attn = model.blocks[0].attn
    assert isinstance(attn, GroupedQueryAttention)
    names = {n for n, _ in attn.named_parameters()}
    assert names == {"W_Q", "_W_K", "_W_V", "W_O", "b_Q", "_b_K", "_b_V", "b_O"}
    assert attn._W_K.shape == (2, 8, 4) and attn._b_V.shape == (2, 4)
    # the per-query-head views: query head h reads kv head h // 2
    for h in range(4):
        assert torch.equal(attn.W_K[h], attn._W_K[h // 2])
        assert torch.equal(attn.W_V[h], attn._W_V[h // 2])
        assert torch.equal(attn.b_K[h], attn._b_K[h // 2])
        assert torch.equal(attn.b_V[h], attn._b_V[h // 2])
    assert model.W_K.shape == (2, 4, 8, 4) and model.b_V.shape == (2, 4, 4)
    with pytest.raises(AttributeError, match="read only: write _W_K"):
        attn.W_K = torch.nn.Parameter(torch.zeros(4, 8, 4))
    _, cache = model.run_with_cache(random_input(model.cfg))
    assert cache["k", 0].shape == (3, 5, 2, 4) and cache["v", 1].shape == (3, 5, 2, 4)
    assert cache["q", 0].shape == cache["z", 0].shape == (3, 5, 4, 4)
    assert cache["pattern", 0].shape == (3, 4, 5, 5)
    assert cache["result", 0].shape == (3, 5, 4, 8)


def test_ordinary_attention_keeps_its_parameters_and_draws():
    cfg = tiny_cfg()
    model = vi.HookedVectorTransformer(cfg, seed=3)
    attn = model.blocks[0].attn
    assert type(attn) is Attention
    assert [n for n, _ in attn.named_parameters()] == [
        "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"
    ]  # fmt: skip
    explicit = vi.HookedVectorTransformer(tiny_cfg(n_key_value_heads=2), seed=3)
    for (n, a), (m, b) in zip(
        model.state_dict().items(), explicit.state_dict().items(), strict=True
    ):
        assert n == m and torch.equal(a, b)


# -- the forward pass against independent implementations --------------------------------


def _by_hand(model: vi.HookedVectorTransformer, x: torch.Tensor) -> torch.Tensor:
    """Layer 0's attention output of a one-layer model, computed with repeat_interleave of
    the stored key/value weights (no rotary)."""
    cfg, attn = model.cfg, model.blocks[0].attn
    g = cfg.n_heads // cfg.n_kv_heads
    resid = x @ model.W_E + model.W_pos[: x.shape[1]]
    y = model.blocks[0].ln1(resid)
    q = torch.einsum("bpd,hde->bhpe", y, attn.W_Q) + attn.b_Q[None, :, None]
    W_K, b_K, W_V, b_V = attn.kv_parameters()  # the stored [n_kv, ...] weights
    k = torch.einsum("bpd,hde->bhpe", y, W_K) + b_K[None, :, None]
    v = torch.einsum("bpd,hde->bhpe", y, W_V) + b_V[None, :, None]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
    if cfg.causal:
        n = x.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    z = scores.softmax(-1) @ v
    return torch.einsum("bhpe,hed->bpd", z, attn.W_O) + attn.b_O


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_equals_repeat_interleave_by_hand(n_kv, causal):
    model = random_model(gqa_cfg(n_key_value_heads=n_kv, causal=causal, n_layers=1))
    x = random_input(model.cfg)
    _, cache = model.run_with_cache(x)
    assert rel(cache["attn_out", 0], _by_hand(model, x)) < F64_TOL


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("positional", ["rotary", "learned"])
@pytest.mark.parametrize("normalization", ["LN", "RMS"])
def test_model_equals_the_plain_sdpa_reference(n_kv, causal, positional, normalization):
    cfg = gqa_cfg(
        n_key_value_heads=n_kv, causal=causal, positional=positional, normalization=normalization
    )
    model = random_model(cfg)
    x = random_input(cfg)
    plain = PlainTransformer(cfg, model.state_dict())
    assert rel(model(x), plain(x)) < F64_TOL


def test_expanding_the_key_value_heads_gives_the_same_model():
    """A GQA model equals the ordinary model whose W_K etc. are the expanded copies."""
    gqa = random_model(gqa_cfg(positional="rotary"))
    mha = vi.HookedVectorTransformer(gqa.cfg.replace(n_key_value_heads=4), dtype=torch.float64)
    state = {}
    for name, t in gqa.state_dict().items():
        layer, leaf = name.rsplit(".", 1)
        state[f"{layer}.{leaf.lstrip('_')}"] = (
            t.repeat_interleave(2, dim=0) if leaf.startswith("_") else t
        )
    mha.load_state_dict(state)
    x = random_input(gqa.cfg)
    assert rel(gqa(x), mha(x)) < F64_TOL


def test_hooked_and_idle_paths_agree_bitwise_and_hooks_edit_the_run():
    model = random_model(gqa_cfg(positional="rotary"))
    x = random_input(model.cfg)
    plain = model(x)
    y, cache = model.run_with_cache(x)
    assert torch.equal(y, plain)

    # an edit of kv head 1's values reaches query heads 2 and 3 only
    def zero_v1(v, hook):
        v[:, :, 1] = 0.0
        return v

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_v", zero_v1)]):
        _, edited = model.run_with_cache(x, names_filter="blocks.0.attn.hook_z")
    z, z_edited = cache["z", 0], edited["z", 0]
    assert torch.equal(z_edited[:, :, :2], z[:, :, :2])
    assert bool(z_edited[:, :, 2:].eq(0).all()) and not bool(z[:, :, 2:].eq(0).all())


def test_cache_values_equal_what_hooks_see_and_the_decomposition_sums():
    model = random_model(gqa_cfg(gated_mlp=True))
    x = random_input(model.cfg)
    seen = {}

    def record(t, hook):
        seen[hook.name] = t.detach().clone()

    names = ["blocks.1.attn.hook_k", "blocks.1.attn.hook_v", "blocks.0.mlp.hook_pre_linear"]
    with model.hooks(fwd_hooks=[(n, record) for n in names]):
        model(x)
    _, cache = model.run_with_cache(x)
    for n in names:
        assert torch.equal(seen[n], cache[n])
    parts = cache.decompose_resid()
    assert rel(parts.sum(0), cache["resid_post", 1]) < F64_TOL
    heads = cache.stack_head_results(layer=1)
    b_O = model.blocks[0].attn.b_O
    assert rel(heads.sum(0) + b_O, cache["attn_out", 0]) < F64_TOL


# -- weight processing ---------------------------------------------------------------------


@pytest.mark.parametrize("normalization", ["LN", "RMS"])
def test_processing_keeps_the_outputs(normalization):
    model = random_model(gqa_cfg(normalization=normalization, gated_mlp=True, positional="rotary"))
    x = random_input(model.cfg)
    y = model(x)
    centre = normalization == "LN"
    for new in (
        vi.fold_layer_norm(model),
        vi.fold_value_biases(model),
        vi.process_weights(model, center_writing_weights=centre),
        *([vi.center_writing_weights(model)] if centre else []),
    ):
        assert rel(new(x), y) < F64_TOL


def test_fold_value_biases_sums_over_every_query_head_of_a_group():
    model = random_model(gqa_cfg())
    folded = vi.fold_value_biases(model)
    for old, new in zip(model.blocks, folded.blocks, strict=True):
        a = old.attn
        expected = a.b_O + sum(a._b_V[h // 2] @ a.W_O[h] for h in range(4))
        assert rel(new.attn.b_O, expected) < F64_TOL
        assert bool(new.attn._b_V.eq(0).all())


def test_fold_layer_norm_folds_into_the_stored_key_value_weights():
    model = random_model(gqa_cfg(normalization="LN"))
    folded = vi.fold_layer_norm(model, center_weights=False)
    a, w, b = model.blocks[0].attn, model.blocks[0].ln1.w, model.blocks[0].ln1.b
    assert rel(folded.blocks[0].attn._W_K, a._W_K * w[:, None]) < F64_TOL
    assert rel(folded.blocks[0].attn._b_V, a._b_V + b @ a._W_V) < F64_TOL


# -- circuits, scores, attribution, ablation ------------------------------------------------


def test_ov_and_qk_circuits_use_each_query_heads_group():
    model = random_model(gqa_cfg(n_heads=4, n_key_value_heads=2))
    ov, qk = ov_circuit(model), qk_circuit(model)
    for layer, block in enumerate(model.blocks):
        a = block.attn
        for h in range(4):
            dense_ov = a._W_V[h // 2] @ a.W_O[h]
            dense_qk = a.W_Q[h] @ a._W_K[h // 2].T
            assert rel(ov[layer, h].AB, dense_ov) < F64_TOL
            assert rel(qk[layer, h].AB, dense_qk) < F64_TOL


@torch.no_grad()
def test_composition_and_eigenvalue_scores_match_the_dense_definition():
    model = random_model(gqa_cfg(n_heads=4, n_key_value_heads=1))
    scores = vi.composition_scores(model, "K")
    a0, a1 = model.blocks[0].attn, model.blocks[1].attn
    for h1 in range(4):
        for h2 in range(4):
            L = a0._W_V[0] @ a0.W_O[h1]
            R = (a1.W_Q[h2] @ a1._W_K[0].T).T
            dense = torch.linalg.norm(L @ R) / (torch.linalg.norm(L) * torch.linalg.norm(R))
            assert abs(float(scores[0, h1, 1, h2] - dense)) < 1e-10
    eig = vi.eigenvalue_scores(model, kind="ov")
    for h in range(4):
        m = a1._W_V[0] @ a1.W_O[h]
        ev = torch.linalg.eigvals(m)
        assert abs(float(eig[1, h] - ev.real.sum() / ev.abs().sum())) < 1e-10


def test_direct_attribution_sums_to_the_output():
    model = random_model(gqa_cfg(gated_mlp=True))
    x = random_input(model.cfg)
    y, cache = model.run_with_cache(x)
    t = torch.randn(y.shape, dtype=y.dtype)
    attr = vi.direct_attribution(model, cache, t)
    assert rel(attr.values.sum(0), ((y - model.b_U) * t).sum(-1)) < 1e-10


def test_zero_ablating_a_head_removes_only_that_query_heads_output():
    model = random_model(gqa_cfg())
    x = random_input(model.cfg)
    ablated = vi.ablate_heads(model, x, (0, 1), kind="zero")
    _, cache = model.run_with_cache(x)

    def by_hand(result, hook):
        return result - cache["result", 0][:, :, 1:2].expand_as(result) * (
            torch.arange(4).view(1, 1, 4, 1) == 1
        )

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_result", by_hand)]):
        expected = model(x)
    assert rel(ablated, expected) < F64_TOL


@torch.no_grad()
def test_activation_patching_of_keys_sweeps_the_key_value_heads():
    model = random_model(gqa_cfg())
    clean, corrupted = random_input(model.cfg, seed=1), random_input(model.cfg, seed=2)

    def metric(y):
        return y.sum()

    by_head = vi.activation_patching(model, clean, corrupted, metric, "k", by="head")
    assert by_head.shape == (2, 2)  # [n_layers, n_key_value_heads]
    _, clean_cache = model.run_with_cache(clean)
    # kv head 1 of layer 1 by hand: a paste into hook_k[:, :, 1]
    hook = vi.patch_hook(clean_cache["k", 1], (slice(None), 1))
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_k", hook)]):
        expected = metric(model(corrupted))
    assert abs(float(by_head[1, 1] - expected)) < 1e-10 * abs(float(expected))
    estimate = vi.attribution_patching(model, clean, corrupted, metric, "v", by="head")
    assert estimate.shape == (2, 2)


def test_per_query_head_key_edits_are_refused():
    model = random_model(gqa_cfg())
    x = random_input(model.cfg)
    with pytest.raises(ValueError, match="grouped-query attention"):
        vi.patch_qk_identity(model, layer=0, heads=0)
    with pytest.raises(ValueError, match="grouped-query attention"):
        vi.path_patching(model, x, x + 1, lambda y: y.sum(), (0, 1), (1, 0, "k"))
    with pytest.raises(ValueError, match="grouped-query attention"):
        vi.discover_circuit(model, x, x + 1, metric=lambda y: y.sum(), threshold=0.0)
    # a query receiver is per query head, and allowed
    vi.path_patching(model, x, x + 1, lambda y: y.sum(), (0, 1), (1, 0, "q"))


_WRITES = {
    "copy_": lambda t: t.copy_(torch.zeros_like(t)),
    "normal_": lambda t: t.normal_(),
    "zero_": lambda t: t.zero_(),
    "setitem": lambda t: t.__setitem__(0, 1.0),
    "view add_": lambda t: t[0].add_(1.0),
    "detach fill_": lambda t: t.detach().fill_(2.0),
    "+=": lambda t: t.__iadd__(1.0),
    "nn.init": lambda t: torch.nn.init.normal_(t),
    "out=": lambda t: torch.mul(t.detach().clone(), 2.0, out=t),
    ".data =": lambda t: setattr(t, "data", torch.zeros_like(t)),
}


@pytest.mark.parametrize("name", ["W_K", "W_V", "b_K", "b_V"])
@pytest.mark.parametrize("write", _WRITES.values(), ids=_WRITES.keys())
def test_writes_into_the_expanded_key_value_weights_raise(name, write):
    # before, each of these wrote into a new tensor and the model stayed as it was
    model = random_model(gqa_cfg())
    attn = model.blocks[0].attn
    before = {n: p.detach().clone() for n, p in attn.named_parameters()}
    with torch.no_grad(), pytest.raises(RuntimeError, match=f"Write _{name} "):
        write(getattr(attn, name))
    for n, p in attn.named_parameters():
        assert torch.equal(p, before[n]), n


def test_expanded_key_value_weights_still_read_as_tensors():
    model = random_model(gqa_cfg())
    attn = model.blocks[0].attn
    W_V = attn.W_V
    # new tensors computed from them are ordinary (writable) tensors
    product = W_V @ attn.W_O
    assert type(product) is torch.Tensor and type(W_V.clone()) is torch.Tensor
    product.zero_()
    W_V.detach().clone().zero_()
    # a source of a copy, and gradients flow to the stored _W_V
    target = torch.empty(4, 8, 4, dtype=W_V.dtype)
    target.copy_(W_V)
    assert torch.equal(target, attn._W_V.repeat_interleave(2, dim=0))
    (attn.W_V * torch.arange(4.0, dtype=W_V.dtype)[:, None, None]).sum().backward()
    # kv head g serves query heads 2g and 2g + 1: gradient 2g + 2g + 1 per entry
    expected = torch.tensor([1.0, 5.0], dtype=W_V.dtype)[:, None, None].expand(2, 8, 4)
    assert torch.equal(attn._W_V.grad, expected)
    # writing the stored parameter is the way, and reading W_V shows it
    with torch.no_grad():
        attn.kv_parameters()[2].zero_()
    assert bool((attn.W_V == 0).all())


# -- init, save/load, training --------------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("init", ["gpt2", "transformer_lens"])
def test_init_draws_the_key_value_weights_like_the_others(init):
    cfg = gqa_cfg(init=init, d_model=64, d_head=16, d_mlp=256, gated_mlp=True)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    attn = model.blocks[0].attn
    std = cfg.init_std
    for t in (attn._W_K, attn._W_V, attn.W_Q, model.blocks[0].mlp.W_gate):
        assert abs(float(t.std()) / std - 1) < 0.1, t.shape
    assert bool(attn._b_K.eq(0).all()) and bool(attn._b_V.eq(0).all())
    assert not torch.equal(attn._W_K[0], attn._W_K[1])


def test_save_load_round_trip_keeps_the_safetensors_names(tmp_path):
    from safetensors import safe_open

    model = random_model(gqa_cfg(gated_mlp=True), dtype=torch.float32)
    vi.save(model, tmp_path / "m")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"blocks.0.attn._W_K", "blocks.1.attn._b_V", "blocks.0.mlp.W_gate"} <= keys
    assert "blocks.0.attn.W_K" not in keys
    back = vi.load(tmp_path / "m")
    assert back.cfg == model.cfg
    for name, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], t)


def test_train_and_train_ensemble_run_and_agree_with_the_model():
    from vecinterp.training._stacked import forward, stack_weights

    cfg = gqa_cfg(gated_mlp=True, positional="rotary", act_fn="silu")
    models = [random_model(cfg, seed=s, dtype=torch.float32) for s in (0, 1)]
    x = torch.randn(2, 3, 5, cfg.d_in)
    out = forward(cfg, stack_weights(models, torch.device("cpu")), x)
    for i, m in enumerate(models):
        assert rel(out[i], m(x[i])) < 1e-5

    def make_batch(step: int, gen: torch.Generator):
        x = torch.randn(4, 5, cfg.d_in, generator=gen)
        return x, x[..., :1].expand(4, 5, cfg.d_out).cumsum(1)

    model = vi.HookedVectorTransformer(cfg, seed=0)
    before = model.blocks[0].attn._W_K.detach().clone()
    alone = vi.train(model, make_batch, steps=3, lr=1e-2, progress=False, device="cpu").model
    assert not torch.equal(alone.blocks[0].attn._W_K, before)
    assert not torch.equal(alone.blocks[0].mlp.W_gate, model.blocks[0].mlp.W_gate)
    members = [vi.HookedVectorTransformer(cfg, seed=s) for s in (0, 1)]
    out = vi.train_ensemble(members, make_batch, steps=3, lr=1e-2, progress=False, device="cpu")
    # member 0 and the model trained alone from the same start and data agree (float32)
    for name, t in alone.state_dict().items():
        assert rel(out.models[0].state_dict()[name], t) < 1e-4, name


def test_f_sdpa_gqa_convention_is_repeat_interleave():
    """The reference's enable_gqa groups query heads as repeat_interleave does."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 2, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 3, 2, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, 3, 2, generator=gen, dtype=torch.float64)
    a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    b = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    )
    assert rel(a, b) < F64_TOL
