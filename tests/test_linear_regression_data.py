"""Tests of the in-context linear-regression prompts (vecinterp.tasks.linear_regression)."""

import pytest
import torch

import vecinterp as vi
from vecinterp.tasks import linear_regression as lr


def unwrapped(fn):
    """``fn`` without the test suite's runtime type checker, as users run it: its own
    checks must still give clear errors."""
    return getattr(fn, "__wrapped__", fn)


FIELDS = ("inputs", "targets", "loss_mask", "xs", "ys", "w")


def test_interleaving_masks_and_targets():
    b = lr.generate(16, dim=4, n_points=6, seed=0, dtype=torch.float64)
    assert b.inputs.shape == (16, 12, 4) and b.targets.shape == (16, 12, 1)
    assert b.loss_mask.shape == (16, 12) and b.loss_mask.dtype == torch.bool
    assert b.xs.shape == (16, 6, 4) and b.ys.shape == (16, 6) and b.w.shape == (16, 4)
    assert (b.n_points, b.dim) == (6, 4)
    # x_i at even positions, y_i in the first coordinate of the odd ones, zeros elsewhere
    assert torch.equal(b.inputs[:, 0::2], b.xs)
    assert torch.equal(b.inputs[:, 1::2, 0], b.ys)
    assert torch.equal(b.inputs[:, 1::2, 1:], torch.zeros(16, 6, 3, dtype=torch.float64))
    # the prediction of y_i is read at x_i's position; y positions are masked out
    assert b.loss_mask[0].tolist() == [True, False] * 6
    assert torch.equal(b.loss_mask, b.loss_mask[:1].expand(16, -1))
    assert torch.equal(b.targets[:, 0::2, 0], b.ys)
    assert torch.equal(b.targets[:, 1::2], torch.zeros(16, 6, 1, dtype=torch.float64))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_y_is_w_dot_x(dtype, tol):
    b = lr.generate(64, dim=5, n_points=11, seed=1, dtype=dtype)
    expected = torch.einsum("bkd,bd->bk", b.xs.double(), b.w.double())
    scale = expected.abs().max().item()
    assert (b.ys.double() - expected).abs().max().item() <= tol * max(scale, 1)
    assert all(getattr(b, f).dtype == dtype for f in FIELDS if f != "loss_mask")


def test_noise_has_the_asked_standard_deviation():
    b = lr.generate(4000, dim=3, n_points=10, noise_std=0.5, seed=2, dtype=torch.float64)
    residual = b.ys - torch.einsum("bkd,bd->bk", b.xs, b.w)
    # 40,000 draws: the sample std is within ~0.0018 (1 sigma) of 0.5
    assert abs(residual.std().item() - 0.5) < 0.01
    assert abs(residual.mean().item()) < 0.01


def test_sparsity_keeps_s_coordinates_spread_over_all():
    b = lr.generate(3000, dim=6, n_points=4, sparsity=2, seed=3, dtype=torch.float64)
    assert ((b.w != 0).sum(dim=1) == 2).all()
    counts = (b.w != 0).sum(dim=0).double() / 3000  # each coordinate kept with prob 1/3
    assert (counts - 1 / 3).abs().max() < 0.04
    dense = lr.generate(10, dim=6, n_points=4, sparsity=6, seed=3)
    assert (dense.w != 0).all()


def test_distribution_is_standard_normal():
    b = lr.generate(4000, dim=5, n_points=10, seed=4, dtype=torch.float64)
    for sample in (b.xs.reshape(-1), b.w.reshape(-1)):
        assert abs(sample.mean().item()) < 0.03 and abs(sample.std().item() - 1) < 0.03
    assert abs(b.ys.var().item() - 5) < 0.3  # E[y^2] = E|w|^2 = dim


def test_seeds_reproducible_and_streams():
    a = lr.generate(8, dim=3, n_points=5, seed=7)
    b = lr.generate(8, dim=3, n_points=5, generator=torch.Generator().manual_seed(7))
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert not torch.equal(a.xs, lr.generate(8, dim=3, n_points=5, seed=8).xs)
    torch.manual_seed(5)
    g1 = lr.generate(8, dim=3, n_points=5)
    torch.manual_seed(5)
    assert torch.equal(g1.xs, lr.generate(8, dim=3, n_points=5).xs)
    stream = lr.batches(8, dim=3, n_points=5, seed=7)
    first, second = next(stream), next(stream)
    assert torch.equal(first.inputs, a.inputs)
    gen = torch.Generator().manual_seed(7)
    lr.generate(8, dim=3, n_points=5, generator=gen)
    assert torch.equal(second.inputs, lr.generate(8, dim=3, n_points=5, generator=gen).inputs)


def test_float32_is_the_float64_draw_rounded():
    a = lr.generate(8, dim=3, n_points=5, seed=9, dtype=torch.float64)
    b = lr.generate(8, dim=3, n_points=5, seed=9, dtype=torch.float32)
    assert torch.equal(a.inputs.float(), b.inputs)


def test_trains_with_vi_train_and_the_config():
    cfg = vi.VectorTransformerConfig(**{**lr.MODEL_CONFIG_KWARGS, "n_layers": 1, "d_mlp": 16})
    model = vi.HookedVectorTransformer(cfg, seed=0)
    batch = lr.generate(4, seed=0)
    assert model(batch.inputs).shape == batch.targets.shape
    loss = vi.evaluate(model, batch)
    masked = (model(batch.inputs) - batch.targets)[batch.loss_mask].pow(2).mean().item()
    assert loss == pytest.approx(masked, rel=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"dim": 0}, "dim must be an int >= 1"),
        ({"n_points": 1.5}, "n_points must be an int >= 1"),
        ({"noise_std": -0.1}, "noise_std must be a finite float >= 0"),
        ({"noise_std": float("nan")}, "noise_std must be a finite float >= 0"),
        ({"noise_std": "0.1"}, "noise_std must be a float >= 0"),
        ({"sparsity": 0}, "sparsity must be an int >= 1"),
        ({"sparsity": 4, "dim": 3}, "sparsity must be at most dim = 3, got 4"),
        ({"dtype": torch.int64}, "dtype must be one of"),
        ({"device": "gpu7"}, "device must be a valid torch device"),
        ({"seed": 1, "generator": torch.Generator()}, "at most one of seed and generator"),
        ({"seed": -1}, r"seed must be an int in \[0, 2\*\*64\)"),
    ],
)
def test_bad_inputs_are_refused(kwargs, match):
    kwargs = {"batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        unwrapped(lr.generate)(**kwargs)


def test_batches_checks_arguments_at_once():
    with pytest.raises(ValueError, match="n_points must be an int >= 1"):
        unwrapped(lr.batches)(2, seed=0, n_points=0)
