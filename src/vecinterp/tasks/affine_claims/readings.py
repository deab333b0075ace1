"""Readings of the claims that are not attention patterns: the scaled-identity share of a
matrix (claim 7), the fit of an estimate on the previous input vector (claims 6 and 13),
and the share of sequences that show something, by the recurrence's ``c`` (claims 3, 4)."""

from collections.abc import Sequence

import torch
from jaxtyping import Float

from ...analysis import LinearFit, fit_line

C_BINS: tuple[tuple[float, float], ...] = ((-2.0, -1.0), (-1.0, 0.0), (0.0, 1.0), (1.0, 2.0))
"""The bins of the recurrence's ``c`` (drawn uniformly from ``(-2, 2)``) in which the
per-sequence readings of claims 3 and 4 are reported."""


def identity_share(matrix: Float[torch.Tensor, "d d"]) -> float:
    """The share of a square matrix's squared Frobenius norm in its scaled-identity part.

    ``M = (tr M / d) I + N`` with ``tr N = 0`` splits ``‖M‖_F²`` into ``(tr M / d)² d`` and
    ``‖N‖_F²`` (the two parts are orthogonal), and the share is the first over the whole:
    1 for a scaled identity, 0 for a traceless matrix. For ``x ~ N(0, I)`` the per-vector
    R² of the fit ``(x_d, (x M)_d)`` over the ``d`` dimensions is close to this share
    (for large ``d``; claim 7's random-vector R²), so an R² of 0.6 on random vectors needs
    about 60 % of ``‖M‖_F²`` on the diagonal's common value: a visible diagonal.

    Args:
        matrix: ``[d, d]``, finite.

    Returns:
        The share, in ``[0, 1]`` (``nan`` for the zero matrix).

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_claims import identity_share
        >>> identity_share(2.5 * torch.eye(4)), identity_share(torch.diag(torch.tensor(
        ...     [1.0, -1.0, 1.0, -1.0])))
        (1.0, 0.0)
        >>> round(identity_share(torch.eye(4) + torch.tensor([[0.0, 2.0], [0.0, 0.0]]).kron(
        ...     torch.eye(2))), 4)                  # 4 on the diagonal's mean, 4 + 8 in all
        0.3333
    """
    if (
        not isinstance(matrix, torch.Tensor)
        or matrix.ndim != 2
        or matrix.shape[0] != matrix.shape[1]
    ):
        got = tuple(matrix.shape) if isinstance(matrix, torch.Tensor) else type(matrix).__name__
        raise ValueError(f"matrix must be a square [d, d] tensor, got {got}")
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError("matrix holds NaN or inf")
    m = matrix.detach().double()
    d = m.shape[0]
    total = float(m.square().sum())
    if total == 0.0:
        return float("nan")
    return float((m.trace() / d) ** 2 * d / total)


def previous_vector_fit(
    estimate: Float[torch.Tensor, "batch pos dim"],
    inputs: Float[torch.Tensor, "batch pos dim"],
) -> LinearFit:
    """Fit, per sequence and position ``n >= 1``, the estimate at ``n`` on the previous
    input vector ``a_{n-1}``, over the vectors' dimensions.

    One least-squares line ``estimate[b, n, i] ≈ slope · inputs[b, n-1, i] + intercept``
    per ``(b, n)``, the points being the ``dim`` coordinates (:func:`~vecinterp.analysis.
    fit_line`). Claim 6's output-space reading (the logit lens after layer 0 against
    ``a_{n-1}``: the paper's slope 2.1-2.5 and R² 0.83) and claim 13's single-regressor
    slope (the paper's ``α`` of ``a_n + α a_{n-1}`` without the ``a_n`` term) are this fit.

    Args:
        estimate: ``[batch, pos, dim]``, e.g. a logit lens.
        inputs: ``[batch, pos, dim]``, the model's input vectors (``inputs[:, n] = a_n``).

    Returns:
        A :class:`~vecinterp.analysis.LinearFit` with ``[batch, pos - 1]`` fits (position
        ``n`` at index ``n - 1``).

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_claims import previous_vector_fit
        >>> a = torch.randn(2, 4, 6, dtype=torch.float64)
        >>> est = torch.zeros_like(a)
        >>> est[:, 1:] = 2.3 * a[:, :-1] + 0.1      # 2.3 a_{n-1} + 0.1 at every n >= 1
        >>> fit = previous_vector_fit(est, a)
        >>> fit.slope.shape, torch.allclose(fit.slope, torch.tensor(2.3, dtype=torch.float64))
        (torch.Size([2, 3]), True)
    """
    for name, t in (("estimate", estimate), ("inputs", inputs)):
        if not isinstance(t, torch.Tensor) or t.ndim != 3:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be [batch, pos, dim], got {got}")
    if estimate.shape != inputs.shape or estimate.shape[1] < 2:
        raise ValueError(
            f"estimate and inputs must have one shape [batch, pos >= 2, dim], got "
            f"{tuple(estimate.shape)} and {tuple(inputs.shape)}"
        )
    return fit_line(inputs[:, :-1].double(), estimate[:, 1:].double())


def share_by_c(
    flags: torch.Tensor, c: torch.Tensor, bins: Sequence[tuple[int | float, int | float]]
) -> list[float]:
    """The share of ``True`` among the sequences whose ``c`` lies in each bin ``(lo, hi)``
    (``lo < c < hi``); ``nan`` for an empty bin.

    Args:
        flags: ``[batch]`` booleans, one per sequence.
        c: ``[batch]`` the recurrence's ``c`` of each sequence.
        bins: ``(lo, hi)`` pairs; e.g. :data:`C_BINS`, or ``[(-2, -1), (1, 2)]``.

    Returns:
        One share per bin.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_claims import share_by_c
        >>> share_by_c(torch.tensor([True, False, True, True]), torch.tensor([-1.5, -1.2,
        ...            0.5, 1.7]), [(-2, -1), (-1, 1), (1, 2), (5, 6)])
        [0.5, 1.0, 1.0, nan]
    """
    if flags.shape != c.shape or flags.ndim != 1:
        raise ValueError(
            f"flags and c must be [batch] of one length, got {tuple(flags.shape)} and "
            f"{tuple(c.shape)}"
        )
    out = []
    for lo, hi in bins:
        inside = (c > lo) & (c < hi)
        n = int(inside.sum())
        out.append(float(flags[inside].double().mean()) if n else float("nan"))
    return out
