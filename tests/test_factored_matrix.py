"""FactoredMatrix: factored vs dense for every operation, hand-worked values, bad inputs."""

import copy
import doctest
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from vecinterp import factored_matrix
from vecinterp.factored_matrix import FactoredMatrix

F64 = torch.float64
TOL = {"atol": 1e-10, "rtol": 1e-10}


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def assert_same_multiset(
    small: torch.Tensor, dense: torch.Tensor, atol: float = 1e-8, pad: bool = True
) -> None:
    """``small`` [..., r] and ``dense`` [..., m] (r <= m) are equal as multisets once
    ``small`` is padded with zeros, matched optimally (robust to ordering and ties)."""
    small, dense = small.to(torch.complex128), dense.to(torch.complex128)
    assert small.shape[:-1] == dense.shape[:-1]
    if pad:
        zeros = torch.zeros(*small.shape[:-1], dense.shape[-1] - small.shape[-1], dtype=small.dtype)
        small = torch.cat([small, zeros], dim=-1)
    assert small.shape == dense.shape
    for x, y in zip(small.reshape(-1, small.shape[-1]), dense.reshape(-1, dense.shape[-1])):
        cost = (x[:, None] - y[None, :]).abs().numpy()
        rows, cols = linear_sum_assignment(cost)
        assert cost[rows, cols].max() < atol, (x, y)


@pytest.fixture
def factors() -> tuple[torch.Tensor, torch.Tensor]:
    """A [2, 3, 5, 2] and B [3, 2, 5]: leading dims broadcast to [2, 3]; AB is 5x5 of rank 2."""
    return randn(2, 3, 5, 2, seed=0), randn(3, 2, 5, seed=1)


@pytest.fixture
def fm(factors: tuple[torch.Tensor, torch.Tensor]) -> FactoredMatrix:
    return FactoredMatrix(*factors)


# ---------------------------------------------------------------- construction and shape


def test_construction_broadcasts_and_reports_shape(factors, fm):
    A, B = factors
    assert fm.A.shape == (2, 3, 5, 2) and fm.B.shape == (2, 3, 2, 5)
    assert fm.shape == torch.Size((2, 3, 5, 5))
    assert (fm.ldim, fm.mdim, fm.rdim, fm.ndim) == (5, 2, 5, 4)
    assert fm.dtype == F64 and fm.device == torch.device("cpu")
    torch.testing.assert_close(fm.AB, A @ B, **TOL)
    assert repr(fm) == (
        "FactoredMatrix(shape=(2, 3, 5, 5), A=(2, 3, 5, 2), B=(2, 3, 2, 5), "
        "dtype=torch.float64, device=cpu)"
    )


def test_ab_ba_transpose_match_dense(factors, fm):
    A, B = factors
    torch.testing.assert_close(fm.BA, B @ A, **TOL)
    assert fm.BA.shape == (2, 3, 2, 2)
    torch.testing.assert_close(fm.T.AB, (A @ B).mT, **TOL)
    assert fm.T.shape == (2, 3, 5, 5) and fm.T.mdim == 2
    torch.testing.assert_close(fm.T.T.AB, fm.AB, **TOL)


def test_non_square_shapes():
    fm = FactoredMatrix(randn(4, 7, 3, seed=2), randn(3, 6, seed=3))
    assert fm.shape == (4, 7, 6) and fm.T.shape == (4, 6, 7)
    torch.testing.assert_close(fm.T.AB, fm.AB.mT, **TOL)


# ---------------------------------------------------------------- products


@pytest.mark.parametrize(
    ("m", "k", "n", "expected_mdim"),
    [(5, 2, 5, 2), (5, 6, 3, 3), (4, 3, 3, 3)],  # through k; through n (AB formed); tie -> k
)
def test_matmul_matrix_on_right(m, k, n, expected_mdim):
    A, B = randn(2, m, k, seed=4), randn(2, k, n, seed=5)
    M = randn(3, 1, n, 4, seed=6)  # leading dims [3, 1] broadcast with [2]
    out = FactoredMatrix(A, B) @ M
    assert isinstance(out, FactoredMatrix)
    assert out.shape == (3, 2, m, 4) and out.mdim == expected_mdim
    torch.testing.assert_close(out.AB, A @ B @ M, **TOL)


@pytest.mark.parametrize(
    ("m", "k", "n", "expected_mdim"),
    [(5, 2, 5, 2), (3, 6, 5, 3), (3, 3, 4, 3)],  # through k; through m (AB formed); tie -> k
)
def test_matmul_matrix_on_left(m, k, n, expected_mdim):
    A, B = randn(2, m, k, seed=7), randn(2, k, n, seed=8)
    M = randn(4, m, seed=9)
    out = M @ FactoredMatrix(A, B)  # Tensor.__matmul__ declines, FactoredMatrix.__rmatmul__ runs
    assert isinstance(out, FactoredMatrix)
    assert out.shape == (2, 4, n) and out.mdim == expected_mdim
    torch.testing.assert_close(out.AB, M @ A @ B, **TOL)


def test_matmul_vector_both_sides_returns_dense(fm):
    v = randn(5, seed=10)
    right, left = fm @ v, v @ fm
    assert isinstance(right, torch.Tensor) and right.shape == (2, 3, 5)
    assert isinstance(left, torch.Tensor) and left.shape == (2, 3, 5)
    torch.testing.assert_close(right, fm.AB @ v, **TOL)
    torch.testing.assert_close(left, v @ fm.AB, **TOL)


def test_unbatched_vector_products():
    fm = FactoredMatrix(randn(4, 2, seed=11), randn(2, 3, seed=12))
    torch.testing.assert_close(fm @ randn(3, seed=13), fm.AB @ randn(3, seed=13), **TOL)
    torch.testing.assert_close(randn(4, seed=14) @ fm, randn(4, seed=14) @ fm.AB, **TOL)


@pytest.mark.parametrize(
    ("k1", "n1", "k2", "expected_mdim"),
    [(2, 6, 3, 2), (4, 6, 3, 3), (4, 2, 5, 2), (3, 6, 3, 3)],  # k1, k2, n1, tie -> k1
)
def test_matmul_factored_picks_smallest_inner_dim(k1, n1, k2, expected_mdim):
    A1, B1 = randn(2, 5, k1, seed=15), randn(2, k1, n1, seed=16)
    A2, B2 = randn(n1, k2, seed=17), randn(k2, 4, seed=18)
    out = FactoredMatrix(A1, B1) @ FactoredMatrix(A2, B2)
    assert isinstance(out, FactoredMatrix)
    assert out.shape == (2, 5, 4) and out.mdim == expected_mdim
    torch.testing.assert_close(out.AB, A1 @ B1 @ A2 @ B2, **TOL)


# ---------------------------------------------------------------- spectra and norms


def test_eigenvalues_from_small_side_match_dense(fm):
    eig = fm.eigenvalues
    assert eig.shape == (2, 3, 2) and eig.dtype == torch.complex128
    assert_same_multiset(eig, torch.linalg.eigvals(fm.AB))
    assert_same_multiset(eig, torch.linalg.eigvals(fm.BA), pad=False)


def test_eigenvalues_when_inner_dim_is_not_smaller():
    fm = FactoredMatrix(randn(2, 3, 5, seed=19), randn(2, 5, 3, seed=20))  # k = 5 >= m = 3
    assert fm.eigenvalues.shape == (2, 3)
    assert_same_multiset(fm.eigenvalues, torch.linalg.eigvals(fm.AB), pad=False)
    # BA (5x5) has the same spectrum plus k - m = 2 zeros.
    assert_same_multiset(fm.eigenvalues, torch.linalg.eigvals(fm.BA))


@pytest.mark.parametrize(("m", "k", "n"), [(5, 2, 5), (6, 3, 4), (3, 7, 4), (4, 4, 4)])
def test_svd_reconstructs_and_matches_dense(m, k, n):
    fm = FactoredMatrix(randn(2, m, k, seed=21), randn(2, k, n, seed=22))
    r = min(m, n, k)
    U, S, Vh = fm.svd()
    assert U.shape == (2, m, r) and S.shape == (2, r) and Vh.shape == (2, r, n)
    torch.testing.assert_close(U @ torch.diag_embed(S) @ Vh, fm.AB, **TOL)
    eye = torch.eye(r, dtype=F64).expand(2, r, r)
    torch.testing.assert_close(U.mT @ U, eye, **TOL)
    torch.testing.assert_close(Vh @ Vh.mT, eye, **TOL)
    dense = torch.linalg.svdvals(fm.AB)
    torch.testing.assert_close(S, dense[..., :r], **TOL)
    torch.testing.assert_close(fm.singular_values, S, **TOL)
    assert bool((dense[..., r:].abs() < 1e-10).all())


def test_norm_matches_dense_frobenius(fm):
    norm = fm.norm()
    assert norm.shape == (2, 3)
    torch.testing.assert_close(norm, torch.linalg.matrix_norm(fm.AB), **TOL)


def test_norm_stays_accurate_when_product_cancels():
    # AB = [[-1e-3], [-1e-3]] from factors of size 1e6: tr((A^T A)(B B^T)) would be ~1e12 - 1e12,
    # giving a norm 10x off; the QR route keeps about 6 digits.
    big = torch.full((2, 1), 1e6, dtype=F64)
    A, B = torch.cat([big, big + 1e-3], dim=1), torch.tensor([[1.0], [-1.0]], dtype=F64)
    torch.testing.assert_close(
        FactoredMatrix(A, B).norm(), torch.linalg.matrix_norm(A @ B), rtol=1e-5, atol=0
    )


def test_get_corner_matches_dense(fm):
    torch.testing.assert_close(fm.get_corner(3), fm.AB[..., :3, :3], **TOL)
    torch.testing.assert_close(fm.get_corner(9), fm.AB, **TOL)


# ---------------------------------------------------------------- exact hand-worked values


def test_projection_onto_first_coordinates():
    eye = torch.eye(5, dtype=F64)
    fm = FactoredMatrix(eye[:, :2], eye[:2, :])  # AB = diag(1, 1, 0, 0, 0)
    assert torch.equal(fm.AB, torch.diag(torch.tensor([1.0, 1, 0, 0, 0], dtype=F64)))
    assert fm.eigenvalues.tolist() == [1 + 0j, 1 + 0j]
    assert fm.singular_values.tolist() == [1.0, 1.0]
    assert fm.norm().item() == math.sqrt(2)


def test_minus_identity_has_eigenvalues_minus_one_and_copying_score_minus_one():
    fm = FactoredMatrix(-torch.eye(4, dtype=F64), torch.eye(4, dtype=F64))  # k = m
    eig = fm.eigenvalues
    assert eig.tolist() == [-1 + 0j] * 4
    assert (eig.sum().real / eig.abs().sum()).item() == -1.0
    # A non-trivial factorisation of -I through k = m: -Q @ Q^T with Q orthogonal.
    Q, _ = torch.linalg.qr(randn(4, 4, seed=23))
    torch.testing.assert_close(
        FactoredMatrix(-Q, Q.T).eigenvalues, torch.full((4,), -1 + 0j, dtype=torch.complex128)
    )


def test_rank_one_has_eigenvalue_v_dot_u():
    u = torch.tensor([[1.0], [2.0], [3.0]], dtype=F64)
    v = torch.tensor([[4.0, -5.0, 6.0]], dtype=F64)
    fm = FactoredMatrix(u, v)
    assert fm.eigenvalues.tolist() == [12 + 0j]  # 4 - 10 + 18
    torch.testing.assert_close(fm.norm(), torch.tensor(math.sqrt(14 * 77), dtype=F64))
    torch.testing.assert_close(fm.singular_values, torch.tensor([math.sqrt(14 * 77)], dtype=F64))


def test_rotation_has_eigenvalues_plus_minus_i():
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64)
    eig = FactoredMatrix(rot, torch.eye(2, dtype=F64)).eigenvalues
    assert sorted(eig.tolist(), key=lambda z: z.imag) == [-1j, 1j]


# ---------------------------------------------------------------- indexing


@pytest.mark.parametrize(
    "index",
    [0, -1, (1, 2), (slice(None), 2), slice(0, 1), None, (None, 1), torch.tensor([1, 0])],
    ids=repr,
)
def test_indexing_leading_dims_matches_dense(fm, index):
    out = fm[index]
    assert isinstance(out, FactoredMatrix)
    torch.testing.assert_close(out.AB, fm.AB[index], **TOL)


def test_boolean_mask_over_leading_dims(fm):
    mask = torch.tensor([[True, False, True], [False, False, True]])
    torch.testing.assert_close(fm[mask].AB, fm.AB[mask], **TOL)


@pytest.mark.parametrize("index", [(0, 0, 0), (0, 0, slice(None), 1), (..., 0), Ellipsis])
def test_indexing_matrix_axes_is_refused(fm, index):
    with pytest.raises(IndexError, match=r"fm\.AB\[\.\.\.\]"):
        fm[index]


def test_len_and_iteration(fm):
    assert len(fm) == 2
    items = list(fm)
    assert len(items) == 2 and all(item.shape == (3, 5, 5) for item in items)
    torch.testing.assert_close(items[1].AB, fm.AB[1], **TOL)
    unbatched = fm[0, 0]
    with pytest.raises(TypeError, match="unbatched"):
        len(unbatched)
    with pytest.raises(IndexError, match="leading dim"):
        unbatched[0]


# ---------------------------------------------------------------- immutability


def test_is_immutable(fm):
    A_before = fm.A.clone()
    with pytest.raises(AttributeError):
        fm.A = torch.zeros(2, 3, 5, 2, dtype=F64)
    with pytest.raises(AttributeError, match="immutable"):
        fm._A = torch.zeros(2, 3, 5, 2, dtype=F64)
    with pytest.raises(AttributeError, match="immutable"):
        fm.extra = 1
    with pytest.raises(AttributeError, match="immutable"):
        del fm._B
    _ = (fm.T, fm @ randn(5, 4, seed=24), fm[0], fm.svd(), fm.eigenvalues, fm.norm())
    assert torch.equal(fm.A, A_before)


def test_copy_and_pickle_round_trip(fm):
    for clone in (copy.copy(fm), copy.deepcopy(fm), pickle.loads(pickle.dumps(fm))):
        assert isinstance(clone, FactoredMatrix)
        assert torch.equal(clone.A, fm.A) and torch.equal(clone.B, fm.B)


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("A", "B", "error", "match"),
    [
        (torch.ones(3, dtype=F64), torch.ones(3, 3, dtype=F64), ValueError, r"A .*2 dims.*\(3,\)"),
        (torch.ones(3, 3, dtype=F64), torch.ones(3, dtype=F64), ValueError, r"B .*2 dims"),
        (
            torch.ones(4, 2, dtype=F64),
            torch.ones(3, 4, dtype=F64),
            ValueError,
            r"inner dims differ: A \(4, 2\) .* B \(3, 4\)",
        ),
        (
            torch.ones(2, 2),
            torch.ones(2, 2, dtype=F64),
            TypeError,
            "float32 but B is torch.float64",
        ),
        (torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2), TypeError, "floating-point"),
        (
            torch.ones(2, 4, 2, dtype=F64),
            torch.ones(3, 2, 4, dtype=F64),
            ValueError,
            r"leading dims of A \(2, 4, 2\) and B \(3, 2, 4\) do not broadcast",
        ),
        (torch.ones(0, 2, dtype=F64), torch.ones(2, 2, dtype=F64), ValueError, "empty"),
        (
            torch.tensor([[1.0, math.nan]], dtype=F64),
            torch.ones(2, 1, dtype=F64),
            ValueError,
            "A .* NaN or inf",
        ),
        (
            torch.ones(1, 2, dtype=F64),
            torch.tensor([[math.inf], [1.0]], dtype=F64),
            ValueError,
            "B .* NaN or inf",
        ),
        (
            torch.ones(2, 2, dtype=F64),
            torch.ones(2, 2, dtype=F64, device="meta"),
            TypeError,
            "A is on cpu but B is on meta",
        ),
    ],
)
def test_bad_factors_fail_with_clear_errors(A, B, error, match):
    with pytest.raises(error, match=match):
        FactoredMatrix(A, B)


def test_non_tensor_factor_is_a_type_error():
    # Under the test suite's runtime type checker the annotation catches it first; either way
    # the message names the expected torch.Tensor.
    with pytest.raises(TypeError, match="Tensor"):
        FactoredMatrix([[1.0]], torch.ones(1, 1))  # type: ignore[arg-type]


def test_square_only_operations_refuse_non_square():
    fm = FactoredMatrix(randn(4, 2, seed=25), randn(2, 3, seed=26))
    with pytest.raises(ValueError, match=r"BA needs a square AB.*\(4, 3\)"):
        fm.BA
    with pytest.raises(ValueError, match=r"eigenvalues needs a square AB"):
        fm.eigenvalues


def test_bad_operands_fail_with_clear_errors(fm):
    with pytest.raises(ValueError, match=r"fm @ x: .*\(2, 3, 5, 5\).*\(4, 2\)"):
        fm @ randn(4, 2, seed=27)
    with pytest.raises(ValueError, match=r"x @ fm: .*\(4,\)"):
        randn(4, seed=28) @ fm
    with pytest.raises(TypeError, match="float32 on cpu, but the matrix is torch.float64"):
        fm @ torch.ones(5, 2)
    with pytest.raises(ValueError, match="do not broadcast"):
        fm @ randn(4, 5, 2, seed=29)
    other = FactoredMatrix(randn(4, 2, seed=30), randn(2, 4, seed=31))
    with pytest.raises(ValueError, match=r"do not chain \(5 != 4\)"):
        fm @ other
    with pytest.raises(TypeError):
        fm @ 3  # type: ignore[operator]
    with pytest.raises(TypeError):
        np.ones(5) @ fm  # numpy defers to FactoredMatrix, which declines
    with pytest.raises(ValueError, match="positive int"):
        fm.get_corner(0)


# ---------------------------------------------------------------- docs and properties


def test_docstring_examples_run():
    result = doctest.testmod(factored_matrix, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8 and result.failed == 0


dims = st.integers(min_value=1, max_value=5)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    batch=st.lists(st.integers(min_value=1, max_value=3), max_size=2),
    m=dims,
    k=dims,
    n=dims,
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_factored_matches_dense_on_random_shapes(batch, m, k, n, seed):
    A, B = randn(*batch, m, k, seed=seed), randn(*batch, k, n, seed=seed + 1)
    fm, dense = FactoredMatrix(A, B), A @ B
    assert fm.shape == dense.shape
    torch.testing.assert_close(fm.AB, dense, **TOL)
    torch.testing.assert_close(fm.T.AB, dense.mT, **TOL)
    torch.testing.assert_close(fm.norm(), torch.linalg.matrix_norm(dense), **TOL)
    r = min(m, k, n)
    U, S, Vh = fm.svd()
    torch.testing.assert_close(U @ torch.diag_embed(S) @ Vh, dense, **TOL)
    torch.testing.assert_close(S, torch.linalg.svdvals(dense)[..., :r], **TOL)
    M = randn(n, 3, seed=seed + 2)
    torch.testing.assert_close((fm @ M).AB, dense @ M, **TOL)
    torch.testing.assert_close((M.T @ fm.T).AB, (dense @ M).mT, **TOL)
    if m == n:
        assert_same_multiset(fm.eigenvalues, torch.linalg.eigvals(dense), atol=1e-6)


def test_broadcast_is_torch_broadcast_shapes():
    from vecinterp.factored_matrix import _broadcast

    shapes = [(), (1,), (3,), (0,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (1, 0), (5, 2, 1, 1)]
    for a in shapes:
        for b in shapes:
            try:
                expected = tuple(torch.broadcast_shapes(a, b))
            except RuntimeError:
                expected = None
            assert _broadcast(a, b) == expected, (a, b)
