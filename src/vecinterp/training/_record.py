"""The record of a training checkpoint (``trainer.json``): its checksum, its fields, and
the optimizer settings it holds, checked against the run's own before they are loaded.

``trainer.json`` carries, under ``"vecinterp.sha256"``, the SHA-256 of the rest of the
record in a canonical form (:func:`record_checksum`: JSON with sorted keys, no spaces), so
that a flipped bit anywhere in it (a beta of 1.9, a swapped parameter index) is refused
on resume instead of training on from a different state. Records of ``format_version`` 1,
written before the checksum existed, have none and still load (as tensor files without a
checksum do); from version 2 on the checksum is required, so a flip in its key cannot
pass a record off as an old one.

Whatever the record says, the optimizer is restored only with settings equal to the run's
own (:func:`restore_optimizer`): the hyperparameters must match, the parameter indices
must be the run's in order, and the implementation (``fused``, ``foreach``, ...) is the
run's own.
"""

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..model.atomic import read_regular
from ..model.tensor_files import CHECKSUM_KEY

FORMAT = "vecinterp-checkpoint"
FORMAT_VERSION = 2
"""Version 2: ``trainer.json`` carries its checksum. Version 1 (no checksum) still loads."""
TRAINER_FILE = "trainer.json"
# the settings that choose an implementation of the same update, not the update itself:
# the run's own are kept (a checkpoint written on a GPU resumes on a CPU)
_IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")


def record_checksum(record: dict[str, Any]) -> str:
    """The SHA-256 (hex) of a checkpoint record without its checksum entry, in a canonical
    JSON form (sorted keys, no spaces): independent of how the file was indented.

    Example:
        >>> from vecinterp.training._record import record_checksum
        >>> a = record_checksum({"step": 2, "betas": [0.9, 0.999]})
        >>> a == record_checksum({"betas": [0.9, 0.999], "step": 2}), len(a)
        (True, 64)
        >>> a == record_checksum({"step": 2, "betas": [1.9, 0.999]})
        False
    """
    body = {k: v for k, v in record.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(b"vecinterp-record-1\n" + text.encode()).hexdigest()


def sealed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its checksum (:func:`record_checksum`) added."""
    return {**record, CHECKSUM_KEY: record_checksum(record)}


def read_record(path: Path) -> dict[str, Any]:
    """The verified record ``path / trainer.json`` of the checkpoint ``path`` (without its
    checksum entry): ``ValueError`` naming the file for one that is unreadable, not a
    regular file, corrupted (checksum mismatch, or a version-2 record without one), of a
    newer format, or with a missing or mistyped field."""
    file = path / TRAINER_FILE
    try:
        record = json.loads(read_regular(file))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not a readable checkpoint record: {err}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a vecinterp training checkpoint")
    stored = record.pop(CHECKSUM_KEY, None)
    version = record.get("format_version")
    old_format = isinstance(version, int) and not isinstance(version, bool) and version < 2
    if stored is None and not old_format:
        raise ValueError(
            f"{file} is corrupted: it has no {CHECKSUM_KEY!r} checksum, which every record of "
            f"format_version 2 or later carries (format_version is {version!r})"
        )
    if stored is not None and stored != record_checksum(record):
        raise ValueError(
            f"{file} is corrupted: its contents do not match the SHA-256 checksum stored in "
            f"it (stored {str(stored)[:16]}…, computed {record_checksum(record)[:16]}…); "
            "resume from an older checkpoint of the run (move this step's folder away)"
        )
    _check_record(record, file)
    if record["format_version"] > FORMAT_VERSION:
        raise ValueError(
            f"{path} has checkpoint format_version {record['format_version']}; this vecinterp "
            f"reads up to {FORMAT_VERSION}: upgrade vecinterp"
        )
    return record


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "format_version": ("an int >= 1", lambda v: _is_int(v) and v >= 1),
    "step": ("an int >= 0", lambda v: _is_int(v) and v >= 0),
    "config": ("an object (the run's config)", lambda v: isinstance(v, dict)),
    "data_fingerprint": ("a string (a SHA-256)", lambda v: isinstance(v, str)),
    "elapsed": (
        "a finite number >= 0 (seconds)",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf,
    ),
    "optimizer": (
        "an object with a list 'param_groups' of objects",
        lambda v: (
            isinstance(v, dict)
            and isinstance(v.get("param_groups"), list)
            and all(
                isinstance(g, dict) and isinstance(g.get("params"), list) for g in v["param_groups"]
            )
        ),
    ),
}


def _check_record(record: dict[str, Any], file: Path) -> None:
    """Raise ``ValueError`` naming ``file`` and the field for a missing or mistyped field."""
    for field, (expected, valid) in _FIELDS.items():
        if field not in record:
            raise ValueError(f"{file}: the field {field!r} is missing (expected {expected})")
        if not valid(record[field]):
            raise ValueError(f"{file}: field {field!r} must be {expected}, got {record[field]!r}")


def _same(a: object, b: object) -> bool:
    """Equal as settings: sequences element by element (a tuple saved as a list), numbers
    by value (``0`` and ``0.0`` alike), anything else by type and value."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if _is_number(a) and _is_number(b):
        return a == b
    return type(a) is type(b) and a == b


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def checked_groups(
    saved: list[dict[str, Any]], own: list[dict[str, Any]], file: Path
) -> list[dict[str, Any]]:
    """The param_groups to load: the run's own (``own``, from its optimizer's state dict),
    with the saved learning rate, once the saved ones (``saved``) are found to agree with
    them. Raises ``ValueError`` naming ``file`` and the setting for another number of
    groups, parameter indices other than the run's in order (a swapped pair would exchange
    two parameters' moments, a repeated one corrupt the step), and any hyperparameter
    (``betas``, ``eps``, ``weight_decay``, ``amsgrad``, ...) that differs. Settings that only
    choose the implementation (``fused``, ``foreach``, ...) and settings one of the two
    torch versions lacks are taken from the run."""
    if len(saved) != len(own):
        raise ValueError(
            f"{file} holds {len(saved)} optimizer parameter group(s); this run's optimizer has "
            f"{len(own)}"
        )
    groups = []
    for g, (theirs, mine) in enumerate(zip(saved, own, strict=True)):
        if not _same(theirs.get("params"), mine["params"]):
            raise ValueError(
                f"{file}: optimizer param_groups[{g}] lists the parameter indices "
                f"{theirs.get('params')!r}, but this run's optimizer has {mine['params']!r}: "
                "the record is corrupted (resume from an older checkpoint)"
            )
        for key, value in mine.items():
            if key in ("params", "lr", "initial_lr", *_IMPLEMENTATION) or key not in theirs:
                continue
            if not _same(theirs[key], value):
                raise ValueError(
                    f"{file}: the optimizer setting {key!r} is {theirs[key]!r} in the "
                    f"checkpoint but {value!r} in this run (the run's config says so too): the "
                    "record is corrupted (resume from an older checkpoint)"
                )
        lr = theirs.get("lr")
        usable = isinstance(lr, int | float) and not isinstance(lr, bool) and math.isfinite(lr)
        groups.append({**mine, "lr": lr if usable else mine["lr"]})
    return groups


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], path: Path) -> None:
    """``optimizer.load_state_dict(state)`` with the run's own settings
    (:func:`checked_groups`), refusing (``ValueError`` naming the file) saved settings that
    differ from them, and a state whose parameter count or tensor shapes do not fit
    ``optimizer``'s parameters."""
    file = path / TRAINER_FILE
    groups = checked_groups(state["param_groups"], optimizer.state_dict()["param_groups"], file)
    tensors = path / "optimizer.safetensors"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, per_param in state["state"].items():
        if not 0 <= index < len(params):
            raise ValueError(
                f"{tensors} holds state for parameter {index}; the model has {len(params)}"
            )
        for name, value in per_param.items():
            if value.dim() > 0 and value.shape != params[index].shape:
                raise ValueError(
                    f"{tensors}: state.{index}.{name} has shape {tuple(value.shape)}, but "
                    f"parameter {index} has shape {tuple(params[index].shape)}"
                )
    try:
        optimizer.load_state_dict({"state": state["state"], "param_groups": groups})
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise ValueError(f"{tensors} does not fit this run's optimizer: {err}") from None
