"""Saving and loading models as safetensors plus a JSON config (never pickle).

What a save guarantees (on Linux; tested by killing saves with SIGKILL at random instants,
see ``benchmarks/kill_saves.py``):

- **All or nothing.** :func:`save` writes the new save into a hidden sibling directory,
  flushes it to disk and swaps it in with one atomic exchange of directories
  (``renameat2(RENAME_EXCHANGE)``). At every instant the path holds the complete old save
  or the complete new one, never new weights beside an old config.
- **No debris.** The hidden directories of a save killed mid-way are removed by the next
  save to that path. Saves into one parent directory hold an OS lock (``flock``) on it,
  so they never remove a directory that a live save is writing.
- **Checksummed.** Every safetensors file carries a SHA-256 of its tensors (names, dtypes,
  shapes and bytes, see :func:`tensor_checksum`) in its header; loading verifies it and
  names the file that does not match. Files written before checksums existed still load.
- **Finite.** Saving refuses NaN/inf weights, and so does loading.

Where ``renameat2`` is missing (other systems, some network file systems) the swap is two
renames; a save killed between them is rolled back to the old save by the next load or save.
A load that keeps meeting saves swapping the directory, or meets it between two renames,
reads under the parent's lock, which saves hold throughout. Loading reads regular files only
(a FIFO, a device, a directory in a file's place: ``ValueError`` naming it, nothing read).

This module holds what is about models (the config record, the weights, checking them
against the config); the file-system steps are in :mod:`vecinterp.model.atomic` and the
checksummed tensor files in :mod:`vecinterp.model.tensor_files`, whose names are importable
from here as well.
"""

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from . import atomic
from .atomic import _AT_FDCWD as _AT_FDCWD
from .atomic import _NEW as _NEW
from .atomic import _OLD as _OLD
from .atomic import _RENAME_EXCHANGE as _RENAME_EXCHANGE
from .atomic import _exchange as _exchange
from .atomic import _fsync_file as _fsync_file
from .atomic import _leftovers as _leftovers
from .atomic import _recover as _recover
from .atomic import _renameat2 as _renameat2
from .atomic import atomic_write as atomic_write
from .atomic import directory_lock as directory_lock
from .atomic import fsync_dir as fsync_dir
from .atomic import read_regular as read_regular
from .config import VectorTransformerConfig, same_config
from .tensor_files import _INT_OF_SIZE as _INT_OF_SIZE
from .tensor_files import _SHOWN as _SHOWN
from .tensor_files import CHECKSUM_KEY as CHECKSUM_KEY
from .tensor_files import _parse_safetensors as _parse_safetensors
from .tensor_files import read_tensors as read_tensors
from .tensor_files import refuse_non_finite as refuse_non_finite
from .tensor_files import tensor_checksum as tensor_checksum
from .tensor_files import verify_checksum as verify_checksum
from .transformer import HookedVectorTransformer, uninitialised_weights

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "vecinterp-model"
FORMAT_VERSION = 1


def _swap_in(stage: Path, directory: Path) -> Path:
    """:func:`vecinterp.model.atomic._swap_in` through this module's ``_exchange``, looked
    up when called: replacing ``vecinterp.model.io._exchange`` (as the tests do, to take
    the two-rename path of systems without ``renameat2``) reaches every model save and
    training checkpoint."""
    return atomic._swap_in(stage, directory, exchange=_exchange)


# ------------------------------------------------------------------ save


def save(
    model: HookedVectorTransformer,
    path: str | os.PathLike[str],
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` to the directory ``path``: ``model.safetensors`` and ``config.json``.

    The save is all or nothing: everything is written to a hidden sibling directory, flushed
    to disk, and swapped in with one atomic rename, so at every instant (a kill -9 included)
    ``path`` holds the complete previous save or the complete new one. Hidden directories
    left by a killed save are removed by the next save to ``path``. Other plain files in
    ``path`` (a README, a history) are kept; a subdirectory there is refused, as the
    directory is replaced as a whole. The safetensors header holds the config and a SHA-256
    of the tensors (:func:`tensor_checksum`), which :func:`load` verifies. Non-finite
    weights are refused (``ValueError`` naming them). ``metadata`` (JSON-serialisable) is
    stored in the config file under ``"metadata"``.

    Returns:
        ``path``, the directory.

    Example:
        >>> import tempfile, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = vi.save(model, f"{d}/run")
        ...     vi.load(f"{d}/run").cfg == model.cfg
        True
    """
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"save expects a HookedVectorTransformer, got {type(model).__name__}")
    directory = _check_path(path)
    if directory.is_symlink():  # save where the link points, as writing into it would
        directory = directory.resolve()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} exists and is not a directory")
    tensors, header, text = _serialise(model, metadata)  # bad metadata fails before a write
    parent = directory.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(
            f"path {directory} cannot be a directory: a file is in the way of {parent}"
        ) from None
    with directory_lock(parent) as locked:
        _recover(directory, clean=locked)
        directory.mkdir(exist_ok=True)
        carried = _carried_entries(directory)
        stage = Path(tempfile.mkdtemp(dir=parent, prefix=f".{directory.name}{_NEW}"))
        try:
            os.chmod(stage, stat.S_IMODE(directory.stat().st_mode))  # mkdtemp makes 0700
            _write_files(stage, tensors, header, text)
            for entry in carried:
                _carry(Path(entry.path), stage / entry.name, entry.is_symlink())
            for name in (WEIGHTS_FILE, CONFIG_FILE):
                _fsync_file(stage / name)
            fsync_dir(stage)
            previous = _swap_in(stage, directory)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        shutil.rmtree(previous, ignore_errors=True)
        fsync_dir(parent)
    return Path(path)


def _serialise(
    model: HookedVectorTransformer, metadata: dict[str, Any] | None
) -> tuple[dict[str, torch.Tensor], dict[str, str], str]:
    """The tensors, safetensors header and config text of a save (nothing written yet)."""
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict (JSON-serialisable) or None, got {metadata!r}")
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    refuse_non_finite(tensors, "save refuses a model with non-finite weights")
    dtypes = {str(t.dtype) for t in tensors.values()}
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": model.cfg.to_dict(),
        "dtype": dtypes.pop() if len(dtypes) == 1 else None,
        "metadata": metadata or {},
    }
    try:
        text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False)
    except TypeError as err:
        raise TypeError(f"metadata must be JSON-serialisable: {err}") from None
    except ValueError:
        raise ValueError(
            f"metadata must be JSON-serialisable, but holds a NaN or inf: {metadata!r}"
        ) from None
    header = {
        "format": FORMAT,
        "config": json.dumps(model.cfg.to_dict(), sort_keys=True),
        CHECKSUM_KEY: tensor_checksum(tensors),
    }
    return tensors, header, text


def _write_files(
    directory: Path, tensors: dict[str, torch.Tensor], header: dict[str, str], text: str
) -> None:
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata=header)
    (directory / CONFIG_FILE).write_text(text)


def save_new(
    model: HookedVectorTransformer, path: Path, metadata: dict[str, Any] | None = None
) -> None:
    """Write a save into the new directory ``path`` (which must not exist) without the
    swap, lock and flushes of :func:`save`: for a directory that is itself staged, flushed
    and renamed into place as a whole (a training checkpoint)."""
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"save expects a HookedVectorTransformer, got {type(model).__name__}")
    tensors, header, text = _serialise(model, metadata)
    path.mkdir()
    _write_files(path, tensors, header, text)


def _check_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path must be a str or os.PathLike (a directory), got {type(path).__name__}"
        )
    return Path(path)


def _carried_entries(directory: Path) -> list[os.DirEntry[str]]:
    """The files of ``directory`` that are not the save's own, to keep in the new one."""
    carried = []
    with os.scandir(directory) as scan:
        entries = list(scan)
    for entry in entries:
        if entry.name in (WEIGHTS_FILE, CONFIG_FILE):
            continue
        if entry.is_dir(follow_symlinks=False):
            raise ValueError(
                f"cannot save into {directory}: it holds the folder {entry.name!r}, and "
                "vecinterp.save replaces the directory as a whole (keeping plain files only); "
                "save into a new or empty directory, or move the folder out"
            )
        carried.append(entry)
    return carried


def _carry(source: Path, target: Path, is_link: bool) -> None:
    if is_link:
        os.symlink(os.readlink(source), target)
        return
    try:
        os.link(source, target)  # the same file, no copy
    except OSError:
        shutil.copy2(source, target)


# ------------------------------------------------------------------ load


def _parse_config(data: bytes, file: Path) -> tuple[VectorTransformerConfig, dict[str, Any]]:
    try:
        record = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{file} is not a vecinterp model config (missing format={FORMAT!r})")
    version = record.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"{file}: format_version must be an int, got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{file} has format_version {version}; this vecinterp reads up to "
            f"{FORMAT_VERSION}: upgrade vecinterp"
        )
    if not isinstance(record.get("config"), dict):
        raise ValueError(f"{file} has no 'config' record")
    try:
        cfg = VectorTransformerConfig.from_dict(record["config"])
    except (ValueError, TypeError) as err:
        raise ValueError(f"{file}: {err}") from None
    metadata = record.get("metadata", {})
    return cfg, metadata if isinstance(metadata, dict) else {}


def read_config(path: str | os.PathLike[str]) -> tuple[VectorTransformerConfig, dict[str, Any]]:
    """The config and metadata saved in the directory ``path``."""
    _finish_interrupted(Path(path))
    file = Path(path) / CONFIG_FILE
    try:
        data = read_regular(file)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {Path(path)} (was it written by vecinterp.save?)"
        ) from None
    return _parse_config(data, file)


class _Moved(Exception):
    """The save directory was swapped while it was being read."""


def _read_once(directory: Path) -> tuple[bytes, bytes]:
    """The bytes of the config and the weights, both read from one directory inode (a save
    swapping in a new directory meanwhile raises ``_Moved``: read again)."""
    missing = {
        CONFIG_FILE: f"no {CONFIG_FILE} in {directory} (was it written by vecinterp.save?)",
        WEIGHTS_FILE: f"no {WEIGHTS_FILE} in {directory}",
    }
    if os.open not in os.supports_dir_fd:  # pragma: no cover - not on Linux
        try:
            return read_regular(directory / CONFIG_FILE), read_regular(directory / WEIGHTS_FILE)
        except FileNotFoundError as err:
            raise FileNotFoundError(missing[Path(str(err.filename)).name]) from None
    try:
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise _Moved from None  # gone since it was seen: swapped out, or never a directory
    try:
        out = []
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            try:  # a FIFO or a device there is refused before it is read (ValueError)
                out.append(read_regular(name, dir_fd=dfd, shown=directory / name))
            except FileNotFoundError:
                try:
                    now = os.stat(directory)
                except OSError:
                    raise _Moved from None
                before = os.fstat(dfd)
                if (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev):
                    raise _Moved from None
                raise FileNotFoundError(missing[name]) from None
        return out[0], out[1]
    finally:
        os.close(dfd)


def _finish_interrupted(directory: Path) -> bool:
    """If ``directory`` is missing because a save was killed between its two renames (or
    is between them now), wait for any live save and roll it back; ``True`` if it exists
    afterwards."""
    if os.path.lexists(directory) or not _leftovers(directory)[1]:
        return False
    with directory_lock(directory.parent):  # waits for a live save to finish
        _recover(directory, clean=False)
    return directory.is_dir()


_UNLOCKED_TRIES = 3


def _read_save(directory: Path) -> tuple[bytes, bytes]:
    """The config's and the weights' bytes of one save at ``directory``.

    A few plain tries first (a save swapping a new directory in meanwhile makes a try read
    again). If saves keep swapping it, or it is missing while a save is half-way through its
    two renames (no ``renameat2``), the read waits for the parent's lock, which every save
    holds from its start to its end: under it no save runs, one killed between its renames
    is rolled back, and the read cannot be interrupted again."""
    for _ in range(_UNLOCKED_TRIES):
        if not directory.is_dir():
            if not _leftovers(directory)[1] and not directory.is_dir():
                raise FileNotFoundError(f"no saved model at {directory} (expected a directory)")
            break  # between the two renames of a save, or one killed there
        try:
            return _read_once(directory)
        except _Moved:
            continue
    with directory_lock(directory.parent):
        _recover(directory, clean=False)
        for _ in range(10):  # locked, a try fails only through a writer that takes no lock
            if not directory.is_dir():
                raise FileNotFoundError(f"no saved model at {directory} (expected a directory)")
            try:
                return _read_once(directory)
            except _Moved:
                continue
    raise OSError(
        f"{directory} kept changing while it was read (saves running in a loop, on a file "
        "system without flock?)"
    )


def load(
    path: str | os.PathLike[str], device: str | torch.device | None = None
) -> HookedVectorTransformer:
    """Rebuild a model written by :func:`save`.

    The dtype is the saved one. The config and the weights are read from the same save even
    while another process saves over ``path``. The weights' SHA-256 checksum is verified
    (files written before checksums existed load without one). Raises ``FileNotFoundError``
    for a missing file and ``ValueError`` for a corrupted file (naming it), one that is not
    a regular file (a FIFO, a device, a directory: refused before it is read), non-finite
    weights, or weights that do not match the config (the first few missing, unexpected and
    mis-shaped tensors, and how many).

    Args:
        path: the directory :func:`save` wrote.
        device: where to put the weights (default: the CPU).

    Example:
        >>> import tempfile, torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> x = torch.randn(2, 5, 3)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     again = vi.load(vi.save(model, f"{d}/run"))
        >>> torch.equal(again(x), model(x)), again is model
        (True, False)
    """
    directory = _check_path(path)
    config_data, weights_data = _read_save(directory)
    cfg, _ = _parse_config(config_data, directory / CONFIG_FILE)
    weights = directory / WEIGHTS_FILE
    tensors, header = _parse_safetensors(weights_data, weights)
    refuse_non_finite(tensors, f"{weights} (vecinterp.save never writes these)")
    dtypes = {t.dtype for t in tensors.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    with uninitialised_weights():  # every tensor is loaded below (checked first)
        model = HookedVectorTransformer(cfg, seed=0, dtype=dtype)
    check_state_dict(model, tensors, source=str(weights))
    if "config" in header and not same_config(_json_or_none(header["config"]), cfg):
        raise ValueError(
            f"{weights} and {CONFIG_FILE} in {directory} come from different saves: "
            "their configs differ"
        )
    model.load_state_dict(tensors)
    return model.to(device) if device is not None else model


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _first(items: list[str], sep: str = ", ") -> str:
    shown = sep.join(items[:_SHOWN])
    return shown + (f"{sep}… and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def check_state_dict(
    model: HookedVectorTransformer, state: dict[str, torch.Tensor], source: str = "state dict"
) -> None:
    """Raise ``ValueError`` naming the first few missing, unexpected and mis-shaped tensors
    (with how many there are of each)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = [
        f"{k}: expected {expected[k]}, got {got[k]}"
        for k in expected
        if k in got and expected[k] != got[k]
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing [{_first([repr(k) for k in missing])}]")
        if unexpected:
            parts.append(f"unexpected [{_first([repr(k) for k in unexpected])}]")
        if shapes:
            parts.append(f"wrong shapes: {_first(shapes, '; ')}")
        count = len(missing) + len(unexpected) + len(shapes)
        raise ValueError(
            f"{source} does not match its config ({count} tensor(s) differ): " + ", ".join(parts)
        )
