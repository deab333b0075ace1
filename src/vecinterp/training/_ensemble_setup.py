"""Argument checks of :func:`~vecinterp.training.ensemble.train_ensemble`: the members, the
per-member values, the data sources, and the check of the batched forward pass."""

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..model.transformer import HookedVectorTransformer
from .data import is_batch


def check_models(models: object) -> list[HookedVectorTransformer]:
    """The members as a list, refusing anything but K >= 1 models of one config and dtype."""
    if isinstance(models, HookedVectorTransformer) or not isinstance(models, Sequence):
        raise TypeError(
            f"models must be a list of HookedVectorTransformer, one per member, got "
            f"{type(models).__name__} (one model: pass [model])"
        )
    if len(models) == 0:
        raise ValueError("models is empty: an ensemble needs K >= 1 members")
    for i, m in enumerate(models):
        if not isinstance(m, HookedVectorTransformer):
            raise TypeError(
                f"models[{i}] must be a HookedVectorTransformer, got {type(m).__name__}"
            )
    cfg, dtype = models[0].cfg, next(models[0].parameters()).dtype
    for i, m in enumerate(models):
        if m.cfg != cfg:
            a, b = cfg.to_dict(), m.cfg.to_dict()
            diff = ", ".join(f"{f} ({b[f]!r} vs {a[f]!r})" for f in a if a[f] != b[f])
            raise ValueError(
                f"models[{i}]'s config differs from models[0]'s in {diff}: the members' "
                "weights are stacked into one computation, so they must share one config "
                "(train models of other configs in another ensemble, or with vi.train)"
            )
        if next(m.parameters()).dtype != dtype:
            raise ValueError(
                f"models[{i}] is {next(m.parameters()).dtype} but models[0] is {dtype}: the "
                "members must share one dtype"
            )
    return list(models)


def per_member(name: str, value: object, k: int) -> list[Any]:
    """``value`` for each of the K members: one value for all, or a sequence of K."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != k:
            raise ValueError(
                f"{name} has {len(value)} values but the ensemble has {k} members: pass one "
                f"{name} for all, or one per member"
            )
        return list(value)
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a number or a list of K numbers, not a tensor")
    return [value] * k


def member_data(data: object, k: int) -> list[Any]:
    """One data source per member: a list of K as given, else one ``make_batch`` for all."""

    def is_source(d: object) -> bool:
        return callable(d) or (hasattr(d, "__iter__") and not is_batch(d))

    if is_batch(data):  # refused by make_source, with vi.train's message
        return [data] * k
    if isinstance(data, list | tuple) and data and all(is_source(d) for d in data):
        if len(data) != k:
            raise ValueError(
                f"data holds {len(data)} data sources but the ensemble has {k} members: pass "
                "one per member, or one make_batch(step, generator) for all"
            )
        _refuse_shared_iterables(data)
        return list(data)
    if k > 1 and not callable(data) and hasattr(data, "__iter__") and not is_batch(data):
        raise ValueError(
            f"data is one iterable of batches, which cannot feed {k} members (they would "
            f"share and split its batches): pass a list of {k} iterables, one per member, or "
            "make_batch(step, generator), which every member calls with its own generator"
        )
    return [data] * k


def _refuse_shared_iterables(data: Sequence[object]) -> None:
    """``ValueError`` for one iterable object given to two members (``[stream] * K``): the
    members would draw alternate batches of one stream. A ``make_batch`` given twice is
    fine: each member calls it with its own generator."""
    first: dict[int, int] = {}
    for i, d in enumerate(data):
        if not isinstance(d, Iterable) or isinstance(d, str | bytes) or is_batch(d):
            continue  # a make_batch(step, generator)
        j = first.setdefault(id(d), i)
        if j != i:
            raise ValueError(
                f"data[{j}] and data[{i}] are the same iterable object "
                f"({type(d).__name__}): the members would share it and draw alternate batches "
                "of it. Pass one iterable per member (e.g. K calls of "
                "affine_recurrence.batches(..., seed=i)), or one make_batch(step, generator), "
                "which every member calls with its own generator"
            )


def check_forward(
    net: HookedVectorTransformer, inputs: torch.Tensor, out: torch.Tensor, i: int
) -> None:
    """Refuse to train if the batched forward disagrees with ``net``'s own (member ``i``)
    on the first sequence of its batch (a small fraction of a step's work)."""
    with torch.no_grad():
        ref = net(inputs[i, :1])
        error = float(torch.linalg.vector_norm(out[i, :1].detach() - ref))
        scale = float(torch.linalg.vector_norm(ref)) + torch.finfo(ref.dtype).tiny
    if not math.isfinite(scale):
        return  # no reference to compare with (NaN/inf); the step's loss check names it
    if not error <= torch.finfo(ref.dtype).eps ** 0.5 * scale:
        raise RuntimeError(
            f"train_ensemble's batched forward differs from member {i}'s own forward "
            f"(relative error {error / scale:.3g}) for the config {net.cfg}: train these "
            "models with vi.train, and report this as a bug"
        )
