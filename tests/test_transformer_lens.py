"""Conversion to and from TransformerLens 3: numerical equivalence of outputs and of every
shared cached activation, lossless round trips, the vector-input recipe, refused
configurations and the message when TransformerLens is missing.

TransformerLens is the optional extra ``vecinterp[transformer-lens]``: without it this
module is skipped (with the reason shown by ``pytest -rs``).
"""

import math
import sys
import types

import pytest
import torch

pytest.importorskip(
    "transformer_lens",
    reason='TransformerLens is not installed (pip install "vecinterp[transformer-lens]")',
)

import transformer_lens as tl  # noqa: E402

import vecinterp as vi  # noqa: E402
from helpers import random_input, random_model, tiny_cfg, unchecked  # noqa: E402
from vecinterp.interop.transformer_lens import (  # noqa: E402
    from_transformer_lens,
    tl_forward_vectors,
    tl_run_with_cache_vectors,
    to_transformer_lens,
)

# TransformerLens 3 deprecates HookedTransformer (removed in 4); the tests build some
# directly. to_transformer_lens silences the warning itself.
pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

F32, F64 = torch.float32, torch.float64

CFGS = {
    "LN-learned-relu": tiny_cfg(),
    "RMS-rotary-gelu-bidir": tiny_cfg(
        normalization="RMS", positional="rotary", act_fn="gelu", causal=False, rotary_base=500.0
    ),
    "LNPre-learned-silu-3layers": tiny_cfg(normalization="LNPre", act_fn="silu", n_layers=3),
    "RMSPre-rotary-gelu_tanh": tiny_cfg(
        normalization="RMSPre", positional="rotary", act_fn="gelu_tanh"
    ),
    "None-learned-attn_only-bidir": tiny_cfg(normalization=None, attn_only=True, causal=False),
    # n_heads * d_head != d_model, d_out != d_in, eps and init_range changed
    "LN-rotary-odd-widths": tiny_cfg(
        d_in=4,
        d_out=2,
        d_model=6,
        d_head=4,
        n_heads=3,
        positional="rotary",
        eps=1e-6,
        init_range=0.1,
    ),
}

# hook points that TransformerLens has and vecinterp does not: the split inputs (filled
# only with use_split_qkv_input / use_attn_in / use_hook_mlp_in), the input of the
# unembedding (= the output of ln_final), and an MLP hook attn-only blocks never fire
TL_ONLY_PER_BLOCK = ["hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in"]


def converted(cfg: vi.VectorTransformerConfig, dtype: torch.dtype, **kwargs):
    model = random_model(cfg, dtype=dtype, scale=0.3)
    tl_model = to_transformer_lens(model, **kwargs)
    tl_model.set_use_attn_result(True)  # so that hook_result exists on both sides
    return model, tl_model


def assert_all_close(ours: dict, theirs: dict, names, rtol: float, atol: float) -> None:
    for name in names:
        torch.testing.assert_close(
            theirs[name], ours[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


# -- numerical equivalence ------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(F32, 1e-5), (F64, 1e-10)], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CFGS))
def test_outputs_and_every_shared_activation_agree(name, dtype, tol):
    cfg = CFGS[name]
    model, tl_model = converted(cfg, dtype)
    x = random_input(cfg, batch=3, n_pos=cfg.n_ctx - 1, dtype=dtype)
    with torch.no_grad():
        y, cache = model.run_with_cache(x, names_filter=lambda n: True)
        y_tl, cache_tl = tl_run_with_cache_vectors(tl_model, x)
    torch.testing.assert_close(y_tl, y, rtol=tol, atol=tol)
    # every vecinterp hook point exists in TL under the same name, and fired there
    ours, theirs = set(model.hook_dict), set(tl_model.hook_dict)
    assert ours <= theirs
    tl_only = {"unembed.hook_in"} | {
        f"blocks.{i}.{h}"
        for i in range(cfg.n_layers)
        for h in TL_ONLY_PER_BLOCK + (["hook_mlp_out"] if cfg.attn_only else [])
    }
    assert theirs - ours == tl_only
    assert set(cache.keys()) == ours
    assert set(cache_tl.keys()) == ours | {"unembed.hook_in"}
    assert_all_close(dict(cache.items()), dict(cache_tl.items()), sorted(ours), tol, tol)
    # TL's extra unembed.hook_in is vecinterp's ln_final output
    with torch.no_grad():
        final = model.ln_final(cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"])
    torch.testing.assert_close(cache_tl["unembed.hook_in"], final, rtol=tol, atol=tol)


@pytest.mark.parametrize("positional", ["sinusoidal", "none"])
def test_fixed_or_absent_positions_convert_as_learned_positions(positional):
    cfg = tiny_cfg(positional=positional, normalization="RMS")
    model, tl_model = converted(cfg, F32, as_learned_positions=True)
    expected = torch.zeros(cfg.n_ctx, cfg.d_model) if positional == "none" else None
    W_pos = tl_model.pos_embed.W_pos.detach()
    if expected is None:
        assert torch.equal(W_pos, model.pos_embed.W_pos)
    else:
        assert torch.equal(W_pos, expected)
    x = random_input(cfg, dtype=F32)
    with torch.no_grad():
        torch.testing.assert_close(tl_forward_vectors(tl_model, x), model(x), rtol=1e-5, atol=1e-5)
    back = from_transformer_lens(tl_model)
    # a TransformerLens model is initialised TransformerLens's way: the range carries over
    assert back.cfg == cfg.replace(
        positional="learned", init="transformer_lens", init_range=cfg.init_range
    )


def test_hooks_act_alike_on_both_models():
    # a head ablated through hook_z and the residual stream patched at one position
    cfg = CFGS["LN-learned-relu"]
    model, tl_model = converted(cfg, F64)
    x = random_input(cfg, dtype=F64)

    def zero_head_1(z, hook):
        z = z.clone()
        z[:, :, 1] = 0.0
        return z

    def shift_pos_2(resid, hook):
        resid = resid.clone()
        resid[:, 2] += 1.0
        return resid

    hooks = [("blocks.0.attn.hook_z", zero_head_1), ("blocks.1.hook_resid_pre", shift_pos_2)]
    with torch.no_grad():
        y = model.run_with_hooks(x, fwd_hooks=hooks)
        with tl_model.hooks(fwd_hooks=hooks):
            y_tl = tl_forward_vectors(tl_model, x)
        assert (y - model(x)).abs().max() > 1e-3  # the hooks did something
    torch.testing.assert_close(y_tl, y, rtol=1e-10, atol=1e-10)


def test_gradients_agree():
    # one training step's gradients, parameter by parameter (the names are the same)
    cfg = CFGS["RMS-rotary-gelu-bidir"]
    model, tl_model = converted(cfg, F64)
    x = random_input(cfg, dtype=F64)
    targets = random_input(cfg.replace(d_in=cfg.d_out), seed=1, dtype=F64)
    vi.masked_mse(model(x), targets).backward()
    vi.masked_mse(tl_forward_vectors(tl_model, x), targets).backward()
    tl_params = dict(tl_model.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(tl_params[name].grad, p.grad, rtol=1e-9, atol=1e-12)


# -- the vector-input recipe ----------------------------------------------------------


@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_one_hot_vectors_reproduce_the_token_model_exactly(positional):
    cfg = tiny_cfg(positional=positional, d_in=6)
    _, tl_model = converted(cfg, F32)
    tokens = torch.tensor([[0, 5, 2, 2, 1], [3, 4, 0, 1, 5]])
    x = torch.nn.functional.one_hot(tokens, cfg.d_in).to(F32)
    with torch.no_grad():
        y_tokens, cache_tokens = tl_model.run_with_cache(tokens)
        y_vectors, cache_vectors = tl_run_with_cache_vectors(tl_model, x)
    assert torch.equal(y_vectors, y_tokens)
    assert set(cache_vectors.keys()) == set(cache_tokens.keys())
    for name in cache_tokens.keys():
        assert torch.equal(cache_vectors[name], cache_tokens[name]), name
    assert ("hook_pos_embed" in cache_tokens.keys()) == (positional == "learned")


@pytest.mark.parametrize(
    "overrides",
    [
        dict(positional_embedding_type="shortformer"),
        dict(positional_embedding_type="alibi"),
        dict(post_embedding_ln=True),
    ],
    ids=["shortformer", "alibi", "post_embedding_ln"],
)
def test_vector_helpers_follow_the_token_path_of_other_tl_models(overrides):
    # models vecinterp cannot express still run on vectors exactly as on one-hot tokens
    tl_model = random_tl_model(tl_cfg(**overrides))
    tokens = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]])
    x = torch.nn.functional.one_hot(tokens, 3).to(F32)
    with torch.no_grad():
        y_tokens, cache_tokens = tl_model.run_with_cache(tokens)
        y_vectors, cache_vectors = tl_run_with_cache_vectors(tl_model, x)
    assert torch.equal(y_vectors, y_tokens)
    assert set(cache_vectors.keys()) == set(cache_tokens.keys())
    for name in cache_tokens.keys():
        assert torch.equal(cache_vectors[name], cache_tokens[name]), name


def test_start_at_layer_zero_skips_exactly_the_embeddings():
    # the documented recipe, by hand: resid = x @ W_E + W_pos[:pos], then start_at_layer=0
    cfg = tiny_cfg()
    model, tl_model = converted(cfg, F64)
    x = random_input(cfg, n_pos=5, dtype=F64)
    with torch.no_grad():
        resid = x @ tl_model.W_E + tl_model.W_pos[:5]
        _, cache = tl_model.run_with_cache(resid, start_at_layer=0)
        y = tl_model(resid, start_at_layer=0)
    assert "hook_embed" not in cache.keys() and "hook_pos_embed" not in cache.keys()
    assert torch.equal(y, tl_forward_vectors(tl_model, x).detach())
    torch.testing.assert_close(y, model(x).detach(), rtol=1e-10, atol=1e-10)


# -- round trips ----------------------------------------------------------------------


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("name", list(CFGS))
def test_round_trip_from_vecinterp_is_lossless(name):
    model = random_model(CFGS[name], dtype=F32)
    model.eval()
    model.blocks[0].attn.W_Q.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    tl_model = to_transformer_lens(model)
    back = from_transformer_lens(tl_model)
    assert torch.equal(torch.get_rng_state(), rng)  # no global random state consumed
    # every field but init, which says how TransformerLens initialises (its range kept)
    assert back.cfg == model.cfg.replace(init="transformer_lens", init_range=model.cfg.init_range)
    assert_same_state(back, model)
    assert not back.training and not tl_model.training
    assert not back.blocks[0].attn.W_Q.requires_grad and back.blocks[0].attn.W_K.requires_grad
    # copies, not shared storage; the source is left as it was
    assert tl_model.W_E.data_ptr() != model.W_E.data_ptr() != back.W_E.data_ptr()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_init_converts_both_ways():
    cfg = vi.VectorTransformerConfig(d_in=3, d_model=32, d_head=8, n_heads=4, n_layers=2, n_ctx=6)
    for init in ("gpt2", "transformer_lens"):
        model = vi.HookedVectorTransformer(cfg.replace(init=init), seed=0)
        tl_model = to_transformer_lens(model)
        assert tl_model.cfg.initializer_range == model.cfg.init_range
        assert tl_model.cfg.init_mode == "gpt2"  # TransformerLens's own default
        back = from_transformer_lens(tl_model)
        assert back.cfg.init == "transformer_lens"
        assert back.cfg.init_range == model.cfg.init_range
    # TransformerLens's default range, 0.8 / sqrt(d_model), is init="transformer_lens"'s
    tl_model = to_transformer_lens(vi.HookedVectorTransformer(cfg, seed=0))
    tl_model.cfg.initializer_range = 0.8 / math.sqrt(32)
    assert from_transformer_lens(tl_model).cfg == cfg.replace(init="transformer_lens")


def tl_cfg(**overrides):
    kwargs = dict(
        d_model=8,
        d_head=4,
        n_heads=2,
        n_layers=2,
        n_ctx=7,
        d_mlp=16,
        d_vocab=3,
        d_vocab_out=5,
        act_fn="relu",
        device="cpu",
        init_weights=False,
    )
    kwargs.update(overrides)
    return tl.HookedTransformerConfig(**kwargs)


def random_tl_model(cfg, seed: int = 0):
    tl_model = tl.HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tl_model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=F64).to(p.dtype)
            p.copy_(1 + 0.3 * noise if name.endswith(".w") else 0.3 * noise)
    return tl_model


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(positional_embedding_type="rotary", normalization_type="RMS", act_fn="silu"),
        dict(normalization_type="LNPre", attention_dir="bidirectional", act_fn="gelu"),
        dict(normalization_type=None, attn_only=True, dtype=F64),
    ],
    ids=["default", "rotary-RMS", "LNPre-bidir", "attn_only-f64"],
)
def test_round_trip_from_transformer_lens_is_lossless(overrides):
    tl_model = random_tl_model(tl_cfg(**overrides))
    model = from_transformer_lens(tl_model)
    again = to_transformer_lens(model)
    assert_same_state(again, tl_model)
    for field in (
        "d_vocab",
        "d_vocab_out",
        "d_model",
        "d_head",
        "n_heads",
        "n_layers",
        "n_ctx",
        "d_mlp",
        "act_fn",
        "eps",
        "normalization_type",
        "positional_embedding_type",
        "rotary_dim",
        "attention_dir",
        "attn_only",
        "dtype",
        "initializer_range",
    ):
        assert getattr(again.cfg, field) == getattr(tl_model.cfg, field), field
    x = random_input(model.cfg, dtype=model.W_E.dtype)
    with torch.no_grad():
        torch.testing.assert_close(model(x), tl_forward_vectors(tl_model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act_fn", ["gelu_new", "gelu_fast"])
def test_tanh_gelu_variants_convert_to_gelu_tanh(act_fn):
    tl_model = random_tl_model(tl_cfg(act_fn=act_fn))
    model = from_transformer_lens(tl_model)
    assert model.cfg.act_fn == "gelu_tanh"
    x = random_input(model.cfg, dtype=F32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), tl_forward_vectors(tl_model, x), rtol=1e-5, atol=1e-5)


# -- refused configurations -----------------------------------------------------------


def test_embed_bias_is_refused():
    model = random_model(tiny_cfg(embed_bias=True))
    with pytest.raises(ValueError, match="embed_bias=True"):
        to_transformer_lens(model)


@pytest.mark.parametrize("positional", ["sinusoidal", "none"])
def test_fixed_or_absent_positions_are_refused_by_default(positional):
    model = random_model(tiny_cfg(positional=positional))
    with pytest.raises(ValueError, match=f"positional='{positional}'.*as_learned_positions"):
        to_transformer_lens(model)


def test_every_reason_is_listed():
    model = random_model(tiny_cfg(positional="sinusoidal", embed_bias=True))
    with pytest.raises(ValueError, match=r"(?s)embed_bias=True.*positional='sinusoidal'"):
        to_transformer_lens(model)


def test_to_transformer_lens_bad_arguments():
    with pytest.raises(TypeError, match="HookedVectorTransformer"):
        to_transformer_lens(torch.nn.Linear(2, 2))
    model = random_model(tiny_cfg())
    with pytest.raises(TypeError, match="as_learned_positions"):  # the checker's
        to_transformer_lens(model, as_learned_positions=1)
    with unchecked(), pytest.raises(TypeError, match="as_learned_positions must be a bool"):
        to_transformer_lens(model, as_learned_positions=1)


# TL models vecinterp cannot express: built for real where TL builds them cheaply, else a
# valid model whose config is edited (the checks read the config)
BUILT = {
    "parallel_attn_mlp": dict(parallel_attn_mlp=True),
    "positional_embedding_type='shortformer'": dict(positional_embedding_type="shortformer"),
    "positional_embedding_type='alibi'": dict(positional_embedding_type="alibi"),
    "rotary_dim=2 != d_head=4": dict(positional_embedding_type="rotary", rotary_dim=2),
    "rotary_adjacent_pairs": dict(positional_embedding_type="rotary", rotary_adjacent_pairs=True),
    "use_NTK_by_parts_rope": dict(positional_embedding_type="rotary", use_NTK_by_parts_rope=True),
    "final_rms": dict(final_rms=True),
    "act_fn='solu_ln'": dict(act_fn="solu_ln"),
    "attn_scale=3.0": dict(attn_scale=3.0),
    "use_attn_scale=False": dict(use_attn_scale=False),
    "post_embedding_ln": dict(post_embedding_ln=True),
    "scale_attn_by_inverse_layer_idx": dict(scale_attn_by_inverse_layer_idx=True),
    "use_qk_norm": dict(use_qk_norm=True),
    "attn_scores_soft_cap=50.0": dict(attn_scores_soft_cap=50.0),
    "output_logits_soft_cap=30.0": dict(output_logits_soft_cap=30.0),
}
EDITED = {
    "num_experts": dict(num_experts=4),
    "use_local_attn": dict(use_local_attn=True),
    "use_normalization_before_and_after": dict(use_normalization_before_and_after=True),
    "use_yarn_rope": dict(positional_embedding_type="rotary", rotary_dim=4, use_yarn_rope=True),
    "original_architecture='Olmo2ForCausalLM'": dict(original_architecture="Olmo2ForCausalLM"),
    "clip_qkv": dict(clip_qkv=8.0),
    "use_attention_sinks": dict(use_attention_sinks=True),
}


@pytest.mark.parametrize("reason", list(BUILT))
def test_inexpressible_transformer_lens_models_are_refused(reason):
    tl_model = tl.HookedTransformer(tl_cfg(**BUILT[reason]))
    field = reason.split("=")[0]
    with pytest.raises(ValueError, match=f"(?s)cannot convert this TransformerLens.*{field}"):
        from_transformer_lens(tl_model)


@pytest.mark.parametrize("reason", list(EDITED))
def test_inexpressible_transformer_lens_configs_are_refused(reason):
    tl_model = tl.HookedTransformer(tl_cfg())
    for field, value in EDITED[reason].items():
        setattr(tl_model.cfg, field, value)
    with pytest.raises(ValueError, match=reason.split("=")[0]):
        from_transformer_lens(tl_model)


def test_parameters_without_counterpart_are_refused():
    tl_model = tl.HookedTransformer(tl_cfg())
    tl_model.blocks[0].attn.register_parameter("extra", torch.nn.Parameter(torch.zeros(2)))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.extra \(2,\) has no counterpart"):
        from_transformer_lens(tl_model)


def test_from_transformer_lens_needs_a_hooked_transformer():
    with pytest.raises(TypeError, match="transformer_lens.HookedTransformer"):
        from_transformer_lens(random_model(tiny_cfg()))


# -- bad input to the vector helpers --------------------------------------------------


@pytest.fixture(scope="module")
def small_tl_model():
    return to_transformer_lens(random_model(tiny_cfg(), dtype=F32))


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.zeros(2, 4, 5), ValueError, r"\[batch, pos, d_vocab=3\]"),
        (torch.zeros(4, 3), ValueError, r"\[batch, pos, d_vocab=3\]"),
        (torch.zeros(2, 8, 3), ValueError, "n_ctx=7"),
        (torch.zeros(0, 4, 3), ValueError, "at least one batch item"),
        (torch.zeros(2, 4, 3, dtype=F64), TypeError, "dtype torch.float64"),
        ([[0.0, 1.0, 0.0]], TypeError, "torch.Tensor"),
    ],
    ids=["d_in", "rank", "n_ctx", "empty", "dtype", "list"],
)
def test_tl_forward_vectors_bad_input(small_tl_model, x, error, match):
    with unchecked(), pytest.raises(error, match=match):
        tl_forward_vectors(small_tl_model, x)


def test_the_checker_rejects_non_vector_input(small_tl_model):
    for x in (torch.zeros(4, 3), [[0.0, 1.0, 0.0]]):
        with pytest.raises(TypeError, match="Type-check error"):
            tl_forward_vectors(small_tl_model, x)


def test_tl_forward_vectors_refuses_start_at_layer(small_tl_model):
    with pytest.raises(ValueError, match="sets start_at_layer=0"):
        tl_forward_vectors(small_tl_model, torch.zeros(1, 2, 3), start_at_layer=1)


def test_tl_helpers_need_a_hooked_transformer():
    model = random_model(tiny_cfg(), dtype=F32)
    with pytest.raises(TypeError, match="transformer_lens.HookedTransformer"):
        tl_forward_vectors(model, torch.zeros(1, 2, 3))
    with pytest.raises(TypeError, match="transformer_lens.HookedTransformer"):
        tl_run_with_cache_vectors(model, torch.zeros(1, 2, 3))


def test_stop_at_layer_passes_through(small_tl_model):
    x = torch.ones(1, 3, 3)
    resid = tl_forward_vectors(small_tl_model, x, stop_at_layer=1)
    _, cache = tl_run_with_cache_vectors(small_tl_model, x, names_filter="blocks.1.hook_resid_pre")
    assert list(cache.keys()) == ["blocks.1.hook_resid_pre"]
    assert torch.equal(resid, cache["blocks.1.hook_resid_pre"])


# -- TransformerLens missing or too new -------------------------------------------------


def test_missing_transformer_lens_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_lens", None)  # `import` raises ImportError
    model = random_model(tiny_cfg())
    for call in (
        lambda: to_transformer_lens(model),
        lambda: from_transformer_lens(model),
        lambda: tl_forward_vectors(model, torch.zeros(1, 2, 3)),
    ):
        with pytest.raises(ImportError, match=r'pip install "vecinterp\[transformer-lens\]"'):
            call()


def test_transformer_lens_4_is_refused(monkeypatch):
    fake = types.ModuleType("transformer_lens")
    fake.__version__ = "4.0.0"
    monkeypatch.setitem(sys.modules, "transformer_lens", fake)
    with pytest.raises(ImportError, match=r"TransformerLens 4\.0\.0 has no HookedTransformer"):
        to_transformer_lens(random_model(tiny_cfg()))


def test_attn_scale_check_accepts_the_default_exactly():
    # np.sqrt(d_head) as TL stores it passes; a scale off by 1e-6 relative does not
    tl_model = tl.HookedTransformer(tl_cfg(d_head=3, n_heads=2))
    from_transformer_lens(tl_model)
    tl_model.cfg.attn_scale = math.sqrt(3) * (1 + 1e-6)
    with pytest.raises(ValueError, match="attn_scale"):
        from_transformer_lens(tl_model)
