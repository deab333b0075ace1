"""Emergence tracking over checkpoints: exact values against a hand computation, the table,
the plot, and bad inputs."""

import math

import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg
from vecinterp.analysis.emergence import EmergenceTable, emergence, path_attention
from vecinterp.tasks import retrieval as R

DEPTH, CHAINS = 2, 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny retrieval model trained 6 steps with a checkpoint every 2 (float64)."""
    ckdir = tmp_path_factory.mktemp("emergence") / "ck"
    cfg = R.model_config(DEPTH, 2, n_chains=CHAINS, d_model=8, n_heads=2, attn_only=True)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    vi.train(
        model,
        lambda step, g: R.generate(16, DEPTH, n_chains=CHAINS, generator=g, dtype=torch.float64),
        steps=6,
        lr=3e-2,
        checkpoint_dir=ckdir,
        checkpoint_every=2,
        keep_last=None,
        progress=False,
        device="cpu",
    )
    batch = R.generate(5, DEPTH, n_chains=CHAINS, seed=1, dtype=torch.float64)
    return ckdir, batch


def _paths():
    return {
        "pair": (0, 1, lambda b: b.right_pos, lambda b: b.left_pos),
        "q->R0": (1, 0, lambda b: b.query_pos, lambda b: b.right_pos[:, :, 0]),
        "last->0": (-1, 1, -1, 0),
    }


def _by_hand(model, batch):
    """The same averages with explicit loops over sequences and chains."""
    with torch.no_grad():
        out, cache = model.run_with_cache(batch.inputs)
    p0, p1 = cache["pattern", 0], cache["pattern", 1]
    B = batch.inputs.shape[0]
    pair = [
        float(p0[b, 1, batch.right_pos[b, c, i], batch.left_pos[b, c, i]])
        for b in range(B)
        for c in range(CHAINS)
        for i in range(DEPTH)
    ]
    q = [
        float(p1[b, 0, batch.query_pos[b, c], batch.right_pos[b, c, 0]])
        for b in range(B)
        for c in range(CHAINS)
    ]
    last = [float(p1[b, 1, batch.n_pos - 1, 0]) for b in range(B)]
    parts = R.partial_losses(out, batch)
    return {
        "pair": sum(pair) / len(pair),
        "q->R0": sum(q) / len(q),
        "last->0": sum(last) / len(last),
        "x_1": float(parts[0]),
        "x_2": float(parts[1]),
    }


def _losses(batch):
    def fn(model):
        parts = R.partial_losses(model(batch.inputs), batch)
        return {f"x_{j + 1}": parts[j] for j in range(DEPTH)}

    return fn


def test_table_matches_a_hand_computation_from_the_checkpoints(run):
    ckdir, batch = run
    table = emergence(ckdir, batch, _paths(), _losses(batch), progress=False)
    assert table.steps == [2, 4, 6]
    assert table.names == ["pair", "q->R0", "last->0", "x_1", "x_2"]
    assert len(table) == 15
    for step in (2, 4, 6):
        model = vi.load(ckdir / f"step_{step:08d}" / "model")
        expected = _by_hand(model, batch)
        for name, value in expected.items():
            assert math.isclose(table.value(step, name), value, rel_tol=1e-12, abs_tol=1e-15)
    # the checkpoints differ, so the column is not constant
    assert len(set(table.column("pair"))) == 3


def test_every_checkpoint_form_gives_the_same_table(run):
    ckdir, batch = run
    dirs = [ckdir / f"step_{s:08d}" for s in (6, 2, 4)]  # any order: sorted by step
    reference = emergence(ckdir, batch, _paths(), progress=False)
    from_dirs = emergence(dirs, batch, _paths(), progress=False)
    from_model_dirs = emergence([d / "model" for d in dirs], batch, _paths(), progress=False)
    pairs = [(s, vi.load(ckdir / f"step_{s:08d}" / "model")) for s in (2, 4, 6)]
    from_pairs = emergence(pairs, batch, _paths(), progress=False)
    assert from_dirs.rows == reference.rows
    assert from_model_dirs.rows == reference.rows
    assert from_pairs.rows == reference.rows


def test_path_attention_with_tensor_int_and_broadcast_indices(run):
    ckdir, batch = run
    model = vi.load(ckdir / "step_00000006" / "model")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.inputs)
    p1 = cache["pattern", 1][:, 0]
    # one dest per sequence, k sources: broadcast [batch, 1] against [batch, k]
    dest = batch.query_pos[:, 0]
    src = batch.left_pos[:, 0, :]
    got = path_attention(model, batch.inputs, {"a": (1, 0, dest, src)})["a"]
    rows = torch.arange(5)[:, None]
    assert math.isclose(got, float(p1[rows, dest[:, None], src].mean()), rel_tol=1e-12)
    # negative ints count from the end; a plain tensor as data works
    got = path_attention(model, batch.inputs, {"b": (1, 0, -1, -2)})["b"]
    assert math.isclose(got, float(p1[:, -1, -2].mean()), rel_tol=1e-12)


def test_path_attention_hand_worked_values():
    cfg = tiny_cfg(n_layers=1)
    model = random_model(cfg)
    x = torch.randn(2, 5, cfg.d_in, dtype=torch.float64)
    got = path_attention(model, x, {"self0": (0, 0, 0, 0), "future": (0, 1, 1, 3)})
    assert got == {"self0": 1.0, "future": 0.0}  # causal: row 0 is all on 0, no look-ahead
    # a row of the pattern sums to 1
    total = sum(path_attention(model, x, {f"s{s}": (0, 0, 4, s) for s in range(5)}).values())
    assert math.isclose(total, 1.0, rel_tol=1e-12)


def test_model_is_left_as_it_was():
    model = random_model(tiny_cfg())
    model.train()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    emergence([(0, model)], x, {"a": (0, 0, 1, 0)}, lambda m: {"l": 1.0}, progress=False)
    assert model.training
    assert not any(model.hook_point(n).has_hooks for n in model.hook_names())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


# ------------------------------------------------------------------------------ the table


def test_table_accessors_csv_and_dict(tmp_path):
    table = EmergenceTable(((0, "a", 0.0), (0, "l", 1.0), (10, "a", 0.25), (10, "l", 0.5),
                            (20, "a", 0.75), (20, "l", 0.25)))  # fmt: skip
    assert table.series("a") == ([0, 10, 20], [0.0, 0.25, 0.75])
    assert table.column("l") == [1.0, 0.5, 0.25]
    assert table.to_dict() == {
        "step": [0, 0, 10, 10, 20, 20],
        "name": ["a", "l", "a", "l", "a", "l"],
        "value": [0.0, 1.0, 0.25, 0.5, 0.75, 0.25],
    }
    # 0.5 is crossed between 10 (0.25) and 20 (0.75): halfway
    assert table.crossing_step("a", 0.5) == 15.0
    assert table.crossing_step("a", 0.5, interpolate=False) == 20.0
    assert table.crossing_step("l", 0.75, above=False) == 5.0
    assert table.crossing_step("l", 2.0, above=False) == 0.0
    assert table.crossing_step("a", 0.9) is None
    path = table.to_csv(tmp_path / "t.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "step,name,value" and lines[4] == "10,l,0.5" and len(lines) == 7


def test_table_bad_rows_and_names():
    with pytest.raises(TypeError, match="row"):
        EmergenceTable(((0.5, "a", 1.0),))
    with pytest.raises(ValueError, match="two rows for step 0"):
        EmergenceTable(((0, "a", 1.0), (0, "a", 2.0)))
    table = EmergenceTable(((0, "a", 1.0),))
    with pytest.raises(KeyError, match="no quantity 'b'"):
        table.column("b")
    with pytest.raises(KeyError, match="no row for step 1"):
        table.value(1, "a")


# ------------------------------------------------------------------------------ errors


@pytest.fixture(scope="module")
def small():
    model = random_model(tiny_cfg())
    return model, torch.randn(2, 4, 3, dtype=torch.float64)


def test_nothing_to_measure(small):
    model, x = small
    with pytest.raises(ValueError, match="nothing to measure"):
        emergence([(0, model)], x)


def test_paths_without_data(small):
    model, _ = small
    with pytest.raises(ValueError, match="paths need data"):
        emergence([(0, model)], None, {"a": (0, 0, 1, 0)})


@pytest.mark.parametrize(
    "paths, error, match",
    [
        ({"a": (0, 0, 1)}, ValueError, r"must be \(layer, head, dest, src\)"),
        ({"a": [0, 0, 1]}, ValueError, r"must be \(layer, head, dest, src\)"),
        ({"a": (5, 0, 1, 0)}, ValueError, "layer must be an int"),
        ({"a": (0, 9, 1, 0)}, ValueError, "head must be an int"),
        ({"a": (0, 0, 4, 0)}, ValueError, r"dest positions must lie in \[-4, 3\]"),
        ({"a": (0, 0, 1, torch.tensor([0.0, 1.0]))}, TypeError, "src must hold integer"),
        ({"a": (0, 0, torch.zeros(3, dtype=torch.long), 0)}, ValueError, r"\[batch=2\]"),
        ({"a": (0, 0, "x", 0)}, TypeError, "dest must be an int, an integer tensor"),
        (
            {"a": (0, 0, torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))},
            ValueError,
            "do not broadcast",
        ),
        ({}, ValueError, "paths is empty"),
        ([(0, 0, 1, 0)], TypeError, "paths"),
    ],
)
def test_bad_paths(small, paths, error, match):
    model, x = small
    with pytest.raises(error, match=match):
        path_attention(model, x, paths)


def test_bad_data(small):
    model, _ = small
    with pytest.raises(TypeError, match="data must be an input tensor"):
        path_attention(model, [1, 2], {"a": (0, 0, 0, 0)})
    with pytest.raises(ValueError, match="d_in"):
        path_attention(model, torch.randn(2, 4, 5, dtype=torch.float64), {"a": (0, 0, 0, 0)})


def test_bad_checkpoints(small, tmp_path):
    model, x = small
    paths = {"a": (0, 0, 1, 0)}
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        emergence(tmp_path / "missing", x, paths)
    with pytest.raises(ValueError, match="holds no checkpoint"):
        emergence(tmp_path, x, paths)
    with pytest.raises(ValueError, match="checkpoints is empty"):
        emergence([], x, paths)
    with pytest.raises(ValueError, match="same step"):
        emergence([(1, model), (1, model)], x, paths, progress=False)
    with pytest.raises(TypeError, match="int step"):
        emergence([(1.0, model)], x, paths)
    with pytest.raises(TypeError, match="path or a \\(step, model\\) pair"):
        emergence([model], x, paths)
    with pytest.raises(TypeError, match="checkpoints"):
        emergence(model, x, paths)
    vi.save(model, tmp_path / "no_step")
    with pytest.raises(ValueError, match="cannot tell the training step"):
        emergence([tmp_path / "no_step"], x, paths)


def test_bad_losses(small):
    model, x = small
    with pytest.raises(TypeError, match="losses"):
        emergence([(0, model)], x, losses={"a": 1.0})
    cases = [
        (lambda m: [1.0], TypeError, "must return a dict"),
        (lambda m: {"a": "x"}, TypeError, "loss 'a' must be a number"),
        (lambda m: {"a": torch.ones(2)}, ValueError, "single number"),
        (lambda m: {"a": float("nan")}, ValueError, "not finite"),
        (lambda m: {"p": 1.0}, ValueError, "also a path name"),
    ]
    for fn, error, match in cases:
        with pytest.raises(error, match=match):
            emergence([(0, model)], x, {"p": (0, 0, 1, 0)}, fn, progress=False)


# ------------------------------------------------------------------------------ the plot


def test_plot_emergence_renders_with_agg():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vecinterp.plot import plot_emergence

    table = EmergenceTable(((0, "a", 0.1), (0, "l", 1.0), (10, "a", 0.9), (10, "l", 0.01),
                            (30, "a", 0.95), (30, "l", 0.001)))  # fmt: skip
    ax = plot_emergence(table, ["a"], threshold=0.5, title="attention")
    assert [line.get_label() for line in ax.lines][:1] == ["a"]
    assert list(ax.lines[0].get_xdata()) == [0, 10, 30]
    assert list(ax.lines[0].get_ydata()) == [0.1, 0.9, 0.95]
    assert ax.get_xlabel() == "step" and ax.get_title() == "attention"
    assert ax.get_yscale() == "linear"
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in ax.lines[1:])  # threshold
    plt.close(ax.figure)

    ax = plot_emergence(table.to_dict(), ["l"], log=True, ylabel="loss")
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "loss"
    low, high = ax.get_ylim()
    assert low <= 0.001 and high >= 1.0
    ax.figure.canvas.draw()
    plt.close(ax.figure)

    ax = plot_emergence(table)  # every quantity
    assert [line.get_label() for line in ax.lines] == ["a", "l"]
    plt.close(ax.figure)


def test_plot_emergence_bad_inputs():
    pytest.importorskip("matplotlib")
    from vecinterp.plot import plot_emergence

    table = EmergenceTable(((0, "a", 0.1),))
    with pytest.raises(KeyError, match="no quantity 'b'"):
        plot_emergence(table, ["b"])
    with pytest.raises(TypeError, match="table must be an EmergenceTable"):
        plot_emergence([1, 2, 3])
    with pytest.raises(ValueError, match="names must be"):
        plot_emergence(table, "a")
