"""The weights record: a model's weights as a run began, kept without copying any.

:func:`_record_weights` notes where each submodule, parameter and buffer sits, with each
tensor's version counter and storage address; :func:`_changed_weights` lists what is no
longer so. ``run_with_cache`` records the weights as the run begins, and the analyses of an
:class:`~vecinterp.ActivationCache` that read the weights refuse once they changed.
"""

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
    return _Weights(tuple(modules), tuple(tensors), tuple(sizes))


def _changed_weights(record: _Weights) -> list[str]:
    """What is not as ``record`` saw it: parameter and buffer names (changed in place or
    replaced), replaced submodules, and modules that gained or lost one; ``[]`` when
    nothing changed."""
    if (
        all(len(d) == n for _, d, n in record.sizes)
        and all(d.get(key) is child for _, d, key, child in record.modules)
        and all(
            d.get(key) is t and _version(t) == v and t.data_ptr() == ptr
            for _, d, key, t, v, ptr in record.tensors
        )
    ):
        return []
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
