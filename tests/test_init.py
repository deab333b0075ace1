"""The two initialisations (``VectorTransformerConfig.init``): the GPT-2 style default and
TransformerLens's, compared with TransformerLens's own ``HookedTransformer`` init."""

import math
import warnings

import pytest
import torch

import vecinterp as vi

KW = dict(d_in=5, d_model=64, d_head=16, n_heads=4, n_layers=3, n_ctx=8, d_mlp=256)


def _weights(model):
    return {n: p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1].startswith("W_")}


def test_transformer_lens_init_draws_every_matrix_with_one_std_and_no_shrinking():
    cfg = vi.VectorTransformerConfig(**KW, init="transformer_lens")
    assert cfg.init_range == pytest.approx(0.8 / math.sqrt(64)) and cfg.init_std == cfg.init_range
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    for name, p in _weights(model).items():
        # a sample std of n >= 320 draws lies within 5 of its standard errors (sigma/sqrt(2n))
        tol = 5 * cfg.init_range / math.sqrt(2 * p.numel())
        assert abs(float(p.detach().std()) - cfg.init_range) < tol, name
        assert abs(float(p.detach().mean())) < 5 * cfg.init_range / math.sqrt(p.numel()), name
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "w":
            assert torch.equal(p, torch.ones_like(p)), name
        elif not leaf.startswith("W_"):
            assert torch.equal(p, torch.zeros_like(p)), name


def test_gpt2_init_shrinks_only_the_residual_writers():
    cfg = vi.VectorTransformerConfig(**KW)
    assert (cfg.init, cfg.init_range) == ("gpt2", 0.02)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    shrunk = 0.02 / math.sqrt(2 * 3)
    for name, p in _weights(model).items():
        std = shrunk if name.endswith(("W_O", "W_out")) else 0.02
        assert abs(float(p.detach().std()) - std) < 5 * std / math.sqrt(2 * p.numel()), name


def test_the_two_inits_share_the_draws_and_differ_by_the_scale():
    # one generator, the same parameter order: the matrices are the same float64 draws,
    # scaled, each rounded once to the float32 the model is built in before .to(float64)
    a = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**KW), seed=3, dtype=torch.float64)
    cfg_b = vi.VectorTransformerConfig(**KW, init="transformer_lens")
    b = vi.HookedVectorTransformer(cfg_b, seed=3, dtype=torch.float64)
    for (name, pa), pb in zip(_weights(a).items(), _weights(b).values(), strict=True):
        scale = 0.02 / math.sqrt(6) if name.endswith(("W_O", "W_out")) else 0.02
        torch.testing.assert_close(pa / scale, pb / cfg_b.init_range, rtol=2.5e-7, atol=0)


def test_init_matches_transformer_lens_own_initialisation_statistics():
    tl = pytest.importorskip("transformer_lens")
    cfg = vi.VectorTransformerConfig(**KW, init="transformer_lens")
    torch.manual_seed(0)
    tl_cfg = tl.HookedTransformerConfig(
        d_model=64,
        d_head=16,
        n_heads=4,
        n_layers=3,
        n_ctx=8,
        d_mlp=256,
        d_vocab=5,
        act_fn="relu",
        normalization_type="LN",
        dtype=torch.float64,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated")
        tl_model = tl.HookedTransformer(tl_cfg)
    assert tl_cfg.initializer_range == pytest.approx(cfg.init_range)
    ours = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    theirs = dict(tl_model.named_parameters())
    for name, p in _weights(ours).items():
        q = theirs[name]
        tol = 5 * cfg.init_range * math.sqrt(2 / p.numel())  # two sample stds' difference
        assert abs(float(p.detach().std()) - float(q.detach().std())) < tol, name


def test_init_is_saved_with_the_model_and_validated(tmp_path):
    cfg = vi.VectorTransformerConfig(**KW, init="transformer_lens")
    model = vi.HookedVectorTransformer(cfg, seed=0)
    again = vi.load(vi.save(model, tmp_path / "m"))
    assert again.cfg == cfg and again.cfg.init == "transformer_lens"
    with pytest.raises(ValueError, match="VectorTransformerConfig.init must be one of"):
        vi.VectorTransformerConfig(**KW, init="xavier")


def test_a_config_saved_before_init_existed_loads_as_the_gpt2_default():
    old = vi.VectorTransformerConfig(**KW).to_dict()
    del old["init"]
    old["init_range"] = 0.02
    assert vi.VectorTransformerConfig.from_dict(old) == vi.VectorTransformerConfig(**KW)


def test_replace_moves_a_default_range_with_init_and_keeps_a_chosen_one():
    cfg = vi.VectorTransformerConfig(**KW)
    assert cfg.replace(init="transformer_lens").init_range == pytest.approx(0.1)
    assert cfg.replace(init="transformer_lens").replace(init="gpt2").init_range == 0.02
    tl_cfg = cfg.replace(init="transformer_lens")
    assert tl_cfg.replace(d_model=256, d_mlp=1024).init_range == pytest.approx(0.05)
    chosen = vi.VectorTransformerConfig(**KW, init_range=0.05)
    assert chosen.replace(init="transformer_lens").init_range == 0.05
    assert cfg.replace(init="transformer_lens", init_range=0.3).init_range == 0.3
