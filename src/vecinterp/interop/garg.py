"""Checkpoints of Garg et al.'s in-context-learning code, opened in one call.

Garg, Tsipras, Liang and Valiant, "What Can Transformers Learn In-Context? A Case Study of
Simple Function Classes", 2022, arXiv:2208.01066, train a ``TransformerModel`` of three
parts, ``_read_in`` (``nn.Linear(n_dims, n_embd)``), ``_backbone`` (a Hugging Face
``GPT2Model`` with ``n_positions = 2 * n_points``) and ``_read_out`` (``nn.Linear(n_embd,
1)``), and save ``{"model_state_dict": ..., "optimizer_state_dict": ..., "train_step":
...}`` as ``state.pt`` (their released models: ``model.pt``, the state dict alone).
:func:`from_garg_checkpoint` reads either, rebuilds the three parts from the weights'
shapes (only the number of heads is not in them: their ``conf/*.yaml`` says it, 8 in the
paper) and imports them with :func:`vecinterp.from_hf`.
"""

import os
import pickle
import re
from collections.abc import Mapping

import torch
from torch import nn

from ..model.transformer import HookedVectorTransformer
from .hf import from_hf, transformers_module
from .hf_gpt2 import ACT_FROM_GPT2

__all__ = ["from_garg_checkpoint"]

_PREFIX = "_backbone."


def _load(path: str | os.PathLike) -> object:
    """``torch.load(path, weights_only=True)``, or an error saying what the file is not."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {os.fspath(path)!r} does not exist")
    if not os.path.isfile(path):  # a directory, /dev/zero, a FIFO: never read
        raise ValueError(
            f"checkpoint {os.fspath(path)!r} is not a regular file: pass the path of the "
            "state.pt / model.pt file that torch.save wrote"
        )
    try:
        # weights_only: a checkpoint is data, and loading it must not run code
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "GLOBAL" in str(err) or "global" in str(err):
            raise ValueError(
                f"checkpoint {os.fspath(path)!r} holds pickled Python objects, not only "
                "tensors (a whole module saved with torch.save(model)?): vecinterp reads "
                "checkpoints with weights_only=True and never runs a file's code. If you "
                "trust the file, load it yourself, module = torch.load(path, "
                "weights_only=False), and pass module.state_dict() as the checkpoint"
            ) from None
        raise ValueError(_not_a_torch_file(path, err)) from None
    except Exception as err:  # noqa: BLE001 - torch raises many kinds for a bad file
        raise ValueError(_not_a_torch_file(path, err)) from None


def _not_a_torch_file(path: str | os.PathLike, err: Exception) -> str:
    text = str(err)
    if "WeightsUnpickler error:" in text:  # not torch's advice to pass weights_only=False
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0][:200] if lines else ""
    return (
        f"checkpoint {os.fspath(path)!r} is not a file torch.save wrote, or it is damaged "
        f"(torch.load: {type(err).__name__}{': ' + first if first else ''}); pass the "
        "state.pt / model.pt of Garg et al.'s code"
    )


def _state_dict(checkpoint: object) -> Mapping[str, torch.Tensor]:
    if isinstance(checkpoint, str | os.PathLike):
        checkpoint = _load(checkpoint)
    if isinstance(checkpoint, Mapping) and "model_state_dict" in checkpoint:
        checkpoint = checkpoint["model_state_dict"]
    if not isinstance(checkpoint, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in checkpoint.items()
    ):
        raise TypeError(
            "checkpoint must be a path to a torch.save file, a state dict (name -> tensor) "
            "or a dict with a 'model_state_dict' entry, as Garg et al.'s code saves; got "
            f"{type(checkpoint).__name__}"
        )
    missing = [
        k
        for k in ("_read_in.weight", "_read_out.weight", f"{_PREFIX}wpe.weight")
        if k not in checkpoint
    ]
    if missing:
        raise ValueError(
            f"not a checkpoint of Garg et al.'s TransformerModel: it lacks {missing} (its "
            "parts are _read_in, _backbone (a GPT2Model) and _read_out)"
        )
    return checkpoint


def from_garg_checkpoint(
    checkpoint: object,
    *,
    n_head: int,
    activation_function: str = "gelu_new",
    layer_norm_epsilon: float = 1e-5,
    dtype: torch.dtype | None = None,
) -> HookedVectorTransformer:
    """A :class:`~vecinterp.HookedVectorTransformer` computing the model of a Garg et al.
    checkpoint (see the module docstring).

    ``model(zs)`` is the checkpoint's ``_read_out(_backbone(inputs_embeds=_read_in(zs)))``
    at every position; the task's predictions are at the x positions, ``model(zs)[:, ::2,
    0]``. The widths, the number of layers and ``n_positions`` come from the weights'
    shapes; the GPT-2 settings that are not in them are Garg et al.'s (GPT-2's defaults)
    unless given.

    Args:
        checkpoint: a path to ``state.pt`` / ``model.pt``, or the loaded dict (with or
            without the ``"model_state_dict"`` level). Files are read with
            ``torch.load(..., weights_only=True)``.
        n_head: the number of attention heads (``model.n_head`` in their config; 8 in the
            paper).
        activation_function: GPT-2's MLP activation (default ``"gelu_new"``, GPT-2's).
        layer_norm_epsilon: GPT-2's LayerNorm epsilon (default 1e-5, GPT-2's).
        dtype: the new model's dtype (default: the checkpoint's).

    Raises:
        ImportError: ``transformers`` (the ``hf`` extra) is not installed.
        TypeError: ``checkpoint`` is not a path or a state dict.
        FileNotFoundError: the path does not exist.
        ValueError: the path is not a regular file, or not one ``torch.save`` wrote (a
            file holding pickled objects, such as a whole module saved with
            ``torch.save(model)``, is refused with the way out: load it yourself and pass
            its ``state_dict()``); the state dict is not of Garg et al.'s model,
            ``n_head`` does not divide the width, ``activation_function`` is not one of
            GPT-2's that vecinterp reads, or a weight does not fit.

    Example:
        >>> import torch, vecinterp as vi
        >>> from torch import nn
        >>> from transformers import GPT2Config, GPT2Model
        >>> parts = nn.Module()
        >>> parts._read_in = nn.Linear(5, 16)
        >>> parts._backbone = GPT2Model(GPT2Config(n_positions=2 * 11, n_embd=16, n_layer=2,
        ...     n_head=4, vocab_size=1, bos_token_id=0, eos_token_id=0))
        >>> parts._read_out = nn.Linear(16, 1)
        >>> model = vi.from_garg_checkpoint({"model_state_dict": parts.state_dict()},
        ...                                 n_head=4)
        >>> model.cfg.d_in, model.cfg.d_out, model.cfg.n_ctx, model.cfg.n_layers
        (5, 1, 22, 2)
    """
    transformers = transformers_module()
    state = _state_dict(checkpoint)
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head <= 0:
        raise ValueError(f"n_head must be a positive int, got {n_head!r}")
    if activation_function not in ACT_FROM_GPT2:
        raise ValueError(
            f"activation_function={activation_function!r} is not one of GPT-2's that "
            f"vecinterp reads: {sorted(ACT_FROM_GPT2)} (Garg et al.'s is 'gelu_new', the "
            "default)"
        )
    n_positions, n_embd = state[f"{_PREFIX}wpe.weight"].shape
    if n_embd % n_head:
        raise ValueError(f"n_head={n_head} does not divide the width n_embd={n_embd}")
    layers = {int(m.group(1)) for k in state if (m := re.match(r"_backbone\.h\.(\d+)\.", k))}
    n_layer = max(layers) + 1 if layers else 0
    fc = state.get(f"{_PREFIX}h.0.mlp.c_fc.weight")
    config = transformers.GPT2Config(
        vocab_size=state.get(f"{_PREFIX}wte.weight", torch.empty(1, 0)).shape[0],
        bos_token_id=0,
        eos_token_id=0,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_inner=None if fc is None else fc.shape[1],
        activation_function=activation_function,
        layer_norm_epsilon=layer_norm_epsilon,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    read_in_w, read_out_w = state["_read_in.weight"], state["_read_out.weight"]
    with torch.random.fork_rng(devices=[]):  # every weight is overwritten below
        backbone = transformers.GPT2Model(config)
        read_in = nn.Linear(read_in_w.shape[1], n_embd, bias="_read_in.bias" in state)
        read_out = nn.Linear(n_embd, read_out_w.shape[0], bias="_read_out.bias" in state)
    backbone_state = {k[len(_PREFIX) :]: v for k, v in state.items() if k.startswith(_PREFIX)}
    for module, part in (
        (backbone, backbone_state),
        (read_in, "_read_in."),
        (read_out, "_read_out."),
    ):
        if isinstance(part, str):
            part = {k[len(part) :]: v for k, v in state.items() if k.startswith(part)}
        module.to(read_in_w.dtype)
        try:
            # strict, except for GPT-2's non-persistent attention buffers in old versions
            result = module.load_state_dict(part, strict=False)
        except RuntimeError as err:
            raise ValueError(
                f"the checkpoint's weights do not fit Garg et al.'s model: {err}"
            ) from None
        missing = [k for k in result.missing_keys if not k.endswith("wte.weight")]
        unexpected = [
            k for k in result.unexpected_keys if not k.endswith((".attn.bias", ".attn.masked_bias"))
        ]
        if missing or unexpected:
            raise ValueError(
                f"the checkpoint's weights do not fit Garg et al.'s model: missing {missing}, "
                f"unexpected {unexpected}"
            )
    return from_hf(backbone.eval(), read_in, read_out, dtype=dtype)
