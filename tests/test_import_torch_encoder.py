"""Import of pre-norm ``torch.nn.TransformerEncoder`` models (vi.from_torch_encoder) and
export (vi.to_torch_encoder): the imported model reproduces the source's outputs (on
PyTorch's slow path and on its fused eval-mode fast path, float64 and float32, causal and
bidirectional, batch_first either way, with and without positions, several shapes, batch
sizes and lengths) and its residual stream at every layer boundary; the analyses agree
with the same quantities computed from the source's weights; round trips are lossless;
every refusal says why.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vecinterp as vi
from helpers import random_model, tiny_cfg, unchecked
from import_helpers import rel_err

F32, F64 = torch.float32, torch.float64
TOL = {F64: 1e-10, F32: 1e-5}  # max |ours - source| / max |source|


def randomise(module, seed):
    """Every parameter random: biases and LayerNorm weights too."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = 0.3 * torch.randn(p.shape, generator=gen, dtype=F64).to(p.dtype)
            is_norm_weight = "norm" in name and name.endswith("weight")
            p.copy_(1 + noise if is_norm_weight else noise)
    return module


def encoder(
    d=8,
    nhead=2,
    ff=16,
    n_layers=2,
    act=F.relu,
    eps=1e-5,
    batch_first=True,
    bias=True,
    norm=True,
    dtype=F64,
    seed=0,
    **layer_kwargs,
):
    layer = nn.TransformerEncoderLayer(
        d, nhead, ff, dropout=0.0, activation=act, layer_norm_eps=eps,
        batch_first=batch_first, norm_first=True, bias=bias, **layer_kwargs,
    )  # fmt: skip
    final = nn.LayerNorm(d, eps=eps) if norm is True else norm
    enc = nn.TransformerEncoder(layer, n_layers, norm=final, enable_nested_tensor=False)
    return randomise(enc, seed).to(dtype).eval()


def linear(d_in, d_out, bias=True, dtype=F64, seed=1):
    return randomise(nn.Linear(d_in, d_out, bias=bias), seed).to(dtype)


def source_forward(enc, read_in, read_out, x, *, causal, pos=None, fast=False):
    """The source model; ``fast``: under no_grad, where PyTorch takes its fused path."""
    n = x.shape[1]
    h = read_in(x) + (0 if pos is None else pos[:n])
    batch_first = enc.layers[0].self_attn.batch_first
    if not batch_first:
        h = h.transpose(0, 1)
    mask = nn.Transformer.generate_square_subsequent_mask(n, dtype=x.dtype) if causal else None
    with torch.set_grad_enabled(not fast):
        out = enc(h, mask=mask, is_causal=causal)
        out = out if batch_first else out.transpose(0, 1)
        return read_out(out).detach()


# (encoder kwargs, d_in, d_out, causal, positions, read_in/read_out biases, as tuples)
SHAPES = {
    "relu-causal-pos": (dict(), 3, 1, True, "tensor", True, False),
    "gelu-bidir-seq_first-no_pos": (
        dict(d=12, nhead=3, ff=20, n_layers=3, act="gelu", eps=1e-6, batch_first=False),
        4,
        2,
        False,
        None,
        False,
        True,
    ),
    "GELU-no_bias-affine_free_norm-embedding": (
        dict(d=6, nhead=1, ff=10, n_layers=1, act=nn.GELU(), eps=1e-3, bias=False)
        | dict(norm=nn.LayerNorm(6, eps=1e-3, elementwise_affine=False)),
        2,
        3,
        True,
        "embedding",
        True,
        True,
    ),
    "ReLU-4heads-norm_without_bias": (
        dict(d=8, nhead=4, ff=12, act=nn.ReLU(), norm=nn.LayerNorm(8, bias=False)),
        3,
        3,
        False,
        "tensor",
        True,
        False,
    ),
}


def build(name, dtype):
    kwargs, d_in, d_out, causal, positions, biases, tuples = SHAPES[name]
    enc = encoder(dtype=dtype, **kwargs)
    d = enc.layers[0].self_attn.embed_dim
    read_in, read_out = linear(d_in, d, biases, dtype, 1), linear(d, d_out, biases, dtype, 2)
    n_ctx = 7
    pos_arg = pos = None
    if positions == "tensor":
        pos_arg = pos = randomise(nn.Linear(d, n_ctx + 2), 3).weight.detach().to(dtype)
    elif positions == "embedding":
        pos_arg = randomise(nn.Embedding(n_ctx, d), 3).to(dtype)
        pos = pos_arg.weight.detach()
    args = (read_in, read_out)
    if tuples:  # (weight, bias) or (weight,)
        args = tuple((lin.weight, lin.bias) if biases else (lin.weight,) for lin in args)
    model = vi.from_torch_encoder(enc, *args, causal=causal, pos_embed=pos_arg, n_ctx=n_ctx)
    return enc, read_in, read_out, pos, causal, model


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", SHAPES)
def test_outputs_and_residual_stream_match_the_source(name, dtype):
    enc, read_in, read_out, pos, causal, model = build(name, dtype)
    cfg = model.cfg
    assert model.W_E.dtype == dtype and not model.training
    assert (cfg.n_ctx, cfg.causal, cfg.positional) == (
        7,
        causal,
        "none" if pos is None else "learned",
    )
    gen = torch.Generator().manual_seed(4)
    for batch, n in [(1, 7), (3, 1), (2, 5)]:
        x = torch.randn(batch, n, cfg.d_in, generator=gen, dtype=F64).to(dtype)
        with torch.no_grad():
            ours, cache = model.run_with_cache(x)
        for fast in (False, True):
            y = source_forward(enc, read_in, read_out, x, causal=causal, pos=pos, fast=fast)
            assert rel_err(ours, y) <= TOL[dtype], fast
        # the residual stream entering every layer, and the final norm's output
        seen = []
        hooks = [
            layer.register_forward_pre_hook(lambda m, a: seen.append(a[0])) for layer in enc.layers
        ]
        hooks.append(enc.norm.register_forward_hook(lambda m, a, out: seen.append(out)))
        try:
            source_forward(enc, read_in, read_out, x, causal=causal, pos=pos)
        finally:
            for hook in hooks:
                hook.remove()
        if not enc.layers[0].self_attn.batch_first:
            seen = [s.transpose(0, 1) for s in seen]
        for i in range(cfg.n_layers):
            assert rel_err(cache[f"blocks.{i}.hook_resid_pre"], seen[i]) <= TOL[dtype]
        final = model.ln_final(cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"])
        assert rel_err(final, seen[-1]) <= TOL[dtype]


def test_the_fused_fast_path_runs_on_these_sources():
    """Not a tautology of the test above: PyTorch takes its fused kernel here (eval, no
    grad, batch_first), whose rounding differs from the slow path's."""
    enc = encoder(dtype=F32)
    x = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(0))
    calls = []
    original = torch._transformer_encoder_layer_fwd

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch._transformer_encoder_layer_fwd = spy
    try:
        with torch.no_grad():
            enc(x, mask=nn.Transformer.generate_square_subsequent_mask(7), is_causal=True)
    finally:
        torch._transformer_encoder_layer_fwd = original
    assert len(calls) == 2


# ---------------------------------------------------------------- analyses on an import


def imported():
    enc, read_in, read_out, pos, causal, model = build("relu-causal-pos", F64)
    x = torch.randn(3, 7, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    return enc, read_in, read_out, pos, model, x


def test_decomposition_and_attribution_sum_to_the_source_output():
    enc, read_in, read_out, pos, model, x = imported()
    y = source_forward(enc, read_in, read_out, x, causal=True, pos=pos)
    _, cache = model.run_with_cache(x)
    comps = cache.decompose_resid()
    with torch.no_grad():
        assert rel_err(comps[0], read_in(x)) <= 1e-12
        assert rel_err(comps[1], pos[:7].expand_as(comps[1])) == 0
        assert rel_err(model.unembed(model.ln_final(comps.sum(0))), y) <= 1e-10
    t = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    total = vi.direct_attribution(model, cache, t).total()
    expected = ((y - read_out.bias.detach()) * t).sum(-1)
    assert (total - expected).abs().max() <= 1e-10 * expected.abs().max()


def test_circuits_equal_products_of_the_source_weights():
    enc, _, _, _, model, _ = imported()
    ov, qk = vi.ov_circuit(model).AB, vi.qk_circuit(model).AB
    for layer in range(2):
        attn = enc.layers[layer].self_attn
        W_Q, W_K, W_V = attn.in_proj_weight.detach().chunk(3)  # [d, d], rows = outputs
        W_O = attn.out_proj.weight.detach()
        for head in range(2):
            rows = slice(head * 4, (head + 1) * 4)
            torch.testing.assert_close(
                ov[layer, head], W_V[rows].T @ W_O[:, rows].T, rtol=1e-12, atol=1e-12
            )
            torch.testing.assert_close(
                qk[layer, head], W_Q[rows].T @ W_K[rows], rtol=1e-12, atol=1e-12
            )


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 1)])
def test_head_ablation_equals_ablating_the_source(layer, head):
    """Zeroing head h's z is zeroing its columns of out_proj's weight (nn.MultiheadAttention
    reads out_proj's weight directly, so a module hook would not fire)."""
    enc, read_in, read_out, pos, model, x = imported()
    ablated = copy.deepcopy(enc)
    with torch.no_grad():
        ablated.layers[layer].self_attn.out_proj.weight[:, head * 4 : (head + 1) * 4] = 0
    expected = source_forward(ablated, read_in, read_out, x, causal=True, pos=pos)
    with torch.no_grad():
        ours = vi.ablate_heads(model, x, (layer, head), kind="zero")
    assert rel_err(ours, expected) <= 1e-10
    y = source_forward(enc, read_in, read_out, x, causal=True, pos=pos)
    assert (expected - y).abs().max() > 1e-3


# ---------------------------------------------------------------- export and round trips

EXPORT_CFGS = {
    "LN-relu-learned": tiny_cfg(embed_bias=True),
    "LNPre-gelu-none-bidir": tiny_cfg(
        normalization="LNPre", act_fn="gelu", positional="none", causal=False, n_layers=3
    ),
    "LN-gelu-wide": tiny_cfg(act_fn="gelu", d_model=12, n_heads=3, d_head=4, d_out=1),
}


@pytest.mark.parametrize("name", EXPORT_CFGS)
def test_to_torch_encoder_reproduces_the_model_and_round_trips(name):
    cfg = EXPORT_CFGS[name]
    model = random_model(cfg)
    rng = torch.get_rng_state()
    enc, read_in, read_out, pos = vi.to_torch_encoder(model)
    assert torch.equal(torch.get_rng_state(), rng)
    assert (pos is None) == (cfg.positional == "none")
    x = torch.randn(2, 6, cfg.d_in, generator=torch.Generator().manual_seed(0), dtype=F64)
    for fast in (False, True):
        y = source_forward(enc, read_in, read_out, x, causal=cfg.causal, pos=pos, fast=fast)
        with torch.no_grad():
            assert rel_err(model(x), y) <= 1e-10
    back = vi.from_torch_encoder(
        enc, read_in, read_out, causal=cfg.causal, pos_embed=pos, n_ctx=cfg.n_ctx
    )
    assert back.cfg == cfg.replace(normalization="LN")
    for key, value in back.state_dict().items():
        if cfg.normalization == "LNPre" and key.split(".")[-1] in ("w", "b"):
            assert torch.equal(value, torch.ones_like(value) if key.endswith("w") else value * 0)
        else:
            assert torch.equal(value, model.state_dict()[key]), key


def test_from_then_to_is_bit_identical():
    enc, read_in, read_out, pos, model, _ = imported()
    again, read_in2, read_out2, pos2 = vi.to_torch_encoder(model)
    theirs = dict(again.named_parameters())
    for name, p in enc.named_parameters():
        assert torch.equal(theirs[name], p), name
    assert torch.equal(read_in2.weight, read_in.weight)
    assert torch.equal(read_out2.bias, read_out.bias) and torch.equal(read_in2.bias, read_in.bias)
    assert torch.equal(pos2, pos[:7])


# ---------------------------------------------------------------- refusals


def refuse(enc, match, exc=ValueError, **kwargs):
    d = enc.layers[0].self_attn.embed_dim if isinstance(enc, nn.TransformerEncoder) else 8
    kwargs = {"causal": True, "n_ctx": 5} | kwargs
    with unchecked(), pytest.raises(exc, match=match):  # the library's own checks
        vi.from_torch_encoder(enc, linear(3, d), linear(d, 1), **kwargs)


def test_refusals():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    post = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    refuse(post, r"layers\.0: norm_first=False \(post-norm: x = norm\(x \+ f\(x\)\)")
    refuse(encoder(norm=None), r"norm=None: the encoder has no final norm")
    refuse(encoder(act=nn.GELU(approximate="tanh")), r"activation nn\.GELU\(approximate='tanh'\)")
    refuse(encoder(act=F.silu), r"layers\.0: activation silu \(vecinterp reads")
    enc = encoder()
    enc.layers[1].self_attn = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    refuse(enc, r"layers\.1\.self_attn: add_bias_kv=True")
    refuse(
        encoder(norm=nn.LayerNorm(8, eps=1e-3)), r"layer norms of different eps \[1e-05, 0\.001\]"
    )
    refuse(encoder(norm=nn.RMSNorm(8)), r"norm is a RMSNorm, not an nn\.LayerNorm")
    refuse(layer, r"a single layer has no final norm: wrap it", exc=TypeError)
    refuse(encoder(), r"n_ctx is required without pos_embed", n_ctx=None)
    refuse(
        encoder(), r"n_ctx=9 is more than pos_embed's 7 rows", pos_embed=torch.zeros(7, 8), n_ctx=9
    )
    refuse(
        encoder(),
        r"pos_embed must be \[n_ctx, d_model=8\], got shape \(7, 6\)",
        pos_embed=torch.zeros(7, 6),
    )
    refuse(encoder(), r"causal must be a bool, got 1", exc=TypeError, causal=1)


def test_refusals_list_every_reason():
    refuse(
        encoder(act=F.silu, norm=None),
        r"cannot convert this nn\.TransformerEncoder to vecinterp:\n  - layers\.0: activation "
        r"silu .*\n  - layers\.1: activation silu .*\n  - norm=None",
    )


def test_to_torch_encoder_refusals():
    cases = {
        "positional='rotary'": tiny_cfg(positional="rotary"),
        "normalization='RMS'": tiny_cfg(normalization="RMS"),
        "attn_only=True": tiny_cfg(attn_only=True),
        "act_fn='silu'": tiny_cfg(act_fn="silu"),
        r"d_model=8 != n_heads \* d_head = 6": tiny_cfg(n_heads=2, d_head=3),
        # before: W_gate and b_gate were left out and the export computed an ungated MLP
        r"gated_mlp=True \(nn\.TransformerEncoderLayer's MLP has no gate": tiny_cfg(gated_mlp=True),
    }
    for match, cfg in cases.items():
        with pytest.raises(ValueError, match=match):
            vi.to_torch_encoder(vi.HookedVectorTransformer(cfg))


def test_a_source_in_train_mode_with_dropout_is_refused():
    """Its outputs are random while the import computes its eval-mode function (before:
    imported without a word). Refused, naming the dropouts and .eval(); the source is left
    as it was."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2, batch_first=True, norm_first=True)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    enc = randomise(enc, 0).to(F64).train()
    read_in, read_out = linear(3, 8), linear(8, 2)
    with pytest.raises(
        ValueError,
        match=r"the nn\.TransformerEncoder is in training mode with dropout \(layers\.0\."
        r"self_attn\.dropout=0\.2, layers\.0\.dropout \(p=0\.2\), .*call \.eval\(\) on it",
    ):
        vi.from_torch_encoder(enc, read_in, read_out, causal=False, n_ctx=6)
    assert enc.training
    model = vi.from_torch_encoder(enc.eval(), read_in, read_out, causal=False, n_ctx=6)
    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    y = source_forward(enc, read_in, read_out, x, causal=False)
    with torch.no_grad():
        assert rel_err(model(x), y) <= 1e-10
    with torch.device("meta"):
        enc = nn.TransformerEncoder(layer, 1, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    with pytest.raises(ValueError, match=r"tensors on the meta device .*load its weights first"):
        vi.from_torch_encoder(enc.eval(), read_in, read_out, causal=False, n_ctx=6)


def test_dtype_argument():
    enc = encoder(dtype=F32)
    model = vi.from_torch_encoder(
        enc, linear(3, 8, dtype=F32), linear(8, 1, dtype=F32), causal=True, n_ctx=4, dtype=F64
    )
    assert model.W_E.dtype == F64
    assert torch.equal(model.W_in[0], enc.layers[0].linear1.weight.detach().T.double())
