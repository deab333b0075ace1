"""The prompts of in-context linear regression: drawing them, their batch, the recipe.

Documented in :mod:`vecinterp.tasks.linear_regression` (the package docstring gives the
format in full); the names are re-exported there.
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float

from .._common import check_device, check_dtype, check_int, resolve_generator, seeded_generator

DEFAULT_DIM = 5
"""``d``, the dimension of ``x`` and ``w`` of the shipped reference model (20 in the paper)."""
DEFAULT_POINTS = 11
"""``k``, the number of ``(x, y)`` pairs per prompt of the reference model (``2 d + 1``, the
paper's ratio: 41 points for ``d = 20``)."""

MODEL_CONFIG_KWARGS: dict[str, Any] = dict(
    d_in=DEFAULT_DIM,
    d_out=1,
    d_model=64,
    d_head=16,
    n_heads=4,
    n_layers=4,
    d_mlp=256,
    n_ctx=2 * DEFAULT_POINTS,
    act_fn="gelu_tanh",
    normalization="LN",
    positional="learned",
    embed_bias=True,
)
"""The reference model: Garg et al.'s GPT-2 layout scaled down
(``vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)``).

The paper's model has 12 layers, 8 heads, width 256 and 40 points of dimension 20; this one
has 4 layers, 4 heads of 16, width 64, ``d_mlp = 4 * width`` (GPT-2's ratio) and 11 points
of dimension 5 (22 positions). As in the paper: GPT-2 blocks (pre-LayerNorm, learned
positions, the tanh approximation of GELU), a read-in ``nn.Linear(d, width)`` with a bias
(``embed_bias``) and a read-out to one number (``d_out = 1``)."""

RECIPE: dict[str, Any] = dict(
    steps=25_000,
    batch_size=64,
    lr=1e-3,
    weight_decay=0.0,
    optimizer="AdamW",
    warmup_steps=500,
    schedule="cosine",
    min_lr=1e-5,
    grad_clip=1.0,
)
"""The training recipe of the reference model: fresh prompts every step (``dim = 5``,
``n_points = 11``, noiseless), AdamW on the masked MSE (the squared error of every
prediction of ``y_i``, as the paper's loss), a linear warm-up to the peak and a cosine decay
to 1 % of it, gradient clipping at total norm 1. The paper: Adam at lr ``1e-4``, batch 64,
500k steps, with a curriculum on ``d`` and ``k``; this recipe has no curriculum."""


@dataclasses.dataclass(frozen=True, eq=False)
class RegressionBatch:
    """One batch of in-context linear-regression prompts, ``k`` points each.

    Attributes:
        inputs: ``[batch, 2k, dim]``, interleaved ``x_1, y_1, x_2, y_2, ...``: position
            ``2i`` holds ``x_{i+1}``, position ``2i + 1`` holds ``y_{i+1}`` in its first
            coordinate and zeros elsewhere.
        targets: ``[batch, 2k, 1]``, ``y_{i+1}`` at position ``2i`` (the prediction read at
            ``x_{i+1}``), zero at the ``y`` positions (masked out).
        loss_mask: ``[batch, 2k]``, True at the ``x`` positions (even), False at the ``y``
            positions.
        xs: ``[batch, k, dim]``, the points ``x_i``.
        ys: ``[batch, k]``, the values ``y_i = w . x_i (+ noise)``.
        w: ``[batch, dim]``, each prompt's weight vector.

    ``eq=False``: compare the fields with ``torch.equal`` instead.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> batch = lr.generate(4, dim=3, n_points=5, seed=0)
        >>> batch.inputs.shape, batch.targets.shape, batch.xs.shape, batch.ys.shape
        (torch.Size([4, 10, 3]), torch.Size([4, 10, 1]), torch.Size([4, 5, 3]), torch.Size([4, 5]))
        >>> batch.loss_mask[0, :4].tolist()
        [True, False, True, False]
        >>> torch.equal(batch.inputs[:, 0::2], batch.xs)
        True
        >>> torch.equal(batch.inputs[:, 1::2, 0], batch.ys)
        True
        >>> wx = torch.einsum("bkd,bd->bk", batch.xs, batch.w)
        >>> bool(torch.allclose(batch.ys, wx, atol=1e-5))
        True
    """

    inputs: Float[torch.Tensor, "batch pos dim"]
    targets: Float[torch.Tensor, "batch pos 1"]
    loss_mask: Bool[torch.Tensor, "batch pos"]
    xs: Float[torch.Tensor, "batch k dim"]
    ys: Float[torch.Tensor, "batch k"]
    w: Float[torch.Tensor, "batch dim"]

    @property
    def n_points(self) -> int:
        """``k``, the number of ``(x, y)`` pairs per prompt."""
        return self.xs.shape[1]

    @property
    def dim(self) -> int:
        """``d``, the dimension of the points."""
        return self.xs.shape[2]


def generate(
    batch_size: int,
    *,
    dim: int = DEFAULT_DIM,
    n_points: int = DEFAULT_POINTS,
    noise_std: float = 0.0,
    sparsity: int | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> RegressionBatch:
    """Draw ``batch_size`` prompts of in-context linear regression (Garg et al., 2022).

    Per prompt: ``w ~ N(0, I_d)``, ``x_i ~ N(0, I_d)`` and ``y_i = w . x_i + e_i`` with
    ``e_i ~ N(0, noise_std^2)``. With ``sparsity = s``, ``w`` keeps ``s`` coordinates,
    chosen uniformly at random per prompt, and the others are set to zero (the paper's
    sparse linear class). Everything is drawn on the CPU in float64, in the order ``xs``,
    ``w``, the support (if ``sparsity``), the noise (if ``noise_std > 0``), then cast to
    ``dtype`` and moved to ``device``.

    Args:
        batch_size: number of prompts (>= 1).
        dim: ``d``, the dimension of ``x`` and ``w`` (>= 1).
        n_points: ``k``, the number of ``(x, y)`` pairs (>= 1); a prompt has ``2k``
            positions.
        noise_std: standard deviation of the label noise (>= 0).
        sparsity: None (dense ``w``) or the number of nonzero coordinates, ``1 .. dim``.
        generator: a CPU ``torch.Generator`` to draw from (its state advances).
        seed: seed of a fresh generator; give at most one of ``seed`` and ``generator``.
            With neither, torch's global CPU generator is used.
        dtype: floating dtype of the returned tensors.
        device: where the returned tensors live.

    Returns:
        A :class:`RegressionBatch`.

    Raises:
        ValueError: for an argument outside its allowed values.

    Example:
        >>> from vecinterp.tasks import linear_regression as lr
        >>> b = lr.generate(2, dim=4, n_points=3, sparsity=1, seed=0)
        >>> b.inputs.shape, (b.w != 0).sum(dim=1).tolist()
        (torch.Size([2, 6, 4]), [1, 1])
        >>> b.inputs[0, 1].tolist()[1:]  # a y position: zeros after the first coordinate
        [0.0, 0.0, 0.0]
    """
    _check_common(batch_size, dim, n_points, noise_std, sparsity, dtype)
    generator = resolve_generator(generator, seed)
    device = check_device(device)

    f64 = torch.float64
    xs = torch.randn((batch_size, n_points, dim), generator=generator, dtype=f64)
    w = torch.randn((batch_size, dim), generator=generator, dtype=f64)
    if sparsity is not None and sparsity < dim:
        order = torch.rand((batch_size, dim), generator=generator, dtype=f64).argsort(dim=1)
        keep = torch.zeros((batch_size, dim), dtype=torch.bool)
        keep.scatter_(1, order[:, :sparsity], True)
        w = torch.where(keep, w, torch.zeros((), dtype=f64))
    ys = torch.einsum("bkd,bd->bk", xs, w)
    if noise_std > 0:
        ys = ys + noise_std * torch.randn((batch_size, n_points), generator=generator, dtype=f64)

    inputs = torch.zeros((batch_size, 2 * n_points, dim), dtype=f64)
    inputs[:, 0::2] = xs
    inputs[:, 1::2, 0] = ys
    targets = torch.zeros((batch_size, 2 * n_points, 1), dtype=f64)
    targets[:, 0::2, 0] = ys
    loss_mask = (torch.arange(2 * n_points) % 2 == 0).repeat(batch_size, 1)

    return RegressionBatch(
        inputs=inputs.to(device=device, dtype=dtype),
        targets=targets.to(device=device, dtype=dtype),
        loss_mask=loss_mask.to(device),
        xs=xs.to(device=device, dtype=dtype),
        ys=ys.to(device=device, dtype=dtype),
        w=w.to(device=device, dtype=dtype),
    )


def batches(
    batch_size: int,
    *,
    seed: int,
    dim: int = DEFAULT_DIM,
    n_points: int = DEFAULT_POINTS,
    noise_std: float = 0.0,
    sparsity: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Iterator[RegressionBatch]:
    """An endless stream of fresh batches, reproducible from ``seed``.

    The stream uses one private generator seeded with ``seed``, so its first batch equals
    ``generate(batch_size, seed=seed, ...)``. The arguments are checked now, not at the
    first ``next``.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> stream = lr.batches(8, dim=3, n_points=4, seed=0)
        >>> torch.equal(next(stream).xs, lr.generate(8, dim=3, n_points=4, seed=0).xs)
        True
    """
    _check_common(batch_size, dim, n_points, noise_std, sparsity, dtype)
    generator = seeded_generator(seed)
    device = check_device(device)
    kwargs = dict(
        dim=dim, n_points=n_points, noise_std=noise_std, sparsity=sparsity, dtype=dtype,
        device=device,
    )  # fmt: skip
    return _stream(batch_size, generator, kwargs)


def _stream(
    batch_size: int, generator: torch.Generator, kwargs: dict[str, Any]
) -> Iterator[RegressionBatch]:
    # A separate generator function, so that batches() checks its arguments when called.
    while True:
        yield generate(batch_size, generator=generator, **kwargs)


def _check_common(
    batch_size: object,
    dim: object,
    n_points: object,
    noise_std: object,
    sparsity: object,
    dtype: object,
) -> None:
    # object annotations: these are the checks, so the runtime type checker must let
    # wrong values through to them
    check_int("batch_size", batch_size, minimum=1)
    check_int("dim", dim, minimum=1)
    check_int("n_points", n_points, minimum=1)
    if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)):
        raise ValueError(f"noise_std must be a float >= 0, got {noise_std!r}")
    if not noise_std >= 0 or noise_std == float("inf"):  # `not >=` also catches NaN
        raise ValueError(f"noise_std must be a finite float >= 0, got {noise_std!r}")
    if sparsity is not None:
        check_int("sparsity", sparsity, minimum=1, why="None for a dense w")
        if sparsity > dim:  # type: ignore[operator]  # both checked ints by now
            raise ValueError(f"sparsity must be at most dim = {dim}, got {sparsity!r}")
    check_dtype(dtype)
