"""Splicing dictionaries into models (vecinterp.dictionary.splice) and the decompositions
through them (vecinterp.dictionary.decompose): exactness with the error term in float64,
the original left untouched, hooks on features acting, the reconstruction without the
error term, refusals, and the decomposition rule (each kind of dictionary)."""

import pytest
import torch

import vecinterp as vi
from vecinterp.dictionary import (
    DictionaryConfig,
    SparseAutoencoder,
    SplicedPoint,
    Transcoder,
    decompose_resid_features,
    dictionary_decomposition,
    splice,
    splice_metric,
    spliced_dictionaries,
    unspliced_copy,
)
from vecinterp.dictionary.splice import clean_reconstruction

F64 = torch.float64
EXACT = 1e-12


def _model(**overrides: object) -> vi.HookedVectorTransformer:
    fields = dict(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5)
    fields.update(overrides)
    return vi.HookedVectorTransformer(vi.VectorTransformerConfig(**fields), seed=0, dtype=F64)


def _sae(activation: str = "relu", seed: int = 1, **kw: object) -> SparseAutoencoder:
    k = 3 if activation in ("topk", "batchtopk") else None
    cfg = DictionaryConfig(d_in=8, d_sae=12, activation=activation, k=k, dtype="float64", **kw)
    sae = SparseAutoencoder(cfg, seed=seed)
    with torch.no_grad():  # weights away from their start, so every part is nonzero
        gen = torch.Generator().manual_seed(seed)
        sae.b_enc.copy_(0.1 * torch.randn(12, generator=gen, dtype=F64))
        sae.b_dec.copy_(0.3 * torch.randn(8, generator=gen, dtype=F64))
        if sae.threshold is not None:
            sae.threshold.fill_(0.05)
        if sae.log_threshold is not None:
            sae.log_threshold.copy_(torch.randn(12, generator=gen, dtype=F64) - 3)
    return sae


def _transcoder(activation: str = "relu", skip: bool = True, **kw: object) -> Transcoder:
    k = 3 if activation in ("topk", "batchtopk") else None
    cfg = DictionaryConfig(
        d_in=8, d_sae=16, activation=activation, k=k, transcoder=True, skip=skip,
        dtype="float64", **kw,
    )  # fmt: skip
    tc = Transcoder(cfg, seed=2)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        tc.b_dec.copy_(0.2 * torch.randn(8, generator=gen, dtype=F64))
        if tc.W_skip is not None:
            tc.W_skip.copy_(0.3 * torch.randn(8, 8, generator=gen, dtype=F64))
    return tc


def _x(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 5, 3, generator=torch.Generator().manual_seed(seed), dtype=F64)


EVERY_KIND = {
    "blocks.0.hook_resid_pre": lambda: _sae("relu"),
    "blocks.0.hook_attn_out": lambda: _sae("topk", seed=3),
    "blocks.0.hook_resid_mid": lambda: _sae("jumprelu", seed=4),
    "blocks.0.hook_mlp_out": lambda: _sae("batchtopk", seed=5),
    "blocks.0.hook_resid_post": lambda: _sae("relu", seed=6),
    "blocks.1.hook_attn_out": lambda: _sae("relu", seed=7),
    "blocks.1.hook_mlp_out": lambda: _transcoder("relu"),
    "blocks.1.hook_resid_post": lambda: _sae("topk", seed=8),
}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def _max_diff(a: vi.ActivationCache, b: vi.ActivationCache) -> float:
    return max(_diff(a[k], b[k]) for k in a.keys())


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"gated_mlp": True, "n_heads": 4, "n_key_value_heads": 2, "d_head": 2},
        {"normalization": None},
        {"normalization": "RMS", "positional": "rotary"},
    ],
    ids=["ln", "gated-gqa", "no-norm", "rms-rotary"],
)
def test_error_term_is_exact_on_every_kind(overrides: dict[str, object]) -> None:
    model = _model(**overrides)
    spliced = splice(model, {name: make() for name, make in EVERY_KIND.items()})
    x = _x()
    y0, cache0 = model.run_with_cache(x)
    y1, cache1 = spliced.run_with_cache(x)
    assert _diff(y0, y1) <= EXACT
    assert set(cache0.keys()) <= set(cache1.keys())
    assert _max_diff(cache0, cache1) <= EXACT
    for name in EVERY_KIND:  # the dictionaries did work: the errors are not small
        assert float(cache1[f"{name}.hook_sae_error"].abs().max()) > 1e-3


def test_error_term_keeps_gradients_of_the_original() -> None:
    model = _model()
    spliced = splice(model, {name: make() for name, make in EVERY_KIND.items()})
    x0, x1 = _x().requires_grad_(), _x().requires_grad_()
    (model(x0) ** 2).sum().backward()
    (spliced(x1) ** 2).sum().backward()
    assert x0.grad is not None and x1.grad is not None
    assert _diff(x0.grad, x1.grad) <= 1e-10


def test_original_and_dictionaries_are_untouched() -> None:
    model = _model()
    handle = model.add_hook("blocks.0.hook_resid_mid", lambda act, hook: act * 2)[0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    points = dict(model.hook_dict)
    y_before = model(_x())
    sae = _sae()
    sae_state = {k: v.clone() for k, v in sae.state_dict().items()}
    spliced = splice(model, {"blocks.0.hook_resid_mid": sae})
    assert model.hook_dict == points and model.hook_dict.keys() == points.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(_x()), y_before)
    assert list(model.blocks[0].hook_resid_mid._fwd) == [handle]  # still the original's
    assert sorted(sae.hook_dict) == sorted(
        ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons",
         "hook_sae_error"]
    )  # fmt: skip
    assert all(torch.equal(v, sae_state[k]) for k, v in sae.state_dict().items())
    # the copy carries the global hook (at the spliced point) and its own dictionary
    assert isinstance(spliced.blocks[0].hook_resid_mid, SplicedPoint)
    assert spliced.blocks[0].hook_resid_mid._fwd[0].fn is handle.fn
    assert spliced_dictionaries(spliced)["blocks.0.hook_resid_mid"] is not sae
    assert _diff(spliced(_x()), y_before) <= EXACT
    assert not any(p is q for p in spliced.parameters() for q in model.parameters())


@pytest.mark.parametrize("activation", ["relu", "topk", "batchtopk", "jumprelu"])
def test_dictionaries_taken_out_of_a_spliced_model_splice_again(activation: str) -> None:
    """A dictionary from spliced_dictionaries lent its hook points to the spliced point;
    splice (through unspliced_copy) rebuilds it, and the result computes the same bits."""
    model = _model()
    points = {"blocks.0.hook_resid_mid": _sae(activation), "blocks.1.hook_mlp_out": _transcoder()}
    once = splice(model, points)
    taken = spliced_dictionaries(once)
    twice = splice(model, taken)
    again = splice(model, {k: unspliced_copy(v) for k, v in taken.items()})
    y, cache = once.run_with_cache(_x())
    for other in (twice, again):
        y2, cache2 = other.run_with_cache(_x())
        assert torch.equal(y2, y)
        assert cache2.keys() == cache.keys()
        assert all(torch.equal(cache2[k], cache[k]) for k in cache.keys())
    copy = unspliced_copy(taken["blocks.0.hook_resid_mid"])
    assert copy is not taken["blocks.0.hook_resid_mid"]
    assert sorted(copy.hook_dict) == sorted(
        ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons",
         "hook_sae_error"]
    )  # fmt: skip
    state = taken["blocks.0.hook_resid_mid"].state_dict()
    assert copy.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in copy.state_dict().items())


def test_hook_on_a_feature_acts_by_exactly_its_decoder_row() -> None:
    model = _model()
    name = "blocks.0.hook_resid_mid"
    spliced = splice(model, {name: _sae()})
    d = spliced_dictionaries(spliced)[name]
    _, clean = spliced.run_with_cache(_x())
    acts = clean[f"{name}.hook_sae_acts_post"]
    feature = int(acts.gt(0).sum((0, 1)).argmax())  # the most active feature

    def zero(a: torch.Tensor, hook: object) -> torch.Tensor:
        a = a.clone()
        a[..., feature] = 0
        return a

    _, hooked = spliced.run_with_cache(_x(), fwd_hooks=[(f"{name}.hook_sae_acts_post", zero)])
    moved = hooked[name] - clean[name]
    expected = -acts[..., feature, None] * d.W_dec[feature].detach()
    assert float(expected.detach().abs().max()) > 1e-2
    assert _diff(moved, expected) <= EXACT
    assert torch.equal(hooked[f"{name}.hook_sae_error"], clean[f"{name}.hook_sae_error"])


def test_hook_on_the_error_gives_the_reconstruction() -> None:
    model = _model()
    name = "blocks.1.hook_mlp_out"
    spliced = splice(model, {name: _transcoder()})
    zero = lambda act, hook: torch.zeros_like(act)  # noqa: E731
    _, with_error = spliced.run_with_cache(_x(), fwd_hooks=[(f"{name}.hook_sae_error", zero)])
    _, without = splice(model, {name: _transcoder()}, error_term=False).run_with_cache(_x())
    assert torch.equal(with_error[name], without[name])


def test_without_error_term_the_point_carries_the_reconstruction() -> None:
    model = _model()
    sae, tc = _sae("topk"), _transcoder("jumprelu", skip=False)
    spliced = splice(
        model, {"blocks.0.hook_resid_mid": sae, "blocks.1.hook_mlp_out": tc}, error_term=False
    )
    _, cache = spliced.run_with_cache(_x())
    assert torch.equal(
        cache["blocks.0.hook_resid_mid"], sae(cache["blocks.0.hook_resid_mid.hook_sae_input"])
    )
    assert torch.equal(cache["blocks.1.hook_mlp_out"], tc(cache["blocks.1.ln2.hook_normalized"]))
    assert torch.equal(
        cache["blocks.0.hook_resid_mid.hook_sae_input"],
        model.run_with_cache(_x())[1]["blocks.0.hook_resid_mid"],
    )
    assert "blocks.0.hook_resid_mid.hook_sae_error" not in cache


def test_splice_metric_is_the_mse_of_the_spliced_model() -> None:
    model = _model()
    sae = _sae()
    x, t = _x(), _x(seed=1)
    metric = splice_metric(model, {"blocks.0.hook_resid_post": sae}, x, t)
    spliced = splice(model, {"blocks.0.hook_resid_post": sae}, error_term=False)
    with torch.no_grad():
        original = float(((model(x) - t) ** 2).mean())
        replaced = float(((spliced(x) - t) ** 2).mean())
    assert metric.original_mse == pytest.approx(original, rel=1e-12)
    assert metric.spliced_mse == pytest.approx(replaced, rel=1e-12)
    assert metric.increase == metric.spliced_mse - metric.original_mse
    assert metric.increase != 0


def test_clean_reconstruction_is_the_forward_bit_for_bit() -> None:
    x = _x().reshape(-1, 3)[:, :1].expand(-1, 8).contiguous() + torch.randn(20, 8, dtype=F64)
    for d in [_sae(a) for a in ("relu", "topk", "jumprelu", "batchtopk")] + [
        _transcoder(),
        _transcoder("topk", skip=False),
    ]:
        assert torch.equal(clean_reconstruction(d, x), d(x))


def test_a_transcoder_reads_resid_mid_where_an_sae_runs_there() -> None:
    model = _model()
    tc = _transcoder(hook_in="blocks.0.hook_resid_mid")
    spliced = splice(model, {"blocks.0.hook_resid_mid": _sae(), "blocks.0.hook_mlp_out": tc})
    y, cache = spliced.run_with_cache(_x())
    assert _diff(y, model(_x())) <= EXACT
    # the transcoder read what the SAE put out, the stream the MLP read
    assert torch.equal(cache["blocks.0.hook_mlp_out.hook_sae_input"], cache["resid_mid", 0])


def test_refusals() -> None:
    model = _model()
    with pytest.raises(ValueError, match="unknown hook name 'blocks.0.hook_resid_mdi'"):
        splice(model, {"blocks.0.hook_resid_mdi": _sae()})
    with pytest.raises(ValueError, match="has no block 7"):
        splice(model, {"blocks.7.hook_resid_pre": _sae()})
    wide = SparseAutoencoder(DictionaryConfig(d_in=6, d_sae=4, dtype="float64"))
    with pytest.raises(ValueError, match="d_in=6 .* width d_model=8"):
        splice(model, {"blocks.0.hook_resid_pre": wide})
    with pytest.raises(ValueError, match="two dictionaries for one hook point"):
        splice(model, [("blocks.0.hook_resid_pre", _sae()), ("blocks.0.hook_resid_pre", _sae())])
    spliced = splice(model, {"blocks.0.hook_resid_pre": _sae()})
    with pytest.raises(ValueError, match="already runs a dictionary"):
        splice(spliced, {"blocks.0.hook_resid_pre": _sae()})
    f32 = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=4))
    with pytest.raises(
        ValueError, match="dtype torch.float32 .* model's weights are torch.float64"
    ):
        splice(model, {"blocks.0.hook_resid_pre": f32})
    with pytest.raises(ValueError, match="a transcoder replaces an MLP"):
        splice(model, {"blocks.0.hook_resid_post": _transcoder()})
    with pytest.raises(ValueError, match="an SAE can be spliced at"):
        splice(model, {"blocks.0.attn.hook_z": _sae()})
    with pytest.raises(ValueError, match="reads the MLP's input"):
        splice(model, {"blocks.0.hook_mlp_out": _transcoder(hook_in="blocks.0.hook_resid_pre")})
    with pytest.raises(ValueError, match="trained on 'blocks.1.hook_resid_pre'"):
        splice(model, {"blocks.0.hook_resid_pre": _sae(hook_in="blocks.1.hook_resid_pre")})
    with pytest.raises(ValueError, match="unknown hook name"):
        splice(_model(attn_only=True), {"blocks.0.hook_mlp_out": _transcoder()})
    with pytest.raises(TypeError, match="SparseAutoencoder or Transcoder|SparseDictionary"):
        splice(model, {"blocks.0.hook_resid_pre": torch.nn.Linear(8, 8)})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="error_term"):
        splice(model, {"blocks.0.hook_resid_pre": _sae()}, error_term=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dictionaries is empty"):
        splice(model, {})


# -- the decomposition rule ---------------------------------------------------------------
COMPONENTS = {
    "blocks.0.hook_attn_out": lambda: _sae("topk", seed=3),
    "blocks.0.hook_mlp_out": lambda: _sae("relu", seed=5),
    "blocks.1.hook_mlp_out": lambda: _transcoder("relu"),
    "blocks.1.hook_resid_mid": lambda: _sae("jumprelu", seed=4),  # a view of the stream
}


def test_decomposition_with_component_dictionaries_sums_to_the_stream() -> None:
    spliced = splice(_model(), {name: make() for name, make in COMPONENTS.items()})
    _, cache = spliced.run_with_cache(_x())
    parts, labels = decompose_resid_features(cache, return_labels=True)
    assert _diff(parts.sum(0), cache["resid_post", -1]) <= EXACT
    assert len(labels) == len(set(labels)) == parts.shape[0]
    # components with a dictionary are split, the others stay; the resid SAE adds nothing
    assert "0_attn_out" not in labels and "1_attn_out" in labels
    assert labels.count("1_mlp_out.skip") == 1 and "1_mlp_out.error" in labels
    assert [lab for lab in labels if "resid" in lab] == []
    assert sum(lab.startswith("0_mlp_out.feature_") for lab in labels) == 12
    # the features and bias and error of one component sum to it
    kept = [i for i, lab in enumerate(labels) if lab.startswith("0_attn_out.")]
    assert _diff(parts[kept].sum(0), cache["attn_out", 0]) <= EXACT
    # at block 1's MLP input too
    mid, mid_labels = decompose_resid_features(cache, 1, mlp_input=True, return_labels=True)
    assert _diff(mid.sum(0), cache["resid_mid", 1]) <= EXACT
    summed = decompose_resid_features(cache, features="sum")
    assert summed.shape[0] == len(labels) - 2 * 11 - 15
    assert _diff(summed.sum(0), parts.sum(0)) <= EXACT


def test_a_stream_dictionary_has_its_own_decomposition() -> None:
    name = "blocks.1.hook_resid_mid"
    spliced = splice(_model(), {n: make() for n, make in COMPONENTS.items()})
    _, cache = spliced.run_with_cache(_x())
    parts, labels = dictionary_decomposition(cache, name, return_labels=True)
    assert labels == [f"feature_{i}" for i in range(12)] + ["bias", "error"]
    assert _diff(parts.sum(0), cache[name]) <= EXACT
    d = spliced_dictionaries(spliced)[name]
    acts = cache[f"{name}.hook_sae_acts_post"]
    assert torch.equal(parts[4], acts[..., 4, None] * d.W_dec[4].detach())  # by hand
    assert torch.equal(parts[-2], d.b_dec.detach().expand_as(parts[-2]))
    assert torch.equal(parts[-1], cache[f"{name}.hook_sae_error"])


def test_decomposition_refusals() -> None:
    model = _model()
    spliced = splice(model, {"blocks.0.hook_resid_mid": _sae()}, error_term=False)
    _, cache = spliced.run_with_cache(_x())
    with pytest.raises(ValueError, match="without the error term"):
        decompose_resid_features(cache)
    # before it, the decomposition holds; the stream dictionary's own one too (no error)
    first = decompose_resid_features(cache, 0)
    assert _diff(first.sum(0), cache["resid_pre", 0]) <= EXACT
    parts = dictionary_decomposition(cache, "blocks.0.hook_resid_mid")
    assert _diff(parts.sum(0), cache["resid_mid", 0]) <= EXACT
    with pytest.raises(ValueError, match="no dictionary is spliced at 'blocks.0.hook_attn_out'"):
        dictionary_decomposition(cache, "blocks.0.hook_attn_out")
    double = lambda act, hook: 2 * act  # noqa: E731
    _, edited = spliced.run_with_cache(_x(), fwd_hooks=[("blocks.0.hook_resid_mid", double)])
    with pytest.raises(ValueError, match="edited"):
        dictionary_decomposition(edited, "blocks.0.hook_resid_mid")
    _, partial = spliced.run_with_cache(_x(), names_filter="blocks.0.hook_resid_mid")
    with pytest.raises(ValueError, match="the cache has no"):
        dictionary_decomposition(partial, "blocks.0.hook_resid_mid")
    with pytest.raises(ValueError, match="features must be one of"):
        dictionary_decomposition(cache, "blocks.0.hook_resid_mid", features="all")
