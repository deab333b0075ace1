"""The model preset, the paper's training recipe and the losses of the retrieval problem
(:func:`model_config`, :data:`PAPER_RECIPE`, :func:`partial_losses`, :func:`min_layers`)."""

import math

import torch
from jaxtyping import Float

from ...model.config import VectorTransformerConfig
from .._common import check_int
from .data import DEFAULT_CHAINS, DEFAULT_DIM, RetrievalBatch, _check_bool, _check_dim

PAPER_RECIPE = dict(
    steps=10_000,
    batch_size=512,
    lr=1e-3,
    weight_decay=0.1,
    optimizer="AdamW",
    train_examples=2**20,
)
"""The paper's training recipe (§7.1): Adam with decoupled weight decay 0.1 (AdamW), lr
1e-3, batch 512, 10k steps, MSE, no dropout, a fixed set of ``2^20`` training sequences."""


def partial_losses(
    outputs: Float[torch.Tensor, "batch pos d_out"], batch: RetrievalBatch
) -> Float[torch.Tensor, " depth"]:
    r"""The IC loss split by chain position: entry ``j - 1`` is the MSE of the ``x_j`` block.

    .. math::
        \mathcal{L}_j = \frac{1}{B N K} \sum_{b, c} \lVert y_{b, q(b,c)}[(j-1)K : jK]
        - x_j^{(b,c)} \rVert^2, \qquad j = 1 .. D

    over the query positions ``q(b, c)``. Their mean is the masked MSE of the batch.

    Args:
        outputs: model outputs ``[batch, pos, D K]`` on ``batch.inputs``.
        batch: an IC batch.

    Returns:
        ``[depth]``, in ``outputs``' dtype (with its autograd graph).

    Raises:
        ValueError: ``batch`` is non-IC (its only block is ``x_D``: use the masked MSE), or
            ``outputs`` does not have ``batch.targets``' shape.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.retrieval import generate, partial_losses
        >>> b = generate(16, 2, seed=0)
        >>> out = b.targets.clone()
        >>> out[..., 4:] += 2.0                    # x_1 right, x_2 off by 2 everywhere
        >>> partial_losses(out, b).tolist()
        [0.0, 4.0]
    """
    if not isinstance(batch, RetrievalBatch):
        raise TypeError(f"batch must be a RetrievalBatch, got {type(batch).__name__}")
    if not batch.implicit_curriculum:
        raise ValueError(
            "partial_losses needs an implicit-curriculum batch (targets x_1 .. x_D); a "
            "non-IC batch's only target is x_D: use vecinterp.masked_mse"
        )
    if not isinstance(outputs, torch.Tensor) or tuple(outputs.shape) != tuple(batch.targets.shape):
        got = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise ValueError(
            f"outputs must have the targets' shape [batch, pos, d_out]="
            f"{tuple(batch.targets.shape)}, got {got}"
        )
    start, D, K = batch.first_query, batch.depth, batch.dim
    pred = outputs[:, start:].unflatten(-1, (D, K))  # [B, N, D, K]
    target = batch.targets[:, start:].to(device=outputs.device, dtype=outputs.dtype)
    return (pred - target.unflatten(-1, (D, K))).pow(2).mean(dim=(0, 1, 3))


def min_layers(depth: int) -> int:
    r"""Theorem 1's lower bound on the number of layers for chains of ``depth`` steps:
    the smallest integer ``t`` with ``t >= log_3(2D)``, i.e. ``3^t >= 2D``.

    Example:
        >>> from vecinterp.tasks.retrieval import min_layers
        >>> [min_layers(d) for d in (1, 2, 3, 4, 5, 14)]
        [1, 2, 2, 2, 3, 4]
    """
    check_int("depth", depth, minimum=1)
    return max(1, math.ceil(math.log(2 * depth, 3) - 1e-12))


def model_config(
    depth: int,
    n_layers: int,
    *,
    implicit_curriculum: bool = True,
    n_chains: int = DEFAULT_CHAINS,
    dim: int = DEFAULT_DIM,
    d_model: int = 128,
    n_heads: int = 8,
    d_head: int | None = None,
    d_mlp: int | None = None,
    attn_only: bool = False,
    act_fn: str = "gelu_tanh",
) -> VectorTransformerConfig:
    """The paper's model for this task (§7.1), or a scaled-down one.

    GPT-2 blocks (pre-LayerNorm, GELU as in Radford et al.), ``n_heads`` heads and
    ``d_model`` 128 by default, ``d_head = d_model / n_heads``, ``d_mlp = 4 d_model``,
    causal attention, no positional embedding (the inputs carry their codes), ``d_in = 2K``,
    ``d_out = D K`` (IC) or ``K`` (non-IC), ``n_ctx = N (2D + 1)``.

    Args:
        depth: ``D``.
        n_layers: number of blocks (the paper: 1 to 8; :func:`min_layers` is the bound).
        implicit_curriculum: IC (``d_out = D K``) or non-IC (``d_out = K``).
        n_chains, dim: ``N`` and ``K`` of the data.
        d_model, n_heads, d_head, d_mlp, attn_only, act_fn: the model's sizes; see
            :class:`~vecinterp.VectorTransformerConfig`.

    Example:
        >>> from vecinterp.tasks.retrieval import model_config
        >>> cfg = model_config(3, 4)
        >>> cfg.d_in, cfg.d_out, cfg.n_ctx, cfg.n_heads, cfg.d_model, cfg.positional
        (8, 12, 28, 8, 128, 'none')
    """
    check_int("depth", depth, minimum=1)
    check_int("n_layers", n_layers, minimum=1)
    check_int("n_chains", n_chains, minimum=1)
    _check_dim(dim)
    _check_bool("implicit_curriculum", implicit_curriculum)
    check_int("n_heads", n_heads, minimum=1)
    check_int("d_model", d_model, minimum=1)
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} is not a multiple of n_heads={n_heads}: pass d_head"
            )
        d_head = d_model // n_heads
    return VectorTransformerConfig(
        d_in=2 * dim,
        d_out=depth * dim if implicit_curriculum else dim,
        d_model=d_model,
        d_head=d_head,
        n_heads=n_heads,
        n_layers=n_layers,
        d_mlp=d_mlp,
        n_ctx=n_chains * (2 * depth + 1),
        act_fn=act_fn,
        normalization="LN",
        positional="none",
        attn_only=attn_only,
    )
