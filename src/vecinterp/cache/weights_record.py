"""The weights record: a model's weights as a run began, kept without copying any.

:func:`_record_weights` notes where each submodule, parameter and buffer sits, with each
tensor's version counter and storage address; :func:`_changed_weights` lists what is no
longer so (:func:`_unchanged` answers "nothing" column by column, :func:`_changed_rows`
names what changed row by row). ``run_with_cache`` records the weights as the run begins,
and the analyses of an :class:`~vecinterp.ActivationCache` that read the weights refuse
once they changed.
"""

import operator
import weakref
from typing import Any, NamedTuple

import torch
from torch import nn


class _Weights(NamedTuple):
    """The weights of a model as they were at one moment, without copying any: where each
    submodule, parameter and buffer sits (its name, the container ``dict`` and key), the
    object there, and for a tensor its version counter and storage address. In-place
    writes (``p.add_``, ``load_state_dict``, an optimizer step) move the version;
    assigning a new ``Parameter``, module or ``p.data`` (``model.double()``,
    ``.to(device)``) changes the object or the address. Writes through ``p.data[...]``
    bypass PyTorch's version counter and are not seen."""

    modules: tuple[tuple[str, dict[str, Any], str, Any], ...]
    tensors: tuple[tuple[str, dict[str, Any], str, torch.Tensor, int, int], ...]
    sizes: tuple[tuple[str, dict[str, Any], int], ...]
    columns: "_Columns"


class _Columns(NamedTuple):
    """The same record column by column, for :func:`_unchanged`: comparing whole columns
    (``map`` over ``dict.get``, one list of versions, one of addresses) takes about half
    the time of a loop over the rows (27 µs instead of 45 µs for the paper's model), and
    ``run_with_cache`` checks the record twice per call.

    ``counted`` are the tensors that had a version counter (``versions``) when recorded;
    ``uncounted`` the inference tensors, which have none (recorded as version ``-1``)."""

    size_dicts: tuple[dict[str, Any], ...]
    sizes: list[int]
    module_dicts: tuple[dict[str, Any], ...]
    module_keys: tuple[str, ...]
    module_objects: tuple[Any, ...]
    tensor_dicts: tuple[dict[str, Any], ...]
    tensor_keys: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    addresses: list[int]
    counted: tuple[torch.Tensor, ...]
    versions: list[int]
    uncounted: tuple[torch.Tensor, ...]


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


_LAST_RECORD: "weakref.WeakKeyDictionary[nn.Module, _Weights]" = weakref.WeakKeyDictionary()


def _record_weights(model: nn.Module) -> _Weights:
    """``model``'s weights now (see :class:`_Weights`): the last record of ``model`` when
    nothing changed since (tens of microseconds), else a new one."""
    last = _LAST_RECORD.get(model)
    if last is not None and not _changed_weights(last):
        return last
    _LAST_RECORD[model] = record = _walk_weights(model)
    return record


def _walk_weights(model: nn.Module) -> _Weights:
    modules: list[tuple[str, dict[str, Any], str, Any]] = []
    tensors: list[tuple[str, dict[str, Any], str, torch.Tensor, int, int]] = []
    sizes: list[tuple[str, dict[str, Any], int]] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for d in (mod._parameters, mod._buffers, mod._modules):
            sizes.append((prefix.rstrip(".") or "the model", d, len(d)))
        for d in (mod._parameters, mod._buffers):
            for key, t in d.items():
                if t is not None:
                    tensors.append((prefix + key, d, key, t, _version(t), t.data_ptr()))
        for key, child in mod._modules.items():
            modules.append((prefix + key, mod._modules, key, child))
            if child is not None:
                stack.append((f"{prefix}{key}.", child))
    counted = tuple(row[3] for row in tensors if row[4] >= 0)
    columns = _Columns(
        size_dicts=tuple(row[1] for row in sizes),
        sizes=[row[2] for row in sizes],
        module_dicts=tuple(row[1] for row in modules),
        module_keys=tuple(row[2] for row in modules),
        module_objects=tuple(row[3] for row in modules),
        tensor_dicts=tuple(row[1] for row in tensors),
        tensor_keys=tuple(row[2] for row in tensors),
        tensors=tuple(row[3] for row in tensors),
        addresses=[row[5] for row in tensors],
        counted=counted,
        versions=[row[4] for row in tensors if row[4] >= 0],
        uncounted=tuple(row[3] for row in tensors if row[4] < 0),
    )
    return _Weights(tuple(modules), tuple(tensors), tuple(sizes), columns)


def _unchanged(record: _Weights) -> bool | None:
    """Whether everything is as ``record`` saw it, checked column by column: ``True``
    only when :func:`_changed_rows` finds nothing; ``False`` or ``None`` (a counted tensor
    lost its version counter, or a container is not a ``dict``) when something may have
    changed, which :func:`_changed_rows` then names."""
    c = record.columns
    try:
        return (
            list(map(len, c.size_dicts)) == c.sizes
            and all(
                map(operator.is_, map(dict.get, c.module_dicts, c.module_keys), c.module_objects)
            )
            and all(map(operator.is_, map(dict.get, c.tensor_dicts, c.tensor_keys), c.tensors))
            and [t._version for t in c.counted] == c.versions
            and all(t.is_inference() for t in c.uncounted)
            and [t.data_ptr() for t in c.tensors] == c.addresses
        )
    except (RuntimeError, TypeError):  # e.g. p.data = an inference tensor: no counter
        return None


def _changed_weights(record: _Weights) -> list[str]:
    """What is not as ``record`` saw it: parameter and buffer names (changed in place or
    replaced), replaced submodules, and modules that gained or lost one; ``[]`` when
    nothing changed."""
    return [] if _unchanged(record) else _changed_rows(record)


def _changed_rows(record: _Weights) -> list[str]:
    """:func:`_changed_weights`, row by row (the definition :func:`_unchanged` agrees
    with, and the names it gives when something changed)."""
    changed = [name for name, d, key, child in record.modules if d.get(key) is not child]
    changed += [
        name
        for name, d, key, t, v, ptr in record.tensors
        if d.get(key) is not t or _version(t) != v or t.data_ptr() != ptr
    ]
    changed += [
        f"{name} (a parameter, buffer or submodule added or removed)"
        for name, d, n in record.sizes
        if len(d) != n
    ]
    return changed
