"""Attention-head detectors: how much of each head's attention falls where a target map says.

Everything works on attention patterns ``A [batch, n_heads, dest_pos, src_pos]`` of
real-vector inputs (no token ids), for every head of every layer at once. A target map
``D [dest_pos, src_pos]`` (or ``[batch, dest_pos, src_pos]``) says where a head of some
kind should attend; the score of a head is the share of its attention that lands there,

    score = mean_batch ( Σ_{d ∈ R, s} A[d, s] D[d, s] / Σ_{d ∈ R, s} A[d, s] ),

where ``R`` is the set of destination rows in which ``D`` is not all zero. Rows where the
target is undefined (position 0 has no previous position; in a causal model rows before
``k`` cannot see position ``k``; the first half of a repeated sequence has nothing to
induct from) are left out of both sums, so a head that does exactly what the target says
scores 1, and for one-hot targets the score lies in ``[0, 1]``.
"""

from collections.abc import Callable
from typing import TypeVar

import torch
from jaxtyping import Float

from ..cache import ActivationCache
from ..model import HookedVectorTransformer
from ..model.validation import check_finite, check_finite_number, check_float_dtype, check_seed
from ._validate import check_model

Patterns = (
    Float[torch.Tensor, "batch n_heads dest_pos src_pos"]
    | Float[torch.Tensor, "n_layers batch n_heads dest_pos src_pos"]
    | ActivationCache
)
Scores = Float[torch.Tensor, " n_heads"] | Float[torch.Tensor, "n_layers n_heads"]
T = TypeVar("T")
KINDS = ("previous_position", "position_k", "induction", "pattern")


# -- target maps --------------------------------------------------------------------
def previous_position_target(n_pos: int) -> Float[torch.Tensor, "dest_pos src_pos"]:
    """The previous-position map: ``D[d, d-1] = 1`` for ``d >= 1``; row 0 is empty.

    Example:
        >>> from vecinterp.analysis.detectors import previous_position_target
        >>> previous_position_target(3)
        tensor([[0., 0., 0.],
                [1., 0., 0.],
                [0., 1., 0.]])
    """
    _check_positive("n_pos", n_pos)
    return torch.eye(n_pos).roll(-1, dims=1).tril(-1)


def position_k_target(n_pos: int, k: int) -> Float[torch.Tensor, "dest_pos src_pos"]:
    """Attend to position ``k``: ``D[d, k] = 1`` for ``d >= k``; rows before ``k`` (which
    cannot see ``k`` in a causal model) are empty.

    Example:
        >>> from vecinterp.analysis.detectors import position_k_target
        >>> position_k_target(3, 1)
        tensor([[0., 0., 0.],
                [0., 1., 0.],
                [0., 1., 0.]])
    """
    _check_positive("n_pos", n_pos)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n_pos:
        raise ValueError(f"k must be an int in [0, {n_pos - 1}] (a position), got {k!r}")
    target = torch.zeros(n_pos, n_pos)
    target[k:, k] = 1.0
    return target


def induction_target(n_pos: int, m: int) -> Float[torch.Tensor, "dest_pos src_pos"]:
    """The induction map for a sequence of period ``m`` (``x[i] = x[i - m]``).

    At destination ``d >= m`` the current vector last occurred at ``d - m``; an induction
    head attends to the vector that followed it, ``D[d, d - m + 1] = 1``. Rows ``d < m``
    (the first occurrence) are empty.

    Example:
        >>> from vecinterp.analysis.detectors import induction_target
        >>> induction_target(4, 2)
        tensor([[0., 0., 0., 0.],
                [0., 0., 0., 0.],
                [0., 1., 0., 0.],
                [0., 0., 1., 0.]])
    """
    _check_positive("n_pos", n_pos)
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m < n_pos:
        raise ValueError(f"m (the period) must be an int in [1, {n_pos - 1}], got {m!r}")
    target = torch.zeros(n_pos, n_pos)
    dest = torch.arange(m, n_pos)
    target[dest, dest - m + 1] = 1.0
    return target


# -- scores -------------------------------------------------------------------------
def pattern_score(patterns: Patterns, target: torch.Tensor) -> Scores:
    """The share of each head's attention that falls on a target map.

    ``score = mean_b Σ_{d∈R_b, s} A[b, d, s] D[b, d, s] / Σ_{d∈R_b, s} A[b, d, s]`` per
    head, with ``R_b`` the rows of ``D[b]`` that are not all zero (see the module
    docstring). For a genuine pattern each row sums to 1, so the denominator is the
    number of scored rows.

    Args:
        patterns: ``[batch, n_heads, dest_pos, src_pos]`` (one layer), ``[n_layers,
            batch, n_heads, dest_pos, src_pos]``, or an :class:`~vecinterp.ActivationCache`
            holding ``hook_pattern`` of every layer. NaN or inf is refused (``ValueError``
            naming the first bad index), here and in every score below.
        target: ``[dest_pos, src_pos]`` or ``[batch, dest_pos, src_pos]``, real weights
            (usually 0/1) or booleans.

    Returns:
        ``[n_heads]`` for one layer's patterns, ``[n_layers, n_heads]`` otherwise.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.detectors import pattern_score, previous_position_target
        >>> uniform = torch.ones(4, 4).tril() / torch.arange(1, 5)[:, None]
        >>> pattern_score(uniform.expand(2, 1, 4, 4), previous_position_target(4))
        tensor([0.3611])
    """
    A = _stack_patterns(patterns)
    batch, n_pos = A.shape[-4], A.shape[-1]
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a tensor [dest_pos, src_pos], got {type(target).__name__}")
    if tuple(target.shape) not in ((n_pos, n_pos), (batch, n_pos, n_pos)):
        raise ValueError(
            f"target must have shape [dest_pos, src_pos] = {(n_pos, n_pos)} or [batch, dest_pos, "
            f"src_pos] = {(batch, n_pos, n_pos)} to match the patterns, got {tuple(target.shape)}"
        )
    D = target.to(device=A.device, dtype=A.dtype)
    if not bool(torch.isfinite(D).all()):
        raise ValueError("target contains NaN or inf")
    D = D.reshape(-1, 1, n_pos, n_pos)  # [batch or 1, 1 (heads), dest, src]
    rows = D.ne(0).any(dim=-1, keepdim=True)
    if not bool(rows.any(dim=-2).all()):
        raise ValueError("target is all zero (for some batch item): no destination row to score")
    hits = (A * D).sum(dim=(-2, -1))
    mass = (A * rows).sum(dim=(-2, -1))
    return (hits / mass).mean(dim=-2)


def previous_position_score(patterns: Patterns) -> Scores:
    """How much each head attends to the previous position (rows ``1..pos-1``).

    :func:`pattern_score` with :func:`previous_position_target`.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.detectors import previous_position_score
        >>> prev = torch.eye(5).roll(-1, dims=1).tril(-1) + torch.eye(5)[0].diag()
        >>> previous_position_score(prev.expand(1, 1, 5, 5))
        tensor([1.])
    """
    A = _stack_patterns(patterns)
    return pattern_score(A, previous_position_target(A.shape[-1]))


def position_k_score(patterns: Patterns, k: int) -> Scores:
    """How much each head attends to position ``k`` (rows ``k..pos-1``).

    :func:`pattern_score` with :func:`position_k_target`.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.detectors import position_k_score
        >>> first = torch.zeros(1, 1, 4, 4); first[..., 0] = 1
        >>> position_k_score(first, 0), position_k_score(first, 2)
        (tensor([1.]), tensor([0.]))
    """
    A = _stack_patterns(patterns)
    return pattern_score(A, position_k_target(A.shape[-1], k))


def induction_score(patterns: Patterns, m: int | None = None) -> Scores:
    """How much each head attends like an induction head on a repeated sequence.

    The input must be a sequence of period ``m`` (e.g. :func:`repeated_random_vectors`:
    ``m`` random vectors, then the same ``m`` again). Only the repeated part (rows
    ``d >= m``) is scored; there the target is ``d - m + 1``, the position right after the
    previous occurrence of the current vector (:func:`induction_target`).

    Args:
        patterns: as in :func:`pattern_score`.
        m: the period; ``None`` means half the number of positions (which must be even).

    Example:
        >>> import torch
        >>> from vecinterp.analysis.detectors import induction_score, induction_target
        >>> A = induction_target(6, 3) + torch.eye(6) * (torch.arange(6) < 3)[:, None]
        >>> induction_score(A.expand(2, 1, 6, 6))
        tensor([1.])
    """
    A = _stack_patterns(patterns)
    n_pos = A.shape[-1]
    if m is None:
        if n_pos % 2:
            raise ValueError(
                f"m=None means a sequence repeated twice, which needs an even number of "
                f"positions; got {n_pos}: pass the period m"
            )
        m = n_pos // 2
    return pattern_score(A, induction_target(n_pos, m))


def attention_patterns(
    model: HookedVectorTransformer, x: Float[torch.Tensor, "batch pos d_in"]
) -> Float[torch.Tensor, "n_layers batch n_heads pos pos"]:
    """Every layer's attention pattern on ``x``, stacked (one forward pass, no gradients).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.detectors import attention_patterns
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> attention_patterns(model, torch.randn(4, 5, 3)).shape
        torch.Size([2, 4, 2, 5, 5])
    """
    model = check_model(model)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=names)
    return torch.stack([cache[name] for name in names])


def detect_heads(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    kind: str,
    threshold: float = 0.5,
    *,
    k: int | None = None,
    m: int | None = None,
    target: torch.Tensor | None = None,
    return_scores: bool = False,
) -> list[tuple[int, int]] | tuple[list[tuple[int, int]], Float[torch.Tensor, "n_layers n_heads"]]:
    """The heads whose detector score on ``x`` is at least ``threshold``.

    Args:
        model: the model.
        x: inputs ``[batch, pos, d_in]``; for ``"induction"`` a repeated sequence such as
            :func:`repeated_random_vectors`.
        kind: ``"previous_position"``, ``"position_k"`` (needs ``k``), ``"induction"``
            (period ``m``, default half the positions) or ``"pattern"`` (needs
            ``target``, see :func:`pattern_score`).
        threshold: the minimum score, a finite number.
        k: the position for ``"position_k"``.
        m: the period for ``"induction"``.
        target: the map for ``"pattern"``.
        return_scores: also return the ``[n_layers, n_heads]`` scores.

    Returns:
        Sorted ``(layer, head)`` pairs with ``score >= threshold`` (and the scores).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.detectors import detect_heads, repeated_random_vectors
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = repeated_random_vectors(4, 3, 3)
        >>> heads, scores = detect_heads(model, x, "induction", 0.9, return_scores=True)
        >>> heads, scores.shape
        ([], torch.Size([2, 2]))
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    check_finite_number("threshold", threshold)  # NaN would select no head, silently
    scorers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "previous_position": previous_position_score,
        "position_k": lambda A: position_k_score(A, _needed(k, "k", kind)),
        "induction": lambda A: induction_score(A, m),
        "pattern": lambda A: pattern_score(A, _needed(target, "target", kind)),
    }
    scores = scorers[kind](attention_patterns(model, x))
    heads = [(int(ell), int(h)) for ell, h in (scores >= threshold).nonzero().tolist()]
    return (heads, scores) if return_scores else heads


def repeated_random_vectors(
    batch: int,
    m: int,
    d_in: int,
    seed: int = 0,
    *,
    repeats: int = 2,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    generator: torch.Generator | None = None,
) -> Float[torch.Tensor, "batch pos d_in"]:
    """Random unit vectors ``r_1..r_m`` repeated: ``[batch, repeats * m, d_in]``.

    Each ``r_i`` is a standard normal vector divided by its norm (uniform on the sphere),
    drawn independently per batch item (float64, then cast) from ``generator`` if given (a
    CPU ``torch.Generator``, advanced by the draw: successive calls give fresh vectors),
    else from a new generator seeded with ``seed``. Position ``i`` holds ``r_{i mod m}``:
    the input for :func:`induction_score`.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.detectors import repeated_random_vectors
        >>> x = repeated_random_vectors(2, 3, 4, seed=0)
        >>> x.shape, bool(torch.equal(x[:, :3], x[:, 3:]))
        (torch.Size([2, 6, 4]), True)
        >>> gen = torch.Generator().manual_seed(0)
        >>> a, b = (repeated_random_vectors(2, 3, 4, generator=gen) for _ in range(2))
        >>> bool(torch.equal(a, x)), bool(torch.equal(a, b))  # seed 0's draw, then a fresh one
        (True, False)
    """
    for name, value in (("batch", batch), ("m", m), ("d_in", d_in), ("repeats", repeats)):
        _check_positive(name, value)
    check_float_dtype("dtype", dtype)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    if generator is None:
        generator = torch.Generator().manual_seed(check_seed("seed", seed))
    gen = generator
    r = torch.randn(batch, m, d_in, generator=gen, dtype=torch.float64)
    r = r / r.norm(dim=-1, keepdim=True)
    return r.repeat(1, repeats, 1).to(dtype=dtype, device=device)


# -- helpers ------------------------------------------------------------------------
def _stack_patterns(patterns: object) -> torch.Tensor:
    """``[..., batch, n_heads, dest_pos, src_pos]`` from a tensor or a cache."""
    if isinstance(patterns, ActivationCache):
        A = torch.stack([patterns["pattern", ell] for ell in range(patterns.cfg.n_layers)])
    elif isinstance(patterns, torch.Tensor):
        A = patterns
    else:
        raise TypeError(
            "patterns must be a tensor [batch, n_heads, dest_pos, src_pos] (or with a leading "
            f"n_layers axis) or an ActivationCache, got {type(patterns).__name__}"
        )
    if A.ndim not in (4, 5) or A.shape[-1] != A.shape[-2]:
        raise ValueError(
            "patterns must have shape [batch, n_heads, dest_pos, src_pos] or [n_layers, batch, "
            f"n_heads, dest_pos, src_pos] with dest_pos == src_pos, got {tuple(A.shape)}"
        )
    if not A.is_floating_point():
        raise TypeError(f"patterns must be a floating-point tensor, got {A.dtype}")
    # a NaN pattern (a model with a NaN weight, or an edited cache) would score NaN
    check_finite("patterns", A)
    return A


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _needed(value: T | None, name: str, kind: str) -> T:
    if value is None:
        raise ValueError(f"kind={kind!r} needs {name}=...")
    return value
