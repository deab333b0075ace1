"""masked_mse: hand-worked values for every mask shape and reduction, errors, gradients."""

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked

F64 = torch.float64


@pytest.fixture
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    """pred = 0 and targets whose squared errors, averaged over d_out=2, are
    [[1, 2, 4.5], [0, 1, 4]] at the (batch, pos) positions."""
    target = torch.tensor(
        [
            [[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]],
            [[0.0, 0.0], [1.0, -1.0], [2.0, 2.0]],
        ],
        dtype=F64,
    )
    return torch.zeros_like(target), target


PER_POS = torch.tensor([[1.0, 2.0, 4.5], [0.0, 1.0, 4.0]], dtype=F64)


def test_no_mask_is_plain_mse(pair):
    pred, target = pair
    assert float(vi.masked_mse(pred, target)) == pytest.approx(12.5 / 6, abs=1e-15)
    assert float(vi.masked_mse(pred, target, reduction="sum")) == pytest.approx(12.5, abs=1e-15)
    assert torch.equal(vi.masked_mse(pred, target, reduction="none"), PER_POS)
    pred = torch.randn(4, 5, 3, dtype=F64)
    target = torch.randn(4, 5, 3, dtype=F64)
    torch.testing.assert_close(
        vi.masked_mse(pred, target), torch.nn.functional.mse_loss(pred, target)
    )


def test_batch_pos_mask_hand_worked(pair):
    pred, target = pair
    mask = torch.tensor([[True, True, False], [False, True, True]])
    # selected: 1, 2 (batch 0) and 1, 4 (batch 1)
    assert float(vi.masked_mse(pred, target, mask)) == pytest.approx(2.0, abs=1e-15)
    assert float(vi.masked_mse(pred, target, mask, reduction="sum")) == pytest.approx(8.0)
    none = vi.masked_mse(pred, target, mask, reduction="none")
    assert none.shape == (2, 3)
    assert torch.equal(none, torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 4.0]], dtype=F64))


def test_pos_mask_broadcasts_over_batch(pair):
    pred, target = pair
    mask = torch.tensor([False, True, True])
    # selected: 2, 4.5 (batch 0) and 1, 4 (batch 1)
    assert float(vi.masked_mse(pred, target, mask)) == pytest.approx(11.5 / 4, abs=1e-15)
    assert float(vi.masked_mse(pred, target, mask, reduction="sum")) == pytest.approx(11.5)
    expected = torch.tensor([[0.0, 2.0, 4.5], [0.0, 1.0, 4.0]], dtype=F64)
    assert torch.equal(vi.masked_mse(pred, target, mask, reduction="none"), expected)
    full = mask.expand(2, 3)
    assert torch.equal(vi.masked_mse(pred, target, mask), vi.masked_mse(pred, target, full))


def test_docstring_example():
    y, t = torch.zeros(1, 3, 2), torch.ones(1, 3, 2)
    assert float(vi.masked_mse(y, t, torch.tensor([False, True, True]))) == 1.0


def test_mean_is_sum_over_count():
    gen = torch.Generator().manual_seed(0)
    pred = torch.randn(3, 6, 4, generator=gen, dtype=F64)
    target = torch.randn(3, 6, 4, generator=gen, dtype=F64)
    mask = torch.rand(3, 6, generator=gen) > 0.5
    mean = vi.masked_mse(pred, target, mask)
    total = vi.masked_mse(pred, target, mask, reduction="sum")
    none = vi.masked_mse(pred, target, mask, reduction="none")
    torch.testing.assert_close(mean, total / mask.sum(), rtol=1e-14, atol=0)
    torch.testing.assert_close(total, none.sum(), rtol=1e-14, atol=0)
    reference = ((pred - target) ** 2).mean(-1)[mask].mean()
    torch.testing.assert_close(mean, reference, rtol=1e-14, atol=0)


def test_masked_out_values_do_not_matter(pair):
    pred, target = pair
    mask = torch.tensor([[True, True, False], [False, True, True]])
    wild = target.clone()
    wild[0, 2] = 1e30
    wild[1, 0] = -7.0
    for reduction in ("mean", "sum", "none"):
        assert torch.equal(
            vi.masked_mse(pred, target, mask, reduction=reduction),
            vi.masked_mse(pred, wild, mask, reduction=reduction),
        )


def test_non_finite_values_at_masked_out_positions_are_ignored(pair):
    """Positions without a target (e.g. the last one, which has no next vector) are
    natural to fill with NaN; a masked-out position must not reach the loss at all."""
    pred, target = pair
    mask = torch.tensor([[True, True, False], [False, True, True]])
    holes = target.clone()
    holes[0, 2] = float("nan")
    holes[1, 0] = float("inf")
    assert float(vi.masked_mse(pred, holes, mask)) == pytest.approx(2.0, abs=1e-15)
    assert float(vi.masked_mse(pred, holes, mask, reduction="sum")) == pytest.approx(8.0)
    none = vi.masked_mse(pred, holes, mask, reduction="none")
    assert torch.equal(none, torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 4.0]], dtype=F64))
    pred = pred.clone().requires_grad_(True)
    vi.masked_mse(pred, holes, mask).backward()
    assert pred.grad is not None
    assert torch.equal(pred.grad[~mask], torch.zeros(2, 2, dtype=F64))
    assert bool(torch.isfinite(pred.grad).all())


def test_gradient_flows_only_through_selected_positions():
    gen = torch.Generator().manual_seed(1)
    pred = torch.randn(2, 4, 3, generator=gen, dtype=F64).requires_grad_(True)
    target = torch.randn(2, 4, 3, generator=gen, dtype=F64)
    mask = torch.tensor([[True, False, True, False], [False, False, True, True]])
    vi.masked_mse(pred, target, mask).backward()
    grad = pred.grad
    assert grad is not None
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    # d/dy of sum_{selected} |y - t|^2 / (|M| d_out)
    expected = 2 * (pred - target).detach() / (int(mask.sum()) * 3)
    torch.testing.assert_close(grad[mask], expected[mask], rtol=1e-14, atol=0)
    assert bool((grad[mask] != 0).all())


def test_gradient_with_pos_mask_and_sum():
    gen = torch.Generator().manual_seed(2)
    pred = torch.randn(3, 4, 2, generator=gen, dtype=F64).requires_grad_(True)
    target = torch.randn(3, 4, 2, generator=gen, dtype=F64)
    mask = torch.tensor([False, True, True, False])
    vi.masked_mse(pred, target, mask, reduction="sum").backward()
    assert pred.grad is not None
    assert torch.equal(pred.grad[:, ~mask], torch.zeros(3, 2, 2, dtype=F64))
    expected = 2 * (pred - target).detach()[:, mask] / 2
    torch.testing.assert_close(pred.grad[:, mask], expected, rtol=1e-14, atol=0)


def test_model_loss_is_masked_mse():
    cfg = tiny_cfg()
    model = random_model(cfg)
    x = random_input(cfg, batch=2)
    targets = random_input(cfg.replace(d_in=cfg.d_out), batch=2, seed=5)
    mask = torch.tensor([i % 2 == 0 for i in range(cfg.n_ctx)])
    y, loss = model(x, targets=targets, loss_mask=mask, return_type="both")
    assert torch.equal(loss, vi.masked_mse(y, targets, mask))
    assert torch.equal(model(x, targets=targets, loss_mask=mask, return_type="loss"), loss)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "target_shape", [(2, 3, 3), (2, 4, 2), (3, 3, 2), (3, 2)], ids=["d_out", "pos", "batch", "rank"]
)
def test_shape_mismatch(pair, target_shape):
    pred, _ = pair
    target = torch.zeros(target_shape, dtype=F64)
    # the test suite's shape checks (a TypeError) may reject it first ...
    with pytest.raises((TypeError, ValueError)):
        vi.masked_mse(pred, target)
    # ... and without them, masked_mse's own check names both shapes
    with unchecked(), pytest.raises(ValueError, match=r"\(2, 3, 2\).*differ in shape"):
        vi.masked_mse(pred, target)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.uint8])
def test_non_bool_mask(pair, dtype):
    pred, target = pair
    mask = torch.ones(2, 3, dtype=dtype)
    with pytest.raises(TypeError):
        vi.masked_mse(pred, target, mask)
    with unchecked(), pytest.raises(TypeError, match="bool"):
        vi.masked_mse(pred, target, mask)


@pytest.mark.parametrize("mask_shape", [(3, 2), (2,), (4,), (2, 3, 1), (1, 3)])
def test_wrong_mask_shape(pair, mask_shape):
    pred, target = pair
    mask = torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises((TypeError, ValueError)):
        vi.masked_mse(pred, target, mask)
    with unchecked(), pytest.raises(ValueError, match=r"loss_mask must have shape"):
        vi.masked_mse(pred, target, mask)


@pytest.mark.parametrize("mask", [torch.zeros(2, 3, dtype=torch.bool), torch.zeros(3) > 0])
def test_all_false_mask(pair, mask):
    pred, target = pair
    with pytest.raises(ValueError, match="selects no position"):
        vi.masked_mse(pred, target, mask)


@pytest.mark.parametrize("reduction", ["avg", "Mean", ""])
def test_bad_reduction(pair, reduction):
    pred, target = pair
    with pytest.raises(ValueError, match="reduction must be"):
        vi.masked_mse(pred, target, reduction=reduction)
