"""The masked mean-squared error used by training and analysis."""

import torch
from jaxtyping import Bool, Float


def masked_mse(
    pred: Float[torch.Tensor, "batch pos d_out"],
    target: Float[torch.Tensor, "batch pos d_out"],
    loss_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    r"""Mean squared error over the positions ``loss_mask`` selects.

    .. math::
        \mathrm{MSE} = \frac{1}{|M|\, d_{out}} \sum_{(b,p) \in M} \lVert y_{bp} - t_{bp} \rVert^2

    Args:
        pred: model outputs ``[batch, pos, d_out]``.
        target: targets of the same shape.
        loss_mask: boolean ``[batch, pos]`` or ``[pos]``; ``None`` uses every position.
        reduction: ``"mean"`` (a scalar), ``"none"`` (``[batch, pos]``, the per-position
            mean over ``d_out``, zero where masked out) or ``"sum"``.

    Example:
        >>> import torch, vecinterp as vi
        >>> y, t = torch.zeros(1, 3, 2), torch.ones(1, 3, 2)
        >>> float(vi.masked_mse(y, t, torch.tensor([False, True, True])))
        1.0
    """
    if pred.shape != target.shape:
        raise ValueError(
            f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape"
        )
    if reduction not in ("mean", "none", "sum"):
        raise ValueError(f"reduction must be 'mean', 'none' or 'sum', got {reduction!r}")
    batch_pos = pred.shape[:-1]
    mask = loss_positions(loss_mask, batch_pos, pred.device)
    # select before squaring: a NaN at a masked-out position reaches neither the loss
    # nor, through the backward pass, the gradient
    diff = torch.where(mask[..., None], pred - target, torch.zeros((), dtype=pred.dtype))
    masked = diff.pow(2).mean(-1)
    if reduction == "none":
        return masked
    total = masked.sum()
    if reduction == "sum":
        return total
    count = mask.sum()
    if int(count) == 0:
        raise ValueError("loss_mask selects no position")
    return total / count


def loss_positions(
    loss_mask: object, batch_pos: tuple[int, ...] | torch.Size, device: torch.device
) -> Bool[torch.Tensor, "batch pos"]:
    """The positions the loss uses: ``loss_mask`` checked and expanded to ``[batch, pos]``
    (all True for ``None``).

    ``loss_mask`` must be a bool tensor ``[batch, pos]`` or ``[pos]``. A Python list is
    refused rather than converted: a list of indices such as ``[2, 3]`` would silently
    become a mask that selects every position.

    Example:
        >>> import torch
        >>> from vecinterp.loss import loss_positions
        >>> loss_positions(torch.tensor([False, True]), (2, 2), torch.device("cpu")).tolist()
        [[False, True], [False, True]]
    """
    batch_pos = tuple(batch_pos)
    if loss_mask is None:
        return torch.ones(batch_pos, dtype=torch.bool, device=device)
    if not isinstance(loss_mask, torch.Tensor):
        raise TypeError(
            f"loss_mask must be a bool tensor [batch, pos] or [pos], got "
            f"{type(loss_mask).__name__}; e.g. torch.tensor(mask, dtype=torch.bool)"
        )
    if loss_mask.dtype != torch.bool:
        raise TypeError(f"loss_mask must be a bool tensor, got {loss_mask.dtype}")
    if tuple(loss_mask.shape) not in (batch_pos, batch_pos[1:]):
        raise ValueError(
            f"loss_mask must have shape [batch, pos]={batch_pos} or "
            f"[pos]={batch_pos[1:]}, got {tuple(loss_mask.shape)}"
        )
    return loss_mask.to(device).expand(batch_pos)
