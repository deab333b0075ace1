"""vecinterp.dictionary's feature evaluation (feature_density, decoder_similarity,
feature_correlations, feature_report) on tiny dictionaries whose answers are worked by
hand, and vecinterp.plot's pictures of them, checked by the data they draw."""

import math

import pytest
import torch

import vecinterp as vi
from vecinterp.dictionary import (
    DictionaryConfig,
    FeatureReport,
    SparseAutoencoder,
    Transcoder,
    decoder_similarity,
    feature_correlations,
    feature_density,
    feature_report,
)


def _identity_sae(d: int = 3) -> SparseAutoencoder:
    """ReLU SAE with W_enc = I, W_dec = I and zero biases: feature i is relu(x_i)."""
    sae = SparseAutoencoder(DictionaryConfig(d_in=d, d_sae=d, dtype="float64"))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(d))
        sae.W_dec.copy_(torch.eye(d))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


X = torch.tensor(
    [[1.0, 0.0, -1.0], [2.0, 1.0, -1.0], [-1.0, 0.0, -3.0], [0.5, 0.0, -2.0]],
    dtype=torch.float64,
)


def test_density_by_hand():
    # feature 0 fires on rows 0, 1, 3; feature 1 on row 1; feature 2 never (dead)
    assert feature_density(_identity_sae(), X).tolist() == [0.75, 0.25, 0.0]
    # in batches the same
    assert feature_density(_identity_sae(), X, batch_size=3).tolist() == [0.75, 0.25, 0.0]
    stats = vi.evaluate_dictionary(_identity_sae(), X)
    assert torch.equal(stats.feature_density, feature_density(_identity_sae(), X))


def test_density_refuses_bad_input():
    with pytest.raises(ValueError, match="rows"):
        feature_density(_identity_sae(), X[0])
    with pytest.raises(TypeError):
        feature_density(torch.eye(3), X)  # type: ignore[arg-type]


def test_decoder_similarity_by_hand():
    sae = _identity_sae()
    with torch.no_grad():
        sae.W_dec.copy_(torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    dirs = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, -2.0], [0.0, 1.0, 0.0]])
    sim = decoder_similarity(sae, dirs)
    expected = torch.tensor(
        [[0.6, 0.0, 1.0], [0.0, -1.0, 0.0], [0.8, 0.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(sim, expected)
    assert sim.abs().max(1).values.tolist() == pytest.approx([1.0, 1.0, 0.8])
    # one direction as a vector; a zero direction gives NaN, a wrong width is refused
    assert decoder_similarity(sae, dirs[2]).shape == (1, 3)
    assert decoder_similarity(sae, torch.zeros(1, 3)).isnan().all()
    with pytest.raises(ValueError, match="width"):
        decoder_similarity(sae, torch.ones(1, 4))


def test_feature_correlations_by_hand():
    acts = torch.tensor([[0.0, 3.0, 1.0], [0.0, 1.0, 1.0], [0.0, 2.0, 1.0]])
    v = torch.tensor([2.0, 0.0, 1.0])
    r = feature_correlations(acts, v)
    assert math.isnan(r[0]) and math.isnan(r[2])  # constant columns (e.g. dead)
    assert r[1].item() == pytest.approx(1.0)
    assert feature_correlations(acts, -v)[1].item() == pytest.approx(-1.0)
    # matches numpy's corrcoef on random data
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(50, 4, generator=g), torch.randn(50, generator=g)
    import numpy as np

    ref = [np.corrcoef(a[:, i].numpy(), w.numpy())[0, 1] for i in range(4)]
    assert feature_correlations(a, w).tolist() == pytest.approx(ref, abs=1e-6)
    with pytest.raises(ValueError):
        feature_correlations(a, w[:10])


def test_report_numbers_and_markdown():
    model = vi.HookedVectorTransformer(
        vi.VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5),
        seed=0,
        dtype=torch.float64,
    )
    sae = SparseAutoencoder(
        DictionaryConfig(d_in=8, d_sae=16, dtype="float64", hook_in="blocks.0.hook_resid_mid"),
        seed=1,
    )
    x, t = torch.randn(4, 5, 3, dtype=torch.float64), torch.randn(4, 5, 3, dtype=torch.float64)
    _, cache = model.run_with_cache(x)
    rows = cache["blocks.0.hook_resid_mid"].reshape(-1, 8)
    r = feature_report(sae, rows, model=model, x=x, model_targets=t, dense_above=0.2)
    stats = vi.evaluate_dictionary(sae, rows, dense_above=0.2)
    metric = vi.splice_metric(model, {"blocks.0.hook_resid_mid": sae}, x, t)
    assert (r.fvu, r.l0, r.n_dead, r.n_dense, r.n_rows) == (
        stats.fvu, stats.l0, stats.n_dead, stats.n_dense, 20,
    )  # fmt: skip
    assert r.splice == metric
    assert r.architecture == "relu" and r.d_sae == 16
    md = r.to_markdown().splitlines()
    assert len(md) == 3 and md[0].count("|") == md[2].count("|") == 12
    cells = [c.strip() for c in md[2].strip("|").split("|")]
    assert cells[0] == "blocks.0.hook_resid_mid"
    assert float(cells[3]) == pytest.approx(stats.fvu, abs=5e-5)
    assert float(cells[-1]) == pytest.approx(metric.increase, rel=1e-3)
    assert "dense (> 0.2)" in md[0]
    table = FeatureReport.markdown_table([r, r]).splitlines()
    assert len(table) == 4 and table[2] == table[3] == md[2]
    # a transcoder's point is its hook_out; without a model no splice numbers
    tc = Transcoder(DictionaryConfig(d_in=8, d_sae=16, transcoder=True, dtype="float64",
                                     hook_out="blocks.0.hook_mlp_out"))  # fmt: skip
    rt = feature_report(tc, rows, rows)
    assert rt.name == "blocks.0.hook_mlp_out" and rt.splice is None
    assert rt.architecture == "relu transcoder" and "–" in rt.row()
    with pytest.raises(ValueError, match="model_targets"):
        feature_report(sae, rows, model=model, x=x)
    with pytest.raises(ValueError):
        FeatureReport.markdown_table([])


# --- figures: check the data drawn -------------------------------------------------------


@pytest.fixture
def plt():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def test_density_histogram_draws_the_counts(plt):
    import vecinterp.plot as vp

    density = [0.0, 0.0, 0.001, 0.01, 0.01, 0.1, 1.0]
    ax = vp.plot_feature_density(density, bins=3)
    hist, dead = ax.containers
    # log10: -3, -2, -2, -1, 0 in three bins of width 1 from -3 to 0
    assert [p.get_height() for p in hist] == [1, 2, 2]
    assert dead.get_label() == "dead" and [p.get_height() for p in dead] == [2]
    assert dead.patches[0].get_x() + dead.patches[0].get_width() <= -3  # left of the rest
    assert "dead: 2" in [t.get_text() for t in ax.texts]
    # every feature is counted once
    assert sum(p.get_height() for p in hist) + 2 == len(density)
    with pytest.raises(ValueError):
        vp.plot_feature_density([0.5, 1.5])


def test_density_histogram_all_dead_or_one_value(plt):
    import vecinterp.plot as vp

    ax = vp.plot_feature_density([0.0, 0.0])
    assert [p.get_height() for p in ax.containers[-1]] == [2]
    ax = vp.plot_feature_density([0.1, 0.1, 0.0], bins=4)
    assert sum(p.get_height() for p in ax.containers[0]) == 2


def test_decoder_similarity_heatmap(plt):
    import vecinterp.plot as vp

    sim = torch.tensor([[0.1, -0.9, 0.3, 0.0], [0.5, 0.0, 0.0, 0.2]])
    ax = vp.plot_decoder_similarity(sim, labels=["c", "d"])
    assert ax.images[0].get_array().ravel().tolist() == pytest.approx(sim.ravel().tolist())
    assert [t.get_text() for t in ax.get_yticklabels()] == ["c (0.90)", "d (0.50)"]
    ax = vp.plot_decoder_similarity(sim, top=2)  # features 1 (0.9) and 0 (0.5)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "0"]
    assert ax.images[0].get_array().ravel().tolist() == pytest.approx([-0.9, 0.1, 0.0, 0.5])
    assert ax.images[0].get_clim() == (-1, 1)
    with pytest.raises(ValueError, match="labels"):
        vp.plot_decoder_similarity(sim, labels=["c"])


def test_feature_activation_binned_mean(plt):
    import vecinterp.plot as vp

    v = torch.arange(10, dtype=torch.float64)
    a = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 5], dtype=torch.float64)
    ax = vp.plot_feature_activation(v, a, bins=2, max_points=5)
    scatter, mean = ax.lines
    assert scatter.get_xdata().tolist() == [0, 2, 4, 6, 8]  # every 2nd row
    assert mean.get_xdata().tolist() == pytest.approx([2.25, 6.75])
    assert mean.get_ydata().tolist() == pytest.approx([0.0, 9 / 5])
    # empty bins are skipped
    ax = vp.plot_feature_activation([0.0, 0.1, 1.0], [1.0, 3.0, 5.0], bins=4)
    assert ax.lines[-1].get_ydata().tolist() == pytest.approx([2.0, 5.0])
    with pytest.raises(ValueError, match="length"):
        vp.plot_feature_activation([0.0, 1.0], [1.0])
