"""The weights record: a model's weights as a run began, kept without copying any.

:func:`_record_weights` notes where each submodule, parameter and buffer sits, with each
tensor's version counter and storage address; :func:`_changed_weights` lists what is no
longer so (:func:`_unchanged` answers "nothing" column by column, :func:`_changed_rows`
names what changed row by row). ``run_with_cache`` records the weights as the run begins,
and the analyses of an :class:`~vecinterp.ActivationCache` that read the weights refuse
once they changed.

Writes through ``p.data`` (and any other path that bypasses PyTorch's version counter:
a NumPy view, ``torch.Tensor.set_``) move neither the version nor the address. So
``run_with_cache`` also copies the few small tensors those analyses read (every norm's
``w`` and ``b``, each ``attn.b_O``, ``unembed.W_U`` and ``b_U``: :func:`_read_values`),
and :func:`_changed_values` compares them bit for bit: any change of a weight an analysis
reads is seen, whatever made it. A ``p.data`` write into another weight (``W_Q``) is not
seen; the analyses never read it, so their numbers, which are the cached run's, stay right.
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
    read: tuple[tuple[str, torch.Tensor], ...]
    """The tensors that analyses interpreting a cache read, by name (:data:`_READ`)."""


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


_READ: tuple[str, ...] = ("ln1.w", "ln1.b", "ln2.w", "ln2.b", "ln_final.w", "ln_final.b")
_READ += ("attn.b_O", "unembed.W_U", "unembed.b_U")
"""The weights that the analyses interpreting a cache read (``apply_ln_to_stack``, the
decompositions with ``apply_ln``, ``direct_attribution``, ``logit_lens``), by the end of
their names: ``blocks.{l}.ln1.w`` ... ``unembed.b_U``."""


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
    read = tuple(
        (name, t)
        for name, _, _, t, _, _ in tensors
        if any(name == leaf or name.endswith("." + leaf) for leaf in _READ)
    )
    return _Weights(tuple(modules), tuple(tensors), tuple(sizes), columns, read)


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


_INTS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers: compared with ``torch.equal``, NaN equals the same NaN."""
    return t.view(_INTS[t.element_size()])


def _read_values(record: _Weights) -> list[torch.Tensor]:
    """A copy of the tensors ``record.read`` lists as they are now: one flat tensor (one
    copy kernel) when they share a device and dtype, as a model's weights do, else one
    copy each. A few thousand numbers for the paper's model."""
    with torch.no_grad():  # no graph: a quarter cheaper than detaching each tensor
        flat = [t.reshape(-1) for _, t in record.read]
        if not flat:
            return []
        if all(t.device == flat[0].device and t.dtype == flat[0].dtype for t in flat):
            return [torch.cat(flat)]
        return [t.clone() for t in flat]


def _pieces(record: _Weights, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """``values`` (from :func:`_read_values` of ``record``) as one flat tensor per name."""
    if len(values) == len(record.read):
        return values
    sizes = [t.numel() for _, t in record.read]
    return list(values[0].split(sizes))


def _changed_values(record: _Weights, values: list[torch.Tensor]) -> list[str]:
    """The names of the tensors of ``record.read`` whose bits differ from ``values``
    (:func:`_read_values` of the same record). Call it only when :func:`_changed_weights`
    found nothing: the tensors are then the recorded ones, with their shapes."""
    now = _read_values(record)
    if all(torch.equal(_bits(a), _bits(b)) for a, b in zip(now, values, strict=True)):
        return []
    return [
        f"{name} (its values: written through .data or in another way that PyTorch's "
        "version counter does not see)"
        for (name, _), a, b in zip(
            record.read, _pieces(record, now), _pieces(record, values), strict=True
        )
        if not torch.equal(_bits(a), _bits(b))
    ]
