"""Import of Hugging Face Llama-family backbones (LlamaModel, MistralModel, Qwen2Model) with
vi.from_hf, and export with vi.to_hf: the imported model (RMSNorm, rotary, gated MLP,
grouped-query attention) reproduces the source's outputs and its hidden state at every
layer boundary, the analyses keep their invariants and agree with the same quantities
computed from the source's own weights and hooks, round trips are lossless, and every
refusal says why.

Precision: transformers computes Llama's RMSNorm and rotary tables in float32 whatever the
model's dtype (and its eager softmax too). The float64 comparisons therefore run the
source with those steps computed in float64 (``float64_source`` below; the rest of the
source's forward is its own), and separately check that the unmodified float64 source
agrees to float32 rounding. Every model is built from a config with random weights;
nothing is downloaded.
"""

import contextlib

import pytest
import torch
from torch import nn

# the hf extra's tests: .ci/run runs them (-m hf) under the oldest supported transformers too
pytestmark = pytest.mark.hf
pytest.importorskip(
    "transformers", reason='transformers is not installed (pip install "vecinterp[hf]")'
)

import transformers  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.mistral import modeling_mistral  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402

import vecinterp as vi  # noqa: E402
from helpers import random_model, tiny_cfg  # noqa: E402
from import_helpers import hf_forward as source_forward  # noqa: E402
from import_helpers import linear, noise, rel_err  # noqa: E402

F32, F64 = torch.float32, torch.float64
TOL = {F64: 1e-10, F32: 1e-5}  # max |ours - source| / max |source|
_MODULES = (modeling_llama, modeling_mistral, modeling_qwen2)
# transformers 5 reads the rotary settings from rope_parameters, 4.x from rope_theta and
# rope_scaling; 4.40-4.44 have no head_dim (d_head is hidden_size / heads)
V5 = int(transformers.__version__.split(".")[0]) >= 5
HAS_HEAD_DIM = "head_dim" in transformers.LlamaConfig().to_dict()
HAS_MLP_BIAS = "mlp_bias" in transformers.LlamaConfig().to_dict()  # 4.41 on


def rope(rope_type="default", theta=10000.0, **scaling):
    """Config keywords for a rotary embedding, in the fields this transformers reads."""
    if V5:
        return {"rope_parameters": dict(rope_type=rope_type, rope_theta=theta, **scaling)}
    scaled = {} if rope_type == "default" else {"rope_scaling": dict(type=rope_type, **scaling)}
    return {"rope_theta": theta} | scaled


def rope_theta(c):
    return c.rope_parameters["rope_theta"] if V5 else c.rope_theta


@contextlib.contextmanager
def float64_source():
    """The source's RMSNorm and rotary tables computed in the model's dtype (transformers
    computes both in float32); nothing else of its forward changes."""

    def norm_forward(self, x):
        return self.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    def rotary_forward(self, x, position_ids):
        c = getattr(self, "config", None)
        if c is None:  # transformers 4.40: a rotary embedding per attention layer
            dim, base = self.dim, self.base
        else:
            dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
            base = rope_theta(c)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=F64) / dim))
        freqs = position_ids[..., None].to(F64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    with pytest.MonkeyPatch.context() as mp:
        for module in _MODULES:
            prefix = module.__name__.split("_")[-1].capitalize()
            mp.setattr(getattr(module, f"{prefix}RMSNorm"), "forward", norm_forward)
            mp.setattr(getattr(module, f"{prefix}RotaryEmbedding"), "forward", rotary_forward)
        yield


def backbone_of(kind="llama", *, impl="sdpa", dtype=F64, seed=0, **overrides):
    """A Llama-family backbone with every parameter random (norm weights around 1)."""
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaModel),
        "mistral": (transformers.MistralConfig, transformers.MistralModel),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
    }[kind]
    kwargs = dict(
        vocab_size=1,
        bos_token_id=0,
        eos_token_id=0,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=9,
        rms_norm_eps=1e-5,
        use_cache=False,
        attn_implementation=impl,
    )
    if kind == "mistral":
        kwargs["sliding_window"] = None
    kwargs |= overrides
    with torch.random.fork_rng(devices=[]):
        backbone = model_cls(config_cls(**kwargs))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in backbone.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + noise(p, gen, 0.3))
    return backbone.to(dtype).eval()


def head_dim(c):
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


# (family, backbone overrides, d_in, d_out, read_in bias)
SHAPES = {
    "llama-gqa2-biases": ("llama", dict(attention_bias=True, mlp_bias=True), 3, 1, True),
    "llama-mqa-gelu-3layers": (
        "llama",
        dict(num_key_value_heads=1, hidden_act="gelu", num_hidden_layers=3, rms_norm_eps=1e-6),
        4,
        2,
        False,
    ),
    "llama-mha-head_dim-theta": (
        "llama",
        dict(
            num_key_value_heads=4,
            **(dict(head_dim=6) if HAS_HEAD_DIM else {}),
            **rope(theta=500.0),
        ),
        2,
        5,
        True,
    ),
    "mistral-gqa": ("mistral", dict(num_hidden_layers=1, intermediate_size=10), 3, 3, True),
    "qwen2-gqa-qkv-bias": (
        "qwen2",
        dict(num_attention_heads=2, num_key_value_heads=1),
        5,
        1,
        False,
    ),
}


def build(name, impl, dtype):
    kind, overrides, d_in, d_out, in_bias = SHAPES[name]
    backbone = backbone_of(kind, impl=impl, dtype=dtype, **overrides)
    d = backbone.config.hidden_size
    return (
        backbone,
        linear(d_in, d, bias=in_bias, dtype=dtype),
        linear(d, d_out, dtype=dtype, seed=2),
    )


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", SHAPES)
def test_outputs_and_hidden_states_match_the_source(name, impl, dtype):
    backbone, read_in, read_out = build(name, impl, dtype)
    model = vi.from_hf(backbone, read_in, read_out)
    cfg, c = model.cfg, backbone.config
    assert model.W_E.dtype == dtype and not model.training
    assert (cfg.normalization, cfg.positional, cfg.gated_mlp) == ("RMS", "rotary", True)
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_mlp, cfg.n_layers) == (
        c.num_attention_heads,
        c.num_key_value_heads,
        head_dim(c),
        c.intermediate_size,
        c.num_hidden_layers,
    )
    assert cfg.rotary_base == rope_theta(c) and cfg.eps == c.rms_norm_eps
    gen = torch.Generator().manual_seed(3)
    for batch, n in [(1, cfg.n_ctx), (3, 1), (2, cfg.n_ctx - 3)]:
        x = torch.randn(batch, n, cfg.d_in, generator=gen, dtype=F64).to(dtype)
        with torch.no_grad():
            ours, cache = model.run_with_cache(x)
        y_plain, _ = source_forward(backbone, read_in, read_out, x)
        assert rel_err(ours, y_plain) <= 1e-5  # the unmodified source, float32 steps and all
        if dtype == F64 and impl == "eager":
            continue
        # eager attention takes its softmax in float32: the float64 comparison runs SDPA only
        with float64_source() if dtype == F64 else contextlib.nullcontext():
            y, hidden = source_forward(backbone, read_in, read_out, x)
        assert rel_err(ours, y) <= TOL[dtype]
        assert len(hidden) == cfg.n_layers + 1
        for i in range(cfg.n_layers):  # hidden_states[i] is the input of layer i
            assert rel_err(cache[f"blocks.{i}.hook_resid_pre"], hidden[i]) <= TOL[dtype]
        final = model.ln_final(cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"])
        assert rel_err(final, hidden[-1]) <= TOL[dtype]  # the last entry is after the norm


# ---------------------------------------------------------------- analyses on an import


def imported(seed=0, **overrides):
    backbone = backbone_of(seed=seed, **overrides)
    read_in, read_out = linear(3, 16, seed=seed + 1), linear(16, 2, seed=seed + 2)
    model = vi.from_hf(backbone, read_in, read_out)
    x = torch.randn(3, 9, 3, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return backbone, read_in, read_out, model, x


def test_decomposition_sums_to_the_source_output():
    backbone, read_in, read_out, model, x = imported(attention_bias=True, mlp_bias=True)
    with float64_source():
        y, _ = source_forward(backbone, read_in, read_out, x)
    _, cache = model.run_with_cache(x)
    comps, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    with torch.no_grad():
        assert rel_err(comps[0], read_in(x)) <= 1e-12
        out = model.unembed(model.ln_final(comps.sum(0)))
    assert rel_err(out, y) <= 1e-10


def head_slices(backbone, layer, head):
    """Query head ``head``'s W_Q, W_K, W_V [d, d_head] and W_O [d_head, d] in the source:
    its keys and values are those of key/value head ``head // group``."""
    a, c = backbone.layers[layer].self_attn, backbone.config
    dh, group = head_dim(c), c.num_attention_heads // c.num_key_value_heads
    q, kv = slice(head * dh, (head + 1) * dh), slice(head // group * dh, (head // group + 1) * dh)
    return (
        a.q_proj.weight.detach()[q].T,
        a.k_proj.weight.detach()[kv].T,
        a.v_proj.weight.detach()[kv].T,
        a.o_proj.weight.detach()[:, q].T,
    )


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_circuits_equal_products_of_the_source_weights(n_kv):
    backbone, _, _, model, _ = imported(num_key_value_heads=n_kv)
    ov, qk = vi.ov_circuit(model).AB, vi.qk_circuit(model).AB
    for layer in range(2):
        for head in range(4):
            W_Q, W_K, W_V, W_O = head_slices(backbone, layer, head)
            torch.testing.assert_close(ov[layer, head], W_V @ W_O, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(qk[layer, head], W_Q @ W_K.T, rtol=1e-12, atol=1e-12)


def test_direct_attribution_sums_to_the_source_output():
    backbone, read_in, read_out, model, x = imported()
    with float64_source():
        y, _ = source_forward(backbone, read_in, read_out, x)
    _, cache = model.run_with_cache(x)
    t = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    attr = vi.direct_attribution(model, cache, t)
    expected = ((y - read_out.bias.detach()) * t).sum(-1)
    assert (attr.total() - expected).abs().max() <= 1e-10 * expected.abs().max()


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 2)])
def test_head_ablation_equals_ablating_the_source(layer, head):
    """Under grouped-query attention, ablating query head 1 leaves head 0 (same key/value
    head) alone: the source's o_proj input is zeroed in head 1's slice only."""
    backbone, read_in, read_out, model, x = imported()
    dh = head_dim(backbone.config)

    def zero_head(module, args):
        (z,) = args
        z = z.clone()
        z[..., head * dh : (head + 1) * dh] = 0
        return (z,)

    with float64_source():
        handle = backbone.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero_head)
        try:
            y_ablated, _ = source_forward(backbone, read_in, read_out, x)
        finally:
            handle.remove()
        y, _ = source_forward(backbone, read_in, read_out, x)
    with torch.no_grad():
        ours = vi.ablate_heads(model, x, (layer, head), kind="zero")
    assert rel_err(ours, y_ablated) <= 1e-10
    assert (y_ablated - y).abs().max() > 1e-3  # the ablation changed the output


def test_weight_processing_keeps_the_source_output():
    backbone, read_in, read_out, model, x = imported(attention_bias=True, mlp_bias=True)
    with float64_source():
        y, _ = source_forward(backbone, read_in, read_out, x)
    processed = vi.fold_value_biases(vi.fold_layer_norm(model))
    assert processed.cfg.normalization == "RMSPre"
    with torch.no_grad():
        assert rel_err(processed(x), y) <= 1e-10


# ---------------------------------------------------------------- export and round trips

EXPORT_CFGS = {
    "gqa2-silu-base5e5": tiny_cfg(
        normalization="RMS",
        positional="rotary",
        gated_mlp=True,
        act_fn="silu",
        n_key_value_heads=1,
        rotary_base=5e5,
    ),  # fmt: skip
    "mha-gelu-embed_bias-RMSPre": tiny_cfg(
        normalization="RMSPre", positional="rotary", gated_mlp=True, act_fn="gelu", embed_bias=True
    ),
}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", EXPORT_CFGS)
def test_to_hf_reproduces_the_model_and_round_trips(name, impl):
    cfg = EXPORT_CFGS[name]
    model = random_model(cfg)
    if not HAS_MLP_BIAS:  # before: exported without them, 44 % off
        with pytest.raises(ValueError, match=r"MLP biases are nonzero, and transformers 4"):
            vi.to_hf(model, attn_implementation=impl)
        with torch.no_grad():
            for block in model.blocks:
                for b in (block.mlp.b_gate, block.mlp.b_in, block.mlp.b_out):
                    b.zero_()
    rng = torch.get_rng_state()
    backbone, read_in, read_out = vi.to_hf(model, attn_implementation=impl)
    # the rotary base is in the field this version reads (before: 5.x's only, so that
    # 4.40-4.57 ran the export at 10000 whatever the model's)
    assert rope_theta(backbone.config) == cfg.rotary_base
    assert torch.equal(torch.get_rng_state(), rng)
    assert type(backbone).__name__ == "LlamaModel" and not backbone.training
    x = torch.randn(2, cfg.n_ctx, cfg.d_in, generator=torch.Generator().manual_seed(0), dtype=F64)
    patched = float64_source() if impl == "sdpa" else contextlib.nullcontext()
    with patched:
        y, _ = source_forward(backbone, read_in, read_out, x)
    with torch.no_grad():
        assert rel_err(model(x), y) <= (1e-10 if impl == "sdpa" else 1e-5)
    back = vi.from_hf(backbone, read_in, read_out)
    assert back.cfg == cfg.replace(normalization="RMS")
    for key, value in back.state_dict().items():
        if key.split(".")[-1] == "w" and cfg.normalization == "RMSPre":
            assert torch.equal(value, torch.ones_like(value))
        else:
            assert torch.equal(value, model.state_dict()[key]), key


def test_from_hf_then_to_hf_is_bit_identical():
    backbone, read_in, read_out = build("llama-gqa2-biases", "sdpa", F64)
    again, read_in2, read_out2 = vi.to_hf(vi.from_hf(backbone, read_in, read_out))
    theirs = dict(again.named_parameters())
    for name, p in backbone.named_parameters():
        if name != "embed_tokens.weight":  # not used; to_hf stores a 1-row table
            assert torch.equal(theirs[name], p), name
    assert torch.equal(read_in2.weight, read_in.weight)
    assert torch.equal(read_out2.bias, read_out.bias)


# ---------------------------------------------------------------- refusals


def refuse(backbone, match, *, exc=ValueError, **kwargs):
    d = backbone.config.hidden_size
    with pytest.raises(exc, match=match):
        vi.from_hf(backbone, linear(3, d), linear(d, 1), **kwargs)


def test_refusals_of_the_backbone():
    refuse(
        backbone_of(**rope("linear", 1e4, factor=2.0)),
        r"rope_type='linear' \(rotary scaling",
    )
    refuse(backbone_of(hidden_act="quick_gelu"), r"hidden_act='quick_gelu'")
    refuse(backbone_of("mistral", sliding_window=4), r"sliding_window=4 < n_ctx=9 .* n_ctx <= 4")
    backbone = backbone_of()
    backbone.layers[1].self_attn.q_norm = nn.Identity()  # Qwen3's query norm
    refuse(backbone, r"layers\.1 has \['self_attn\.q_norm'\]")
    backbone = backbone_of()
    backbone.norm = nn.LayerNorm(16)
    refuse(backbone, r"norm is a LayerNorm, not one of")
    backbone = backbone_of()
    backbone.layers[0].input_layernorm.variance_epsilon = 1e-3
    refuse(backbone, r"norms of different eps \[1e-05, 0\.001\]")
    refuse(
        backbone_of(max_position_embeddings=5000), r"max_position_embeddings=5000 .* pass n_ctx="
    )
    refuse(backbone_of(), r"n_ctx must be a positive int, got 0", n_ctx=0)


def test_the_activation_is_read_from_the_modules():
    """An activation swap in layer.mlp.act_fn imports as it computes (before: as the
    config's silu, ~29 % off); one that is none of vecinterp's is refused."""
    backbone = backbone_of(hidden_act="silu")
    read_in, read_out = linear(3, 16), linear(16, 1)
    for layer in backbone.layers:
        layer.mlp.act_fn = nn.GELU()
    model = vi.from_hf(backbone, read_in, read_out)
    assert model.cfg.act_fn == "gelu"
    x = torch.randn(2, 9, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    with float64_source():
        y, _ = source_forward(backbone, read_in, read_out, x)
    with torch.no_grad():
        assert rel_err(model(x), y) <= 1e-10
    backbone.layers[0].mlp.act_fn = nn.Softplus()
    refuse(
        backbone,
        r"layers\.0\.mlp\.act_fn is a torch\.nn\.modules\.activation\.Softplus, which "
        r"computes none of vecinterp's",
    )


def test_a_source_in_train_mode_with_attention_dropout_is_refused():
    backbone = backbone_of(attention_dropout=0.25).train()
    refuse(
        backbone,
        r"LlamaModel is in training mode with dropout \(layers\.0\.self_attn\."
        r"attention_dropout=0\.25, .*call \.eval\(\) on it first",
    )
    assert backbone.training
    vi.from_hf(backbone.eval(), linear(3, 16), linear(16, 1))
    vi.from_hf(backbone_of().train(), linear(3, 16), linear(16, 1))  # no dropout: imported


def test_a_rotary_base_that_the_model_does_not_use_is_refused():
    """The rotary embedding's inv_freq is checked against the base read from the config's
    field that this transformers reads: a config edited after the model was built (or a
    4.x config carrying 5.x's rope_parameters) is refused, not imported at a base the
    source does not run at."""
    backbone = backbone_of()
    if V5:
        backbone.config.rope_parameters["rope_theta"] = 500.0
    else:
        backbone.config.rope_theta = 500.0
    refuse(backbone, r"rotary_emb\.inv_freq is not rope_theta=500's")


def test_n_ctx_argument():
    """A window or a long configured context is imported for the lengths it will see: the
    sliding window longer than n_ctx changes nothing."""
    backbone = backbone_of("mistral", sliding_window=6, max_position_embeddings=5000)
    read_in, read_out = linear(3, 16), linear(16, 1)
    model = vi.from_hf(backbone, read_in, read_out, n_ctx=6)
    assert model.cfg.n_ctx == 6
    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    with float64_source():
        y, _ = source_forward(backbone, read_in, read_out, x)
    with torch.no_grad():
        assert rel_err(model(x), y) <= 1e-10
    gpt2 = transformers.GPT2Model(
        transformers.GPT2Config(
            vocab_size=1, bos_token_id=0, eos_token_id=0, n_embd=8, n_layer=1, n_head=2
        )
    )
    with pytest.raises(ValueError, match=r"a GPT2Model's n_ctx is its n_positions \(1024"):
        vi.from_hf(gpt2, linear(3, 8), linear(8, 1), n_ctx=6)


def test_to_hf_refusals_name_both_architectures():
    with pytest.raises(
        ValueError,
        match=r"(?s)to GPT-2:\n  - positional='rotary'.*\nnor to Llama:\n.*gated_mlp=False",
    ):
        vi.to_hf(vi.HookedVectorTransformer(tiny_cfg(positional="rotary", normalization="RMS")))
