"""Saving and loading models as safetensors plus a JSON config (never pickle)."""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .config import VectorTransformerConfig
from .transformer import HookedVectorTransformer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "vecinterp-model"
FORMAT_VERSION = 1


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over
    ``path``: readers see the old file or the new one, never half of one."""
    tmp = _staged(path, write)
    os.replace(tmp, path)


def _staged(path: Path, write: Any) -> Path:
    """Write a temporary file beside ``path`` with ``write(tmp)``; removed if that fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes 0600 files; a saved model is meant to be shared
    tmp = Path(name)
    try:
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def save(
    model: HookedVectorTransformer,
    path: str | os.PathLike[str],
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` to the directory ``path``: ``model.safetensors`` and ``config.json``.

    Both files are written in full to temporary names first and only then renamed into
    place, so an interrupted save leaves the previous files intact. The config is also
    stored inside the safetensors header, and :func:`load` checks that the two agree.
    ``metadata`` (JSON-serialisable) is stored in the config file under ``"metadata"``.

    Returns:
        The directory.

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
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} exists and is not a directory")
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    dtypes = {str(t.dtype) for t in tensors.values()}
    config_json = json.dumps(model.cfg.to_dict(), sort_keys=True)
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": model.cfg.to_dict(),
        "dtype": dtypes.pop() if len(dtypes) == 1 else None,
        "metadata": metadata or {},
    }
    text = json.dumps(record, indent=2, sort_keys=True)
    header = {"format": FORMAT, "config": config_json}
    weights_tmp = _staged(
        directory / WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata=header)
    )
    try:
        config_tmp = _staged(directory / CONFIG_FILE, lambda tmp: tmp.write_text(text))
    except BaseException:
        weights_tmp.unlink(missing_ok=True)
        raise
    os.replace(weights_tmp, directory / WEIGHTS_FILE)
    os.replace(config_tmp, directory / CONFIG_FILE)
    return directory


def read_config(path: str | os.PathLike[str]) -> tuple[VectorTransformerConfig, dict[str, Any]]:
    """The config and metadata saved in the directory ``path``."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {Path(path)} (was it written by vecinterp.save?)"
        )
    try:
        record = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{file} is not a vecinterp model config (missing format={FORMAT!r})")
    if record.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{file} has format_version {record['format_version']}; this vecinterp reads up to "
            f"{FORMAT_VERSION}: upgrade vecinterp"
        )
    if not isinstance(record.get("config"), dict):
        raise ValueError(f"{file} has no 'config' record")
    try:
        cfg = VectorTransformerConfig.from_dict(record["config"])
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
    return cfg, record.get("metadata", {})


def load(
    path: str | os.PathLike[str], device: str | torch.device | None = None
) -> HookedVectorTransformer:
    """Rebuild a model written by :func:`save`.

    The dtype is the saved one. Raises ``FileNotFoundError`` for a missing file and
    ``ValueError`` for a corrupted file or weights that do not match the config (listing
    the missing, unexpected and mis-shaped tensors).

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
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"no saved model at {directory} (expected a directory)")
    cfg, _ = read_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {directory}")
    try:
        tensors = load_file(str(weights))
        with safe_open(str(weights), framework="pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{weights} is not a readable safetensors file: {err}") from None
    dtypes = {t.dtype for t in tensors.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    model = HookedVectorTransformer(cfg, seed=0, dtype=dtype)
    check_state_dict(model, tensors, source=str(weights))
    if "config" in header and json.loads(header["config"]) != cfg.to_dict():
        raise ValueError(
            f"{weights} and {CONFIG_FILE} in {directory} come from different saves: "
            "their configs differ"
        )
    model.load_state_dict(tensors)
    return model.to(device) if device is not None else model


def check_state_dict(
    model: HookedVectorTransformer, state: dict[str, torch.Tensor], source: str = "state dict"
) -> None:
    """Raise ``ValueError`` naming every missing, unexpected or mis-shaped tensor."""
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
            parts.append(f"missing {missing}")
        if unexpected:
            parts.append(f"unexpected {unexpected}")
        if shapes:
            parts.append("wrong shapes: " + "; ".join(shapes))
        raise ValueError(f"{source} does not match its config: " + ", ".join(parts))
