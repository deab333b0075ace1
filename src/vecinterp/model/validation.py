"""Fail-fast checks on what users pass to a model."""

import torch

from .config import VectorTransformerConfig


def check_input(
    x: object,
    cfg: VectorTransformerConfig,
    param: torch.Tensor,
    axis: str = "d_in",
    *,
    name: str = "x",
) -> torch.Tensor:
    """Raise a clear error unless ``x`` is a finite ``[batch, pos, axis]`` float tensor that
    fits ``n_ctx`` and sits on the model's device with the model's dtype. ``axis`` is
    ``"d_in"`` for inputs, ``"d_model"`` for a residual stream fed to a later block.
    ``name`` is what the messages call the tensor: the argument the user passed it as
    (``"population"``, ``"corrupted_x"``, ...)."""
    width = getattr(cfg, axis)
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"expected {name} as a torch.Tensor [batch, pos, {axis}], got {type(x).__name__}"
        )
    if x.ndim != 3:
        hint = f" (add a batch axis with {name}.unsqueeze(0))" if x.ndim == 2 else ""
        raise ValueError(
            f"expected {name} of rank 3 [batch, pos, {axis}={width}], "
            f"got shape {tuple(x.shape)}{hint}"
        )
    if x.shape[-1] != width:
        raise ValueError(
            f"expected the last axis of {name} to be {axis}={width}, got shape {tuple(x.shape)}"
        )
    if x.shape[1] > cfg.n_ctx:
        raise ValueError(
            f"{name} has {x.shape[1]} positions but the model takes at most n_ctx={cfg.n_ctx}"
        )
    if x.shape[1] == 0 or x.shape[0] == 0:
        raise ValueError(
            f"{name} must have at least one batch item and position, got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point {name} with the model's dtype {param.dtype}, got {x.dtype}"
        )
    if x.dtype != param.dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the model's weights are {param.dtype}; "
            f"use {name}.to({param.dtype}) or model.to({x.dtype})"
        )
    if x.device != param.device:
        raise ValueError(
            f"{name} is on {x.device} but the model is on {param.device}; "
            f"use {name}.to('{param.device}')"
        )
    check_finite(name, x)
    return x


def check_finite(name: str, t: torch.Tensor, where: torch.Tensor | None = None) -> None:
    """Raise a ``ValueError`` naming ``name`` and the first bad index unless ``t`` is finite
    (only where the bool mask ``where``, broadcastable to ``t``'s leading axes, is True)."""
    if where is None:
        if bool(torch.isfinite(t).all()):  # the common case: one reduction, no mask
            return
        bad = ~torch.isfinite(t)
    else:
        bad = ~torch.isfinite(t) & where.reshape(*where.shape, *[1] * (t.ndim - where.ndim))
    if bool(bad.any()):
        first = bad.nonzero()[0].tolist()
        used = " at a position the loss uses" if where is not None else ""
        raise ValueError(f"{name} contains NaN or inf{used} (first at index {first})")


def check_like(name: str, t: object, shape: tuple[int, ...], ref: torch.Tensor) -> torch.Tensor:
    """Check that ``t`` is a tensor of ``shape`` on ``ref``'s device (dtype may differ)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"expected {name} as a torch.Tensor of shape {shape}, got {type(t).__name__}"
        )
    if tuple(t.shape) != shape:
        raise ValueError(f"expected {name} of shape {shape}, got {tuple(t.shape)}")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but the model is on {ref.device}")
    return t
