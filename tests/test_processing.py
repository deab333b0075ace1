"""Weight processing: every transformation keeps the outputs, never edits its input,
changes the config and weights as documented, and refuses what would not be exact."""

import re

import pytest
import torch
from einops import einsum
from hypothesis import given, settings
from hypothesis import strategies as st

import vecinterp as vi
from helpers import ACT_FNS, NORMALIZATIONS, POSITIONALS, random_input, random_model, tiny_cfg
from vecinterp.model import processing

F64_TOL = 1e-10
F32_TOL = 1e-5
SCALE = 0.3  # random_model's noise: keeps 3-layer un-normalised outputs O(10)


@st.composite
def configs(draw) -> vi.VectorTransformerConfig:
    positional = draw(st.sampled_from(POSITIONALS))
    d_head = draw(st.sampled_from([2, 4]))
    n_heads = draw(st.sampled_from([1, 2, 3, 4]))
    return tiny_cfg(
        normalization=draw(st.sampled_from(NORMALIZATIONS)),
        positional=positional,
        act_fn=draw(st.sampled_from(ACT_FNS)),
        causal=draw(st.booleans()),
        attn_only=draw(st.booleans()),
        embed_bias=draw(st.booleans()),
        n_layers=draw(st.integers(1, 3)),
        n_heads=n_heads,
        n_key_value_heads=draw(st.sampled_from([k for k in (1, 2, 4) if n_heads % k == 0])),
        gated_mlp=draw(st.booleans()),
        d_head=d_head,
        d_model=draw(st.sampled_from([4, 6, 8])),
        d_in=draw(st.integers(1, 4)),
        d_out=draw(st.integers(1, 4)),
        d_mlp=draw(st.integers(2, 12)),
        n_ctx=draw(st.integers(1, 6)),
    )


def transforms(cfg, uncentred_fold: bool = True) -> dict:
    """Every exact transformation that applies to ``cfg``."""
    centre = cfg.is_mean_removing
    out = {
        "fold_layer_norm": vi.fold_layer_norm,
        "fold_value_biases": vi.fold_value_biases,
        "process_weights": lambda m: vi.process_weights(m, center_writing_weights=centre),
    }
    if uncentred_fold:
        out["fold_layer_norm(center_weights=False)"] = lambda m: vi.fold_layer_norm(
            m, center_weights=False
        )
    if centre:
        out["center_writing_weights"] = vi.center_writing_weights
    return out


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).detach().abs().max())


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k


# ---------------------------------------------------------------- outputs are kept


@settings(max_examples=25, deadline=None)
@given(cfg=configs(), seed=st.integers(0, 2**16))
def test_transformations_keep_outputs_fp64(cfg, seed):
    model = random_model(cfg, seed=seed, scale=SCALE)
    x = random_input(cfg, batch=2, seed=seed)
    with torch.no_grad():
        y = model(x)
        for name, transform in transforms(cfg, uncentred_fold=cfg.n_layers == 1).items():
            new = transform(model)
            assert max_diff(new(x), y) <= F64_TOL, name


FP32_CFGS = {
    "LN-learned": tiny_cfg(embed_bias=True),
    "LN-sinusoidal-gelu-3L": tiny_cfg(positional="sinusoidal", act_fn="gelu", n_layers=3),
    "RMS-rotary-silu": tiny_cfg(normalization="RMS", positional="rotary", act_fn="silu"),
    "LNPre-attn_only-noncausal": tiny_cfg(normalization="LNPre", attn_only=True, causal=False),
    "none-none": tiny_cfg(normalization=None, positional="none", embed_bias=True),
}


@pytest.mark.parametrize("cfg", FP32_CFGS.values(), ids=FP32_CFGS.keys())
def test_transformations_keep_outputs_fp32(cfg):
    model = random_model(cfg, seed=3, dtype=torch.float32, scale=SCALE)
    x = random_input(cfg, batch=4, seed=3, dtype=torch.float32)
    with torch.no_grad():
        y = model(x)
        for name, transform in transforms(cfg).items():
            new = transform(model)
            assert new.embed.W_E.dtype == torch.float32
            assert max_diff(new(x), y) <= F32_TOL, name


# ---------------------------------------------------------------- the input is never edited


@settings(max_examples=6, deadline=None)
@given(cfg=configs())
def test_input_model_is_never_modified(cfg):
    model = random_model(cfg, scale=SCALE)
    model.eval()
    before, cfg_before = snapshot(model), model.cfg
    x = random_input(cfg, batch=1)
    with torch.no_grad():
        y = model(x)
    for name, transform in transforms(cfg).items():
        new = transform(model)
        assert new is not model, name
        assert model.cfg is cfg_before and model.cfg == cfg
        assert_same_state(model, before)
        assert not new.training
        # no storage is shared: editing the new model leaves the old one alone
        old_ptrs = {p.data_ptr() for p in model.parameters()}
        assert not old_ptrs & {p.data_ptr() for p in new.parameters()}, name
        with torch.no_grad():
            for p in new.parameters():
                p.add_(1.0)
        assert_same_state(model, before)
    with torch.no_grad():
        assert torch.equal(model(x), y)


def test_process_weights_with_nothing_to_do_returns_a_copy():
    model = random_model(tiny_cfg())
    before = snapshot(model)
    new = vi.process_weights(
        model, fold_ln=False, center_writing_weights=False, fold_value_biases=False
    )
    assert new is not model
    assert new.cfg == model.cfg
    assert_same_state(new, before)
    assert_same_state(model, before)


def test_non_model_is_refused():
    with pytest.raises(TypeError, match="HookedVectorTransformer"):
        vi.fold_value_biases(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- fold_layer_norm


@pytest.mark.parametrize(
    ("norm", "folded"),
    [("LN", "LNPre"), ("LNPre", "LNPre"), ("RMS", "RMSPre"), ("RMSPre", "RMSPre"), (None, None)],
)
def test_fold_layer_norm_config(norm, folded):
    cfg = tiny_cfg(normalization=norm, embed_bias=True)
    new = vi.fold_layer_norm(random_model(cfg))
    assert new.cfg == cfg.replace(normalization=folded)
    ln_keys = [k for k in new.state_dict() if k.endswith((".w", "ln1.b", "ln2.b", "ln_final.b"))]
    assert ln_keys == []


def readers(model) -> list[tuple[str, torch.Tensor]]:
    """Every weight that reads the normalised stream, with d_model on axis -2."""
    out = []
    for ell, block in enumerate(model.blocks):
        for name in ("W_Q", "W_K", "W_V"):
            out.append((f"blocks.{ell}.attn.{name}", getattr(block.attn, name).detach()))
        if not model.cfg.attn_only:
            out.append((f"blocks.{ell}.mlp.W_in", block.mlp.W_in.detach()))
    out.append(("unembed.W_U", model.unembed.W_U.detach()))
    return out


@pytest.mark.parametrize("norm", ["LN", "LNPre"])
@pytest.mark.parametrize("attn_only", [False, True])
def test_fold_layer_norm_centres_the_readers(norm, attn_only):
    model = random_model(tiny_cfg(normalization=norm, attn_only=attn_only))
    for name, W in readers(model):
        assert float(W.mean(-2).abs().max()) > 1e-3, name  # not centred to begin with
    for name, W in readers(vi.fold_layer_norm(model)):
        assert float(W.mean(-2).abs().max()) <= 1e-14, name
    for name, W in readers(vi.fold_layer_norm(model, center_weights=False)):
        assert float(W.mean(-2).abs().max()) > 1e-3, name


def test_fold_layer_norm_rms_folds_w_only():
    model = random_model(tiny_cfg(normalization="RMS"))
    new = vi.fold_layer_norm(model)
    old = dict(readers(model))
    lns = {
        "blocks.0.attn": model.blocks[0].ln1,
        "blocks.1.attn": model.blocks[1].ln1,
        "blocks.0.mlp": model.blocks[0].ln2,
        "blocks.1.mlp": model.blocks[1].ln2,
        "unembed": model.ln_final,
    }
    for name, W in readers(new):
        w = lns[name.rsplit(".", 1)[0]].w.detach()
        torch.testing.assert_close(W, old[name] * w[:, None], rtol=1e-15, atol=0)
    new_sd, old_sd = new.state_dict(), model.state_dict()
    for bias in ("blocks.0.attn.b_Q", "blocks.1.mlp.b_in", "unembed.b_U"):
        assert torch.equal(new_sd[bias], old_sd[bias])  # RMS has no b to fold


def test_fold_layer_norm_hand_worked():
    """d_model = 2, one head of width 1: every number below is worked out by hand."""
    cfg = tiny_cfg(d_in=1, d_out=1, d_model=2, d_head=1, n_heads=1, n_layers=1, d_mlp=2)
    model = random_model(cfg)
    with torch.no_grad():
        model.blocks[0].ln1.w.fill_(2.0)
        model.blocks[0].ln1.b.copy_(torch.tensor([0.5, -1.0]))
        model.blocks[0].attn.W_Q.copy_(torch.tensor([[[1.0], [3.0]]]))
        model.blocks[0].attn.b_Q.fill_(0.25)
    new = vi.fold_layer_norm(model)
    # 2 W_Q = [2, 6], mean 4, centred [-2, 2]; b_Q + c W_Q = 0.25 + 0.5*1 - 1*3 = -2.25
    expected_W = torch.tensor([[[-2.0], [2.0]]], dtype=torch.float64)
    assert torch.equal(new.blocks[0].attn.W_Q.detach(), expected_W)
    assert torch.equal(
        new.blocks[0].attn.b_Q.detach(), torch.tensor([[-2.25]], dtype=torch.float64)
    )
    x = random_input(cfg, batch=2)
    with torch.no_grad():
        assert max_diff(new(x), model(x)) <= F64_TOL


def test_fold_layer_norm_formula_for_every_reader():
    """ln.w = 2 and ln.b = c in every norm: W ← centred(2 W), b_W ← b_W + c W."""
    cfg = tiny_cfg(n_layers=1, n_heads=3)
    model = random_model(cfg)
    gen = torch.Generator().manual_seed(7)
    c = {}
    with torch.no_grad():
        for key, ln in [("attn", model.blocks[0].ln1), ("mlp", model.blocks[0].ln2)] + [
            ("unembed", model.ln_final)
        ]:
            ln.w.fill_(2.0)
            c[key] = torch.randn(cfg.d_model, generator=gen, dtype=torch.float64)
            ln.b.copy_(c[key])
    new = vi.fold_layer_norm(model)
    old_sd, new_sd = model.state_dict(), new.state_dict()
    pairs = [(f"blocks.0.attn.W_{n}", f"blocks.0.attn.b_{n}", "attn") for n in "QKV"]
    pairs += [
        ("blocks.0.mlp.W_in", "blocks.0.mlp.b_in", "mlp"),
        ("unembed.W_U", "unembed.b_U", "unembed"),
    ]
    for W_name, b_name, key in pairs:
        W, b = old_sd[W_name], old_sd[b_name]
        d_model, d_x = W.shape[-2:]
        W3, b2 = W.reshape(-1, d_model, d_x).tolist(), b.reshape(-1, d_x).tolist()
        expected_W = [[[0.0] * d_x for _ in range(d_model)] for _ in W3]
        expected_b = [list(row) for row in b2]
        for h, Wh in enumerate(W3):  # one head (or the single matrix) at a time
            for j in range(d_x):
                column_mean = sum(2 * Wh[k][j] for k in range(d_model)) / d_model
                for i in range(d_model):
                    expected_W[h][i][j] = 2 * Wh[i][j] - column_mean
                expected_b[h][j] += sum(float(c[key][k]) * Wh[k][j] for k in range(d_model))
        expected_W = torch.tensor(expected_W, dtype=W.dtype).reshape(W.shape)
        expected_b = torch.tensor(expected_b, dtype=b.dtype).reshape(b.shape)
        torch.testing.assert_close(new_sd[W_name], expected_W, rtol=0, atol=1e-14)
        torch.testing.assert_close(new_sd[b_name], expected_b, rtol=0, atol=1e-13)
    x = random_input(cfg)
    with torch.no_grad():
        assert max_diff(new(x), model(x)) <= F64_TOL


# ---------------------------------------------------------------- fold_value_biases


@pytest.mark.parametrize("causal", [True, False])
def test_fold_value_biases(causal):
    cfg = tiny_cfg(causal=causal, n_layers=3)
    model = random_model(cfg)
    new = vi.fold_value_biases(model)
    assert new.cfg == cfg
    for old_block, block in zip(model.blocks, new.blocks):
        a, old = block.attn, old_block.attn
        assert torch.equal(a.b_V, torch.zeros_like(a.b_V))
        assert float(old.b_V.detach().abs().max()) > 0.1
        assert torch.equal(a.W_V, old.W_V) and torch.equal(a.W_O, old.W_O)
        expected = old.b_O + einsum(old.b_V, old.W_O, "h d_head, h d_head d_model -> d_model")
        torch.testing.assert_close(a.b_O.detach(), expected.detach(), rtol=0, atol=1e-14)
    x = random_input(cfg)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        _, new_cache = new.run_with_cache(x)
    for ell in range(cfg.n_layers):
        v_bias = model.blocks[ell].attn.b_V.detach()
        assert max_diff(new_cache["v", ell], cache["v", ell] - v_bias) <= F64_TOL
        assert max_diff(new_cache["resid_post", ell], cache["resid_post", ell]) <= F64_TOL


# ---------------------------------------------------------------- center_writing_weights


def writers(model) -> list[tuple[str, torch.Tensor]]:
    """Everything that writes into the residual stream, d_model on the last axis."""
    out = [("W_E", model.embed.W_E)]
    if model.embed.b_E is not None:
        out.append(("b_E", model.embed.b_E))
    if model.pos_embed is not None:
        out.append(("W_pos", model.pos_embed.W_pos))
    for ell, block in enumerate(model.blocks):
        out += [(f"{ell}.W_O", block.attn.W_O), (f"{ell}.b_O", block.attn.b_O)]
        if not model.cfg.attn_only:
            out += [(f"{ell}.W_out", block.mlp.W_out), (f"{ell}.b_out", block.mlp.b_out)]
    return [(name, t.detach()) for name, t in out]


RESID_HOOKS = ("hook_embed", "hook_pos_embed", "resid_pre", "resid_mid", "resid_post", "_out")


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("norm", ["LN", "LNPre"])
@pytest.mark.parametrize("attn_only", [False, True])
def test_center_writing_weights(norm, positional, attn_only):
    cfg = tiny_cfg(normalization=norm, positional=positional, attn_only=attn_only, embed_bias=True)
    model = random_model(cfg)
    new = vi.center_writing_weights(model)
    assert new.cfg == cfg
    old = dict(writers(model))
    for name, t in writers(new):
        assert float(old[name].mean(-1).abs().max()) > 1e-3, name
        assert float(t.mean(-1).abs().max()) <= 1e-14, name
        assert max_diff(t, old[name] - old[name].mean(-1, keepdim=True)) <= 1e-14, name
    x = random_input(cfg)
    with torch.no_grad():
        y, cache = model.run_with_cache(x)
        new_y, new_cache = new.run_with_cache(x)
    assert max_diff(new_y, y) <= F64_TOL
    resid_names = [n for n in cache if n.endswith(RESID_HOOKS) and not n.startswith("unembed")]
    assert len(resid_names) >= 2 + 3 * cfg.n_layers - (0 if positional != "rotary" else 1)
    for name in resid_names:
        assert float(new_cache[name].mean(-1).abs().max()) <= 1e-12, name
        # the stream changes by exactly its mean over d_model
        centred = cache[name] - cache[name].mean(-1, keepdim=True)
        assert max_diff(new_cache[name], centred) <= F64_TOL, name


@pytest.mark.parametrize("norm", ["RMS", "RMSPre", None])
def test_center_writing_weights_refuses_non_mean_removing_norms(norm):
    model = random_model(tiny_cfg(normalization=norm))
    before = snapshot(model)
    with pytest.raises(ValueError, match=re.escape(f"normalization={norm!r}")):
        vi.center_writing_weights(model)
    assert_same_state(model, before)


@pytest.mark.parametrize("norm", ["RMS", "RMSPre", None])
def test_process_weights_on_non_mean_removing_norms(norm):
    cfg = tiny_cfg(normalization=norm, embed_bias=True)
    model = random_model(cfg)
    # the defaults: the centring RMS cannot take is skipped, as TransformerLens skips it
    # (before, the defaults raised on every RMS model); the other steps run
    new = vi.process_weights(model)
    assert new.cfg.normalization == {"RMS": "RMSPre", "RMSPre": "RMSPre", None: None}[norm]
    for block in new.blocks:
        assert torch.equal(block.attn.b_V, torch.zeros_like(block.attn.b_V))
    x = random_input(cfg)
    with torch.no_grad():
        assert max_diff(new(x), model(x)) <= F64_TOL
    # the same model as without the centring, to the bit
    uncentred = vi.process_weights(model, center_writing_weights=False)
    assert_same_state(new, snapshot(uncentred))
    assert_same_state(uncentred, snapshot(vi.fold_value_biases(vi.fold_layer_norm(model))))


def test_process_weights_is_the_composition():
    cfg = tiny_cfg(embed_bias=True, positional="sinusoidal")
    model = random_model(cfg)
    by_hand = vi.fold_value_biases(vi.center_writing_weights(vi.fold_layer_norm(model)))
    processed = vi.process_weights(model)
    assert processed.cfg == by_hand.cfg == cfg.replace(normalization="LNPre")
    assert_same_state(processed, snapshot(by_hand))


# ---------------------------------------------------------------- no center_unembed


def test_there_is_no_center_unembed():
    assert not hasattr(vi, "center_unembed")
    assert not hasattr(processing, "center_unembed")
    assert "center_unembed" not in vi.__all__


def test_centering_the_unembed_would_change_mse_outputs():
    """Centring W_U and b_U over d_out (TransformerLens's center_unembed) subtracts each
    output's mean over d_out: harmless under a softmax, wrong for a regression output."""
    cfg = tiny_cfg()
    model = random_model(cfg)
    centred = vi.process_weights(model, fold_value_biases=False)
    with torch.no_grad():
        centred.unembed.W_U -= centred.unembed.W_U.mean(-1, keepdim=True)
        centred.unembed.b_U -= centred.unembed.b_U.mean(-1, keepdim=True)
        x = random_input(cfg)
        y, new_y = model(x), centred(x)
    assert max_diff(new_y, y) > 0.1  # the regression outputs change ...
    assert max_diff(new_y, y - y.mean(-1, keepdim=True)) <= F64_TOL  # ... by their mean
    assert max_diff(new_y.softmax(-1), y.softmax(-1)) <= 1e-12  # a softmax would not notice


def test_uninitialised_weights_only_inside_and_restored_after_an_error():
    from vecinterp.model.transformer import uninitialised_weights

    cfg = tiny_cfg()
    with pytest.raises(RuntimeError, match="boom"), uninitialised_weights():
        raise RuntimeError("boom")
    after = vi.HookedVectorTransformer(cfg, seed=3)
    reference = vi.HookedVectorTransformer(cfg, seed=0)
    reference.init_weights(seed=3)
    for (name, p), q in zip(after.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_copy_into_a_config_the_old_model_cannot_fill_starts_from_seed_0():
    # a processed copy is built uninitialised and filled from the old model; a tensor the
    # old model lacks (here: MLP weights of an attention-only model) must not stay empty
    from vecinterp.model.processing import _copy

    old = random_model(tiny_cfg(attn_only=True, d_mlp=None))
    cfg = tiny_cfg()
    new = _copy(old, cfg)
    seed0 = vi.HookedVectorTransformer(cfg, seed=0, dtype=old.W_E.dtype)
    old_sd = old.state_dict()
    for name, tensor in new.state_dict().items():
        expected = old_sd[name] if name in old_sd else seed0.state_dict()[name]
        assert torch.equal(tensor, expected), name
