"""Fail-fast checks on what users pass to a model."""

import torch

from .config import VectorTransformerConfig


def check_input(
    x: object, cfg: VectorTransformerConfig, param: torch.Tensor, axis: str = "d_in"
) -> torch.Tensor:
    """Raise a clear error unless ``x`` is a finite ``[batch, pos, axis]`` float tensor that
    fits ``n_ctx`` and sits on the model's device with the model's dtype. ``axis`` is
    ``"d_in"`` for inputs, ``"d_model"`` for a residual stream fed to a later block."""
    width = getattr(cfg, axis)
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"expected x as a torch.Tensor [batch, pos, {axis}], got {type(x).__name__}"
        )
    if x.ndim != 3:
        hint = " (add a batch axis with x.unsqueeze(0))" if x.ndim == 2 else ""
        raise ValueError(
            f"expected x of rank 3 [batch, pos, {axis}={width}], got shape {tuple(x.shape)}{hint}"
        )
    if x.shape[-1] != width:
        raise ValueError(
            f"expected the last axis of x to be {axis}={width}, got shape {tuple(x.shape)}"
        )
    if x.shape[1] > cfg.n_ctx:
        raise ValueError(
            f"x has {x.shape[1]} positions but the model takes at most n_ctx={cfg.n_ctx}"
        )
    if x.shape[1] == 0 or x.shape[0] == 0:
        raise ValueError(f"x must have at least one batch item and position, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point x with the model's dtype {param.dtype}, got {x.dtype}"
        )
    if x.dtype != param.dtype:
        raise TypeError(
            f"x has dtype {x.dtype} but the model's weights are {param.dtype}; "
            f"use x.to({param.dtype}) or model.to({x.dtype})"
        )
    if x.device != param.device:
        raise ValueError(
            f"x is on {x.device} but the model is on {param.device}; use x.to('{param.device}')"
        )
    if not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).nonzero()[0].tolist()
        raise ValueError(f"x contains NaN or inf (first at index {bad})")
    return x


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
