"""Argument checks and the set-up of a training run: device, data source, evaluation."""

import difflib
import inspect
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..hooks import HookPoint
from ..model.tensor_files import refuse_non_finite
from ..model.transformer import HookedVectorTransformer
from ..model.validation import check_device
from ..threads import check_threads as check_threads_value
from .data import MakeBatchSource, StreamSource, as_batch_list, evaluate_batches, is_batch
from .schedule import check_int, check_positive


def default_device() -> torch.device:
    """``cuda`` if a CUDA GPU is available, else ``cpu``.

    Example:
        >>> import torch
        >>> from vecinterp.training.setup import default_device
        >>> default_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
        True
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_source(data: object, seed: int) -> MakeBatchSource | StreamSource:
    if is_batch(data):
        raise TypeError(
            "data is a single batch; pass an iterable of batches (itertools.repeat(batch) "
            "trains on one batch again and again) or make_batch(step, generator)"
        )
    if isinstance(data, Iterable) and not isinstance(data, str | bytes):
        return StreamSource(data)
    if callable(data):
        _check_make_batch(data)
        return MakeBatchSource(data, seed)
    raise TypeError(
        "data must be an iterable of batches or a callable make_batch(step, generator) -> "
        f"batch, got {type(data).__name__}"
    )


def _check_make_batch(make_batch: Callable[..., Any]) -> None:
    """``TypeError`` naming ``data`` unless ``make_batch(step, generator)`` can be called
    (a callable whose signature cannot be read is trusted)."""
    try:
        signature = inspect.signature(make_batch)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(0, torch.Generator())
    except TypeError as err:
        name = getattr(make_batch, "__name__", type(make_batch).__name__)
        raise TypeError(
            f"data: a callable must be make_batch(step, generator) -> batch, but "
            f"{name}{signature} cannot take (step, generator): {err}"
        ) from None


def make_eval(eval_data: object) -> Callable[[torch.nn.Module], float] | None:
    if eval_data is None:
        return None
    if callable(eval_data) and not is_batch(eval_data) and not isinstance(eval_data, Iterable):

        def run(model: torch.nn.Module) -> float:
            value = eval_data(model)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"eval_data(model) must return a number, got {type(value).__name__}"
                )
            return float(value)

        return run
    if (
        isinstance(eval_data, Iterable)
        and not is_batch(eval_data)
        and (iter(eval_data) is eval_data)
    ):
        raise ValueError(
            "eval_data is an iterator, which would be used up by the first evaluation: pass a "
            "list of batches (e.g. affine_recurrence.fixed_eval_set(...)) or fn(model) -> float"
        )
    batches = as_batch_list(eval_data, "eval_data")
    return lambda model: evaluate_batches(model, batches, "eval_data")


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return default_device()
    dev = check_device("device", device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_ema(ema_decay: object, ema_start: object, steps: int) -> None:
    """Raise ``ValueError`` for a weight-average decay outside (0, 1) or a bad start."""
    if ema_decay is not None and (
        isinstance(ema_decay, bool)
        or not isinstance(ema_decay, (int, float))
        or not 0.0 < ema_decay < 1.0
    ):
        raise ValueError(f"ema_decay must be a number in (0, 1) or None, got {ema_decay!r}")
    check_int("ema_start", ema_start, minimum=0)
    if ema_decay is None and ema_start != 0:
        raise ValueError("ema_start needs ema_decay (the average it starts)")
    if ema_start >= steps:  # type: ignore[operator]
        raise ValueError(f"ema_start must be < steps={steps}, got {ema_start!r}")


def check_args(
    model: object, steps: object, lr: object, weight_decay: object, betas: object,
    eps: object, grad_clip: object, eval_data: object, eval_every: object,
    checkpoint_dir: object, checkpoint_every: object, keep_last: object, resume: object,
    seed: object, progress: object, log_every: object, callback: object,
) -> None:  # fmt: skip
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"model must be a HookedVectorTransformer, got {type(model).__name__}")
    check_int("steps", steps, minimum=1)
    check_positive("lr", lr)
    if (
        isinstance(weight_decay, bool)
        or not isinstance(weight_decay, (int, float))
        or not 0 <= weight_decay < math.inf
    ):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    if (
        not isinstance(betas, (tuple, list))
        or len(betas) != 2
        or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas
        )
    ):
        raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}")
    check_positive("eps", eps)
    if grad_clip is not None:
        check_positive("grad_clip", grad_clip)
    if eval_every is not None:
        check_int("eval_every", eval_every, minimum=1)
        if eval_data is None:
            raise ValueError("eval_every needs eval_data (a list of batches or fn(model))")
    if checkpoint_dir is not None:
        if not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise TypeError(
                f"checkpoint_dir must be a path (str or os.PathLike) or None, got "
                f"{type(checkpoint_dir).__name__}"
            )
        if Path(checkpoint_dir).exists() and not Path(checkpoint_dir).is_dir():
            raise ValueError(
                f"checkpoint_dir must be a directory (created if missing), but {checkpoint_dir} "
                "is a file"
            )
    if checkpoint_every is not None:
        check_int("checkpoint_every", checkpoint_every, minimum=1)
        if checkpoint_dir is None:
            raise ValueError("checkpoint_every needs checkpoint_dir (where to write them)")
    if keep_last is not None:
        check_int("keep_last", keep_last, minimum=1)
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, got {resume!r}")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir (where the checkpoints are)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    check_int("log_every", log_every, minimum=1)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(step, metrics), got {type(callback).__name__}")


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def attached_hooks(model: torch.nn.Module) -> list[str]:
    """Where hooks that this thread's forward passes would call are attached to ``model``:
    vecinterp hooks (``add_hook``, permanent or not, and this thread's ``hooks()`` contexts)
    by hook point name, and PyTorch module hooks (``register_forward_hook`` and its kin) by
    module name. Another thread's scoped hooks are its own business and are not listed."""
    me = threading.current_thread()
    found = []
    for name, module in model.named_modules():
        if isinstance(module, HookPoint):
            handles = list(getattr(module, "_fwd", [])) + list(getattr(module, "_bwd", []))
            if any(h.owner is None or h.owner is me for h in handles):
                found.append(module.name or name)
        if any(getattr(module, attr, None) for attr in _MODULE_HOOKS):
            found.append(f"{name or 'the model'} (a PyTorch module hook)")
    return found


def check_trainable(models: dict[str, HookedVectorTransformer]) -> None:
    """Refuse a model (of ``{name: model}``) whose training would silently differ from what
    it computes: one with hooks attached, which the training copy (rebuilt from the config
    and the weights) would not carry, so that training "with a knocked-out head" would
    train the intact model; and one with NaN/inf weights, which could only diverge
    (``ValueError`` naming them). The weights of all the models are checked in one read
    of their values (on a GPU, one wait for the device)."""
    for name, model in models.items():
        hooked = attached_hooks(model)
        if hooked:
            shown = ", ".join(hooked[:3]) + (
                f" and {len(hooked) - 3} more" if len(hooked) > 3 else ""
            )
            raise ValueError(
                f"{name} has hooks attached ({shown}): training runs on a copy of the model "
                "rebuilt from its config and weights, without hooks, so it would train the "
                "model without the intervention they make. Remove them first "
                "(model.reset_hooks(including_permanent=True), handle.remove(), or leave the "
                "hooks() context); to train under an intervention, make it part of the "
                "weights or write a training loop that calls the hooked model"
            )
    flags = [
        torch.isfinite(t).all()
        for model in models.values()
        for t in model.state_dict().values()
        if t.is_floating_point()
    ]
    if flags and not bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
        for name, model in models.items():
            refuse_non_finite(
                dict(model.state_dict()),
                f"{name} cannot be trained: it holds NaN/inf weights (training could only diverge)",
            )


def check_threads(threads: object) -> None:
    """``ValueError`` unless ``threads`` is ``None``, ``"auto"`` or an int >= 1."""
    check_threads_value("threads", threads)


Frozen = str | Callable[[str], bool] | Iterable[str | Callable[[str], bool]] | None
"""``train(frozen=...)``: parameter names, predicates ``name -> bool``, or a list of both."""


def resolve_frozen(model: torch.nn.Module, frozen: object) -> list[str]:
    """The sorted names (as in ``model.named_parameters()``) of the parameters that
    ``frozen`` selects: ``None`` or an empty list none; a name; a predicate
    ``name -> bool``; or a list (any iterable) of names and predicates, whose selections
    are joined. Raises ``TypeError`` or ``ValueError`` naming ``frozen`` for an entry that
    is neither a string nor callable, a name the model lacks (with the close matches and
    the model's names), a name given twice, a predicate that raises, returns something
    other than True/False or selects no parameter, and a selection of every parameter
    (nothing would be trained).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.training.setup import resolve_frozen
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> resolve_frozen(model, ["unembed.b_U", lambda name: name.endswith(".b_K")])
        ['blocks.0.attn.b_K', 'unembed.b_U']
        >>> try:
        ...     resolve_frozen(model, "unembed.b_u")
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        frozen: 'unembed.b_u' is not a parameter of the model (did you mean 'unembed.b_U'?)
    """
    if frozen is None:
        return []
    if isinstance(frozen, str) or callable(frozen):
        entries: list[object] = [frozen]
    elif isinstance(frozen, Iterable) and not isinstance(frozen, bytes | Mapping | torch.Tensor):
        entries = list(frozen)
    else:
        raise TypeError(
            "frozen must be a parameter name, a predicate name -> bool, a list of names and "
            f"predicates, or None; got {type(frozen).__name__}"
        )
    names = [name for name, _ in model.named_parameters()]
    known = set(names)
    chosen: set[str] = set()
    given: set[str] = set()
    for i, entry in enumerate(entries):
        where = "frozen" if len(entries) == 1 and entries[0] is frozen else f"frozen[{i}]"
        if isinstance(entry, str):
            if entry in given:
                raise ValueError(f"frozen names the parameter {entry!r} twice")
            given.add(entry)
            if entry not in known:
                raise ValueError(_unknown(entry, names, where))
            chosen.add(entry)
        elif callable(entry):
            picked = _apply_predicate(entry, names, where)
            if not picked:
                raise ValueError(
                    f"{where}: the predicate {_callable_name(entry)} selects no parameter of "
                    f"the model (its parameters: {_summary(names)}); pass frozen=None to "
                    "train every parameter"
                )
            chosen.update(picked)
        else:
            raise TypeError(
                f"{where} must be a parameter name (str) or a predicate name -> bool, got "
                f"{type(entry).__name__} {entry!r}"
            )
    if chosen and chosen == known:
        raise ValueError(
            f"frozen selects every parameter of the model ({len(names)}): nothing would be trained"
        )
    return sorted(chosen)


def _apply_predicate(predicate: Callable[[str], object], names: list[str], where: str) -> set[str]:
    """The names ``predicate`` returns True for (``ValueError``/``TypeError`` naming
    ``where`` and the parameter for one that raises or returns a non-bool)."""
    picked = set()
    for name in names:
        try:
            value = predicate(name)
        except Exception as err:
            raise ValueError(
                f"{where}: the predicate {_callable_name(predicate)} raised "
                f"{type(err).__name__} on the parameter name {name!r}: {err}"
            ) from err
        if not isinstance(value, bool):
            raise TypeError(
                f"{where}: the predicate {_callable_name(predicate)} must return True or "
                f"False, but returned {type(value).__name__} {value!r} for {name!r}"
            )
        if value:
            picked.add(name)
    return picked


def _callable_name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _summary(names: list[str]) -> str:
    """The parameter names, each layer's once (``blocks.<i>.attn.W_Q, i = 0..3``)."""
    layers = sorted({int(m.group(1)) for n in names if (m := _LAYER.match(n))})
    shown = list(dict.fromkeys(_LAYER.sub("blocks.<i>.", n) for n in names))
    text = ", ".join(shown)
    if layers:
        text += f" (i = {layers[0]}..{layers[-1]})"
    return text


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def _unknown(name: str, names: list[str], where: str) -> str:
    same = [n for n in names if n.lower() == name.lower()]  # b_u for b_U
    close = same or difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return (
        f"{where}: {name!r} is not a parameter of the model{hint}; its parameters, as "
        f"model.named_parameters() names them: {_summary(names)}"
    )
