"""SAELens's on-disk layout: a directory with ``cfg.json`` and ``sae_weights.safetensors``,
as ``SAE.save_model`` writes it and ``SAE.load_from_disk`` reads it.

The layout followed is SAELens 6.54.12's (``sae_lens/saes/*.py``, ``sae_lens/constants.py``,
``sae_lens/loading/pretrained_sae_loaders.py`` of that release; 6.18.0's is the same, less
``jumprelu_skip_transcoder``). ``tests/test_dictionary_saelens.py`` checks files against
this layout; ``tests/test_dictionary_saelens_live.py`` against SAELens itself where it is
installed (it is not a dependency). ``cfg.json`` holds the config
fields at its top level (``d_in``, ``d_sae``, ``dtype``, ``device``,
``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``,
``architecture``, per architecture ``k``, ``rescale_acts_by_decoder_norm``, ``d_out``,
``hook_name_out``) and a free ``metadata`` object (``hook_name``, ``sae_lens_version``,
...). The tensors, by SAELens's names and shapes:

==============================  =========================================================
architecture                    tensors (ours in brackets where they differ)
==============================  =========================================================
``standard`` (ReLU)             ``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec [d_sae, d_in]``,
                                ``b_dec``
``topk``                        the same, and ``k`` in ``cfg.json``
``jumprelu``                    the same and ``threshold [d_sae]`` (``exp(log_threshold)``)
``transcoder`` (ReLU)           ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``; no pre-encoder bias
``skip_transcoder``             and ``W_skip [d_out, d_in]`` (ours is its transpose)
``jumprelu_transcoder``         a transcoder's tensors and ``threshold [d_sae]``
``jumprelu_skip_transcoder``    and ``W_skip [d_out, d_in]``
==============================  =========================================================

BatchTopK: SAELens saves a trained BatchTopK SAE for inference as ``jumprelu`` with the
global threshold repeated per feature (``BatchTopKTrainingSAE.
process_state_dict_for_saving_inference``); so does :func:`save_saelens` (our inference
rule ``pre * 1{pre > max(t, 0)}`` is SAELens's ``relu(pre) * 1{pre > t}``).
:func:`save_saelens` also writes our own config under ``metadata["vecinterp_config"]``,
so :func:`load_saelens` gives back the same dictionary (a BatchTopK one, the hook names,
JumpReLU's bandwidth); a file without it is read by SAELens's fields alone. Refused with
the reason: what SAELens cannot hold (TopK or BatchTopK transcoders) and what ours cannot
(``gated`` and other architectures, ``apply_b_dec_to_input=false`` for an SAE,
``normalize_activations`` other than ``"none"``, ``hook_z`` reshaping, half-precision
weights without ``dtype=``).
"""

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..model.atomic import read_regular
from ..model.tensor_files import CHECKSUM_KEY, read_tensors, refuse_non_finite, tensor_checksum
from ..training.checkpoint import write_dir_atomically
from .modules import DictionaryConfig, SparseDictionary, make_dictionary

SAELENS_VERSION = "6.54.12"
"""The SAELens release whose on-disk layout :func:`save_saelens` writes and
:func:`load_saelens` reads."""
CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
_OURS = "vecinterp_config"
_DTYPES = {
    "float32": "float32",
    "torch.float32": "float32",
    "float64": "float64",
    "torch.float64": "float64",
}
_HALF = ("float16", "bfloat16", "torch.float16", "torch.bfloat16")


def _architecture(cfg: DictionaryConfig) -> str:
    act = cfg.activation
    if not cfg.transcoder:
        return {"relu": "standard", "topk": "topk", "batchtopk": "jumprelu"}.get(act, act)
    if act == "relu":
        return "skip_transcoder" if cfg.skip else "transcoder"
    if act == "jumprelu":
        return "jumprelu_skip_transcoder" if cfg.skip else "jumprelu_transcoder"
    raise ValueError(
        f"SAELens {SAELENS_VERSION} has no transcoder with activation={act!r} (its "
        "transcoders: ReLU or JumpReLU, each with or without a skip): it cannot be written "
        "in SAELens's layout; use save_dictionary"
    )


def saelens_files(dictionary: SparseDictionary) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``cfg.json`` record and the tensors :func:`save_saelens` writes (on the CPU).

    Example:
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
        >>> from vecinterp.dictionary.saelens import saelens_files
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8, activation="topk", k=2))
        >>> record, tensors = saelens_files(sae)
        >>> record["architecture"], record["k"], sorted(tensors)
        ('topk', 2, ['W_dec', 'W_enc', 'b_dec', 'b_enc'])
    """
    if not isinstance(dictionary, SparseDictionary):
        raise TypeError(
            f"dictionary must be a SparseAutoencoder or Transcoder, got {type(dictionary).__name__}"
        )
    cfg = dictionary.cfg
    arch = _architecture(cfg)
    metadata: dict[str, Any] = {
        "sae_lens_version": SAELENS_VERSION,
        "sae_lens_training_version": SAELENS_VERSION,
        "hook_name": cfg.hook_in,
        _OURS: cfg.to_dict(),
    }
    record: dict[str, Any] = {
        "d_in": cfg.d_in,
        "d_sae": cfg.d_sae,
        "dtype": cfg.dtype,
        "device": "cpu",
        "apply_b_dec_to_input": not cfg.transcoder,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": metadata,
        "architecture": arch,
    }
    if arch == "topk":
        record["k"] = cfg.k
        record["rescale_acts_by_decoder_norm"] = False
    if cfg.transcoder:
        record["d_out"] = cfg.d_out
        record["hook_name_out"] = cfg.hook_out or ""
    d = dictionary
    tensors: dict[str, torch.Tensor] = {
        name: d.get_parameter(name) for name in ("W_enc", "b_enc", "W_dec", "b_dec")
    }
    if d.W_skip is not None:
        tensors["W_skip"] = d.W_skip.T
    if d.log_threshold is not None:
        tensors["threshold"] = d.log_threshold.exp()
    if d.threshold is not None:
        tensors["threshold"] = d.threshold.expand(cfg.d_sae)
    out = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    return record, out


def save_saelens(dictionary: SparseDictionary, path: str | os.PathLike[str]) -> Path:
    """Write ``dictionary`` to the directory ``path`` in SAELens's layout (``cfg.json`` +
    ``sae_weights.safetensors``, see :mod:`.saelens`), replaced as a whole, atomically.
    The safetensors header also carries our SHA-256 of the tensors (SAELens ignores it;
    :func:`load_saelens` checks it). Non-finite weights are refused. Returns ``path``.

    Example:
        >>> import tempfile, torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
        >>> from vecinterp.dictionary import load_saelens, save_saelens
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     back = load_saelens(save_saelens(sae, tmp + "/sae"))
        >>> all(torch.equal(a, b) for a, b in zip(sae.parameters(), back.parameters()))
        True
    """
    record, tensors = saelens_files(dictionary)
    refuse_non_finite(tensors, "save_saelens refuses a dictionary with non-finite weights")
    text = json.dumps(record, indent=2, allow_nan=False)

    def write(directory: Path) -> None:
        header = {"format": "pt", CHECKSUM_KEY: tensor_checksum(tensors)}
        save_file(tensors, str(directory / WEIGHTS_FILE), metadata=header)
        (directory / CFG_FILE).write_text(text)

    return write_dir_atomically(Path(path), write)


def _refuse(file: Path, why: str) -> ValueError:
    return ValueError(f"{file}: {why}")


def load_saelens(path: str | os.PathLike[str], dtype: str | None = None) -> SparseDictionary:
    """Read a dictionary saved in SAELens's layout (by SAELens's ``save_model`` or by
    :func:`save_saelens`) from the directory ``path``.

    Args:
        path: the directory holding ``cfg.json`` and ``sae_weights.safetensors``.
        dtype: ``"float32"`` or ``"float64"`` to convert the weights to (needed for a
            half-precision file); ``None``: the file's ``dtype``.

    A file we wrote comes back as it was (its config from ``metadata["vecinterp_config"]``;
    bit for bit, JumpReLU's ``log_threshold`` excepted: it is the logarithm of the stored
    threshold, chosen so that ``exp(log_threshold)``, the threshold the dictionary uses,
    is the stored one bit for bit where a float allows it). Others are read from
    SAELens's fields: ``hook_name`` (in ``metadata``) becomes ``hook_in``, a TopK file's
    ``rescale_acts_by_decoder_norm=true`` is folded into the weights (``W_enc`` and
    ``b_enc`` times each row norm of ``W_dec``, the rows divided by it: the same
    function, to rounding), and decoder rows stay as stored (not necessarily unit norm).
    Refused with a ``ValueError`` naming the file and the reason: see :mod:`.saelens`.

    Example:
        >>> import json, tempfile, torch
        >>> from pathlib import Path
        >>> from safetensors.torch import save_file
        >>> from vecinterp.dictionary import load_saelens
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "cfg.json").write_text(json.dumps({"architecture": "standard",
        ...         "d_in": 2, "d_sae": 1, "dtype": "float32",
        ...         "metadata": {"hook_name": "blocks.0.hook_resid_pre"}}))
        ...     save_file({"W_enc": torch.ones(2, 1), "b_enc": torch.zeros(1),
        ...                "W_dec": torch.ones(1, 2), "b_dec": torch.zeros(2)},
        ...               tmp + "/sae_weights.safetensors")
        ...     sae = load_saelens(tmp)
        >>> sae.cfg.hook_in, sae(torch.tensor([[1.0, 2.0]])).tolist()
        ('blocks.0.hook_resid_pre', [[3.0, 3.0]])
    """
    directory = Path(path)
    cfg_file = directory / CFG_FILE
    try:
        record = json.loads(read_regular(cfg_file))
    except FileNotFoundError:
        raise FileNotFoundError(f"{cfg_file} is missing: not a SAELens directory") from None
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise _refuse(cfg_file, f"not a readable JSON config ({err})") from None
    if not isinstance(record, dict):
        raise _refuse(cfg_file, "expected a JSON object")
    tensors, _ = read_tensors(directory / WEIGHTS_FILE)
    weights_file = directory / WEIGHTS_FILE
    cfg = _config(record, cfg_file, dtype)
    dictionary = make_dictionary(cfg)
    torch_dtype = cfg.torch_dtype
    arch = record.get("architecture", "standard")
    expected = {"W_enc", "b_enc", "W_dec", "b_dec"}
    if "skip" in arch:
        expected.add("W_skip")
    if "jumprelu" in arch:
        expected.add("threshold")
    if set(tensors) != expected:
        raise _refuse(
            weights_file,
            f"architecture {arch!r} has tensors {sorted(expected)}, the file holds "
            f"{sorted(tensors)}",
        )
    state: dict[str, torch.Tensor] = {
        k: tensors[k].to(torch_dtype) for k in ("W_enc", "b_enc", "W_dec", "b_dec")
    }
    if "W_skip" in tensors:
        state["W_skip"] = tensors["W_skip"].to(torch_dtype).T.contiguous()
    if "threshold" in tensors:
        threshold = tensors["threshold"].to(torch_dtype)
        if cfg.activation == "batchtopk":
            if threshold.numel() and not bool((threshold == threshold[0]).all()):
                raise _refuse(weights_file, "a BatchTopK threshold must be one value")
            state["threshold"] = threshold[0].clone()
        else:
            if not bool((threshold > 0).all()):
                raise _refuse(weights_file, "JumpReLU thresholds must be > 0 to be ours")
            state["log_threshold"] = _log_exactly(threshold)
    if record.get("rescale_acts_by_decoder_norm"):
        norms = state["W_dec"].norm(dim=1)
        state["W_enc"] = state["W_enc"] * norms
        state["b_enc"] = state["b_enc"] * norms
        state["W_dec"] = state["W_dec"] / norms[:, None]
    mine = dictionary.state_dict()
    for key, value in state.items():
        if key not in mine or mine[key].shape != value.shape:
            want = tuple(mine[key].shape) if key in mine else None
            raise _refuse(
                weights_file, f"{key} has shape {tuple(value.shape)}, the config says {want}"
            )
    dictionary.load_state_dict(state)
    return dictionary


def _log_exactly(threshold: torch.Tensor) -> torch.Tensor:
    """``log(threshold)``, each entry moved by a few ulps where that makes ``exp`` of it
    return the threshold bit for bit (as it does for a threshold written as ``exp``)."""
    log = threshold.log()
    for direction in (math.inf, -math.inf):
        step = log
        for _ in range(4):
            step = torch.nextafter(step, torch.full_like(step, direction))
            log = torch.where((log.exp() != threshold) & (step.exp() == threshold), step, log)
    return log


def _config(record: dict[str, Any], file: Path, dtype: str | None) -> DictionaryConfig:
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _refuse(file, "metadata must be a JSON object")
    arch = record.get("architecture", "standard")
    known = (
        "standard",
        "topk",
        "jumprelu",
        "transcoder",
        "skip_transcoder",
        "jumprelu_transcoder",
        "jumprelu_skip_transcoder",
    )
    if arch not in known:
        raise _refuse(
            file,
            f"architecture {arch!r} has no counterpart here (read: {list(known)}; a BatchTopK "
            "SAE is saved by SAELens as 'jumprelu')",
        )
    for field, allowed in (("normalize_activations", "none"), ("reshape_activations", "none")):
        value = record.get(field, allowed)
        if value not in (allowed, None):
            raise _refuse(
                file,
                f"{field}={value!r} is not supported: our dictionaries read the activation as "
                "it is; fold the normalisation into the weights in SAELens first",
            )
    transcoder = "transcoder" in arch
    if record.get("apply_b_dec_to_input", not transcoder) != (not transcoder):
        raise _refuse(
            file,
            "an SAE here always subtracts b_dec before encoding and a transcoder never does; "
            f"this {arch!r} file has apply_b_dec_to_input={record.get('apply_b_dec_to_input')}",
        )
    stored = record.get("dtype", "float32")
    if dtype is None:
        if stored in _HALF:
            raise _refuse(
                file, f"dtype {stored!r}: ours are float32 or float64; pass dtype='float32'"
            )
        if stored not in _DTYPES:
            raise _refuse(file, f"unknown dtype {stored!r}")
        dtype = _DTYPES[stored]
    ours = metadata.get(_OURS)
    if isinstance(ours, dict):
        cfg = DictionaryConfig.from_dict({**ours, "dtype": dtype})
        if _architecture(cfg) != arch or (cfg.d_in, cfg.d_sae) != (
            record.get("d_in"),
            record.get("d_sae"),
        ):
            raise _refuse(file, f"metadata[{_OURS!r}] does not describe this {arch!r} file")
        return cfg
    activation = {"standard": "relu", "topk": "topk"}.get(arch.replace("_transcoder", ""), "")
    if not activation:
        activation = "jumprelu" if "jumprelu" in arch else "relu"
    k = record.get("k") if activation == "topk" else None
    if isinstance(k, float) and k.is_integer():
        k = int(k)
    try:
        return DictionaryConfig(
            d_in=record.get("d_in"),  # type: ignore[arg-type]
            d_sae=record.get("d_sae"),  # type: ignore[arg-type]
            activation=activation,
            k=k,
            d_out=record.get("d_out") if transcoder else None,
            transcoder=transcoder,
            skip="skip" in arch,
            hook_in=metadata.get("hook_name"),
            hook_out=(record.get("hook_name_out") or metadata.get("hook_name_out") or None)
            if transcoder
            else None,
            dtype=dtype,
        )
    except (TypeError, ValueError) as err:
        raise _refuse(file, f"its config is not a valid dictionary: {err}") from None
