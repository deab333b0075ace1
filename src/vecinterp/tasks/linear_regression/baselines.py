"""The baselines of Garg et al. (2022), exact and batched over prompts and prefixes.

Each baseline takes the points ``xs [batch, k, dim]`` and values ``ys [batch, k]`` of a batch
of prompts and returns ``[batch, k]``: entry ``[b, i]`` predicts ``ys[b, i]`` from the
earlier pairs ``(x_1, y_1) .. (x_i, y_i)`` (0-based: ``xs[b, :i]``, ``ys[b, :i]``) and the
query ``xs[b, i]``, as the model does at ``x_{i+1}``'s position. Everything is computed in
float64, for all prompts and all ``k`` prefix lengths at once (no Python loop over prompts
or prefixes). Documented in :mod:`vecinterp.tasks.linear_regression`.
"""

import torch
from jaxtyping import Float

from .._common import check_int


def least_squares(
    xs: Float[torch.Tensor, "batch k dim"], ys: Float[torch.Tensor, "batch k"]
) -> Float[torch.Tensor, "batch k"]:
    """Ordinary least squares on each prefix: the minimum-norm solution below ``dim`` points.

    Prediction ``i`` is ``w_hat . x_i`` with ``w_hat = pinv(X) y`` for the earlier points
    ``X = xs[:, :i]`` and values ``y = ys[:, :i]``: the least-squares solution of smallest
    norm, unique whatever the rank of ``X`` (e.g. fewer than ``dim`` points, or repeated
    points). Position 0 (no earlier point) predicts 0. Computed with an SVD-based solver
    (LAPACK's ``gelsd``) on each prefix written as the full ``[k, dim]`` matrix with the later
    rows set to zero, which changes neither the residual nor the minimum-norm solution.

    Args:
        xs: ``[batch, k, dim]`` points.
        ys: ``[batch, k]`` values.

    Returns:
        ``[batch, k]`` float64 predictions.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> xs = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [2.0, 3.0]]])
        >>> ys = torch.tensor([[2.0, 5.0, 13.0]])   # w = (2, 3)
        >>> lr.least_squares(xs, ys).round(decimals=9)  # 0; min-norm w = (2, 0): 2; exact 13
        tensor([[ 0.,  2., 13.]], dtype=torch.float64)
    """
    xs, ys = _check_xy(xs, ys)
    w_hat = _prefix_lstsq(xs, ys)  # [batch, k, dim]
    return torch.einsum("bkd,bkd->bk", w_hat, xs)


def ridge(
    xs: Float[torch.Tensor, "batch k dim"],
    ys: Float[torch.Tensor, "batch k"],
    alpha: float,
) -> Float[torch.Tensor, "batch k"]:
    """Ridge regression on each prefix: ``w_hat = (X^T X + alpha I)^{-1} X^T y``.

    Prediction ``i`` is ``w_hat . x_i`` with ``X = xs[:, :i]``, ``y = ys[:, :i]`` (position 0
    predicts 0). With noise ``N(0, s^2)`` on ``y`` and ``w ~ N(0, I)``, ``alpha = s^2`` gives
    the Bayes-optimal (posterior-mean) prediction.

    Args:
        xs: ``[batch, k, dim]`` points.
        ys: ``[batch, k]`` values.
        alpha: the penalty, a finite float > 0 (for ``alpha = 0`` use :func:`least_squares`).

    Returns:
        ``[batch, k]`` float64 predictions.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> xs = torch.tensor([[[2.0], [1.0]]]); ys = torch.tensor([[4.0, 3.0]])
        >>> lr.ridge(xs, ys, alpha=1.0)          # w_hat = 2*4 / (4 + 1) = 1.6; 1.6 * 1
        tensor([[0.0000, 1.6000]], dtype=torch.float64)
    """
    xs, ys = _check_xy(xs, ys)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a float > 0, got {type(alpha).__name__}")
    if not 0 < alpha < float("inf"):
        raise ValueError(f"alpha must be a finite float > 0 (use least_squares for 0), got {alpha}")
    batch, k, dim = xs.shape
    # The Gram matrices and X^T y of every prefix, by cumulative sums over the points.
    outer = torch.einsum("bki,bkj->bkij", xs, xs)
    gram = torch.cumsum(outer, dim=1) - outer  # prefix before point i: sum over j < i
    xy = xs * ys[..., None]
    rhs = torch.cumsum(xy, dim=1) - xy
    eye = torch.eye(dim, dtype=torch.float64)
    w_hat = torch.linalg.solve(gram + alpha * eye, rhs[..., None])[..., 0]
    return torch.einsum("bkd,bkd->bk", w_hat, xs)


def nearest_neighbours(
    xs: Float[torch.Tensor, "batch k dim"],
    ys: Float[torch.Tensor, "batch k"],
    n_neighbors: int = 3,
) -> Float[torch.Tensor, "batch k"]:
    """k-nearest neighbours: the plain mean of ``y`` over the nearest earlier points.

    Garg et al.'s weighting: prediction ``i`` is the uniform average of ``ys[:, j]`` over the
    ``n_neighbors`` earlier points ``j < i`` closest to ``xs[:, i]`` in Euclidean distance;
    with fewer than ``n_neighbors`` earlier points, over all of them; position 0 predicts 0.
    Ties in distance go to the earlier point (smaller ``j``).

    Args:
        xs: ``[batch, k, dim]`` points.
        ys: ``[batch, k]`` values.
        n_neighbors: how many neighbours to average (>= 1).

    Returns:
        ``[batch, k]`` float64 predictions.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> xs = torch.tensor([[[0.0], [3.0], [1.0], [2.0]]])
        >>> ys = torch.tensor([[1.0, 2.0, 4.0, 0.0]])
        >>> lr.nearest_neighbours(xs, ys, n_neighbors=2)  # pos 3: x=1 and x=3 are nearest
        tensor([[0.0000, 1.0000, 1.5000, 3.0000]], dtype=torch.float64)
    """
    xs, ys = _check_xy(xs, ys)
    check_int("n_neighbors", n_neighbors, minimum=1)
    batch, k, _ = xs.shape
    dist = torch.cdist(xs, xs)  # [batch, query i, earlier j]
    earlier = torch.ones(k, k, dtype=torch.bool).tril(diagonal=-1)
    dist = dist.masked_fill(~earlier, float("inf"))
    # stable: among equal distances the smaller j comes first; later points sort last (inf)
    order = torch.sort(dist, dim=2, stable=True).indices
    n_used = torch.clamp(torch.arange(k), max=n_neighbors)  # min(i, n_neighbors)
    take = torch.arange(k)[None, :] < n_used[:, None]  # [i, rank]
    picked = torch.gather(ys[:, None, :].expand(batch, k, k), 2, order)
    total = (picked * take).sum(dim=2)
    return total / n_used.clamp(min=1).to(torch.float64)


def averaging(
    xs: Float[torch.Tensor, "batch k dim"], ys: Float[torch.Tensor, "batch k"]
) -> Float[torch.Tensor, "batch k"]:
    """Garg et al.'s "averaging": ``w_hat = mean_{j < i} y_j x_j``, predict ``w_hat·x_i``.

    An unbiased estimate of ``w`` when ``x ~ N(0, I)`` (``E[y x] = w``), but with a variance
    that shrinks only as ``1 / i``. Position 0 predicts 0.

    Args:
        xs: ``[batch, k, dim]`` points.
        ys: ``[batch, k]`` values.

    Returns:
        ``[batch, k]`` float64 predictions.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> xs = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])
        >>> ys = torch.tensor([[3.0, 4.0, 0.0]])
        >>> lr.averaging(xs, ys)  # pos 1: w_hat = (3, 0) -> 0; pos 2: w_hat = (1.5, 4) -> 5.5
        tensor([[0.0000, 0.0000, 5.5000]], dtype=torch.float64)
    """
    xs, ys = _check_xy(xs, ys)
    k = xs.shape[1]
    xy = xs * ys[..., None]
    before = torch.cumsum(xy, dim=1) - xy  # sum over j < i
    count = torch.arange(k, dtype=torch.float64).clamp(min=1)
    w_hat = before / count[None, :, None]
    return torch.einsum("bkd,bkd->bk", w_hat, xs)


def zero(
    xs: Float[torch.Tensor, "batch k dim"], ys: Float[torch.Tensor, "batch k"]
) -> Float[torch.Tensor, "batch k"]:
    """The zero predictor: 0 everywhere (normalised error ``E[y^2] / dim = 1`` for dense
    ``w ~ N(0, I)``, noiseless).

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> lr.zero(torch.ones(2, 3, 4), torch.ones(2, 3)).shape
        torch.Size([2, 3])
    """
    xs, ys = _check_xy(xs, ys)
    return torch.zeros_like(ys)


BASELINES = {
    "least_squares": least_squares,
    "3-nearest_neighbours": nearest_neighbours,
    "averaging": averaging,
    "zero": zero,
}
"""The parameter-free baselines of Garg et al. (2022), name -> function ``(xs, ys)``
(3-nearest neighbours with the default ``n_neighbors = 3``); :func:`ridge` needs its
``alpha``."""


def _prefix_lstsq(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """``[batch, k, dim]``: the min-norm least-squares ``w_hat`` of the prefix before each
    point (row ``i`` uses points ``j < i``)."""
    batch, k, dim = xs.shape
    earlier = torch.ones(k, k, dtype=torch.bool).tril(diagonal=-1).to(torch.float64)
    # [batch, i, j, dim]: prefix i's design matrix, rows j >= i zeroed
    design = xs[:, None, :, :] * earlier[None, :, :, None]
    target = (ys[:, None, :] * earlier[None]).unsqueeze(-1)
    solution = torch.linalg.lstsq(design, target, driver="gelsd").solution
    return solution[..., 0]


def _check_xy(xs: object, ys: object) -> tuple[torch.Tensor, torch.Tensor]:
    for name, value in (("xs", xs), ("ys", ys)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got dtype {value.dtype}")
    assert isinstance(xs, torch.Tensor) and isinstance(ys, torch.Tensor)
    if xs.ndim != 3:
        raise ValueError(f"xs must be [batch, k, dim], got shape {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ValueError(
            f"ys must be [batch, k] = {list(xs.shape[:2])} to match xs {list(xs.shape)}, "
            f"got shape {list(ys.shape)}"
        )
    if xs.shape[1] < 1 or xs.shape[2] < 1:
        raise ValueError(f"xs must have k >= 1 points of dim >= 1, got shape {tuple(xs.shape)}")
    if not (torch.isfinite(xs).all() and torch.isfinite(ys).all()):
        raise ValueError("xs and ys must be finite (no NaN or inf)")
    return xs.detach().to("cpu", torch.float64), ys.detach().to("cpu", torch.float64)
