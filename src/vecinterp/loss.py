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

    Non-finite values: ``target`` must be finite at the positions ``loss_mask`` selects
    (``ValueError`` naming the first bad index; a masked-out position may hold NaN, e.g.
    where a sequence has no next vector). ``pred`` is not checked: a model whose outputs
    blew up gives a NaN or inf loss, which is how training notices divergence.

    Example:
        >>> import torch, vecinterp as vi
        >>> y, t = torch.zeros(1, 3, 2), torch.ones(1, 3, 2)
        >>> float(vi.masked_mse(y, t, torch.tensor([False, True, True])))
        1.0
    """
    for name, t in (("pred", pred), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor [batch, pos, d_out], got {type(t).__name__}")
    if pred.shape != target.shape:
        raise ValueError(
            f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape"
        )
    return mse_at(pred, target, loss_mask, reduction, check_target="target")


def mse_at(
    pred: Float[torch.Tensor, "batch pos d_out"],
    target: Float[torch.Tensor, "batch pos d_out"],
    loss_mask: object,
    reduction: str = "mean",
    *,
    check_target: str | None = None,
) -> torch.Tensor:
    """:func:`masked_mse` of two tensors of one shape, without checking their types and
    shapes; ``target`` is checked for NaN/inf at the used positions only if
    ``check_target`` names it (the training loop skips that cost and diagnoses a
    non-finite loss instead).

    Example:
        >>> import torch
        >>> from vecinterp.loss import mse_at
        >>> t = torch.tensor([[[1.0], [float("nan")]]])
        >>> float(mse_at(torch.zeros(1, 2, 1), t, torch.tensor([True, False])))
        1.0
    """
    if reduction not in ("mean", "none", "sum"):
        raise ValueError(f"reduction must be 'mean', 'none' or 'sum', got {reduction!r}")
    batch_pos = pred.shape[:-1]
    mask = loss_positions(loss_mask, batch_pos, pred.device)
    # select before squaring: a NaN at a masked-out position reaches neither the loss
    # nor, through the backward pass, the gradient
    diff = torch.where(mask[..., None], pred - target, torch.zeros((), dtype=pred.dtype))
    masked = diff.pow(2).mean(-1)
    total = masked.sum()
    count = mask.sum()
    # what the checks need, read in one transfer to the host. A NaN/inf target at a used
    # position makes the sum non-finite, so the targets are scanned only when it is.
    wanted = [count] if reduction == "mean" else []
    if check_target is not None:
        wanted.append(torch.isfinite(total).to(count.dtype))
    values = torch.stack(wanted).tolist() if wanted else []
    n_used = values.pop(0) if reduction == "mean" else 1
    if values and not values[0]:
        bad = ~torch.isfinite(target) & mask[..., None]
        if bool(bad.any()):  # else the predictions are to blame: their loss is returned
            raise ValueError(
                f"{check_target} contains NaN or inf at a position the loss uses (first at "
                f"index {bad.nonzero()[0].tolist()})"
            )
    if reduction == "none":
        return masked
    if reduction == "sum":
        return total
    if n_used == 0:
        raise ValueError("loss_mask selects no position")
    return total / count


def loss_positions(
    loss_mask: object, batch_pos: tuple[int, ...] | torch.Size, device: torch.device
) -> Bool[torch.Tensor, "batch pos"]:
    """The positions the loss uses: ``loss_mask`` checked and expanded to ``[batch, pos]``
    (all True for ``None``).

    ``loss_mask`` must be a bool tensor ``[batch, pos]`` or ``[pos]``. A Python list is
    refused rather than converted: a list of indices such as ``[2, 3]`` would silently
    become a mask that selects every position. A mask on another device is moved to
    ``device`` (``ValueError`` if it cannot be, e.g. from the meta device).

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
    shape = tuple(loss_mask.shape)
    # two comparisons, not `in (a, b)`, which torch.compile's dynamo misjudges when the
    # batch size is symbolic
    if shape != batch_pos and shape != batch_pos[1:]:
        raise ValueError(
            f"loss_mask must have shape [batch, pos]={batch_pos} or "
            f"[pos]={batch_pos[1:]}, got {tuple(loss_mask.shape)}"
        )
    if loss_mask.device != device:
        try:  # a mask on the CPU may serve a model on a GPU: moved, not refused
            loss_mask = loss_mask.to(device)
        except (RuntimeError, NotImplementedError) as err:  # e.g. the meta device: no data
            raise ValueError(
                f"loss_mask is on {loss_mask.device} and cannot be moved to {device}, where "
                f"the outputs are: {err}"
            ) from None
    return loss_mask.expand(batch_pos)
