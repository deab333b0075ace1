"""Attention-pattern measures of the claims: the parity contrast of claim 4
(:func:`checkerboard_contrast`) and the earlier position each head attends to most
(:func:`most_attended_earlier_position`, claim 3's readings)."""

import torch
from jaxtyping import Float


def checkerboard_contrast(
    patterns: Float[torch.Tensor, "batch n_heads dest_pos src_pos"],
    *,
    include_diagonal: bool = False,
) -> Float[torch.Tensor, " n_heads"]:
    """Parity contrast of attention patterns, per head: +1 for a perfect checkerboard.

    For each row ``d >= 2`` and the positions ``s`` it attends to, ``m_same`` is the mean
    attention on the positions of the same parity as ``d`` and ``m_other`` on the others;
    ``contrast = Σ_{b,d} (m_same − m_other) / Σ_{b,d} (m_same + m_other)``: +1 when all
    attention sits on every other position counted from the row, −1 when it sits on the
    other parity (a previous-position head), 0 with no parity preference. By default only
    earlier positions ``s < d`` count, so a head that only attends to itself is not called
    a checkerboard; ``include_diagonal=True`` counts ``s = d`` as same parity (the paper's
    words, §4.6: "every other vector starting from the destination vector itself").

    Args:
        patterns: ``[batch, n_heads, dest_pos, src_pos]``.
        include_diagonal: count the diagonal ``s = d`` as same parity.

    Returns:
        ``[n_heads]`` contrasts in ``[-1, 1]``.

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
    num = (m_same - m_other).sum(dim=(0, 2))
    den = (m_same + m_other).sum(dim=(0, 2)).clamp_min(1e-12)
    return num / den


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
