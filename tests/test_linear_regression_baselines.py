"""Tests of the in-context regression baselines: hand-worked values, numpy per prompt."""

import time

import numpy as np
import pytest
import torch

from vecinterp.tasks import linear_regression as lr

F64 = torch.float64


def unwrapped(fn):
    """``fn`` without the test suite's runtime type checker, as users run it."""
    return getattr(fn, "__wrapped__", fn)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def looped(fn, xs: torch.Tensor, ys: torch.Tensor) -> np.ndarray:
    """Per-prompt, per-prefix numpy reference: fn(X_prefix, y_prefix, x_query) -> float."""
    x, y = xs.double().numpy(), ys.double().numpy()
    out = np.zeros(y.shape)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[b, i] = 0.0 if i == 0 else fn(x[b, :i], y[b, :i], x[b, i])
    return out


def assert_close(actual: torch.Tensor, expected, tol: float) -> None:
    expected = torch.as_tensor(np.asarray(expected), dtype=F64)
    assert actual.dtype == F64 and actual.shape == expected.shape
    error = (actual - expected).abs().max().item()
    assert error <= tol, f"max abs error {error:.3g} > {tol:.3g}"


# --- least squares ---------------------------------------------------------------------


def test_least_squares_hand_worked_d2():
    # w = (2, 3). One point x = (1, 0): min-norm w_hat = (2, 0); at x = (1, 1) -> 2.
    # Two points (1, 0), (1, 1) determine w exactly: 2*2 + 3*3 = 13 at (2, 3).
    xs = t([[[1.0, 0.0], [1.0, 1.0], [2.0, 3.0], [-1.0, 4.0]]])
    ys = t([[2.0, 5.0, 13.0, 10.0]])
    assert_close(lr.least_squares(xs, ys), [[0.0, 2.0, 13.0, 10.0]], 1e-12)


def test_least_squares_min_norm_below_dim_by_hand():
    # one point x = (3, 4), y = 10: min-norm w_hat = y x / |x|^2 = (1.2, 1.6); at (1, 1): 2.8
    xs = t([[[3.0, 4.0, 0.0], [1.0, 1.0, 0.0]]])
    ys = t([[10.0, 0.0]])
    assert_close(lr.least_squares(xs, ys), [[0.0, 2.8]], 1e-12)


def test_least_squares_rank_deficient_repeated_point():
    # the same point twice with different y: the LS fit averages them (y = 1, 3 -> 2),
    # min-norm along x = (1, 1): w_hat = (1, 1); at (2, 0): 2
    xs = t([[[1.0, 1.0], [1.0, 1.0], [2.0, 0.0]]])
    ys = t([[1.0, 3.0, 0.0]])
    assert_close(lr.least_squares(xs, ys), [[0.0, 1.0, 2.0]], 1e-12)


def test_least_squares_exact_past_dim_noiseless():
    b = lr.generate(200, dim=4, n_points=10, seed=0, dtype=F64)
    pred = lr.least_squares(b.xs, b.ys)
    assert_close(pred[:, 4:], b.ys[:, 4:], 1e-9)
    assert (pred[:, 1:4] - b.ys[:, 1:4]).abs().max() > 0.1  # below d it cannot be exact


def test_least_squares_matches_numpy_lstsq_per_prompt():
    b = lr.generate(12, dim=4, n_points=9, noise_std=0.3, seed=1, dtype=F64)
    expected = looped(lambda X, y, q: q @ np.linalg.lstsq(X, y, rcond=None)[0], b.xs, b.ys)
    assert_close(lr.least_squares(b.xs, b.ys), expected, 1e-10)


# --- ridge -----------------------------------------------------------------------------


def test_ridge_hand_worked():
    # one point x = 2, y = 4, alpha = 1: w_hat = 2*4 / (4 + 1) = 1.6; at x = 1: 1.6
    assert_close(lr.ridge(t([[[2.0], [1.0]]]), t([[4.0, 3.0]]), alpha=1.0), [[0.0, 1.6]], 1e-12)


def test_ridge_matches_numpy_per_prompt_and_tends_to_least_squares():
    b = lr.generate(10, dim=3, n_points=8, noise_std=0.5, seed=2, dtype=F64)
    alpha = 0.25

    def fit(X, y, q):
        return q @ np.linalg.solve(X.T @ X + alpha * np.eye(X.shape[1]), X.T @ y)

    assert_close(lr.ridge(b.xs, b.ys, alpha), looped(fit, b.xs, b.ys), 1e-10)
    small = lr.ridge(b.xs, b.ys, 1e-9)
    assert_close(small[:, 4:], lr.least_squares(b.xs, b.ys)[:, 4:], 1e-6)


# --- nearest neighbours ----------------------------------------------------------------


def test_nearest_neighbours_hand_worked():
    xs = t([[[0.0], [3.0], [1.0], [2.0], [10.0]]])
    ys = t([[1.0, 2.0, 4.0, 0.0, 5.0]])
    # pos 1: only x=0 -> 1; pos 2: both -> 1.5; pos 3 (x=2): x=1, x=3 nearest -> (4+2)/2 = 3;
    # pos 4 (x=10): x=3, x=2 -> (2+0)/2 = 1
    assert_close(lr.nearest_neighbours(xs, ys, n_neighbors=2), [[0.0, 1.0, 1.5, 3.0, 1.0]], 0)


def test_nearest_neighbours_ties_go_to_the_earlier_point():
    # query x = 0 at distance 1 from x = 1 (j=0), x = -1 (j=1) and x = 1 (j=2): with
    # n_neighbors = 2 the two earliest, y = 10 and 20, are averaged
    xs = t([[[1.0], [-1.0], [1.0], [0.0]]])
    ys = t([[10.0, 20.0, 40.0, 0.0]])
    assert lr.nearest_neighbours(xs, ys, n_neighbors=2)[0, 3].item() == 15.0
    # a tie at the boundary between the third and fourth nearest: the earliest three win
    xs = t([[[1.0], [-1.0], [1.0], [-1.0], [0.0]]])
    ys = t([[3.0, 6.0, 9.0, 100.0, 0.0]])
    assert lr.nearest_neighbours(xs, ys)[0, 4].item() == 6.0


def test_nearest_neighbours_matches_numpy_per_prompt():
    b = lr.generate(12, dim=3, n_points=9, seed=3, dtype=F64)

    def knn(X, y, q):
        dist = np.linalg.norm(X - q, axis=1)
        return y[np.argsort(dist, kind="stable")[:3]].mean()

    assert_close(lr.nearest_neighbours(b.xs, b.ys), looped(knn, b.xs, b.ys), 1e-12)


# --- averaging and zero ----------------------------------------------------------------


def test_averaging_hand_worked():
    xs = t([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])
    ys = t([[3.0, 4.0, 0.0]])
    # pos 1: w_hat = 3 (1, 0) = (3, 0), at (0, 2) -> 0; pos 2: ((3, 0) + (0, 8)) / 2 = (1.5, 4)
    assert_close(lr.averaging(xs, ys), [[0.0, 0.0, 5.5]], 1e-12)


def test_averaging_matches_numpy_per_prompt():
    b = lr.generate(12, dim=3, n_points=9, seed=4, dtype=F64)
    expected = looped(lambda X, y, q: q @ (y[:, None] * X).mean(axis=0), b.xs, b.ys)
    assert_close(lr.averaging(b.xs, b.ys), expected, 1e-12)


def test_zero_and_the_baselines_table():
    b = lr.generate(3, dim=2, n_points=4, seed=5)
    assert torch.equal(lr.zero(b.xs, b.ys), torch.zeros(3, 4, dtype=F64))
    assert set(lr.BASELINES) == {"least_squares", "3-nearest_neighbours", "averaging", "zero"}
    for fn in lr.BASELINES.values():
        pred = fn(b.xs, b.ys)
        assert pred.shape == (3, 4) and pred.dtype == F64
        assert torch.equal(pred[:, 0], torch.zeros(3, dtype=F64))  # nothing seen: predict 0


def test_float32_inputs_are_computed_in_float64():
    b64 = lr.generate(6, dim=3, n_points=6, seed=6, dtype=F64)
    b32 = lr.generate(6, dim=3, n_points=6, seed=6)
    for fn in lr.BASELINES.values():
        assert torch.equal(fn(b32.xs, b32.ys), fn(b32.xs.double(), b32.ys.double()))
        assert_close(fn(b32.xs, b32.ys), fn(b64.xs, b64.ys), 1e-4)


def test_batched_speed_has_no_per_prompt_loop():
    b = lr.generate(1000, dim=5, n_points=11, seed=7, dtype=F64)
    start = time.perf_counter()
    for fn in lr.BASELINES.values():
        fn(b.xs, b.ys)
    lr.ridge(b.xs, b.ys, 0.1)
    # ~1 s on a loaded 2-core machine (11,000 small SVDs); a Python loop over the
    # 11,000 prompt-prefix pairs costs ~10x that
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((np.zeros((2, 3, 2)), torch.zeros(2, 3)), TypeError, "xs must be a torch.Tensor"),
        ((torch.zeros(2, 3, 2, dtype=torch.int64), torch.zeros(2, 3)), TypeError, "floating"),
        ((torch.zeros(3, 2), torch.zeros(3)), ValueError, r"xs must be \[batch, k, dim\]"),
        ((torch.zeros(2, 3, 2), torch.zeros(2, 4)), ValueError, r"ys must be \[batch, k\]"),
        ((torch.full((1, 2, 2), float("nan")), torch.zeros(1, 2)), ValueError, "finite"),
    ],
)
def test_bad_inputs_are_refused(args, error, match):
    for fn in lr.BASELINES.values():
        with pytest.raises(error, match=match):
            unwrapped(fn)(*args)


def test_bad_parameters_are_refused():
    xs, ys = torch.zeros(1, 2, 2), torch.zeros(1, 2)
    with pytest.raises(ValueError, match="alpha must be a finite float > 0"):
        lr.ridge(xs, ys, 0.0)
    with pytest.raises(TypeError, match="alpha must be a float"):
        unwrapped(lr.ridge)(xs, ys, "1")
    with pytest.raises(ValueError, match="n_neighbors must be an int >= 1"):
        lr.nearest_neighbours(xs, ys, n_neighbors=0)
