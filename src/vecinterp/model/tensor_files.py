"""Safetensors files that carry a checksum: the SHA-256 of their tensors, checked on read.

:func:`tensor_checksum` digests named tensors independently of the file layout;
:func:`~vecinterp.model.io.save` and the training checkpoints store it in the header under
:data:`CHECKSUM_KEY`, and :func:`read_tensors` verifies it (files written before checksums
existed have none and still read). :func:`refuse_non_finite` names the tensors that hold
NaN or inf: saving and loading refuse them.
"""

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes

from .atomic import read_regular

CHECKSUM_KEY = "vecinterp.sha256"
"""The safetensors header (``__metadata__``) key that holds :func:`tensor_checksum`."""
_SHOWN = 3  # how many offending tensors an error lists before giving a count
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """The SHA-256 (hex) of named tensors: each tensor's name, dtype, shape and bytes
    (little-endian), in the order of the sorted names. Independent of the file layout, so
    the same tensors always give the same checksum.

    Example:
        >>> import torch
        >>> from vecinterp.model.io import tensor_checksum
        >>> a = tensor_checksum({"w": torch.zeros(2), "b": torch.ones(1)})
        >>> a == tensor_checksum({"b": torch.ones(1), "w": torch.zeros(2)}), len(a)
        (True, 64)
        >>> a == tensor_checksum({"w": torch.zeros(2, 1), "b": torch.ones(1)})
        False
    """
    digest = hashlib.sha256(b"vecinterp-tensors-1\n")
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode() + b"\n")
        size = tensor.element_size()
        flat = tensor.reshape(-1).view(_INT_OF_SIZE.get(size, torch.uint8)).numpy()
        if sys.byteorder == "big" and size in (2, 4, 8):  # pragma: no cover
            flat = flat.byteswap()
        digest.update(flat.tobytes())
    return digest.hexdigest()


def verify_checksum(
    tensors: Mapping[str, torch.Tensor], header: Mapping[str, str], source: str | os.PathLike[str]
) -> bool:
    """Check ``tensors`` against the checksum stored in their file's ``header``; raise
    ``ValueError`` naming ``source`` if they differ. Returns ``False`` for a file written
    before checksums existed (no checksum to check), ``True`` otherwise."""
    stored = header.get(CHECKSUM_KEY)
    if stored is None:
        return False
    computed = tensor_checksum(tensors)
    if computed != stored:
        raise ValueError(
            f"{source} is corrupted: its tensor data does not match the SHA-256 checksum "
            f"stored in its header (stored {str(stored)[:16]}…, computed {computed[:16]}…); "
            "restore the file from a copy or write it again"
        )
    return True


def read_tensors(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and header metadata of a safetensors file, checksum verified.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for
    one that is truncated, not safetensors, corrupted (checksum mismatch) or not a regular
    file (a directory, a FIFO, a device: refused before it is read)."""
    file = Path(path)
    try:
        data = read_regular(file)
    except FileNotFoundError:
        raise FileNotFoundError(f"{file} is missing") from None
    except ValueError as err:
        raise ValueError(f"{err}, expected a safetensors file") from None
    return _parse_safetensors(data, file)


def _parse_safetensors(data: bytes, file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        tensors = load_bytes(data)
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + length]).get("__metadata__") or {}
    except (SafetensorError, ValueError, OSError, RuntimeError, OverflowError) as err:
        raise ValueError(
            f"{file} is not a readable safetensors file (truncated or corrupted?): {err}"
        ) from None
    verify_checksum(tensors, header, file)
    return tensors, header


def refuse_non_finite(tensors: Mapping[str, torch.Tensor], where: str) -> None:
    """Raise ``ValueError`` naming the tensors of ``tensors`` that hold NaN or inf."""
    bad = []
    for name, tensor in tensors.items():
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(
            torch.isfinite(tensor).all()
        ):
            n_nan = int(torch.isnan(tensor).sum())
            bad.append(f"{name} ({n_nan} NaN, {int((~torch.isfinite(tensor)).sum()) - n_nan} inf)")
    if bad:
        more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
        raise ValueError(
            f"{where}: {len(bad)} tensor(s) hold non-finite values: "
            + ", ".join(bad[:_SHOWN])
            + more
        )
