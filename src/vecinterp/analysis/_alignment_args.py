"""The argument checks of :func:`~vecinterp.alignment_search`: the output mask, the
counterfactual, the position, the optimiser and the held-out fraction."""

import dataclasses
import math

import torch

from ..model import HookedVectorTransformer


@dataclasses.dataclass(frozen=True)
class Optimiser:
    """The search's optimiser settings, checked by :func:`check_optimiser`."""

    optimizer: str
    steps: int
    lr: float
    batch_size: int | None


def check_mask(mask: object, batch: int, n_pos: int, device: torch.device) -> torch.Tensor:
    if mask is None:
        return torch.ones(batch, n_pos, dtype=torch.bool, device=device)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            f"output_mask must be a bool tensor [batch, pos] or [pos], got {mask!r:.60}"
        )
    if tuple(mask.shape) not in ((batch, n_pos), (n_pos,)):
        raise ValueError(
            f"output_mask must be [batch={batch}, pos={n_pos}] or [pos={n_pos}], got "
            f"{tuple(mask.shape)}"
        )
    if not mask.any():
        raise ValueError("output_mask selects no output")
    return mask.to(device).expand(batch, n_pos)


def check_counterfactual(
    cf: object, batch: int, n_pos: int, model: HookedVectorTransformer, mask: torch.Tensor
) -> torch.Tensor:
    shape = (batch, n_pos, model.cfg.d_out)
    if not isinstance(cf, torch.Tensor) or not cf.is_floating_point():
        raise TypeError(f"counterfactual must be a float tensor {shape}, got {cf!r:.60}")
    if tuple(cf.shape) != shape:
        raise ValueError(
            f"counterfactual must be [batch, pos, d_out] = {shape}, got {tuple(cf.shape)}"
        )
    cf = cf.detach().to(device=model.W_E.device, dtype=model.W_E.dtype)
    if not cf[mask].isfinite().all():
        raise ValueError("counterfactual must be finite at the positions output_mask selects")
    return cf.nan_to_num(0.0)


def check_position(position: object, n_pos: int) -> int | None:
    if position is None:
        return None
    if (
        isinstance(position, bool)
        or not isinstance(position, int)
        or not -n_pos <= position < n_pos
    ):
        raise ValueError(
            f"position must be None or an int in [{-n_pos}, {n_pos - 1}], got {position!r}"
        )
    return position % n_pos


def check_optimiser(optimizer: object, steps: object, lr: object, batch_size: object) -> Optimiser:
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not isinstance(lr, float | int) or isinstance(lr, bool) or not 0 < lr < math.inf:
        raise ValueError(f"lr must be a positive float, got {lr!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if batch_size is not None and optimizer == "lbfgs":
        raise ValueError(
            "batch_size is for optimizer='adam'; L-BFGS uses every training pair in each "
            "evaluation (leave batch_size=None, or pass optimizer='adam')"
        )
    return Optimiser(str(optimizer), steps, float(lr), batch_size)


def check_test_fraction(test_fraction: object, batch: int) -> None:
    if not isinstance(test_fraction, float | int) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    n_test = max(1, round(test_fraction * batch))
    if batch - n_test < 1:
        raise ValueError(f"{batch} pairs with test_fraction={test_fraction} leave none to train on")
