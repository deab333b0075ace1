"""The model against independent plain-PyTorch implementations, hand-worked values and
invariants (causality, determinism, losses, ``stop_at_layer``)."""

import math

import pytest
import torch
import torch.nn.functional as F

import vecinterp as vi
from helpers import all_option_cfgs, random_input, random_model, tiny_cfg
from vecinterp.model.components import TransformerBlock
from vecinterp.testing import PlainTransformer

F64 = torch.float64
ALL_CFGS = list(all_option_cfgs())


def cfg_id(cfg: vi.VectorTransformerConfig) -> str:
    causal = "causal" if cfg.causal else "bidir"
    return f"{cfg.normalization}-{cfg.positional}-{cfg.act_fn}-{causal}"


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def plain_output(model: vi.HookedVectorTransformer, x: torch.Tensor) -> torch.Tensor:
    plain = PlainTransformer(model.cfg, model.state_dict())
    with torch.no_grad():
        return plain(x)


# -- whole model vs PlainTransformer --------------------------------------------------


@pytest.mark.parametrize("cfg", ALL_CFGS, ids=cfg_id)
def test_matches_plain_transformer_float64(cfg):
    model = random_model(cfg)
    x = random_input(cfg)
    with torch.no_grad():
        y = model(x)
    assert y.shape == (3, cfg.n_ctx, cfg.d_out)
    assert max_abs_diff(y, plain_output(model, x)) <= 1e-10


FLOAT32_CFGS = [
    tiny_cfg(normalization=norm, positional=pos, act_fn=act, causal=causal, embed_bias=True)
    for norm, pos, act, causal in [
        ("LN", "learned", "gelu_tanh", True),
        ("RMS", "rotary", "silu", True),
        ("LNPre", "sinusoidal", "gelu", False),
        ("RMSPre", "none", "relu", False),
        (None, "rotary", "gelu", True),
    ]
]


@pytest.mark.parametrize("cfg", FLOAT32_CFGS, ids=cfg_id)
def test_matches_plain_transformer_float32(cfg):
    # scale 0.2 keeps outputs O(1), where an absolute 1e-5 is a float32 statement
    model = random_model(cfg, dtype=torch.float32, scale=0.2)
    x = random_input(cfg, dtype=torch.float32)
    with torch.no_grad():
        y = model(x)
    assert y.dtype == torch.float32
    assert y.abs().max() > 0.1
    assert max_abs_diff(y, plain_output(model, x)) <= 1e-5


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attn_only=True),
        dict(attn_only=True, positional="rotary", normalization="RMS", causal=False),
        dict(embed_bias=False),
        dict(embed_bias=False, attn_only=True, normalization=None),
        dict(d_out=1),
        dict(d_in=6, d_out=2, d_model=12, d_head=3, n_heads=3, n_layers=3),
        dict(d_out=None),
        dict(n_layers=1, n_heads=1, d_head=8),
    ],
    ids=repr,
)
def test_variants_match_plain_transformer(overrides):
    cfg = tiny_cfg(**overrides)
    model = random_model(cfg)
    x = random_input(cfg)
    with torch.no_grad():
        y = model(x)
    assert y.shape == (3, cfg.n_ctx, cfg.d_out)
    assert max_abs_diff(y, plain_output(model, x)) <= 1e-10


@pytest.mark.parametrize("n_pos", [1, 4])
@pytest.mark.parametrize("cfg", ALL_CFGS[::13], ids=cfg_id)
def test_shorter_sequences_match_plain_transformer(cfg, n_pos):
    model = random_model(cfg)
    x = random_input(cfg, n_pos=n_pos, batch=2)
    with torch.no_grad():
        y = model(x)
    assert y.shape == (2, n_pos, cfg.d_out)
    assert max_abs_diff(y, plain_output(model, x)) <= 1e-10


def test_shorter_sequence_is_a_prefix_of_the_full_causal_run():
    cfg = tiny_cfg(positional="rotary")
    model = random_model(cfg)
    x = random_input(cfg)
    with torch.no_grad():
        full, short = model(x), model(x[:, :4])
    torch.testing.assert_close(short, full[:, :4], atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "cfg", [tiny_cfg(positional="rotary"), tiny_cfg(causal=False, embed_bias=True)], ids=cfg_id
)
def test_every_parameter_reaches_the_output(cfg):
    """The equivalence above covers every weight: perturbing any one of them (except b_K,
    which only shifts each query's scores by a constant without rotary) changes the
    output, and the plain model built from the perturbed weights follows."""
    model = random_model(cfg)
    x = random_input(cfg, batch=2)
    with torch.no_grad():
        y = model(x)
        for name, param in model.named_parameters():
            if name.endswith("attn.b_K") and cfg.positional != "rotary":
                continue
            original = param.clone()
            gen = torch.Generator().manual_seed(len(name))
            param.add_(0.1 * torch.randn(param.shape, generator=gen, dtype=F64))
            y2 = model(x)
            assert max_abs_diff(y, y2) > 1e-6, name
            assert max_abs_diff(y2, plain_output(model, x)) <= 1e-10, name
            param.copy_(original)


def test_key_bias_is_irrelevant_without_rotary():
    cfg = tiny_cfg(positional="learned")
    model = random_model(cfg)
    x = random_input(cfg)
    with torch.no_grad():
        y = model(x)
        model.blocks[0].attn.b_K.add_(1.0)
        assert max_abs_diff(model(x), y) <= 1e-12


# -- block level: TransformerBlock vs a plain pre-LN block ---------------------------

PLAIN_ACTS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def plain_rotary(t: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half rotary on ``t [batch, n_heads, pos, d_head]``: dimension ``i`` pairs
    with ``i + d_head/2`` and the pair at position ``p`` turns by ``p * base^(-2i/d_head)``."""
    n_pos, d_head = t.shape[-2], t.shape[-1]
    half = d_head // 2
    out = torch.empty_like(t)
    positions = torch.arange(n_pos, dtype=F64)
    for i in range(half):
        angle = positions * base ** (-2 * i / d_head)
        cos, sin = angle.cos().to(t.dtype)[:, None], angle.sin().to(t.dtype)[:, None]
        a, b = t[..., i : i + 1], t[..., i + half : i + half + 1]
        out[..., i : i + 1] = a * cos - b * sin
        out[..., i + half : i + half + 1] = b * cos + a * sin
    return out


def plain_block(
    x: torch.Tensor, sd: dict[str, torch.Tensor], cfg: vi.VectorTransformerConfig
) -> torch.Tensor:
    """A GPT-2 pre-norm block from ``TransformerBlock``'s state dict, in nn.functional."""

    def norm(t: torch.Tensor, name: str) -> torch.Tensor:
        if cfg.normalization is None:
            return t
        w, b = sd.get(f"{name}.w"), sd.get(f"{name}.b")
        if cfg.normalization in ("LN", "LNPre"):
            return F.layer_norm(t, (cfg.d_model,), w, b, cfg.eps)
        return F.rms_norm(t, (cfg.d_model,), w, cfg.eps)

    h = norm(x, "ln1")
    q, k, v = (
        torch.stack(
            [
                F.linear(h, sd[f"attn.W_{n}"][head].T, sd[f"attn.b_{n}"][head])
                for head in range(cfg.n_heads)
            ],
            dim=1,
        )
        for n in "QKV"
    )  # each [batch, n_heads, pos, d_head]
    if cfg.positional == "rotary":
        q, k = plain_rotary(q, cfg.rotary_base), plain_rotary(k, cfg.rotary_base)
    z = F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal)  # scale 1/sqrt(d_head)
    attn_out = (
        sum(F.linear(z[:, head], sd["attn.W_O"][head].T) for head in range(cfg.n_heads))
        + sd["attn.b_O"]
    )
    resid = x + attn_out
    if cfg.attn_only:
        return resid
    hidden = PLAIN_ACTS[cfg.act_fn](F.linear(norm(resid, "ln2"), sd["mlp.W_in"].T, sd["mlp.b_in"]))
    return resid + F.linear(hidden, sd["mlp.W_out"].T, sd["mlp.b_out"])


def random_block(cfg: vi.VectorTransformerConfig, seed: int = 0) -> TransformerBlock:
    block = TransformerBlock(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=F64).to(p.dtype)
            p.copy_(1 + 0.3 * noise if name.endswith(".w") else 0.5 * noise)
    return block.to(F64)


BLOCK_CFGS = [
    tiny_cfg(normalization=norm, positional=pos, act_fn=act, causal=causal)
    for norm in ["LN", "LNPre", "RMS", "RMSPre", None]
    for pos in ["none", "rotary"]
    for act in ["relu", "gelu", "gelu_tanh", "silu"]
    for causal in [True, False]
]


@pytest.mark.parametrize("cfg", BLOCK_CFGS, ids=cfg_id)
def test_block_matches_plain_block(cfg):
    block = random_block(cfg)
    x = torch.randn(
        2, cfg.n_ctx, cfg.d_model, generator=torch.Generator().manual_seed(1), dtype=F64
    )
    sd = block.state_dict()
    with torch.no_grad():
        y = block(x)
        expected = plain_block(x, sd, cfg)
    assert max_abs_diff(y, expected) <= 1e-10
    assert max_abs_diff(y, x) > 1e-3


@pytest.mark.parametrize(
    "cfg",
    [
        tiny_cfg(attn_only=True, positional="rotary", causal=True),
        tiny_cfg(attn_only=True, normalization="RMS", causal=False),
        tiny_cfg(normalization="LN", positional="rotary", act_fn="gelu", rotary_base=7.0),
    ],
    ids=cfg_id,
)
@pytest.mark.parametrize("n_pos", [1, 3, 7])
def test_block_variants_match_plain_block(cfg, n_pos):
    block = random_block(cfg, seed=3)
    x = torch.randn(2, n_pos, cfg.d_model, generator=torch.Generator().manual_seed(2), dtype=F64)
    with torch.no_grad():
        assert max_abs_diff(block(x), plain_block(x, block.state_dict(), cfg)) <= 1e-10


def test_plain_rotary_is_a_rotation_by_the_documented_angle():
    """The test's own rotary: position 0 is untouched, pair (i, i + d_head/2) at position
    p turns by p * base^(-2i/d_head), and norms are preserved."""
    t = torch.zeros(1, 1, 3, 4, dtype=F64)
    t[..., 0] = 1.0  # pair (0, 2), frequency 1
    t[..., 1] = 1.0  # pair (1, 3), frequency base^(-1/2)
    out = plain_rotary(t, base=100.0)
    for p in range(3):
        assert out[0, 0, p, 0].item() == pytest.approx(math.cos(p))
        assert out[0, 0, p, 2].item() == pytest.approx(math.sin(p))
        assert out[0, 0, p, 1].item() == pytest.approx(math.cos(p / 10))
        assert out[0, 0, p, 3].item() == pytest.approx(math.sin(p / 10))
    torch.testing.assert_close(out.norm(dim=-1), t.norm(dim=-1))


# -- hand-worked exact values -----------------------------------------------------------


def hand_model(**overrides) -> vi.HookedVectorTransformer:
    """A one-layer model with every parameter zero and identity embed/unembed."""
    kwargs = dict(
        d_in=4,
        d_model=4,
        d_head=2,
        n_heads=2,
        n_layers=1,
        n_ctx=4,
        attn_only=True,
        normalization=None,
        positional="none",
    )
    kwargs.update(overrides)
    cfg = vi.VectorTransformerConfig(**kwargs)
    model = vi.HookedVectorTransformer(cfg, dtype=F64)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E.copy_(torch.eye(cfg.d_in, cfg.d_model, dtype=F64))
        model.unembed.W_U.copy_(torch.eye(cfg.d_model, cfg.d_out, dtype=F64))
    return model


def set_copying_heads(model: vi.HookedVectorTransformer, signs: tuple[float, float]) -> None:
    """W_Q = W_K = 0; head h reads dims (2h, 2h+1) and writes them back times signs[h]."""
    eye = torch.eye(4, dtype=F64)
    attn = model.blocks[0].attn
    with torch.no_grad():
        for head, sign in enumerate(signs):
            attn.W_V[head] = eye[:, 2 * head : 2 * head + 2]
            attn.W_O[head] = sign * eye[2 * head : 2 * head + 2, :]


# each column has integer running means: 1 3 5 7 -> 1 2 3 4; 0 4 -1 9 -> 0 2 1 3; ...
HAND_X = torch.tensor(
    [[[1.0, 2.0, 0.0, 4.0], [3.0, 2.0, 4.0, -2.0], [5.0, 2.0, -1.0, 1.0], [7.0, 2.0, 9.0, 5.0]]],
    dtype=F64,
)


def test_hand_causal_uniform_attention_copies_the_running_mean():
    model = hand_model()
    set_copying_heads(model, (1.0, 1.0))
    y, cache = model.run_with_cache(HAND_X)
    running_mean = [[1, 2, 0, 4], [2, 2, 2, 1], [3, 2, 1, 1], [4, 2, 3, 2]]
    assert torch.allclose(cache["attn_out", 0][0], torch.tensor(running_mean, dtype=F64))
    # y = x + running mean, worked out by hand
    expected = torch.tensor(
        [[[2, 4, 0, 8], [5, 4, 6, -1], [8, 4, 0, 2], [11, 4, 12, 7]]], dtype=F64
    )
    torch.testing.assert_close(y, expected, atol=1e-14, rtol=0)
    uniform = torch.tensor(
        [
            [1, 0, 0, 0],
            [1 / 2, 1 / 2, 0, 0],
            [1 / 3, 1 / 3, 1 / 3, 0],
            [1 / 4, 1 / 4, 1 / 4, 1 / 4],
        ],
        dtype=F64,
    )
    for head in range(2):
        torch.testing.assert_close(cache["pattern", 0][0, head], uniform, atol=1e-15, rtol=0)


def test_hand_bidirectional_attention_copies_and_negates_the_global_mean():
    model = hand_model(causal=False)
    set_copying_heads(model, (1.0, -1.0))  # head 1 has OV = -I on its dims
    with torch.no_grad():
        model.blocks[0].attn.b_O.copy_(torch.tensor([0.5, 0, 0, 0], dtype=F64))
        model.unembed.b_U.copy_(torch.tensor([0, 0, 0, -1], dtype=F64))
        y = model(HAND_X)
    # column means 4, 2, 3, 2 (pattern 1/4 and integer sums: exact in binary)
    # y_t = x_t + (4, 2, -3, -2) + b_O + b_U
    expected = torch.tensor(
        [[[5.5, 4, -3, 1], [7.5, 4, 1, -5], [9.5, 4, -4, -2], [11.5, 4, 6, 2]]], dtype=F64
    )
    assert torch.equal(y, expected)


def test_hand_attention_scores_are_scaled_by_one_over_sqrt_d_head():
    model = hand_model(d_in=2, d_model=2, n_heads=1, d_head=2, causal=False)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0] = torch.eye(2, dtype=F64)
        model.blocks[0].attn.W_K[0] = torch.eye(2, dtype=F64)
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=F64)
    _, cache = model.run_with_cache(x)
    s = 1 / math.sqrt(2)
    scores = torch.tensor([[1 * s, 0.0], [0.0, 4 * s]], dtype=F64)
    torch.testing.assert_close(cache["attn_scores", 0][0, 0], scores, atol=1e-15, rtol=0)
    row0 = [math.exp(s) / (math.exp(s) + 1), 1 / (math.exp(s) + 1)]
    row1 = [1 / (1 + math.exp(4 * s)), math.exp(4 * s) / (1 + math.exp(4 * s))]
    torch.testing.assert_close(
        cache["pattern", 0][0, 0], torch.tensor([row0, row1], dtype=F64), atol=1e-15, rtol=0
    )


def test_hand_mlp_relu():
    model = hand_model(attn_only=False, d_mlp=4, act_fn="relu")
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        mlp.W_in.copy_(torch.eye(4, dtype=F64))
        mlp.W_out.copy_(2 * torch.eye(4, dtype=F64))
        mlp.b_in.copy_(torch.tensor([0, 0, -1, 0], dtype=F64))
        mlp.b_out.copy_(torch.tensor([0, 0, 0, 0.5], dtype=F64))
        x = torch.tensor([[[1, -2, 3, -4], [-1, 2, 0.5, 4]]], dtype=F64)
        y = model(x)
    # attention writes 0 (W_V = W_O = 0); y = x + 2 relu(x + b_in) + b_out
    expected = torch.tensor([[[3, -2, 7, -3.5], [-1, 6, 0.5, 12.5]]], dtype=F64)
    assert torch.equal(y, expected)


@pytest.mark.parametrize("normalization", ["LN", "RMS"])
def test_hand_final_norm(normalization):
    model = hand_model(normalization=normalization, eps=1e-5)
    with torch.no_grad():
        model.ln_final.w.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64))
        if normalization == "LN":
            model.ln_final.b.copy_(torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64))
        x = torch.tensor([[[5.0, -1.0, 5.0, -1.0]]], dtype=F64)
        y = model(x)
    if normalization == "LN":
        # centred: (3, -3, 3, -3), biased variance 9
        expected = [3 / math.sqrt(9 + 1e-5) * w for w in (1, -2, 3, -4)]
        expected[3] += 1.0
    else:
        # mean square (25 + 1 + 25 + 1) / 4 = 13
        expected = [v / math.sqrt(13 + 1e-5) * w for v, w in zip((5, -1, 5, -1), (1, 2, 3, 4))]
    torch.testing.assert_close(y[0, 0], torch.tensor(expected, dtype=F64), atol=1e-14, rtol=0)


# -- causality ----------------------------------------------------------------------------

CAUSALITY_CFGS = ALL_CFGS[::7]


@pytest.mark.parametrize("cfg", CAUSALITY_CFGS, ids=cfg_id)
def test_causal_outputs_ignore_later_positions(cfg):
    model = random_model(cfg)
    x = random_input(cfg, batch=2)
    with torch.no_grad():
        y = model(x)
        for t in [1, 4, 6]:
            x2 = x.clone()
            x2[:, t] += torch.linspace(-1, 2, cfg.d_in, dtype=F64)
            # separate calls of one shape: bitwise comparable (rows of one batch are not)
            y2 = model(x2)
            assert max_abs_diff(y[:, t], y2[:, t]) > 1e-6  # position t sees its own input
            if cfg.causal:
                assert torch.equal(y[:, :t], y2[:, :t])
            else:
                assert (y[:, :t] - y2[:, :t]).abs().amax(dim=(0, 2)).min() > 1e-8


# -- determinism --------------------------------------------------------------------------


def test_same_seed_same_weights_different_seed_different_weights():
    cfg = tiny_cfg(embed_bias=True)
    a = vi.HookedVectorTransformer(cfg, seed=3).state_dict()
    b = vi.HookedVectorTransformer(cfg, seed=3).state_dict()
    c = vi.HookedVectorTransformer(cfg, seed=4).state_dict()
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    weights = [k for k in a if k.rsplit(".", 1)[-1].startswith("W_")]
    assert weights
    assert all(not torch.equal(a[k], c[k]) for k in weights)
    assert all(torch.equal(a[k], c[k]) for k in a if k not in weights)  # biases, norms


def test_seeded_constructor_leaves_the_global_rng_alone():
    torch.manual_seed(1234)
    state = torch.random.get_rng_state()
    vi.HookedVectorTransformer(tiny_cfg(positional="rotary"), seed=7)
    vi.HookedVectorTransformer(tiny_cfg(), seed=8, dtype=F64)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_unseeded_constructor_follows_the_global_rng():
    cfg = tiny_cfg()
    torch.manual_seed(5)
    a = vi.HookedVectorTransformer(cfg, seed=None).state_dict()
    torch.manual_seed(5)
    b = vi.HookedVectorTransformer(cfg, seed=None).state_dict()
    c = vi.HookedVectorTransformer(cfg, seed=None).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.W_E"], c["embed.W_E"])


def test_default_init_statistics():
    cfg = tiny_cfg(d_model=64, d_mlp=128, n_layers=2, init_range=0.05)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=F64)
    assert model.W_E.std().item() == pytest.approx(0.05, rel=0.2)
    assert model.blocks[0].mlp.W_out.std().item() == pytest.approx(0.05 / 2, rel=0.2)
    assert torch.equal(model.blocks[0].ln1.w, torch.ones(64, dtype=F64))
    assert torch.equal(model.blocks[0].attn.b_Q, torch.zeros(2, 4, dtype=F64))


# -- return types and stop_at_layer ---------------------------------------------------------


def test_loss_and_both_equal_masked_mse_of_the_output():
    cfg = tiny_cfg()
    model = random_model(cfg)
    x = random_input(cfg)
    targets = torch.randn(
        3, cfg.n_ctx, cfg.d_out, generator=torch.Generator().manual_seed(9), dtype=F64
    )
    with torch.no_grad():
        y = model(x)
        loss = model(x, targets=targets, return_type="loss")
        y_both, loss_both = model(x, targets=targets, return_type="both")
    expected = vi.masked_mse(y, targets)
    assert loss.shape == ()
    assert loss.item() == pytest.approx(((y - targets) ** 2).mean().item(), rel=1e-12)
    torch.testing.assert_close(loss, expected, atol=0, rtol=1e-14)
    torch.testing.assert_close(loss_both, expected, atol=0, rtol=1e-14)
    assert torch.equal(y_both, y)


@pytest.mark.parametrize("mask_shape", ["pos", "batch pos"])
def test_loss_with_mask_equals_masked_mse(mask_shape):
    cfg = tiny_cfg()
    model = random_model(cfg)
    x = random_input(cfg)
    targets = torch.randn(
        3, cfg.n_ctx, cfg.d_out, generator=torch.Generator().manual_seed(9), dtype=F64
    )
    gen = torch.Generator().manual_seed(4)
    shape = (cfg.n_ctx,) if mask_shape == "pos" else (3, cfg.n_ctx)
    mask = torch.rand(shape, generator=gen) > 0.4
    mask.view(-1)[0] = True
    with torch.no_grad():
        y = model(x)
        loss = model(x, targets=targets, loss_mask=mask, return_type="loss")
    full_mask = mask.expand(3, cfg.n_ctx)
    by_hand = ((y - targets) ** 2).mean(-1)[full_mask].mean()
    torch.testing.assert_close(loss, by_hand, atol=0, rtol=1e-12)
    torch.testing.assert_close(loss, vi.masked_mse(y, targets, mask), atol=0, rtol=1e-14)
    assert loss.item() != pytest.approx(vi.masked_mse(y, targets).item(), rel=1e-6)


@pytest.mark.parametrize(
    "cfg", [tiny_cfg(n_layers=3), tiny_cfg(n_layers=3, attn_only=True)], ids=repr
)
def test_stop_at_layer_returns_the_cached_residual_stream(cfg):
    model = random_model(cfg)
    x = random_input(cfg)
    # hook_result off the cache: hooking it changes the attention's summation order
    _, cache = model.run_with_cache(x, names_filter=lambda n: not n.endswith("hook_result"))
    n = cfg.n_layers
    with torch.no_grad():
        for layer in range(n):
            assert torch.equal(model(x, stop_at_layer=layer), cache["resid_pre", layer])
            assert torch.equal(model(x, stop_at_layer=layer - n), cache["resid_pre", layer])
        final = model(x, stop_at_layer=n)
    assert final.shape == (3, cfg.n_ctx, cfg.d_model)
    assert torch.equal(final, cache["resid_post", n - 1])
    assert torch.equal(cache["resid_pre", 0], cache["embed"] + cache["pos_embed"])
