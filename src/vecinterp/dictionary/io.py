"""Saving and loading dictionaries: ``dictionary.safetensors`` + ``config.json``, with
checksums, written atomically (the machinery of models' saves and training checkpoints)."""

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..model.atomic import read_regular
from ..model.tensor_files import CHECKSUM_KEY, read_tensors, refuse_non_finite, tensor_checksum
from ..training.checkpoint import record_checksum, sealed, write_dir_atomically
from .modules import DictionaryConfig, SparseAutoencoder, SparseDictionary, Transcoder

FORMAT = "vecinterp-dictionary"
FORMAT_VERSION = 1
WEIGHTS_FILE = "dictionary.safetensors"
CONFIG_FILE = "config.json"


def write_dictionary(
    dictionary: SparseDictionary, directory: Path, metadata: dict[str, Any]
) -> None:
    """Write the two files into the (new or staged) ``directory``."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in dictionary.state_dict().items()}
    refuse_non_finite(tensors, "save_dictionary refuses a dictionary with non-finite weights")
    record = sealed(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "config": dictionary.cfg.to_dict(),
            "metadata": metadata,
        }
    )
    try:
        text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"metadata must be JSON-serialisable and finite: {err}") from None
    directory.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, CHECKSUM_KEY: tensor_checksum(tensors)}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata=header)
    (directory / CONFIG_FILE).write_text(text)


def save_dictionary(
    dictionary: SparseDictionary,
    path: str | os.PathLike[str],
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``dictionary`` to the directory ``path`` (replaced as a whole, atomically):
    ``dictionary.safetensors`` (SHA-256 of the tensors in its header) and ``config.json``
    (the config, ``metadata``, and a SHA-256 of the record). Non-finite weights are
    refused. Returns ``path``.

    Example:
        >>> import tempfile, torch
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder,
        ...                                   load_dictionary, save_dictionary)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = save_dictionary(sae, f"{d}/sae")
        ...     torch.equal(load_dictionary(f"{d}/sae").W_dec, sae.W_dec)
        True
    """
    if not isinstance(dictionary, SparseDictionary):
        raise TypeError(
            f"save_dictionary expects a SparseAutoencoder or Transcoder, got "
            f"{type(dictionary).__name__}"
        )
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} exists and is not a directory")
    write_dir_atomically(directory, lambda tmp: write_dictionary(dictionary, tmp, metadata or {}))
    return directory


def read_dictionary_record(path: Path) -> dict[str, Any]:
    """The verified ``config.json`` of a saved dictionary (``ValueError`` naming the file
    for one that is unreadable, of another format, or corrupted)."""
    file = path / CONFIG_FILE
    try:
        record = json.loads(read_regular(file))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {path} (written by save_dictionary?)"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not a readable dictionary config: {err}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{file} is not a vecinterp dictionary config (format {FORMAT!r})")
    stored = record.pop(CHECKSUM_KEY, None)
    if stored != record_checksum(record):
        raise ValueError(
            f"{file} is corrupted: its contents do not match the SHA-256 checksum stored in it"
        )
    version = record.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{file} has format_version {version!r}; this vecinterp reads up to 1")
    return record


def load_dictionary(path: str | os.PathLike[str]) -> SparseDictionary:
    """Read a dictionary written by :func:`save_dictionary`: a :class:`SparseAutoencoder`
    or :class:`Transcoder`, checksums verified (``ValueError`` naming the file that does
    not match), weights checked against the config.

    Example:
        >>> import tempfile
        >>> from vecinterp.dictionary import (DictionaryConfig, Transcoder,
        ...                                   load_dictionary, save_dictionary)
        >>> cfg = DictionaryConfig(d_in=4, d_sae=8, transcoder=True, activation="topk", k=2)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = save_dictionary(Transcoder(cfg), d + "/tc")
        ...     load_dictionary(d + "/tc").cfg == cfg
        True
    """
    directory = Path(path)
    record = read_dictionary_record(directory)
    try:
        cfg = DictionaryConfig.from_dict(record["config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{directory / CONFIG_FILE}: bad config: {err}") from None
    tensors, _ = read_tensors(directory / WEIGHTS_FILE)
    refuse_non_finite(tensors, f"{directory / WEIGHTS_FILE}")
    dictionary = Transcoder(cfg) if cfg.transcoder else SparseAutoencoder(cfg)
    own = dictionary.state_dict()
    if set(tensors) != set(own) or any(tensors[k].shape != own[k].shape for k in own):
        raise ValueError(
            f"{directory / WEIGHTS_FILE} holds the tensors "
            f"{sorted((k, tuple(v.shape)) for k, v in tensors.items())}, which do not fit "
            f"the config {cfg}"
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)
    return dictionary
