"""Private helpers shared by the ablation modules (:mod:`vecinterp.analysis.ablation`):
the replacement kinds, the argument checks for kinds, head and position indices, the
type of a ``population=`` argument, and how large one batched pass may be."""

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

# a batched pass keeps its widest activation at about this many numbers. On CPU larger passes
# fall out of cache and run slower per row (an [n, 3072] MLP product of the paper-size affine
# model: 55 GFLOP/s at 896 rows, 31 at 14,000, one thread); accelerators like them large.
_PASS_ELEMENTS = {"cpu": 2**22}
_PASS_ELEMENTS_ACCELERATOR = 2**27

KINDS = ("zero", "mean", "resample")
_HEAD_HOOKS = ("z", "result")

Population = torch.Tensor | Mapping[str, torch.Tensor]
"""A population batch of inputs ``[n, pos, d_in]``, or the means
:func:`~vecinterp.mean_activations` computed from one (hook name to ``[pos, ...]``)."""


def default_kind(function: str, default: str) -> str:
    """``default``, with a ``FutureWarning`` that ``function`` was called without ``kind``:
    :func:`~vecinterp.ablate_heads` zero-ablates by default and
    :func:`~vecinterp.head_ablation_sweep` mean-ablates, so a call that leaves ``kind``
    out says which one it gets and asks for ``kind`` (to be required in a later
    release)."""
    other = {"ablate_heads": ("head_ablation_sweep", "mean")}.get(
        function, ("ablate_heads", "zero")
    )
    warnings.warn(
        f"{function} was called without kind, so it uses its default kind={default!r} "
        f"({other[0]}'s default is {other[1]!r}); pass kind='zero', 'mean' or 'resample' "
        "explicitly: kind will be required in a later release",
        FutureWarning,
        stacklevel=3,
    )
    return default


def _check_choice(value: object, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, one of {allowed}, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")
    return value


def _index_list(value: object, what: str) -> list[int] | None:
    """``None``, an int or an iterable of ints (a 0/1-D integer tensor too) as a list."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.ndim <= 1 and not value.is_floating_point():
        value = value.reshape(-1).tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = list(value)
        if all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            if not items:
                raise ValueError(f"{what} is empty: select at least one index")
            return items
    raise TypeError(f"{what} must be None, an int or a sequence of ints, got {value!r}")


def _axis_mask(indices: list[int], size: int, what: str, name: str) -> torch.Tensor:
    bad = [i for i in indices if not -size <= i < size]
    if bad:
        raise ValueError(f"{what} {bad} out of range for {name!r}, which has {size} {what}")
    mask = torch.zeros(size, dtype=torch.bool)
    mask[[i % size for i in indices]] = True
    return mask


def _pass_budget(device: torch.device) -> int:
    """How many numbers the widest activation of one batched pass may hold on ``device``."""
    return _PASS_ELEMENTS.get(device.type, _PASS_ELEMENTS_ACCELERATOR)


def _widest(cfg: Any, d_out: int, n_pos: int, hook: str = "z") -> int:
    """The widest per-position activation of a forward pass (numbers per sequence position)."""
    return max(
        cfg.d_model,
        d_out,
        cfg.n_heads * cfg.d_head,
        cfg.n_heads * n_pos,  # attention scores and pattern
        0 if cfg.attn_only or cfg.d_mlp is None else cfg.d_mlp,
        cfg.n_heads * cfg.d_model if hook == "result" else 0,
    )
