"""vecinterp.plot: every function renders real results to PNG, carries the expected labels,
draws exactly its input, checks shapes, and the module names the extra when matplotlib is
missing."""

import builtins
import doctest
import importlib

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import vecinterp.plot as vplot  # noqa: E402
from helpers import random_input, random_model, tiny_cfg  # noqa: E402
from vecinterp.training.result import TrainHistory  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def patterns():
    """Real attention patterns of a tiny causal model: [n_layers, batch, n_heads, pos, pos]."""
    cfg = tiny_cfg()
    model = random_model(cfg)
    _, cache = model.run_with_cache(random_input(cfg), names_filter=lambda n: "pattern" in n)
    return torch.stack([cache["pattern", layer] for layer in range(cfg.n_layers)])


def save(fig, tmp_path, name="plot.png"):
    path = tmp_path / name
    fig.savefig(path)
    assert path.exists() and path.stat().st_size > 0
    return path


# ------------------------------------------------------------------------------ attention


def test_plot_attention_renders_pattern_with_grey_causal_triangle(patterns, tmp_path):
    pattern = patterns[1, 0, 1]  # layer 1, batch 0, head 1: [7, 7] tensor
    ax = vplot.plot_attention(pattern, title="L1H1")
    save(ax.figure, tmp_path)
    image = ax.images[0]
    assert image.get_extent() == [-0.5, 6.5, 6.5, -0.5]
    shown = image.get_array()
    np.testing.assert_array_equal(shown.data, pattern.numpy())
    np.testing.assert_array_equal(shown.mask, np.triu(np.ones((7, 7), dtype=bool), k=1))
    assert image.get_clim() == (0.0, 1.0)
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == (
        "L1H1",
        "source position",
        "destination position",
    )
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(7)]
    assert len(ax.figure.axes) == 2  # the pattern and its colour bar


def test_plot_attention_does_not_grey_a_nonzero_future(tmp_path):
    pattern = np.full((3, 3), 1 / 3)
    ax = vplot.plot_attention(pattern, labels=["a", "b", "c"], vmax=0.5)
    save(ax.figure, tmp_path)
    assert not np.ma.is_masked(ax.images[0].get_array())
    assert ax.images[0].get_clim() == (0.0, 0.5)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]


def test_plot_attention_offsets_the_causal_triangle_for_fewer_queries():
    # 2 queries at the last 2 of 4 positions: only [0, 3] is in the future
    pattern = np.array([[0.2, 0.3, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]])
    ax = vplot.plot_attention(pattern, labels=["p0", "p1", "p2", "p3"])
    expected = np.zeros((2, 4), dtype=bool)
    expected[0, 3] = True
    np.testing.assert_array_equal(ax.images[0].get_array().mask, expected)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p2", "p3"]


def test_plot_attention_draws_on_given_axes():
    fig, (left, right) = plt.subplots(1, 2)
    assert vplot.plot_attention(np.eye(2), ax=right, colorbar=False) is right
    assert len(left.images) == 0 and len(right.images) == 1


@pytest.mark.parametrize("shape", [(7,), (2, 7, 7), (0, 3)])
def test_plot_attention_rejects_non_2d_pattern(shape):
    with pytest.raises(
        ValueError, match=r"pattern must be a non-empty array \[dest_pos, src_pos\]"
    ):
        vplot.plot_attention(torch.zeros(shape))


def test_plot_attention_rejects_wrong_number_of_labels():
    with pytest.raises(ValueError, match="labels must have one entry per source position"):
        vplot.plot_attention(np.eye(3), labels=["a", "b"])


def test_plot_attention_rejects_complex_pattern():
    with pytest.raises(TypeError, match="pattern must be real"):
        vplot.plot_attention(torch.eye(2, dtype=torch.complex64))


def test_plot_attention_grid_layers_by_heads(patterns, tmp_path):
    grid = patterns[:, 0]  # [n_layers=2, n_heads=2, 7, 7]
    fig = vplot.plot_attention_grid(grid, title="all heads")
    save(fig, tmp_path)
    pattern_axes, colorbar = fig.axes[:4], fig.axes[4:]
    assert len(pattern_axes) == 4 and len(colorbar) == 1
    for k, ax in enumerate(pattern_axes):
        np.testing.assert_array_equal(ax.images[0].get_array().data, grid[k // 2, k % 2].numpy())
        assert ax.images[0].get_clim() == (0.0, 1.0)
    assert [ax.get_title() for ax in pattern_axes] == ["head 0", "head 1", "", ""]
    assert pattern_axes[0].get_ylabel() == "layer 0\ndestination"
    assert pattern_axes[2].get_ylabel() == "layer 1\ndestination"
    assert fig.get_suptitle() == "all heads"


def test_plot_attention_grid_one_row_with_labels(patterns, tmp_path):
    fig = vplot.plot_attention_grid(patterns[0, 0], col_labels=["A", "B"], row_labels=["L0"])
    save(fig, tmp_path)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["A", "B"]
    assert fig.axes[0].get_ylabel() == "L0\ndestination"


def test_plot_attention_grid_rejects_bad_shapes_and_labels():
    with pytest.raises(ValueError, match=r"patterns must be .*\[n_cols, dest_pos, src_pos\]"):
        vplot.plot_attention_grid(np.eye(3))
    with pytest.raises(ValueError, match="col_labels must have 2 entries, got 3"):
        vplot.plot_attention_grid(np.zeros((2, 3, 3)), col_labels=["a", "b", "c"])


def _render(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


@pytest.mark.parametrize("shape", [(1, 1, 3, 3), (2, 3, 7, 7), (3, 8, 14, 14), (2, 4, 5, 9)])
def test_plot_attention_grid_lays_panels_out_without_overlap_or_clipping(shape):
    grid = np.random.default_rng(0).random(shape)
    fig = vplot.plot_attention_grid(grid, title="a title", highlight_source=1)
    renderer = _render(fig)
    assert fig.get_layout_engine() is None  # placed once, not re-laid out on every draw
    n_rows, n_cols = shape[:2]
    panels, colorbar = fig.axes[:-1], fig.axes[-1]
    assert len(panels) == n_rows * n_cols
    boxes = [ax.get_position() for ax in panels] + [colorbar.get_position()]
    for k, a in enumerate(boxes):
        assert 0 <= a.x0 < a.x1 <= 1 and 0 <= a.y0 < a.y1 <= 1
        for b in boxes[k + 1 :]:  # no two panels (or the colour bar) overlap
            assert a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0
    # every label, title and tick label lies inside the canvas
    canvas = fig.bbox
    for ax in fig.axes:
        box = ax.get_tightbbox(renderer)
        assert box.x0 >= canvas.x0 - 1 and box.x1 <= canvas.x1 + 1, ax.get_title()
        assert box.y0 >= canvas.y0 - 1 and box.y1 <= canvas.y1 + 1, ax.get_title()
    title = fig._suptitle.get_window_extent(renderer)
    assert title.y1 <= canvas.y1 + 1 and title.y0 >= max(b.y1 for b in boxes) * canvas.height
    # each panel keeps the pattern's aspect: square cells
    pos = panels[0].get_position()
    width, height = pos.width * fig.get_figwidth(), pos.height * fig.get_figheight()
    assert width / height == pytest.approx(shape[3] / shape[2])


def test_plot_attention_grid_labels_only_the_outer_panels_with_few_ticks():
    fig = vplot.plot_attention_grid(np.random.default_rng(0).random((3, 4, 14, 14)))
    _render(fig)
    panels = np.array(fig.axes[:-1]).reshape(3, 4)
    for i in range(3):
        for j in range(4):
            ax = panels[i, j]
            np.testing.assert_array_equal(ax.get_xticks(), [0, 5, 10])
            np.testing.assert_array_equal(ax.get_yticks(), [0, 5, 10])
            shown_x = [t.get_text() for t in ax.get_xticklabels() if t.get_visible()]
            shown_y = [t.get_text() for t in ax.get_yticklabels() if t.get_visible()]
            assert bool(shown_x) == (i == 2) and bool(shown_y) == (j == 0)


def test_plot_attention_grid_highlights_a_source_column_in_chosen_rows():
    fig = vplot.plot_attention_grid(np.zeros((3, 2, 6, 6)), highlight_source=2, highlight_rows=[1])
    panels = fig.axes[:-1]
    for k, ax in enumerate(panels):
        outlines = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
        if k // 2 == 1:
            (box,) = outlines
            assert (box.get_x(), box.get_y(), box.get_width(), box.get_height()) == (
                1.5,
                -0.5,
                1.0,
                6,
            )
            assert not box.get_fill()
        else:
            assert outlines == []
    all_rows = vplot.plot_attention_grid(np.zeros((2, 2, 4, 4)), highlight_source=0)
    assert all(len(ax.patches) == 1 for ax in all_rows.axes[:-1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(highlight_source=6), r"highlight_source must be a source position in 0\.\.5"),
        (dict(highlight_source=-1), "highlight_source must be"),
        (dict(highlight_source=1, highlight_rows=[3]), r"highlight_rows must be .* 0\.\.2"),
        (dict(panel_size=0.0), "panel_size must be"),
    ],
)
def test_plot_attention_grid_rejects_bad_highlight_and_size(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vplot.plot_attention_grid(np.zeros((3, 2, 6, 6)), **kwargs)


def test_position_ticks_are_located_not_built_before_a_draw():
    # set_ticks would build every tick object at once (the slow path); a locator waits
    ax = vplot.plot_attention(np.eye(14))
    assert len(ax.xaxis.majorTicks) <= 1 and len(ax.yaxis.majorTicks) <= 1
    np.testing.assert_array_equal(ax.get_xticks(), np.arange(14))
    ax = vplot.plot_attention(np.eye(40))  # beyond 16 positions: every 5th
    np.testing.assert_array_equal(ax.get_xticks(), np.arange(0, 40, 5))
    grid = vplot.plot_score_grid(np.zeros((3, 8)))
    assert len(grid.xaxis.majorTicks) <= 1
    np.testing.assert_array_equal(grid.get_xticks(), np.arange(8))


# ---------------------------------------------------------------------- matrices, scores


def test_plot_matrix_is_symmetric_about_zero_for_an_ov_circuit(tmp_path):
    model = random_model(tiny_cfg())
    ov = model.OV[0, 1]  # FactoredMatrix [d_model, d_model]
    ax = vplot.plot_matrix(ov, title="OV L0H1", xlabel="out", ylabel="in")
    save(ax.figure, tmp_path)
    dense = ov.AB.detach().numpy()
    limit = np.abs(dense).max()
    np.testing.assert_allclose(ax.images[0].get_clim(), (-limit, limit))
    np.testing.assert_array_equal(ax.images[0].get_array(), dense)
    assert ax.images[0].get_extent() == [-0.5, 7.5, 7.5, -0.5]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("OV L0H1", "out", "in")


def test_plot_matrix_of_zeros_still_has_a_scale():
    ax = vplot.plot_matrix(np.zeros((2, 3)))
    assert ax.images[0].get_clim() == (-1.0, 1.0)


def test_plot_matrix_rejects_non_2d():
    with pytest.raises(ValueError, match=r"matrix must be a non-empty array \[rows, cols\]"):
        vplot.plot_matrix(torch.zeros(2, 3, 3))


def test_plot_score_grid_annotates_finite_cells_and_blanks_nan(tmp_path):
    scores = torch.tensor([[0.5, float("nan"), -0.25], [1.0, 0.0, float("nan")]])
    ax = vplot.plot_score_grid(scores, title="eigenvalue scores", center=0.0, fmt=".1f")
    save(ax.figure, tmp_path)
    texts = {(t.get_position(), t.get_text()) for t in ax.texts}
    assert texts == {((0, 0), "0.5"), ((2, 0), "-0.2"), ((0, 1), "1.0"), ((1, 1), "0.0")}
    shown = ax.images[0].get_array()
    np.testing.assert_array_equal(shown.mask, np.isnan(scores.numpy()))
    assert ax.images[0].get_clim() == (-1.0, 1.0)
    assert ax.images[0].get_extent() == [-0.5, 2.5, 1.5, -0.5]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "head",
        "layer",
        "eigenvalue scores",
    )
    # NaN cells render as the colour map's "bad" colour, a light grey apart from white (0)
    grey = matplotlib.colors.to_rgba("0.85")
    assert tuple(ax.images[0].to_rgba(shown)[0, 1]) == pytest.approx(grey)
    assert tuple(ax.images[0].to_rgba(np.zeros((1, 1)))[0, 0]) != pytest.approx(grey)


def test_plot_score_grid_default_scale_and_all_nan(tmp_path):
    ax = vplot.plot_score_grid(np.array([[2.0, 3.0], [4.0, 5.0]]))
    assert ax.images[0].get_clim() == (2.0, 5.0)
    ax = vplot.plot_score_grid(np.full((2, 2), np.nan))
    save(ax.figure, tmp_path)
    assert len(ax.texts) == 0


def test_plot_score_grid_fixed_limit_about_center():
    ax = vplot.plot_score_grid(np.array([[0.2, -0.3]]), center=0.0)
    assert ax.images[0].get_clim() == (-0.3, 0.3)  # default: the largest deviation
    ax = vplot.plot_score_grid(np.array([[0.2, -0.3]]), center=0.0, limit=1)
    assert ax.images[0].get_clim() == (-1.0, 1.0)
    ax = vplot.plot_score_grid(np.array([[0.2, -0.3]]), center=0.5, limit=2)
    assert ax.images[0].get_clim() == (-1.5, 2.5)


def test_plot_score_grid_labels_its_colour_scale():
    ax = vplot.plot_score_grid(
        np.array([[0.2, -0.3]]),
        center=0.0,
        limit=1.0,
        colorbar_label="score",
        scale_labels={1: "high", -1.0: "low", 0.5: "half"},
    )
    bar = ax.images[0].colorbar
    assert bar.ax.get_ylabel() == "score"
    np.testing.assert_array_equal(bar.ax.get_yticks(), [-1.0, 0.5, 1.0])
    assert [t.get_text() for t in bar.ax.get_yticklabels()] == ["low", "half", "high"]
    with pytest.raises(ValueError, match=r"scale_labels has values outside .*\[2\.0\]"):
        vplot.plot_score_grid(np.zeros((1, 2)), center=0.0, limit=1.0, scale_labels={2.0: "x"})


@pytest.mark.parametrize(
    ("circuit", "low", "high"),
    [
        ("OV", "−1: negates\n(OV ≈ −I)", "+1: copies\n(OV ≈ +I)"),
        ("QK", "−1: opposite\ndirection (QK ≈ −I)", "+1: same\ndirection (QK ≈ +I)"),
    ],
)
def test_plot_eigenvalue_scores_says_what_the_ends_of_the_scale_mean(circuit, low, high, tmp_path):
    scores = torch.tensor([[-1.0, 0.25], [float("nan"), 1.0]])
    ax = vplot.plot_eigenvalue_scores(scores, circuit=circuit)
    save(ax.figure, tmp_path)
    assert ax.images[0].get_clim() == (-1.0, 1.0)
    bar = ax.images[0].colorbar
    np.testing.assert_array_equal(bar.ax.get_yticks(), [-1.0, 0.0, 1.0])
    assert [t.get_text() for t in bar.ax.get_yticklabels()] == [low, "0", high]
    assert bar.ax.get_ylabel() == f"{circuit} eigenvalue score"
    assert ax.get_title() == f"{circuit} eigenvalue scores"
    assert sorted(t.get_text() for t in ax.texts) == ["-1.00", "0.25", "1.00"]
    with pytest.raises(ValueError, match=r"circuit must be one of \['OV', 'QK'\], got 'VO'"):
        vplot.plot_eigenvalue_scores(scores, circuit="VO")


@pytest.mark.parametrize(
    ("scores", "kwargs", "match"),
    [
        (np.zeros(3), {}, r"scores must be a non-empty array \[n_layers, n_heads\]"),
        (np.array([[1.0, np.inf]]), {}, "scores must not hold ±inf"),
        (np.ones((1, 2)), dict(limit=1.0), "limit needs center"),
        (np.ones((1, 2)), dict(center=0.0, limit=0.0), "limit must be a positive finite"),
        (np.ones((1, 2)), dict(center=0.0, limit=np.nan), "limit must be a positive finite"),
    ],
)
def test_plot_score_grid_rejects_bad_arguments(scores, kwargs, match):
    with pytest.raises(ValueError, match=match):
        vplot.plot_score_grid(scores, **kwargs)


# -------------------------------------------------------------------- attribution, fit


def test_plot_attribution_one_bar_per_component_coloured_by_sign(tmp_path):
    values = torch.tensor([0.3, -0.1, 0.05, -0.4])
    labels = ["embed", "L0H0", "L0H1", "mlp_0"]
    ax = vplot.plot_attribution(values, labels, title="attribution")
    save(ax.figure, tmp_path)
    bars = ax.patches
    assert len(bars) == 4
    np.testing.assert_allclose([b.get_height() for b in bars], values.numpy(), rtol=1e-6)
    colors = [b.get_facecolor() for b in bars]
    assert colors[0] == colors[2] != colors[1] == colors[3]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert ax.get_xticklabels()[0].get_rotation() == 60
    assert (ax.get_ylabel(), ax.get_title()) == ("direct attribution", "attribution")


def test_plot_attribution_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"values must be a non-empty array \[component\]"):
        vplot.plot_attribution(np.zeros((2, 2)), ["a", "b"])
    with pytest.raises(ValueError, match=r"labels must have one entry per component \(3\), got 2"):
        vplot.plot_attribution([1.0, 2.0, 3.0], ["a", "b"])


def test_plot_fit_draws_the_given_line(tmp_path):
    x = torch.linspace(-2, 3, 40, dtype=torch.float64)
    y = 0.7 * x + 0.2 + 0.05 * torch.sin(7 * x)
    ax = vplot.plot_fit(
        x, y, slope=torch.tensor(0.7), intercept=0.2, r2=0.99, xlabel="x_d", ylabel="(x OV)_d"
    )
    save(ax.figure, tmp_path)
    (xs, ys) = ax.lines[0].get_data()
    assert (ys[1] - ys[0]) / (xs[1] - xs[0]) == pytest.approx(0.7)
    assert ys[0] == pytest.approx(0.7 * -2 + 0.2)
    assert (xs[0], xs[1]) == (-2.0, 3.0)
    np.testing.assert_array_equal(ax.collections[0].get_offsets(), np.stack([x, y], axis=1))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["data (n=40)", "fit: y = 0.7 x + 0.2 (R² = 0.9900)"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("x_d", "(x OV)_d")


def test_plot_fit_computes_least_squares_and_subsamples_the_scatter():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 4))
    y = -1.5 * x - 0.3 + rng.normal(scale=0.1, size=x.shape)
    ax = vplot.plot_fit(x, y, max_points=50)
    slope, intercept = np.polyfit(x.ravel(), y.ravel(), 1)
    r2 = 1 - np.sum((y - (slope * x + intercept)) ** 2) / np.sum((y - y.mean()) ** 2)
    xs, ys = ax.lines[0].get_data()
    assert (ys[1] - ys[0]) / (xs[1] - xs[0]) == pytest.approx(slope)
    assert len(ax.collections[0].get_offsets()) == 50
    legend = ax.get_legend().get_texts()
    assert legend[0].get_text() == "data (n=120, 50 of 120 shown)"
    assert legend[1].get_text().endswith(f"(R² = {r2:.4f})")
    assert legend[1].get_text().startswith(f"fit: y = {slope:.3g} x - {-intercept:.3g} (")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(x=np.zeros(3), y=np.zeros(4)), "x and y must be non-empty with the same shape"),
        (dict(x=np.array([0.0, np.nan]), y=np.zeros(2)), "x and y must be finite"),
        (dict(x=np.ones(3), y=np.arange(3.0)), "x needs at least 2 distinct values"),
        (dict(x=np.arange(3.0), y=np.arange(3.0), slope=1.0), "give both slope and intercept"),
        (
            dict(x=np.arange(3.0), y=np.arange(3.0), slope=np.ones(2), intercept=0.0),
            "slope must be a single number",
        ),
    ],
)
def test_plot_fit_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vplot.plot_fit(**kwargs)


def test_plot_fit_draws_a_reference_slope_through_the_origin():
    x = np.linspace(-1.0, 2.0, 30)
    ax = vplot.plot_fit(x, 0.4 * x, reference=2.3, reference_label="paper")
    fit, reference = ax.lines
    xs, ys = reference.get_data()
    np.testing.assert_allclose(xs, [-1.0, 2.0])
    np.testing.assert_allclose(ys, [-2.3, 4.6])
    assert reference.get_linestyle() == "--"
    assert ax.get_legend().get_texts()[-1].get_text() == "paper: slope 2.3"
    assert ax.get_ylim()[1] >= 4.6  # the axes widen to show the claim


def test_plot_fit_draws_a_range_of_reference_slopes_as_a_wedge():
    x = np.linspace(-1.0, 1.0, 30)
    ax = vplot.plot_fit(x, 0.4 * x, reference=(2.5, 2.1), reference_label="paper")
    assert len(ax.lines) == 3
    slopes = sorted(
        (line.get_ydata()[1] - line.get_ydata()[0]) / (line.get_xdata()[1] - line.get_xdata()[0])
        for line in ax.lines[1:]
    )
    assert slopes == pytest.approx([2.1, 2.5])
    wedge = ax.collections[-1]
    corners = wedge.get_paths()[0].vertices
    assert corners[:, 1].max() == pytest.approx(2.5) and corners[:, 1].min() == pytest.approx(-2.5)
    assert ax.get_legend().get_texts()[-1].get_text() == "paper: slope 2.1–2.5"


@pytest.mark.parametrize(
    "reference", [np.array([1.0, 2.0, 3.0]), float("nan"), (1.0, float("inf"))]
)
def test_plot_fit_rejects_a_bad_reference(reference):
    with pytest.raises(ValueError, match="reference must be a slope or a .low, high. pair"):
        vplot.plot_fit(np.arange(3.0), np.arange(3.0), reference=reference)


def test_plot_attribution_reference_line_and_per_component_marks():
    ax = vplot.plot_attribution([0.3, -0.1, 0.05], ["a", "b", "c"], reference=0.2)
    line = ax.lines[-1]
    np.testing.assert_array_equal(line.get_ydata(), [0.2, 0.2])
    assert line.get_linestyle() == "--" and line.get_label() == "reference: 0.2"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["reference: 0.2"]

    ax = vplot.plot_attribution(
        [0.3, -0.1, 0.05], ["a", "b", "c"], reference=[0.25, np.nan, 0.1], reference_label="paper"
    )
    segments = ax.collections[-1].get_segments()
    assert len(segments) == 2  # none for the NaN
    np.testing.assert_allclose(segments[0], [[-0.4, 0.25], [0.4, 0.25]])
    np.testing.assert_allclose(segments[1], [[1.6, 0.1], [2.4, 0.1]])
    assert ax.collections[-1].get_label() == "paper"
    with pytest.raises(ValueError, match=r"reference must be one number or one per component"):
        vplot.plot_attribution([0.3, -0.1], ["a", "b"], reference=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="reference must be a finite number"):
        vplot.plot_attribution([0.3, -0.1], ["a", "b"], reference=np.inf)


# ------------------------------------------------------------------ loss, residuals


def test_plot_loss_from_arrays(tmp_path):
    steps = np.arange(5)
    losses = torch.tensor([1.0, 0.5, 0.1, 0.05, 0.01])
    ax = vplot.plot_loss(steps, losses, eval_steps=[0, 5], eval_losses=[1.1, 0.02], title="run")
    save(ax.figure, tmp_path)
    assert ax.get_yscale() == "log"
    train, evaluation = ax.lines
    np.testing.assert_array_equal(train.get_xdata(), steps)
    np.testing.assert_allclose(train.get_ydata(), losses.numpy())
    np.testing.assert_array_equal(evaluation.get_xdata(), [0, 5])
    assert (train.get_label(), evaluation.get_label()) == ("train", "eval")
    assert (ax.get_xlabel(), ax.get_title()) == ("step", "run")


def test_plot_loss_from_a_train_history():
    history = TrainHistory(
        steps=[0, 1, 2], train_loss=[0.9, 0.4, 0.2], eval_steps=[0, 3], eval_loss=[1.0, 0.1]
    )
    ax = vplot.plot_loss(history, log=False)
    assert ax.get_yscale() == "linear"
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), [0.9, 0.4, 0.2])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [1.0, 0.1])
    empty_eval = TrainHistory(steps=[0, 1], train_loss=[1.0, 0.5])
    assert len(vplot.plot_loss(empty_eval).lines) == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0, 1, 2], [1.0, 0.5]), {}, "train steps and losses must have the same length"),
        (([0, 1],), {}, "losses is required"),
        (([0, 1], [1.0, 0.5]), dict(eval_steps=[0]), "give both eval_steps and eval_losses"),
        ((np.zeros((2, 2)), np.zeros((2, 2))), {}, r"train steps must be .*\[n_steps\]"),
        ((TrainHistory(steps=[0], train_loss=[1.0]), [1.0]), {}, "TrainHistory alone"),
    ],
)
def test_plot_loss_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        vplot.plot_loss(*args, **kwargs)


def test_plot_loss_reference_line_at_the_claimed_loss():
    ax = vplot.plot_loss([0, 1, 2], [1.0, 0.1, 0.01], reference=1e-4, reference_label="paper")
    train, reference = ax.lines
    np.testing.assert_array_equal(reference.get_ydata(), [1e-4, 1e-4])
    np.testing.assert_array_equal(reference.get_xdata(), [0, 1])  # axes coordinates: across
    assert reference.get_label() == "paper: 0.0001"
    assert ax.get_ylim()[0] <= 1e-4
    with pytest.raises(ValueError, match="reference must be positive on a log scale"):
        vplot.plot_loss([0, 1], [1.0, 0.5], reference=0.0)
    assert vplot.plot_loss([0, 1], [1.0, 0.5], reference=-1.0, log=False).lines[-1].get_ydata()[
        0
    ] == pytest.approx(-1.0)


def test_add_note_writes_in_axes_coordinates():
    ax = vplot.plot_loss([0, 1], [1.0, 0.5])
    note = vplot.add_note(ax, "paper: 1e-4\nours: 9e-5", loc="lower right")
    assert note is ax.texts[-1]
    assert note.get_text() == "paper: 1e-4\nours: 9e-5"
    assert note.get_transform() == ax.transAxes
    assert note.get_position() == (0.98, 0.02)
    assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("right", "bottom")
    assert note.get_bbox_patch() is not None
    with pytest.raises(ValueError, match="loc must be one of"):
        vplot.add_note(ax, "x", loc="middle")
    with pytest.raises(TypeError, match="ax"):  # ours, or the test run's type checker
        vplot.add_note(ax.figure, "x")


def test_save_figure_writes_at_the_dpi_and_closes(tmp_path):
    ax = vplot.plot_loss([0, 1], [1.0, 0.5])
    fig = ax.figure
    fig.set_size_inches(3.0, 2.0)
    path = vplot.save_figure(ax, tmp_path / "loss.png")
    assert path == tmp_path / "loss.png"
    assert not plt.fignum_exists(fig.number)
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (200, 300)  # 100 dpi by default
    fig2 = plt.figure(figsize=(2.0, 1.0))
    vplot.save_figure(fig2, tmp_path / "small.png", dpi=50, close=False)
    assert matplotlib.image.imread(tmp_path / "small.png").shape[:2] == (50, 100)
    assert plt.fignum_exists(fig2.number)
    with pytest.raises(ValueError, match="dpi must be a positive finite number"):
        vplot.save_figure(fig2, tmp_path / "x.png", dpi=0)
    with pytest.raises(TypeError, match="fig"):
        vplot.save_figure("figure", tmp_path / "x.png")


def test_plot_residual_vs_target(tmp_path):
    estimate, target = torch.tensor([0.9, 2.1, 2.9, -1.0]), np.array([1.0, 2.0, 3.0, -1.2])
    ax = vplot.plot_residual_vs_target(estimate, target, title="after layer 1")
    save(ax.figure, tmp_path)
    est_line, tgt_line = ax.lines[:2]
    np.testing.assert_array_equal(est_line.get_xdata(), np.arange(4))
    np.testing.assert_allclose(est_line.get_ydata(), estimate.numpy())
    np.testing.assert_array_equal(tgt_line.get_ydata(), target)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["residual through W_U", "target"]
    assert (ax.get_xlabel(), ax.get_title()) == ("component", "after layer 1")


def test_plot_residual_vs_target_rejects_bad_input():
    with pytest.raises(ValueError, match=r"estimate must be a non-empty array \[d_out\]"):
        vplot.plot_residual_vs_target(np.zeros((2, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="same length, got 3 and 4"):
        vplot.plot_residual_vs_target(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="labels must be two strings"):
        vplot.plot_residual_vs_target(np.zeros(3), np.zeros(3), labels=("only one",))


# ------------------------------------------------------------------------ module level


def test_no_function_changes_rcparams_or_calls_show(monkeypatch, patterns):
    before = dict(matplotlib.rcParams)
    monkeypatch.setattr(plt, "show", lambda *a, **k: pytest.fail("plt.show() was called"))
    vplot.plot_attention_grid(patterns[:, 0])
    vplot.plot_score_grid(np.eye(2))
    vplot.plot_loss([0, 1], [1.0, 0.5])
    assert dict(matplotlib.rcParams) == before


def test_import_without_matplotlib_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    try:
        with pytest.raises(ImportError, match=r'pip install "vecinterp\[plot\]"'):
            importlib.reload(vplot)
    finally:
        monkeypatch.undo()
        importlib.reload(vplot)  # leave a complete module for the other tests
    assert callable(vplot.plot_attention)


def test_docstring_examples_run():
    result = doctest.testmod(vplot, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
