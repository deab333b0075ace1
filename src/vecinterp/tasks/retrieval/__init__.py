"""The retrieval problem: follow chains of pairs to the end, in context.

The minimal formulation of Musat (2024), "Stacked attention heads" (``papers/
stacked_attention_heads_musat_2024.txt``, §6 data, §7 the two formulations, §7.1 training).
A sequence holds ``N`` chains ``x_0 -> x_1 -> ... -> x_D``, each written as its ``D`` pairs
``(x_i, x_{i+1})``, and then one query ``x_0`` per chain; at each query the model must
output the chain that starts there. No symbol has a fixed meaning: every symbol is a fresh
random vector in every sequence, so the only way to follow a chain is to match vectors.

Symbols
-------
Per sequence, each of the ``N (D + 1)`` symbols ``x_i`` of chain ``c`` gets its own vector
of ``K`` (``dim``) independent standard normal components (paper §6: ``N = K = 4``).
:attr:`RetrievalBatch.symbols` keeps them, ``[batch, n_chains, depth + 1, dim]``.

Layout
------
The pairs come step by step, perfectly interleaved: the ``N`` pairs ``(x_0, x_1)`` of all
chains, then the ``N`` pairs ``(x_1, x_2)``, and so on; within a step the order of the
chains is shuffled (per sequence and per step). Then come the ``N`` queries ``x_0``, in
shuffled order. Pair ``s`` of step ``i`` (``s = 0 .. N-1``) gets the *pair index*
``p = i N + s`` and fills positions ``2p`` (its left token ``x_i``) and ``2p + 1`` (its
right token ``x_{i+1}``); query slot ``q`` sits at position ``2 N D + q`` with pair index
``N D + q``. So a sequence has ``N (2D + 1)`` positions.

Each token is its symbol's vector followed by the ``K``-dimensional sin/cos code of its
pair index (the rotary frequencies of Su et al.; ``K`` must be even)::

    code(p)[2m] = sin(p w_m),  code(p)[2m + 1] = cos(p w_m),  w_m = base^(-2m / K)

Both tokens of a pair share their code, which is what ties ``x_i`` to ``x_{i+1}``; each
query has a code of its own. The model's input dimension is ``d_in = 2K`` and the model
uses no positional embedding of its own (``positional="none"``).

Worked layout: ``N = 2`` chains ``a`` (chain 0) and ``b`` (chain 1), ``D = 2``; step 0
drew the order ``b, a``, step 1 the order ``a, b`` and the queries the order ``b, a``::

    position    0    1    2    3    4    5    6    7    8    9
    symbol     b_0  b_1  a_0  a_1  a_1  a_2  b_1  b_2  b_0  a_0
    pair index  0    0    1    1    2    2    3    3    4    5
    role       L0   R0   L0   R0   L1   R1   L1   R1   Q    Q      (L_i: x_i, R_i: x_{i+1})
    loss_mask   F    F    F    F    F    F    F    F    T    T
    target                                                [b_1 b_2] [a_1 a_2]   (IC)

    left_pos  = [[2, 4], [0, 6]]    right_pos = left_pos + 1    (chains a, b; steps 0, 1)
    query_pos = [9, 8]              query_chain = [1, 0]        (query slots 0, 1 -> b, a)

Targets
-------
Outputs are read at the ``N`` query positions only (``loss_mask`` is True there and nowhere
else; ``targets`` is zero elsewhere). The query of chain ``c`` wants

- implicit curriculum (IC, the default): ``x_1 .. x_D`` of chain ``c`` concatenated,
  ``d_out = D K`` (block ``j - 1`` of size ``K`` is ``x_j``);
- non-IC: ``x_D`` only, ``d_out = K``.

A batch therefore trains with the masked MSE of :func:`vecinterp.train` unchanged. The
paper finds that IC learns and non-IC does not (every non-IC run ends with a loss above
0.7; predicting zero gives 1), and that in IC the *partial losses*
(:func:`partial_losses`, the MSE of block ``x_j``) fall in order ``x_1, x_2, ...``.
Theorem 1 of the paper: following a chain of ``D`` steps needs at least ``log_3(2D)``
layers (:func:`min_layers`).

Analysis structure
------------------
The positions of every chain vary per sequence, so the batch carries them:
:attr:`~RetrievalBatch.left_pos`, :attr:`~RetrievalBatch.right_pos` (``[batch, n_chains,
depth]``), :attr:`~RetrievalBatch.query_pos` (``[batch, n_chains]``) and
:attr:`~RetrievalBatch.role_positions` (all ``2D + 1`` roles of a chain in sequence order,
``L0 R0 L1 R1 ... Q``). E.g. the attention of head ``h`` from every query to the right
token of its chain's first pair is ``pattern[b, h, query_pos[b, c], right_pos[b, c, 0]]``.

Choices where the paper is silent
---------------------------------
- The code is the rotary pair ``(sin, cos)`` per frequency with base 10000 (``rotary_base``);
  the paper says only "a K-dimensional rotary positional encoding". Queries take the pair
  indices after the last pair's. With ``K = 4`` there are two frequencies, 1 and 0.01; the
  second barely moves over the ``N (D + 1) <= 28`` indices of the paper's settings, so
  codes nearly repeat every ``2 pi`` indices (``cos 6 = 0.96``): telling pair ``p`` from
  pair ``p - 6`` by the code takes large attention weights. A smaller ``rotary_base``
  spreads the codes (examples/retrieval_problem.py keeps 10000).
- The paper's §7 gives the IC target "DN dimensions"; it holds ``x_1 .. x_D`` of one chain,
  i.e. ``D K`` numbers (``N = K = 4`` there, so the two agree).
- Random numbers are drawn on the CPU in float64 from a ``torch.Generator`` in the fixed
  order symbols, pair orders, query order, then cast to ``dtype`` and moved to ``device``,
  so a seed gives the same data everywhere. Without ``seed`` or ``generator`` torch's
  global CPU generator is used.
- The paper trains on a fixed set of ``2^20`` sequences; :func:`batches` and
  ``generate(generator=...)`` draw fresh ones every step.

Model and training
------------------
:func:`model_config` builds the paper's model (§7.1: 8 heads, ``d_model`` 128, LayerNorm,
GPT-2 blocks, no positional embedding) with any number of layers, or a scaled-down one.
:data:`PAPER_RECIPE` is its recipe: Adam with decoupled weight decay (``vi.train`` uses
AdamW) at lr ``1e-3``, weight decay 0.1, batch 512, 10k steps.

Example::

    import vecinterp as vi
    from vecinterp.tasks import retrieval

    cfg = retrieval.model_config(depth=3, n_layers=4)
    model = vi.HookedVectorTransformer(cfg, seed=0)
    result = vi.train(model, lambda step, g: retrieval.generate(512, 3, generator=g),
                      steps=10_000, lr=1e-3, weight_decay=0.1)
    batch = retrieval.generate(256, 3, seed=1)
    retrieval.partial_losses(result.model(batch.inputs), batch)   # [3]: x_1, x_2, x_3
"""

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float, Int

from ..model.config import VectorTransformerConfig
from ._common import check_device, check_dtype, check_int, resolve_generator

__all__ = [
    "DEFAULT_CHAINS",
    "DEFAULT_DIM",
    "DEFAULT_ROTARY_BASE",
    "PAPER_RECIPE",
    "RetrievalBatch",
    "batches",
    "generate",
    "min_layers",
    "model_config",
    "partial_losses",
    "positional_code",
    "role_names",
]

DEFAULT_CHAINS = 4
"""``N``, the number of chains per sequence in the paper (§6)."""
DEFAULT_DIM = 4
"""``K``, the dimension of each symbol's vector (and of the positional code) in the paper."""
DEFAULT_ROTARY_BASE = 10000.0
"""The base of the positional code's frequencies (Su et al.'s)."""

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


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalBatch:
    """One batch of retrieval sequences and where every chain's tokens sit.

    Attributes:
        inputs: ``[batch, pos, d_in]`` with ``pos = N (2D + 1)`` and ``d_in = 2K``: each
            token's symbol vector, then its pair index's positional code.
        targets: ``[batch, pos, d_out]``, zero except at the query positions, where it is
            ``x_1 .. x_D`` of the query's chain (IC, ``d_out = D K``) or ``x_D`` (non-IC,
            ``d_out = K``).
        loss_mask: ``[batch, pos]``, True exactly at the ``N`` query positions (the last
            ``N``).
        symbols: ``[batch, n_chains, depth + 1, dim]``, ``x_0 .. x_D`` of every chain.
        left_pos: ``[batch, n_chains, depth]`` (int64), the position of ``x_i`` as the left
            token of pair ``i`` of chain ``c``.
        right_pos: ``[batch, n_chains, depth]``, the position of ``x_{i+1}`` as the right
            token of pair ``i`` (always ``left_pos + 1``).
        query_pos: ``[batch, n_chains]``, the position of chain ``c``'s query.
        query_chain: ``[batch, n_chains]``, the chain whose query sits in query slot ``q``
            (position ``2 N D + q``); the inverse permutation of ``query_pos - 2 N D``.
        implicit_curriculum: whether the targets are the IC ones.

    ``eq=False``: compare the fields with ``torch.equal``.

    Example:
        >>> from vecinterp.tasks.retrieval import generate
        >>> b = generate(3, 2, n_chains=2, seed=0)
        >>> b.n_pos, b.first_query, tuple(b.role_positions.shape)
        (10, 8, (3, 2, 5))
        >>> bool((b.inputs[0, b.query_pos[0, 1], :4] == b.symbols[0, 1, 0]).all())
        True
    """

    inputs: Float[torch.Tensor, "batch pos d_in"]
    targets: Float[torch.Tensor, "batch pos d_out"]
    loss_mask: Bool[torch.Tensor, "batch pos"]
    symbols: Float[torch.Tensor, "batch n_chains n_symbols dim"]
    left_pos: Int[torch.Tensor, "batch n_chains depth"]
    right_pos: Int[torch.Tensor, "batch n_chains depth"]
    query_pos: Int[torch.Tensor, "batch n_chains"]
    query_chain: Int[torch.Tensor, "batch n_chains"]
    implicit_curriculum: bool

    @property
    def n_chains(self) -> int:
        """``N``, the number of chains per sequence."""
        return self.symbols.shape[1]

    @property
    def depth(self) -> int:
        """``D``, the number of pairs (retrieval steps) per chain."""
        return self.symbols.shape[2] - 1

    @property
    def dim(self) -> int:
        """``K``, the dimension of a symbol's vector."""
        return self.symbols.shape[3]

    @property
    def n_pos(self) -> int:
        """The number of positions, ``N (2D + 1)``."""
        return self.inputs.shape[1]

    @property
    def first_query(self) -> int:
        """The position of query slot 0, ``2 N D``."""
        return 2 * self.n_chains * self.depth

    @property
    def role_positions(self) -> Int[torch.Tensor, "batch n_chains n_roles"]:
        """Every token of every chain in sequence order: ``[batch, n_chains, 2D + 1]`` with
        roles ``L0 R0 L1 R1 ... L{D-1} R{D-1} Q`` (:func:`role_names`)."""
        pairs = torch.stack([self.left_pos, self.right_pos], dim=-1).flatten(-2)
        return torch.cat([pairs, self.query_pos[..., None]], dim=-1)


def role_names(depth: int) -> list[str]:
    """Names of the ``2D + 1`` roles of :attr:`RetrievalBatch.role_positions`.

    ``L{i}`` is ``x_i`` in pair ``i``, ``R{i}`` is ``x_{i+1}`` in pair ``i``, ``Q`` the query.

    Example:
        >>> from vecinterp.tasks.retrieval import role_names
        >>> role_names(2)
        ['L0', 'R0', 'L1', 'R1', 'Q']
    """
    check_int("depth", depth, minimum=1)
    return [f"{side}{i}" for i in range(depth) for side in "LR"] + ["Q"]


def positional_code(
    indices: Int[torch.Tensor, "*shape"], dim: int, base: float = DEFAULT_ROTARY_BASE
) -> Float[torch.Tensor, "*shape dim"]:
    r"""The ``dim``-dimensional sin/cos code of pair indices (float64).

    .. math::
        \mathrm{code}(p)_{2m} = \sin(p\, \omega_m), \quad
        \mathrm{code}(p)_{2m+1} = \cos(p\, \omega_m), \quad
        \omega_m = \mathrm{base}^{-2m/\mathrm{dim}}

    ``indices`` must be an integer tensor, ``dim`` even and ``base`` a positive finite
    number (each refused by name otherwise).

    Example:
        >>> import torch
        >>> from vecinterp.tasks.retrieval import positional_code
        >>> positional_code(torch.tensor([0]), 4).tolist()
        [[0.0, 1.0, 0.0, 1.0]]
    """
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be an integer tensor, got {type(indices).__name__}")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise TypeError(
            f"indices must be an integer tensor (pair indices), got {indices.dtype}; a "
            "fractional index has no pair"
        )
    _check_dim(dim)
    _check_base(base, "base")
    freq = torch.tensor(float(base), dtype=torch.float64) ** (
        -torch.arange(0, dim, 2, dtype=torch.float64) / dim
    )
    angles = indices.to(torch.float64)[..., None] * freq
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)


def generate(
    batch_size: int,
    depth: int,
    *,
    n_chains: int = DEFAULT_CHAINS,
    dim: int = DEFAULT_DIM,
    implicit_curriculum: bool = True,
    rotary_base: float = DEFAULT_ROTARY_BASE,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> RetrievalBatch:
    """Draw one batch of retrieval sequences (see the module docstring for the layout).

    Args:
        batch_size: number of sequences (>= 1).
        depth: ``D``, pairs per chain (>= 1).
        n_chains: ``N``, chains per sequence (>= 1).
        dim: ``K``, dimension of each symbol's vector and of the positional code (even,
            >= 2).
        implicit_curriculum: IC targets ``x_1 .. x_D`` (``d_out = D K``) or non-IC ``x_D``
            (``d_out = K``).
        rotary_base: base of the positional code's frequencies (> 0).
        generator: a CPU ``torch.Generator`` to draw from (its state advances).
        seed: seed of a fresh generator; give at most one of ``seed`` and ``generator``.
        dtype: floating dtype of ``inputs``/``targets``/``symbols``.
        device: where the tensors live (drawn on the CPU, then moved).

    Returns:
        A :class:`RetrievalBatch` with ``inputs [batch_size, N (2D + 1), 2K]``.

    Raises:
        ValueError: for an argument outside its allowed values.
        TypeError: for a non-bool ``implicit_curriculum``.

    Example:
        >>> from vecinterp.tasks.retrieval import generate
        >>> b = generate(8, 3, seed=0)
        >>> b.inputs.shape, b.targets.shape, b.loss_mask[0].nonzero().flatten().tolist()
        (torch.Size([8, 28, 8]), torch.Size([8, 28, 12]), [24, 25, 26, 27])
    """
    _check_common(batch_size, depth, n_chains, dim, implicit_curriculum, rotary_base, dtype)
    generator = resolve_generator(generator, seed)
    device = check_device(device)
    B, N, D, K = batch_size, n_chains, depth, dim

    symbols = torch.randn(B, N, D + 1, K, generator=generator, dtype=torch.float64)
    # slot_chain[b, i, s]: the chain whose pair i sits in slot s of step i
    slot_chain = torch.rand(B, D, N, generator=generator, dtype=torch.float64).argsort(-1)
    query_chain = torch.rand(B, N, generator=generator, dtype=torch.float64).argsort(-1)
    chain_slot = slot_chain.argsort(-1)  # [B, D, N]: the slot of chain c in step i
    query_slot = query_chain.argsort(-1)  # [B, N]

    steps = torch.arange(D)
    left_pos = 2 * (steps[None, :, None] * N + chain_slot)  # [B, D, N]
    left_pos = left_pos.transpose(1, 2).contiguous()  # [B, N, D]
    right_pos = left_pos + 1
    query_pos = 2 * N * D + query_slot

    batch_idx = torch.arange(B)[:, None, None]
    left_sym = symbols[batch_idx, slot_chain, steps[None, :, None]]  # [B, D, N(slot), K]
    right_sym = symbols[batch_idx, slot_chain, steps[None, :, None] + 1]
    pair_tokens = torch.stack([left_sym, right_sym], dim=3).reshape(B, 2 * N * D, K)
    query_tokens = symbols[torch.arange(B)[:, None], query_chain, 0]  # [B, N, K]
    tokens = torch.cat([pair_tokens, query_tokens], dim=1)

    pair_index = torch.cat([torch.arange(N * D).repeat_interleave(2), N * D + torch.arange(N)])
    code = positional_code(pair_index, K, rotary_base)  # [pos, K]
    inputs = torch.cat([tokens, code.expand(B, -1, -1)], dim=-1)

    chain_targets = symbols[:, :, 1:].flatten(2) if implicit_curriculum else symbols[:, :, D]
    n_pos = N * (2 * D + 1)
    targets = torch.zeros(B, n_pos, chain_targets.shape[-1], dtype=torch.float64)
    targets[:, 2 * N * D :] = chain_targets[torch.arange(B)[:, None], query_chain]
    loss_mask = (torch.arange(n_pos) >= 2 * N * D).repeat(B, 1)

    return RetrievalBatch(
        inputs=inputs.to(device=device, dtype=dtype),
        targets=targets.to(device=device, dtype=dtype),
        loss_mask=loss_mask.to(device),
        symbols=symbols.to(device=device, dtype=dtype),
        left_pos=left_pos.to(device),
        right_pos=right_pos.to(device),
        query_pos=query_pos.to(device),
        query_chain=query_chain.to(device),
        implicit_curriculum=implicit_curriculum,
    )


def batches(
    batch_size: int,
    depth: int,
    *,
    seed: int,
    n_chains: int = DEFAULT_CHAINS,
    dim: int = DEFAULT_DIM,
    implicit_curriculum: bool = True,
    rotary_base: float = DEFAULT_ROTARY_BASE,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Iterator[RetrievalBatch]:
    """An endless stream of fresh batches from one generator seeded with ``seed``.

    The first batch equals ``generate(batch_size, depth, seed=seed, ...)``; the arguments
    are checked now, not at the first ``next``.

    Example:
        >>> from vecinterp.tasks.retrieval import batches
        >>> stream = batches(4, 2, seed=0, n_chains=2)
        >>> next(stream).inputs.shape
        torch.Size([4, 10, 8])
    """
    _check_common(batch_size, depth, n_chains, dim, implicit_curriculum, rotary_base, dtype)
    generator = resolve_generator(None, seed)
    device = check_device(device)
    kwargs = dict(
        n_chains=n_chains,
        dim=dim,
        implicit_curriculum=implicit_curriculum,
        rotary_base=rotary_base,
        dtype=dtype,
        device=device,
    )
    return _stream(generator, batch_size, depth, kwargs)


def _stream(
    generator: torch.Generator | None, batch_size: int, depth: int, kwargs: dict[str, Any]
) -> Iterator[RetrievalBatch]:
    while True:
        yield generate(batch_size, depth, generator=generator, **kwargs)


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


# ------------------------------------------------------------------------------ checks


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _check_dim(dim: object) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(
            f"dim must be an even int >= 2 (the positional code pairs sin and cos), got {dim!r}"
        )


def _check_base(base: object, name: str = "rotary_base") -> None:
    if isinstance(base, bool) or not isinstance(base, int | float) or not 0 < base < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {base!r}")


def _check_common(
    batch_size: int,
    depth: int,
    n_chains: int,
    dim: int,
    implicit_curriculum: bool,
    rotary_base: float,
    dtype: torch.dtype,
) -> None:
    check_int("batch_size", batch_size, minimum=1)
    check_int("depth", depth, minimum=1)
    check_int("n_chains", n_chains, minimum=1)
    _check_dim(dim)
    _check_bool("implicit_curriculum", implicit_curriculum)
    _check_base(rotary_base)
    check_dtype(dtype)
