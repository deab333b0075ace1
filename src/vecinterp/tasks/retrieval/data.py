"""The sequences of the retrieval problem: the batch type, the positional code and the
generators (the layout is described in :mod:`vecinterp.tasks.retrieval`)."""

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float, Int

from .._common import check_device, check_dtype, check_int, resolve_generator

DEFAULT_CHAINS = 4
"""``N``, the number of chains per sequence in the paper (§6)."""
DEFAULT_DIM = 4
"""``K``, the dimension of each symbol's vector (and of the positional code) in the paper."""
DEFAULT_ROTARY_BASE = 10000.0
"""The base of the positional code's frequencies (Su et al.'s)."""


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
