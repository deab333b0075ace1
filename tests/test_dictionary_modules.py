"""Sparse dictionaries as modules: the forward pass by hand, the hook points, the decoder
constraint, the config's refusals, save/load (issue 35)."""

import json

import pytest
import torch

import vecinterp as vi
from vecinterp.dictionary import (
    DictionaryConfig,
    SparseAutoencoder,
    Transcoder,
    evaluate_dictionary,
    load_dictionary,
    save_dictionary,
    transcoder_hooks,
)

HOOKS = ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"]


def _sae(activation="relu", k=None, dtype="float64", seed=0):
    cfg = DictionaryConfig(d_in=5, d_sae=7, activation=activation, k=k, dtype=dtype)
    sae = SparseAutoencoder(cfg, seed=seed)
    with torch.no_grad():  # biases non-zero, so that every term counts
        sae.b_dec.copy_(torch.linspace(-0.3, 0.4, 5, dtype=sae.b_dec.dtype))
        sae.b_enc.copy_(torch.linspace(-0.2, 0.1, 7, dtype=sae.b_enc.dtype))
    return sae


def test_sae_forward_is_saelens_formula_by_hand():
    sae = _sae()
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    want = torch.relu(pre) @ sae.W_dec + sae.b_dec
    torch.testing.assert_close(sae(x), want, rtol=0, atol=1e-15)
    assert sae.W_dec.shape == (7, 5) and sae.W_enc.shape == (5, 7)
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(7, dtype=torch.float64))


def test_topk_keeps_the_k_largest_pre_activations():
    sae = _sae("topk", k=2)
    x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    pre = ((x - sae.b_dec) @ sae.W_enc + sae.b_enc).detach()
    acts = sae.encode(x).detach()
    for row in range(6):
        top = set(pre[row].topk(2).indices.tolist())
        for j in range(7):
            want = max(float(pre[row, j]), 0.0) if j in top else 0.0
            assert float(acts[row, j]) == want


def test_transcoder_with_skip_by_hand_and_error_term():
    cfg = DictionaryConfig(d_in=4, d_sae=6, d_out=3, transcoder=True, skip=True, dtype="float64")
    tc = Transcoder(cfg, seed=3)
    with torch.no_grad():
        tc.W_skip.copy_(torch.randn(4, 3, dtype=torch.float64))
        tc.b_dec.fill_(0.25)
    x = torch.randn(5, 4, dtype=torch.float64)
    want = torch.relu(x @ tc.W_enc + tc.b_enc) @ tc.W_dec + tc.b_dec + x @ tc.W_skip
    torch.testing.assert_close(tc(x), want, rtol=0, atol=1e-15)
    target = torch.randn(5, 3, dtype=torch.float64)
    tc.use_error_term = True
    with pytest.raises(ValueError, match="needs target"):
        tc(x)
    out, cache = tc.run_with_cache(x, target)
    torch.testing.assert_close(out, target, rtol=0, atol=1e-15)
    torch.testing.assert_close(cache["hook_sae_error"], target - want, rtol=0, atol=1e-15)


def test_hooks_inside_the_sae_fire_edit_and_cache():
    sae = _sae()
    x = torch.randn(3, 5, dtype=torch.float64)
    _, cache = sae.run_with_cache(x)
    assert set(HOOKS) <= set(cache)
    torch.testing.assert_close(cache["hook_sae_acts_post"], sae.encode(x))

    # zeroing every feature through the hook leaves the bias alone
    def zero(act, hook):
        return torch.zeros_like(act)

    out = sae.run_with_hooks(x, fwd_hooks=[("hook_sae_acts_post", zero)])
    torch.testing.assert_close(out, sae.b_dec.expand(3, 5), rtol=0, atol=0)
    sae.use_error_term = True
    out, cache = sae.run_with_cache(x)
    torch.testing.assert_close(out, x, rtol=0, atol=1e-15)  # recons + error is the input
    assert "hook_sae_error" in cache
    with pytest.raises(ValueError, match="hook_sae_nope"):
        sae.run_with_hooks(x, fwd_hooks=[("hook_sae_nope", zero)])


def test_decoder_constraint_and_parallel_gradient():
    sae = _sae()
    with torch.no_grad():
        sae.W_dec.mul_(3.0)
    sae.normalise_decoder()
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(7, dtype=torch.float64))
    sae.W_dec.grad = torch.randn(7, 5, dtype=torch.float64)
    sae.remove_parallel_gradient()
    along = (sae.W_dec.grad * sae.W_dec).sum(1)
    torch.testing.assert_close(along, torch.zeros(7, dtype=torch.float64), rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d_in": 4, "d_sae": 0}, "d_sae must be an int >= 1"),
        ({"d_in": 0, "d_sae": 4}, "d_in must be an int >= 1"),
        ({"d_in": 4, "d_sae": 3, "activation": "topk", "k": 4}, r"1 <= k <= d_sae \(3\)"),
        ({"d_in": 4, "d_sae": 3, "activation": "topk"}, "k must be an int"),
        ({"d_in": 4, "d_sae": 3, "k": 2}, "k is for activation='topk' or 'batchtopk' only"),
        ({"d_in": 4, "d_sae": 3, "activation": "gelu"}, "activation must be one of"),
        ({"d_in": 4, "d_sae": 3, "skip": True}, "transcoders only"),
        ({"d_in": 4, "d_sae": 3, "d_out": 5}, "d_out must be d_in"),
        ({"d_in": 4, "d_sae": 3, "dtype": "float16"}, "dtype must be one of"),
    ],
)
def test_bad_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DictionaryConfig(**kwargs)


def test_wrong_class_and_wrong_input_width_are_refused():
    with pytest.raises(ValueError, match="build a Transcoder"):
        SparseAutoencoder(DictionaryConfig(d_in=3, d_sae=4, transcoder=True))
    with pytest.raises(ValueError, match="build a SparseAutoencoder"):
        Transcoder(DictionaryConfig(d_in=3, d_sae=4))
    with pytest.raises(ValueError, match=r"d_in=5"):
        _sae()(torch.randn(2, 4, dtype=torch.float64))
    assert transcoder_hooks(2) == ("blocks.2.ln2.hook_normalized", "blocks.2.hook_mlp_out")
    model = vi.HookedVectorTransformer(
        vi.VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=4)
    )
    for name in transcoder_hooks(1):  # the library's real hook names
        model.hook_point(name)


def test_save_load_round_trip_and_corruption_is_named(tmp_path):
    sae = _sae("topk", k=3)
    path = save_dictionary(sae, tmp_path / "sae", metadata={"note": "x"})
    loaded = load_dictionary(path)
    assert isinstance(loaded, SparseAutoencoder) and loaded.cfg == sae.cfg
    for name, tensor in sae.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor)
    record = json.loads((path / "config.json").read_text())
    record["config"]["k"] = 2  # a flipped setting: the record's checksum no longer fits
    (path / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="corrupted"):
        load_dictionary(path)
    save_dictionary(sae, path)  # replaced whole
    data = bytearray((path / "dictionary.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (path / "dictionary.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="dictionary.safetensors is corrupted"):
        load_dictionary(path)
    with torch.no_grad():
        sae.W_dec[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        save_dictionary(sae, tmp_path / "nan")


def test_evaluate_by_hand():
    sae = _sae()
    x = torch.randn(50, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    stats = evaluate_dictionary(sae, x, dense_above=0.5)
    acts = sae.encode(x).detach()
    recons = sae(x).detach()
    fvu = ((x - recons) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert stats.fvu == pytest.approx(float(fvu), rel=1e-12)
    assert stats.l0 == pytest.approx(float((acts != 0).sum(1).double().mean()), rel=1e-12)
    density = (acts != 0).double().mean(0)
    assert torch.equal(stats.feature_density, density)
    assert stats.n_dead == int((density == 0).sum())
    assert stats.n_dense == int((density > 0.5).sum())
    with pytest.raises(ValueError, match="NaN"):
        evaluate_dictionary(sae, torch.full((3, 5), float("nan"), dtype=torch.float64))
