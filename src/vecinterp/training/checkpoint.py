"""Training checkpoints: one directory per step, safetensors + JSON, written atomically.

Layout of ``checkpoint_dir/step_00000500/`` (the state after 500 updates)::

    model/              the model, by vecinterp.save (model.safetensors + config.json)
    average/            the weight average, likewise (only for train(ema_decay=...))
    optimizer.safetensors   per-parameter optimizer tensors, "state.{i}.{name}"
    rng.safetensors         torch's global CPU RNG, the data generator, CUDA's RNG if used
    history.safetensors     the loss history (float64 / int64 vectors)
    trainer.json            step, training config, optimizer param_groups, data fingerprint

Nothing is pickled. A checkpoint is written into a hidden temporary directory beside its
final name and renamed into place only when complete, so a crash mid-write leaves the
previous checkpoints as they were (and a hidden leftover, removed by the next run).
"""

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..model.io import load as load_model
from ..model.io import save as save_model
from ..model.transformer import HookedVectorTransformer

FORMAT = "vecinterp-checkpoint"
FORMAT_VERSION = 1
TRAINER_FILE = "trainer.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".step_"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints in ``checkpoint_dir``, oldest first (empty if none)."""
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / TRAINER_FILE).is_file():
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


def remove_partial(checkpoint_dir: Path) -> None:
    """Delete hidden leftovers of checkpoint writes that a crash interrupted."""
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
    state_tensors, param_groups = _flatten_optimizer(optimizer.state_dict())
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
        save_file(state_tensors, str(tmp / "optimizer.safetensors"))
        save_file(_cpu(rng), str(tmp / "rng.safetensors"))
        save_file(_cpu(history), str(tmp / "history.safetensors"))
        (tmp / TRAINER_FILE).write_text(json.dumps(trainer, indent=2, sort_keys=True))

    return _write_dir_atomically(checkpoint_dir / step_dir_name(step), write)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Everything in one checkpoint: ``record`` (trainer.json), ``model``, ``average``
    (the weight average, or ``None``), ``optimizer`` (a state dict for
    ``load_state_dict``), ``rng`` and ``history`` tensors."""
    try:
        record = json.loads((path / TRAINER_FILE).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path / TRAINER_FILE} is not a readable checkpoint record: {err}"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a vecinterp training checkpoint")
    if record.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path} has checkpoint format_version {record['format_version']}; this vecinterp "
            f"reads up to {FORMAT_VERSION}: upgrade vecinterp"
        )
    optimizer = _unflatten_optimizer(
        load_file(str(path / "optimizer.safetensors")), record["optimizer"]["param_groups"]
    )
    return {
        "record": record,
        "model": load_model(path / "model"),
        "average": load_model(path / "average") if (path / "average").is_dir() else None,
        "optimizer": optimizer,
        "rng": load_file(str(path / "rng.safetensors")),
        "history": load_file(str(path / "history.safetensors")),
    }


def _write_dir_atomically(final: Path, write: Callable[[Path], None]) -> Path:
    # The directory-level counterpart of vecinterp.model.io.atomic_write: stage, fsync,
    # then one rename; a crash at any point before the rename leaves ``final`` untouched.
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        write(tmp)
        _fsync_tree(tmp)
        if final.exists():  # a stale checkpoint of the same step: swap it out, then drop it
            os.replace(final, tmp.with_suffix(".old"))
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp.with_suffix(".old"), ignore_errors=True)
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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # directories cannot be opened on some platforms (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def _flatten_optimizer(
    state_dict: dict[str, Any],
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Per-parameter tensors as ``state.{index}.{name}``; param_groups as JSON-able dicts
    (tuples become lists; their keys are listed under ``"__tuples__"``)."""
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


def _unflatten_optimizer(
    tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]
) -> dict[str, Any]:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    param_groups = []
    for group in groups:
        tuples = set(group.get("__tuples__", []))
        param_groups.append(
            {k: tuple(v) if k in tuples else v for k, v in group.items() if k != "__tuples__"}
        )
    return {"state": state, "param_groups": param_groups}
