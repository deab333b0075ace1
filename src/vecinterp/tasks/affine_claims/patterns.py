"""Attention-pattern measures of the claims: the parity contrast of claim 4
(:func:`checkerboard_contrast`) and the earlier position each head attends to most
(:func:`most_attended_earlier_position`, claim 3's readings)."""

import torch
from jaxtyping import Float


def checkerboard_contrast(
    patterns: Float[torch.Tensor, "batch n_heads dest_pos src_pos"],
    *,
    include_diagonal: bool = False,
    per_sequence: bool = False,
) -> Float[torch.Tensor, " n_heads"] | Float[torch.Tensor, "batch n_heads"]:
    """Parity contrast of attention patterns, per head: +1 for a perfect checkerboard.

    For each row ``d >= 2`` and the positions ``s`` it attends to, ``m_same`` is the mean
    attention on the positions of the same parity as ``d`` and ``m_other`` on the others;
    ``contrast = Σ_{b,d} (m_same − m_other) / Σ_{b,d} (m_same + m_other)``: +1 when all
    attention sits on every other position counted from the row, −1 when it sits on the
    other parity (a previous-position head), 0 with no parity preference. By default only
    earlier positions ``s < d`` count, so a head that only attends to itself is not called
    a checkerboard; ``include_diagonal=True`` counts ``s = d`` as same parity (the paper's
    words, §4.6: "every other vector starting from the destination vector itself").
    With ``per_sequence=True`` the sums run over the rows of each sequence alone, one
    contrast per sequence and head (the paper's Figure 4 shows one sequence).

    Args:
        patterns: ``[batch, n_heads, dest_pos, src_pos]``.
        include_diagonal: count the diagonal ``s = d`` as same parity.
        per_sequence: one contrast per sequence instead of one over the batch.

    Returns:
        ``[n_heads]`` contrasts in ``[-1, 1]`` (``[batch, n_heads]`` per sequence).

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_claims import checkerboard_contrast
        >>> n = 5
        >>> two_back = torch.zeros(1, 1, n, n)   # row d attends to d - 2: a checkerboard
        >>> two_back[0, 0, 0, 0] = two_back[0, 0, 1, 0] = 1
        >>> for d in range(2, n):
        ...     two_back[0, 0, d, d - 2] = 1
        >>> checkerboard_contrast(two_back).tolist()
        [1.0]
        >>> prev = torch.zeros(1, 1, n, n)       # row d attends to d - 1: the other parity
        >>> prev[0, 0, 0, 0] = 1
        >>> for d in range(1, n):
        ...     prev[0, 0, d, d - 1] = 1
        >>> checkerboard_contrast(torch.cat([two_back, prev]), per_sequence=True).tolist()
        [[1.0], [-1.0]]
    """
    if not isinstance(patterns, torch.Tensor) or patterns.ndim != 4:
        got = tuple(patterns.shape) if isinstance(patterns, torch.Tensor) else type(patterns)
        raise ValueError(f"patterns must be [batch, n_heads, dest_pos, src_pos], got {got}")
    n = patterns.shape[-1]
    d = torch.arange(n, device=patterns.device)[:, None]
    s = torch.arange(n, device=patterns.device)[None, :]
    seen = ((s <= d) if include_diagonal else (s < d)) & (d >= 2)
    same = (seen & ((d - s) % 2 == 0)).to(patterns.dtype)
    other = (seen & ((d - s) % 2 == 1)).to(patterns.dtype)
    m_same = (patterns * same).sum(-1) / same.sum(-1).clamp_min(1)  # [batch, heads, dest]
    m_other = (patterns * other).sum(-1) / other.sum(-1).clamp_min(1)
    dims = (2,) if per_sequence else (0, 2)
    num = (m_same - m_other).sum(dim=dims)
    den = (m_same + m_other).sum(dim=dims).clamp_min(1e-12)
    return num / den


def early_focus_per_sequence(
    patterns: Float[torch.Tensor, "batch n_heads dest_pos src_pos"],
    positions: tuple[int, ...] = (1, 2),
    *,
    threshold: float = 0.5,
    min_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Claim 3 per sequence: does a majority of heads focus on one early vector?

    For each sequence, head and position ``k`` in ``positions``, the head's share on
    ``k`` is its mean attention from the rows after ``k`` (``d > k``) onto ``k``; the head
    counts for ``k`` if that share is above ``threshold``. The sequence shows the claim if
    at least ``min_heads`` heads count for the **same** ``k`` (the paper's Figure 4 shows
    one sequence in which most layer-1 heads look at one early vector).

    Args:
        patterns: ``[batch, n_heads, dest_pos, src_pos]`` (one layer).
        positions: the candidate positions ``k`` (``1``: ``a_1``, ``2``: ``a_2``), each
            below ``dest_pos - 1``.
        threshold: the share above which a head counts.
        min_heads: heads needed; ``None`` for a majority, ``n_heads // 2 + 1`` (5 of 8).

    Returns:
        ``(shows, which)``: ``[batch]`` booleans, and ``[batch]`` the position the heads
        agree on (the first of ``positions`` that qualifies), ``-1`` where none does.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_claims import early_focus_per_sequence
        >>> A = torch.zeros(2, 3, 5, 5)
        >>> A[..., 0] = 1.0                         # every head on position 0 ...
        >>> A[0, :2, 2:] = 0.0
        >>> A[0, :2, 2:, 1] = 1.0                   # ... but in sequence 0 two of three on a_1
        >>> early_focus_per_sequence(A)
        (tensor([ True, False]), tensor([ 1, -1]))
    """
    if not isinstance(patterns, torch.Tensor) or patterns.ndim != 4:
        got = tuple(patterns.shape) if isinstance(patterns, torch.Tensor) else type(patterns)
        raise ValueError(f"patterns must be [batch, n_heads, dest_pos, src_pos], got {got}")
    n_heads, n_pos = patterns.shape[1], patterns.shape[-1]
    if not positions or any(not 0 <= k < n_pos - 1 for k in positions):
        raise ValueError(f"positions must be in 0..{n_pos - 2} (a row after each), got {positions}")
    need = n_heads // 2 + 1 if min_heads is None else min_heads
    if isinstance(need, bool) or not isinstance(need, int) or not 1 <= need <= n_heads:
        raise ValueError(f"min_heads must be an int in 1..{n_heads} or None, got {min_heads!r}")
    shows = torch.zeros(patterns.shape[0], dtype=torch.bool, device=patterns.device)
    which = torch.full(patterns.shape[:1], -1, dtype=torch.long, device=patterns.device)
    for k in positions:
        share = patterns[:, :, k + 1 :, k].mean(-1)  # [batch, heads]
        ok = (share > threshold).sum(-1) >= need
        which = torch.where(ok & ~shows, k, which)
        shows |= ok
    return shows, which


def most_attended_earlier_position(
    patterns: Float[torch.Tensor, "batch n_heads dest_pos src_pos"],
) -> tuple[list[int], list[float]]:
    """Per head, the earlier position its rows attend to most, and how often.

    In each row ``d >= 2`` (of each sequence), the earlier position ``s < d`` with the
    largest weight wins the row; the head's answer is the position that wins the most rows
    (the smallest on a tie), with the share of rows it wins. A head that mostly attends to
    itself still names the earlier position it prefers.

    Args:
        patterns: ``[batch, n_heads, dest_pos, src_pos]``, ``dest_pos == src_pos >= 3``.

    Returns:
        ``(positions, shares)``: one int and one share of rows per head.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_claims import most_attended_earlier_position
        >>> A = torch.zeros(1, 1, 5, 5)
        >>> A[0, 0, :, 1] = 1.0                # rows 2, 3 and 4 prefer position 1 ...
        >>> A[0, 0, 4] = torch.tensor([0.1, 0.2, 0.6, 0.1, 0.0])   # ... but row 4 prefers 2
        >>> most_attended_earlier_position(A)
        ([1], [0.6666666666666666])
    """
    if not isinstance(patterns, torch.Tensor) or patterns.ndim != 4 or patterns.shape[-1] < 3:
        got = tuple(patterns.shape) if isinstance(patterns, torch.Tensor) else type(patterns)
        raise ValueError(
            f"patterns must be [batch, n_heads, dest_pos, src_pos] with >= 3 positions, got {got}"
        )
    n = patterns.shape[-1]
    d = torch.arange(n, device=patterns.device)[:, None]
    s = torch.arange(n, device=patterns.device)[None, :]
    earlier = s < d
    masked = patterns.masked_fill(~earlier, float("-inf"))[..., 2:, :]  # rows d >= 2
    wins = masked.argmax(-1)  # [batch, heads, rows]
    counts = torch.nn.functional.one_hot(wins, n).sum(dim=(0, 2))  # [heads, src]
    top = counts.argmax(-1)  # the first maximum: the smallest position on a tie
    shares = counts.gather(1, top[:, None])[:, 0].double() / (wins.shape[0] * wins.shape[2])
    return top.tolist(), shares.tolist()
