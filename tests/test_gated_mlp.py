"""The gated MLP (``gated_mlp=True``, Llama's): the block against a plain PyTorch gated MLP,
its hooks, the cache, weight processing, and the TransformerLens conversion of gated and
grouped-query models both ways."""

import pytest
import torch
import torch.nn.functional as F

import vecinterp as vi
from helpers import ACT_FNS, random_input, random_model, tiny_cfg, unchecked
from vecinterp.model.components import GatedMLP
from vecinterp.testing import PlainTransformer

F64_TOL = 1e-12
_ACT = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


def gated_cfg(**overrides) -> vi.VectorTransformerConfig:
    return tiny_cfg(gated_mlp=True, **overrides)


@pytest.mark.parametrize("act_fn", ACT_FNS)
def test_block_equals_a_plain_gated_mlp(act_fn):
    model = random_model(gated_cfg(act_fn=act_fn))
    mlp = model.blocks[0].mlp
    assert isinstance(mlp, GatedMLP)
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    # Llama's down_proj(act(gate_proj(x)) * up_proj(x)), nn.Linear layout
    gate = F.linear(x, mlp.W_gate.T, mlp.b_gate)
    up = F.linear(x, mlp.W_in.T, mlp.b_in)
    expected = F.linear(_ACT[act_fn](gate) * up, mlp.W_out.T, mlp.b_out)
    assert rel(mlp(x), expected) < F64_TOL


def test_hooks_are_the_gate_the_linear_part_and_their_product():
    model = random_model(gated_cfg(act_fn="silu"))
    x = random_input(model.cfg)
    _, cache = model.run_with_cache(x)
    mlp = model.blocks[1].mlp
    normed = model.blocks[1].ln2(cache["resid_mid", 1])
    pre, pre_linear, post = cache["pre", 1], cache["pre_linear", 1], cache["post", 1]
    assert pre.shape == pre_linear.shape == post.shape == (3, 7, 16)
    assert rel(pre, normed @ mlp.W_gate + mlp.b_gate) < F64_TOL
    assert rel(pre_linear, normed @ mlp.W_in + mlp.b_in) < F64_TOL
    assert rel(post, F.silu(pre) * pre_linear) < F64_TOL
    assert rel(cache["mlp_out", 1], post @ mlp.W_out + mlp.b_out) < F64_TOL
    hooks = [n for n in model.hook_dict if n.startswith("blocks.0.mlp.")]
    assert hooks == [
        "blocks.0.mlp.hook_pre",
        "blocks.0.mlp.hook_pre_linear",
        "blocks.0.mlp.hook_post",
    ]


def test_relu_post_is_cached_not_derived_from_pre():
    """The cache's relu shortcut (hook_post = relu(hook_pre)) must not apply here."""
    model = random_model(gated_cfg(act_fn="relu"))
    x = random_input(model.cfg)
    _, cache = model.run_with_cache(
        x, names_filter=["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post"]
    )
    assert not torch.equal(cache["post", 0], F.relu(cache["pre", 0]))
    seen = {}
    with model.hooks(
        fwd_hooks=[("blocks.0.mlp.hook_post", lambda t, hook: seen.setdefault("p", t.clone()))]
    ):
        model(x)
    assert torch.equal(cache["post", 0], seen["p"])


@pytest.mark.parametrize("normalization", ["LN", "RMS", "LNPre", None])
@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_model_equals_the_plain_reference(normalization, positional):
    cfg = gated_cfg(normalization=normalization, positional=positional, act_fn="gelu")
    model = random_model(cfg)
    x = random_input(cfg)
    assert rel(model(x), PlainTransformer(cfg, model.state_dict())(x)) < F64_TOL


def test_decomposition_sums_and_processing_keeps_the_outputs():
    model = random_model(gated_cfg())
    x = random_input(model.cfg)
    y, cache = model.run_with_cache(x)
    assert rel(cache.decompose_resid().sum(0), cache["resid_post", 1]) < F64_TOL
    for new in (
        vi.fold_layer_norm(model),
        vi.center_writing_weights(model),
        vi.process_weights(model),
    ):
        assert rel(new(x), y) < F64_TOL
    folded = vi.fold_layer_norm(model, center_weights=False)
    ln2, mlp = model.blocks[0].ln2, model.blocks[0].mlp
    assert rel(folded.blocks[0].mlp.W_gate, mlp.W_gate * ln2.w[:, None]) < F64_TOL
    assert rel(folded.blocks[0].mlp.b_gate, mlp.b_gate + ln2.b @ mlp.W_gate) < F64_TOL


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_gated_mlp_must_be_a_bool(bad):
    with unchecked(), pytest.raises(ValueError, match="gated_mlp must be a bool"):
        tiny_cfg(gated_mlp=bad)


def test_attn_only_models_have_no_mlp_even_when_gated():
    model = random_model(tiny_cfg(gated_mlp=True, attn_only=True))
    assert not hasattr(model.blocks[0], "mlp")
    x = random_input(model.cfg)
    assert rel(model(x), PlainTransformer(model.cfg, model.state_dict())(x)) < F64_TOL


def test_model_level_gate_stacks():
    model = random_model(gated_cfg())
    assert torch.equal(model.W_gate[1], model.blocks[1].mlp.W_gate)
    assert torch.equal(model.b_gate[0], model.blocks[0].mlp.b_gate)
    with pytest.raises(AttributeError, match="not gated"):
        _ = random_model(tiny_cfg()).W_gate


def test_path_patching_refuses_a_gated_mlp_receiver():
    model = random_model(gated_cfg())
    x = random_input(model.cfg)
    with pytest.raises(ValueError, match="gated MLP"):
        vi.path_patching(model, x, x + 1, lambda y: y.sum(), (0, 1), ("mlp", 1))


def test_the_gate_bias_is_a_config_field_saved_and_loaded(tmp_path):
    model = random_model(gated_cfg(), dtype=torch.float32)
    vi.save(model, tmp_path / "m")
    back = vi.load(tmp_path / "m")
    assert back.cfg.gated_mlp and back.cfg == model.cfg
    x = random_input(model.cfg, dtype=torch.float32)
    assert torch.equal(back(x), model(x))


# -- TransformerLens ---------------------------------------------------------------------

# TransformerLens is an optional extra: these tests skip without it
tl_deprecation = pytest.mark.filterwarnings(
    "ignore:HookedTransformer is deprecated:DeprecationWarning"
)


def _tl_ready(cfg: vi.VectorTransformerConfig) -> vi.HookedVectorTransformer:
    """A random model whose gated MLPs have the zero b_gate and b_in TL can express."""
    pytest.importorskip("transformer_lens")
    model = random_model(cfg, scale=0.3)
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.b_gate.zero_()
            block.mlp.b_in.zero_()
    return model


@tl_deprecation
@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("positional", ["rotary", "learned"])
def test_gated_gqa_model_converts_to_transformer_lens_exactly(n_kv, positional):
    from vecinterp.interop.transformer_lens import (
        from_transformer_lens,
        tl_run_with_cache_vectors,
        to_transformer_lens,
    )

    cfg = gated_cfg(n_heads=4, n_key_value_heads=n_kv, positional=positional, act_fn="silu")
    model = _tl_ready(cfg)
    tl_model = to_transformer_lens(model)
    tl_model.set_use_attn_result(True)  # so that hook_result exists on both sides
    assert tl_model.cfg.gated_mlp
    assert tl_model.cfg.n_key_value_heads == (n_kv if n_kv < 4 else None)
    x = random_input(cfg, n_pos=6)
    with torch.no_grad():
        y, cache = model.run_with_cache(x)
        y_tl, cache_tl = tl_run_with_cache_vectors(tl_model, x)
    assert rel(y_tl, y) < 1e-10
    for name in cache.keys():
        # -inf where the causal mask is: assert_close takes equal infinities as equal
        torch.testing.assert_close(cache_tl[name], cache[name], rtol=1e-10, atol=1e-10)
    back = from_transformer_lens(tl_model)
    assert back.cfg == cfg.replace(init="transformer_lens", init_range=cfg.init_range)
    for name, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name


@tl_deprecation
def test_transformer_lens_post_product_bias_folds_into_b_out():
    from vecinterp.interop.transformer_lens import (
        from_transformer_lens,
        tl_run_with_cache_vectors,
        to_transformer_lens,
    )

    cfg = gated_cfg(n_heads=4, n_key_value_heads=2, act_fn="gelu")
    tl_model = to_transformer_lens(_tl_ready(cfg))
    tl_model.set_use_attn_result(True)
    with torch.no_grad():
        for block in tl_model.blocks:
            block.mlp.b_in.normal_()
    model = from_transformer_lens(tl_model)
    x = random_input(cfg, n_pos=6)
    with torch.no_grad():
        y, cache = model.run_with_cache(x)
        y_tl, cache_tl = tl_run_with_cache_vectors(tl_model, x)
    assert rel(y, y_tl) < 1e-10
    for layer, block in enumerate(tl_model.blocks):
        mlp = model.blocks[layer].mlp
        assert bool(mlp.b_in.eq(0).all()) and bool(mlp.b_gate.eq(0).all())
        assert rel(mlp.b_out, block.mlp.b_out + block.mlp.b_in @ block.mlp.W_out) < F64_TOL
        # hook_post differs by TL's constant b_in; every other activation agrees
        post, post_tl = cache["post", layer], cache_tl[f"blocks.{layer}.mlp.hook_post"]
        assert rel(post + block.mlp.b_in, post_tl) < 1e-10
        for name in ("hook_pre", "hook_pre_linear"):
            key = f"blocks.{layer}.mlp.{name}"
            assert rel(cache[key], cache_tl[key]) < 1e-10


@tl_deprecation
@pytest.mark.parametrize("bias", ["b_gate", "b_in"])
def test_a_bias_before_the_product_is_refused_to_transformer_lens(bias):
    from vecinterp.interop.transformer_lens import to_transformer_lens

    model = _tl_ready(gated_cfg())
    with torch.no_grad():
        getattr(model.blocks[1].mlp, bias)[3] = 0.5
    with pytest.raises(ValueError, match=f"blocks.1.mlp.{bias} is not zero"):
        to_transformer_lens(model)


@tl_deprecation
def test_transformer_lens_grouped_storage_with_one_kv_head_per_query_head_converts():
    """TL stores _W_K even when n_key_value_heads == n_heads: that is ordinary attention."""
    pytest.importorskip("transformer_lens")
    import transformer_lens as tl

    from vecinterp.interop.transformer_lens import from_transformer_lens, tl_forward_vectors

    tl_model = tl.HookedTransformer(
        tl.HookedTransformerConfig(
            d_model=8, d_head=4, n_heads=4, n_key_value_heads=4, n_layers=2, n_ctx=5,
            d_vocab=3, d_mlp=16, act_fn="silu", gated_mlp=True, normalization_type="RMS",
            positional_embedding_type="rotary", rotary_dim=4, rotary_adjacent_pairs=False,
            seed=0, dtype=torch.float64,
        )
    )  # fmt: skip
    assert "blocks.0.attn._W_K" in dict(tl_model.named_parameters())
    model = from_transformer_lens(tl_model)
    assert model.cfg.n_key_value_heads == 4 and not model.cfg.is_gqa
    assert torch.equal(model.blocks[1].attn.W_V, tl_model.blocks[1].attn._W_V)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    with torch.no_grad():
        assert rel(model(x), tl_forward_vectors(tl_model, x)) < 1e-10
