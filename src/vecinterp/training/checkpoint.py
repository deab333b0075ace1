"""Training checkpoints: one directory per step, safetensors + JSON, written atomically.

Layout of ``checkpoint_dir/step_00000500/`` (the state after 500 updates)::

    model/              the model, by vecinterp.save (model.safetensors + config.json)
    average/            the weight average, likewise (only for train(ema_decay=...))
    optimizer.safetensors   per-parameter optimizer tensors, "state.{i}.{name}"
    rng.safetensors         torch's global CPU RNG, the data generator, CUDA's RNG if used
    history.safetensors     the loss history (float64 / int64 vectors)
    trainer.json            step, training config, optimizer param_groups, data fingerprint,
                            and the SHA-256 of all that (see :mod:`._record`)

Nothing is pickled. Every safetensors file carries a SHA-256 of its tensors, and
trainer.json one of its contents, verified on resume; the optimizer settings are checked
against the run's own before they are loaded. A checkpoint is written into a hidden
temporary directory beside its final name and renamed into place only when complete, so a
crash mid-write leaves the previous checkpoints as they were (and a hidden leftover,
removed by the next run).

A training run owns its ``checkpoint_dir``: it holds an OS lock (``flock``) on the file
``.vecinterp-train.lock`` there from start to end (the kernel releases it when the process
dies, however it dies), and a second run on the same directory is refused, as is a run in
a ``member_*`` directory of a running ensemble (:func:`lock_holder`), known by the
directory itself (its resolved path), not by the name it was given.
"""

import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..model.io import CHECKSUM_KEY, read_tensors, tensor_checksum
from ..model.io import _swap_in as swap_in
from ..model.io import fsync_dir as _fsync_dir
from ..model.io import load as load_model
from ..model.io import save_new as save_model
from ..model.transformer import HookedVectorTransformer
from ._record import FORMAT as FORMAT
from ._record import FORMAT_VERSION as FORMAT_VERSION
from ._record import TRAINER_FILE as TRAINER_FILE
from ._record import read_record as read_record
from ._record import record_checksum as record_checksum
from ._record import restore_optimizer as restore_optimizer
from ._record import sealed as sealed
from .result import _PER_EVAL, _PER_STEP

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".vecinterp-train.lock"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_MEMBER_DIR = re.compile(r"^member_\d+$")  # an ensemble member's (_ensemble_checkpoint)
_TMP_PREFIX = ".step_"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints in ``checkpoint_dir``, oldest first (empty if none)."""
    if not isinstance(checkpoint_dir, (str, os.PathLike)):
        raise TypeError(
            f"checkpoint_dir must be a path (str or os.PathLike), got "
            f"{type(checkpoint_dir).__name__}"
        )
    directory = Path(checkpoint_dir)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint_dir must be a directory, but {directory} is a file")
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        # lexists, not is_file: a trainer.json that is not a regular file (a FIFO, a link to
        # a device) is refused by the resume, naming it, rather than its step skipped
        if match and os.path.lexists(child / TRAINER_FILE):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint written by :func:`vecinterp.training.train` into
    ``checkpoint_dir``, or ``None``.

    Example:
        >>> from vecinterp.training.checkpoint import latest_checkpoint
        >>> latest_checkpoint("no/such/dir") is None
        True
    """
    found = list_checkpoints(checkpoint_dir)
    return found[-1] if found else None


class DirectoryOwner:
    """The lock of a training run on its checkpoint directory (see :func:`own_directory`)."""

    def __init__(self, directory: Path, fd: int | None):
        self.directory = directory
        self.fd = fd

    @property
    def held(self) -> bool:
        """Whether an OS lock is held (``False`` where the file system has no ``flock``)."""
        return self.fd is not None

    def __del__(self) -> None:  # a run that failed before its try block still lets go
        self.release()

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self.fd is None:
            return
        try:
            if _same_file(self.fd, self.directory / LOCK_FILE):
                os.unlink(self.directory / LOCK_FILE)  # still held: no one else can own it
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)


def own_directory(checkpoint_dir: Path) -> DirectoryOwner:
    """Create ``checkpoint_dir`` if needed and take its training lock, or raise
    ``ValueError`` naming the run that holds it (pid, host, start time).

    The lock is an exclusive ``flock`` on ``checkpoint_dir/.vecinterp-train.lock``, which
    records its holder. :meth:`DirectoryOwner.release` removes the file; a killed run leaves
    it behind, unlocked, and the next run takes it over.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from vecinterp.training.checkpoint import own_directory
        >>> with tempfile.TemporaryDirectory() as d:
        ...     first = own_directory(Path(d))
        ...     try:
        ...         own_directory(Path(d))
        ...     except ValueError as err:
        ...         print(str(err).split(" (")[0].endswith("is in use by another training run"))
        ...     first.release()
        ...     own_directory(Path(d)).release()
        True
    """
    if checkpoint_dir.exists() and not checkpoint_dir.is_dir():
        raise ValueError(
            f"checkpoint_dir must be a directory (created if missing), but {checkpoint_dir} "
            "is a file"
        )
    try:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir} cannot be created: {err.strerror or err}"
        ) from None
    if fcntl is None:  # pragma: no cover - no flock on this platform
        return DirectoryOwner(checkpoint_dir, None)
    path = checkpoint_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise ValueError(
                f"checkpoint_dir {checkpoint_dir} is in use by another training run "
                f"({holder}); two runs in one directory would overwrite each other's "
                "checkpoints: wait for that run to end, or pass another checkpoint_dir"
            ) from None
        except OSError:  # a file system without flock: run unlocked, as before
            os.close(fd)
            return DirectoryOwner(checkpoint_dir, None)
        if _same_file(fd, path):  # not removed by a run that released it meanwhile
            break
        os.close(fd)
    details = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join(sys.argv)[:200],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(details) + "\n").encode(), 0)
    owner = DirectoryOwner(checkpoint_dir, fd)
    # by the directory itself, not the name it was given: "." inside member_000, or a
    # symbolic link to it, is the member's directory all the same
    real = checkpoint_dir.resolve()
    if _MEMBER_DIR.match(real.name):  # after taking our lock: see lock_holder
        ensemble = lock_holder(real.parent)
        if ensemble is not None:
            owner.release()
            shown = "" if real == checkpoint_dir else f" (that is, {real})"
            raise ValueError(
                f"checkpoint_dir {checkpoint_dir}{shown} is a member's directory of the "
                f"ensemble training in {real.parent} ({ensemble}); a run here would remove "
                "the checkpoint the ensemble is writing and prune the step it resumes from: "
                "wait for the ensemble to end"
            )
    return owner


def lock_holder(directory: Path) -> str | None:
    """Who holds the training lock of ``directory`` (pid, host, start time), if a live run
    does; ``None`` otherwise. Takes no lock itself (a shared try-lock, dropped at once).

    An ensemble holds its ``checkpoint_dir``'s lock, and a run in one of its ``member_*``
    directories checks it after taking its own; the ensemble checks its members' after
    taking its own (:func:`~._ensemble_checkpoint.check_members_free`). Whichever of the
    two comes second sees the other, so they never run together, and an ensemble of
    thousands of members holds one lock, not thousands of open files."""
    if fcntl is None:  # pragma: no cover - no flock on this platform
        return None
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe_holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # and with it the shared lock, if it was taken
    return None


def _describe_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0))
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}" + (
            f", command {info['command']!r}" if info.get("command") else ""
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder has not written its pid yet"


def remove_partial(checkpoint_dir: Path) -> None:
    """Delete hidden leftovers of checkpoint writes that a crash interrupted. Only for the
    run that owns ``checkpoint_dir`` (:func:`own_directory`): a live run's are its own."""
    if checkpoint_dir.is_dir():
        for child in checkpoint_dir.iterdir():
            if child.name.startswith(_TMP_PREFIX) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def prune(checkpoint_dir: Path, keep_last: int | None) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (renamed away first, so that a
    crash mid-delete never leaves a half checkpoint under a ``step_*`` name)."""
    if keep_last is None:
        return
    for old in list_checkpoints(checkpoint_dir)[:-keep_last]:
        trash = Path(tempfile.mkdtemp(dir=checkpoint_dir, prefix=f".{old.name}.", suffix=".del"))
        os.replace(old, trash / old.name)
        shutil.rmtree(trash, ignore_errors=True)


def write_checkpoint(
    checkpoint_dir: Path,
    step: int,
    model: HookedVectorTransformer,
    optimizer: torch.optim.Optimizer,
    rng: dict[str, torch.Tensor],
    history: dict[str, torch.Tensor],
    record: dict[str, Any],
    *,
    average: HookedVectorTransformer | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically and return its directory."""
    state_tensors, param_groups = flatten_optimizer(optimizer.state_dict())
    trainer = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": step,
        **record,
        "optimizer": {"type": type(optimizer).__name__, "param_groups": param_groups},
    }

    def write(tmp: Path) -> None:
        save_model(model, tmp / "model", metadata={"step": step})
        if average is not None:
            save_model(average, tmp / "average", metadata={"step": step})
        for name, tensors in (
            ("optimizer", state_tensors), ("rng", _cpu(rng)), ("history", _cpu(history))
        ):  # fmt: skip
            header = {"format": FORMAT, CHECKSUM_KEY: tensor_checksum(tensors)}
            save_file(tensors, str(tmp / f"{name}.safetensors"), metadata=header)
        (tmp / TRAINER_FILE).write_text(json.dumps(sealed(trainer), indent=2, sort_keys=True))

    return write_dir_atomically(checkpoint_dir / step_dir_name(step), write)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Everything in one checkpoint: ``record`` (trainer.json), ``model``, ``average``
    (the weight average, or ``None``), ``optimizer`` (a state dict for
    ``load_state_dict``), ``rng`` and ``history`` tensors.

    Every checksum is verified (trainer.json's too, see :mod:`._record`); a corrupted,
    truncated or non-regular file, or a record with a missing or mistyped field, raises
    ``ValueError`` naming the file (and the field)."""
    record = read_record(path)
    file = path / TRAINER_FILE
    match = _STEP_DIR.match(path.name)
    if match and int(match.group(1)) != record["step"]:
        raise ValueError(
            f"{file}: field 'step' is {record['step']} but the checkpoint's folder is "
            f"{path.name}: the record belongs to another checkpoint"
        )
    optimizer_file = path / "optimizer.safetensors"
    optimizer = unflatten_optimizer(
        read_tensors(optimizer_file)[0], record["optimizer"]["param_groups"], optimizer_file
    )
    rng = read_tensors(path / "rng.safetensors")[0]
    needed = ["torch_cpu"] + (
        ["data_generator"] if record["config"].get("data") == "make_batch" else []
    )
    _require(rng, needed, path / "rng.safetensors")
    history = read_tensors(path / "history.safetensors")[0]
    _require(history, list(_PER_STEP + _PER_EVAL), path / "history.safetensors")
    return {
        "record": record,
        "model": load_model(path / "model"),
        "average": load_model(path / "average") if (path / "average").is_dir() else None,
        "optimizer": optimizer,
        "rng": rng,
        "history": history,
    }


def _require(tensors: dict[str, torch.Tensor], names: list[str], file: Path) -> None:
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ValueError(f"{file} lacks the tensor(s) {missing} a checkpoint holds")


def write_dir_atomically(final: Path, write: Callable[[Path], None]) -> Path:
    """Stage a directory with ``write(tmp)``, flush it to disk and rename it to ``final``
    in one step (a stale ``final`` is swapped out and removed), so a crash at any point
    leaves ``final`` as it was: the directory-level counterpart of
    :func:`vecinterp.model.io.atomic_write`. Returns ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        write(tmp)
        _fsync_tree(tmp)
        # a stale checkpoint of the same step is swapped out in one exchange, then dropped
        previous = swap_in(tmp, final) if final.exists() else None
        if previous is None:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    _fsync_dir(final.parent)
    return final


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def flatten_optimizer(
    state_dict: dict[str, Any],
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """An optimizer's ``state_dict()`` as per-parameter tensors named
    ``state.{index}.{name}`` and param_groups as JSON-able dicts (tuples become lists;
    their keys are listed under ``"__tuples__"``); :func:`unflatten_optimizer` undoes it."""
    tensors: dict[str, torch.Tensor] = {}
    for index, per_param in state_dict["state"].items():
        for name, value in per_param.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"optimizer state {name!r} of parameter {index} is a "
                    f"{type(value).__name__}; checkpoints store tensors only"
                )
            tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
    groups = []
    for group in state_dict["param_groups"]:
        tuples = sorted(k for k, v in group.items() if isinstance(v, tuple))
        groups.append({k: list(v) if k in tuples else v for k, v in group.items()})
        groups[-1]["__tuples__"] = tuples
    return tensors, groups


def unflatten_optimizer(
    tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]], file: Path
) -> dict[str, Any]:
    """The optimizer state dict that :func:`flatten_optimizer` took apart (``ValueError``
    naming ``file`` for a tensor name it did not write)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        match = re.fullmatch(r"state\.(\d+)\.(.+)", key)
        if match is None:
            raise ValueError(f"{file} holds the tensor {key!r}; expected state.<index>.<name>")
        state.setdefault(int(match.group(1)), {})[match.group(2)] = value
    param_groups = []
    for group in groups:
        tuples = set(group.get("__tuples__", []))
        param_groups.append(
            {k: tuple(v) if k in tuples else v for k, v in group.items() if k != "__tuples__"}
        )
    return {"state": state, "param_groups": param_groups}
