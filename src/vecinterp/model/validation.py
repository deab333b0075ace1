"""Fail-fast checks on what users pass to a model (and, reused by the layers above, to
the analyses, the tasks and training): tensors, flags, seeds, dtypes and devices."""

import contextlib
import contextvars
import math
import operator
from collections.abc import Iterator
from typing import Literal, overload

import torch

from .config import VectorTransformerConfig


def check_input(
    x: object,
    cfg: VectorTransformerConfig,
    param: torch.Tensor,
    axis: str = "d_in",
    *,
    name: str = "x",
) -> torch.Tensor:
    """Raise a clear error unless ``x`` is a finite ``[batch, pos, axis]`` float tensor that
    fits ``n_ctx`` and sits on the model's device with the model's dtype. ``axis`` is
    ``"d_in"`` for inputs, ``"d_model"`` for a residual stream fed to a later block.
    ``name`` is what the messages call the tensor: the argument the user passed it as
    (``"population"``, ``"corrupted_x"``, ...)."""
    width = getattr(cfg, axis)
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"expected {name} as a torch.Tensor [batch, pos, {axis}], got {type(x).__name__}"
        )
    if not x.is_floating_point() and not x.is_complex():
        # the dtype before the rank: token ids [batch, pos] are not a missing batch axis
        raise TypeError(
            f"{name} has dtype {x.dtype}, shape {tuple(x.shape)}: vecinterp models take "
            f"float vectors [batch, pos, {axis}={width}], not token ids (there is no "
            "tokenizer or vocabulary). For a language model on tokens use TransformerLens's "
            f"HookedTransformer; for integers that are values, pass {name}.to({param.dtype}) "
            f"shaped [batch, pos, {axis}]"
        )
    if x.ndim != 3:
        hint = f" (add a batch axis with {name}.unsqueeze(0))" if x.ndim == 2 else ""
        raise ValueError(
            f"expected {name} of rank 3 [batch, pos, {axis}={width}], "
            f"got shape {tuple(x.shape)}{hint}"
        )
    if x.shape[-1] != width:
        raise ValueError(
            f"expected the last axis of {name} to be {axis}={width}, got shape {tuple(x.shape)}"
        )
    if x.shape[1] > cfg.n_ctx:
        raise ValueError(
            f"{name} has {x.shape[1]} positions but the model takes at most n_ctx={cfg.n_ctx}"
        )
    if x.shape[1] == 0 or x.shape[0] == 0:
        raise ValueError(
            f"{name} must have at least one batch item and position, got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point {name} with the model's dtype {param.dtype}, got {x.dtype}"
        )
    if x.dtype != param.dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the model's weights are {param.dtype}; "
            f"use {name}.to({param.dtype}) or model.to({x.dtype})"
        )
    if x.device != param.device:
        raise ValueError(
            f"{name} is on {x.device} but the model is on {param.device}; "
            f"use {name}.to('{param.device}')"
        )
    check_finite(name, x)
    return x


_FINITE_CHECKS_TAKEN_OVER = contextvars.ContextVar("finite_checks_taken_over", default=False)


@contextlib.contextmanager
def finite_checks_taken_over() -> Iterator[None]:
    """Within this block :func:`check_finite` checks nothing: the caller checks the same
    tensors itself. The training loop does, with a flag it keeps on the device and reads
    with the step's loss, so that a forward pass on a GPU does not wait for the device to
    answer whether its inputs are finite (a host sync per step)."""
    token = _FINITE_CHECKS_TAKEN_OVER.set(True)
    try:
        yield
    finally:
        _FINITE_CHECKS_TAKEN_OVER.reset(token)


def check_finite(name: str, t: torch.Tensor, where: torch.Tensor | None = None) -> None:
    """Raise a ``ValueError`` naming ``name`` and the first bad index unless ``t`` is finite
    (only where the bool mask ``where``, broadcastable to ``t``'s leading axes, is True);
    nothing inside :func:`finite_checks_taken_over`.

    Under ``torch.compile`` (while dynamo traces the caller) the check cannot read the
    device back, which would break the graph: it becomes an assert inside the graph
    (``torch._assert_async``), so a compiled model still refuses NaN/inf, with a
    ``RuntimeError`` carrying the same message without the index (see
    :doc:`/howto_compile`)."""
    if torch.compiler.is_compiling():
        _assert_finite_in_graph(name, t, where)
        return
    if _FINITE_CHECKS_TAKEN_OVER.get():
        return
    if where is None:
        if bool(torch.isfinite(t).all()):  # the common case: one reduction, no mask
            return
        bad = ~torch.isfinite(t)
    else:
        bad = ~torch.isfinite(t) & where.reshape(*where.shape, *[1] * (t.ndim - where.ndim))
    if bool(bad.any()):
        first = bad.nonzero()[0].tolist()
        used = " at a position the loss uses" if where is not None else ""
        raise ValueError(f"{name} contains NaN or inf{used} (first at index {first})")


def _assert_finite_in_graph(name: str, t: torch.Tensor, where: torch.Tensor | None) -> None:
    """:func:`check_finite` inside a compiled graph: an assert that runs with the graph
    (a ``RuntimeError`` on the CPU, a device-side assert on a GPU), no host sync."""
    if where is None:
        ok = torch.isfinite(t).all()
        used = ""
    else:
        mask = where.reshape(*where.shape, *[1] * (t.ndim - where.ndim))
        ok = ~(~torch.isfinite(t) & mask).any()
        used = " at a position the loss uses"
    torch._assert_async(ok, f"{name} contains NaN or inf{used} (checked in a compiled graph)")


def check_like(name: str, t: object, shape: tuple[int, ...], ref: torch.Tensor) -> torch.Tensor:
    """Check that ``t`` is a tensor of ``shape`` on ``ref``'s device (dtype may differ)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"expected {name} as a torch.Tensor of shape {shape}, got {type(t).__name__}"
        )
    if tuple(t.shape) != shape:
        raise ValueError(f"expected {name} of shape {shape}, got {tuple(t.shape)}")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but the model is on {ref.device}")
    return t


# -- scalar arguments ----------------------------------------------------------------------
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def describe(value: object) -> str:
    """``value`` as a message shows it: its type and repr (``str 'yes'``), a dtype as is."""
    if isinstance(value, torch.dtype | torch.device | type(None) | bool):
        return repr(value) if not isinstance(value, torch.dtype) else str(value)
    return f"{type(value).__name__} {value!r}"


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False``; else ``TypeError`` naming ``name``.

    A string such as ``"no"`` is refused rather than read as truthy."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {describe(value)}")
    return value


@overload
def check_seed(name: str, value: object, *, allow_none: Literal[False] = False) -> int: ...
@overload
def check_seed(name: str, value: object, *, allow_none: bool) -> int | None: ...
def check_seed(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """A seed for ``torch.Generator.manual_seed``: an int (or an integer such as
    ``numpy.int64``; not a bool) in ``[-2**63, 2**64)``; ``None`` only if ``allow_none``."""
    if value is None and allow_none:
        return None
    try:
        seed = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        seed = None
    also = " or None" if allow_none else ""
    if seed is None:
        raise TypeError(f"{name} must be an int{also}, got {describe(value)}")
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"{name} must be an int in [-2**63, 2**64){also}, got {seed}")
    return seed


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """``dtype`` if it is a floating-point ``torch.dtype``; else ``TypeError`` naming
    ``name`` (a string such as ``"float32"`` or a NumPy type is not converted)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        allowed = ", ".join(str(t) for t in FLOAT_DTYPES)
        raise TypeError(
            f"{name} must be a floating-point dtype, got {describe(dtype)}; use one of {allowed}"
        )
    return dtype


def check_finite_number(name: str, value: object) -> float:
    """``value`` as a float if it is a finite real number (not a bool); else an error
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a finite number, got {describe(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_device(name: str, device: object) -> torch.device:
    """``device`` as a ``torch.device`` that exists here; ``ValueError`` naming ``name`` for
    a malformed one, CUDA on a machine without it, or a CUDA index beyond the last GPU. A
    ``"cuda"`` without an index stays so (torch's current device)."""
    try:
        dev = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{name} must be a torch device such as 'cpu' or 'cuda:0', got {device!r}"
        ) from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r} but CUDA is not available here")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(
                f"{name}={device!r} but there is no such GPU: this machine has {count} CUDA "
                f"device(s), cuda:0 to cuda:{count - 1}"
            )
    return dev
