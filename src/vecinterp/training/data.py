"""Batches and data sources for the training loop, and :func:`evaluate`.

A *batch* is any object with ``.inputs``, ``.targets`` and ``.loss_mask`` attributes (such
as :class:`vecinterp.tasks.affine_recurrence.AffineBatch`) or a tuple
``(inputs, targets)`` / ``(inputs, targets, loss_mask)``; ``loss_mask=None`` scores every
position.
"""

import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..loss import loss_positions, mse_at
from ..model.validation import finite_checks_taken_over

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
"""A batch taken apart: ``(inputs, targets, loss_mask or None)``."""

_BATCH_FORMS = (
    "an object with .inputs, .targets and .loss_mask, or a tuple (inputs, targets[, loss_mask])"
)


def is_batch(obj: object) -> bool:
    """Whether ``obj`` looks like ONE batch rather than a collection of batches."""
    if all(hasattr(obj, name) for name in ("inputs", "targets")):
        return True
    return isinstance(obj, tuple) and 2 <= len(obj) <= 3 and isinstance(obj[0], torch.Tensor)


def unpack_batch(batch: object, where: str = "batch") -> Tensors:
    """``(inputs, targets, loss_mask)`` of ``batch``, with a clear error for anything else."""
    if all(hasattr(batch, name) for name in ("inputs", "targets")):
        parts = (batch.inputs, batch.targets, getattr(batch, "loss_mask", None))  # type: ignore[attr-defined]
    elif isinstance(batch, tuple) and len(batch) in (2, 3):
        parts = (batch[0], batch[1], batch[2] if len(batch) == 3 else None)
    else:
        raise TypeError(f"{where} must be {_BATCH_FORMS}; got {type(batch).__name__}")
    inputs, targets, mask = parts
    for name, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{where}: {name} must be a floating-point torch.Tensor, got {got}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool):
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{where}: loss_mask must be a bool torch.Tensor or None, got {got}")
    return inputs, targets, mask


def to_model(parts: Tensors, dtype: torch.dtype, device: torch.device) -> Tensors:
    """Move a batch to the model's device, its floats to the model's dtype.

    From the CPU to a CUDA GPU the tensors go through pinned memory with a non-blocking
    copy: a copy from ordinary (pageable) memory would wait until the GPU has run every
    kernel queued before it, a host sync per training step. The values are the same."""
    inputs, targets, mask = parts
    return (
        _move(inputs, device, dtype),
        _move(targets, device, dtype),
        None if mask is None else _move(mask, device, mask.dtype),
    )


def _move(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if device.type == "cuda" and t.device.type == "cpu":
        # pinned (and dense: torch would first copy a strided tensor to pageable memory),
        # the copy runs asynchronously and its buffer is not reused before it has run
        pinned = t.to(dtype=dtype).contiguous().pin_memory()
        return pinned.to(device=device, non_blocking=True)
    return t.to(device=device, dtype=dtype)


def inputs_error(inputs: torch.Tensor, where: str) -> ValueError:
    """The error for a batch whose inputs hold NaN or inf, naming the first bad index."""
    first = (~torch.isfinite(inputs)).nonzero()[0].tolist()
    return ValueError(f"{where}: inputs contain NaN or inf (first at index {first})")


def batch_loss(model: torch.nn.Module, parts: Tensors, where: str = "batch") -> torch.Tensor:
    """The masked MSE of ``model`` on one batch already on its device and dtype.

    ``where`` names the batch in errors (``"batch 3 of data"``): NaN/inf inputs and targets
    of the wrong shape are refused naming it. The targets are not scanned for NaN here
    (that would cost a pass per step); a non-finite loss is explained afterwards by
    :func:`non_finite_targets`."""
    inputs, targets, mask = parts
    try:
        out = model(inputs)
    except ValueError:
        # the model names its argument "x"; say which batch and which of its parts
        if not bool(torch.isfinite(inputs).all()):
            raise inputs_error(inputs, where) from None
        raise
    _check_outputs(targets, out, where)
    return mse_at(out, targets, mask)


def step_loss(
    model: torch.nn.Module, parts: Tensors, where: str = "batch"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batch_loss` without reading anything back to the host: ``(loss,
    inputs_finite)``, two 0-d tensors on the model's device, for the training loop.

    The loss is the same tensor, bit for bit. What :func:`batch_loss` checks by reading
    the device is left to the caller, who reads ``inputs_finite`` and the loss with the
    step's other numbers: NaN/inf inputs (the model's own scan is skipped; the caller
    raises :func:`inputs_error`) and a ``loss_mask`` that selects no position (the loss
    is then NaN, 0 / 0). Shapes are still checked at once (on the host, no sync).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.training.data import batch_loss, step_loss
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> x = torch.randn(3, 4, 2)
        >>> loss, finite = step_loss(model, (x, -x, None))
        >>> bool(finite), torch.equal(loss, batch_loss(model, (x, -x, None)))
        (True, True)
        >>> x[1, 2, 0] = float("nan")
        >>> bool(step_loss(model, (x, -x, None))[1])
        False
    """
    inputs, targets, mask = parts
    finite = torch.isfinite(inputs).all()
    with finite_checks_taken_over():
        out = model(inputs)
    _check_outputs(targets, out, where)
    # mse_at's mean reads the number of used positions back to refuse none; the sum
    # divided by the same count on the device is the same number without that read
    count = loss_positions(mask, out.shape[:-1], out.device).sum()
    return mse_at(out, targets, mask, reduction="sum") / count, finite


def no_used_position(parts: Tensors) -> bool:
    """Whether a batch's ``loss_mask`` selects no position (its mean loss is 0 / 0)."""
    _, targets, mask = parts
    return not bool(loss_positions(mask, targets.shape[:-1], targets.device).any())


def _check_outputs(targets: torch.Tensor, out: torch.Tensor, where: str) -> None:
    if targets.shape != out.shape:
        raise ValueError(
            f"{where}: targets have shape {tuple(targets.shape)}, but the model's outputs "
            f"[batch, pos, d_out] have {tuple(out.shape)}"
        )


def non_finite_targets(parts: Tensors, where: str = "batch") -> str | None:
    """Why a batch's loss is not finite if its targets are to blame: a sentence naming the
    first NaN/inf target at a position the loss uses, else ``None``.

    Example:
        >>> import torch
        >>> from vecinterp.training.data import non_finite_targets
        >>> t = torch.zeros(1, 3, 2); t[0, 2, 1] = float("nan")
        >>> print(non_finite_targets((torch.zeros(1, 3, 2), t, None), "batch 7"))
        batch 7: targets contain NaN or inf at a position the loss uses (first at index [0, 2, 1])
        >>> used = torch.tensor([True, True, False])
        >>> print(non_finite_targets((torch.zeros(1, 3, 2), t, used)))
        None
    """
    _, targets, mask = parts
    used = loss_positions(mask, targets.shape[:-1], targets.device)
    bad = ~torch.isfinite(targets) & used[..., None]
    if not bool(bad.any()):
        return None
    first = bad.nonzero()[0].tolist()
    return (
        f"{where}: targets contain NaN or inf at a position the loss uses (first at index {first})"
    )


def fingerprint(parts: Tensors) -> str:
    """A SHA-256 of a batch's shapes, dtypes and bytes: tells two data streams apart."""
    digest = hashlib.sha256()
    for t in parts:
        if t is None:
            digest.update(b"none")
            continue
        flat = t.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class MakeBatchSource:
    """Data from ``make_batch(step, generator)``: batch ``s`` depends on ``s`` and on the
    state of one CPU generator seeded with ``seed``, which checkpoints save."""

    kind = "make_batch"

    def __init__(self, make_batch: Callable[[int, torch.Generator], Any], seed: int):
        self.make_batch = make_batch
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    @staticmethod
    def where(step: int) -> str:
        """How errors name batch ``step``."""
        return f"make_batch({step}, ...)"

    def next(self, step: int) -> Tensors:
        return unpack_batch(self.make_batch(step, self.generator), self.where(step))

    def state(self) -> dict[str, torch.Tensor]:
        return {"data_generator": self.generator.get_state()}

    def restore(self, step: int, tensors: dict[str, torch.Tensor], saved_fingerprint: str) -> None:
        self.generator.set_state(tensors["data_generator"])


class StreamSource:
    """Data from an iterable: batch ``s`` is its ``s``-th item. A resumed run re-reads the
    stream from its start and skips the batches already trained on."""

    kind = "stream"

    def __init__(self, data: Iterable[Any]):
        self.iterator: Iterator[Any] = iter(data)

    @staticmethod
    def where(step: int) -> str:
        """How errors name batch ``step``."""
        return f"batch {step} of data"

    def next(self, step: int) -> Tensors:
        try:
            batch = next(self.iterator)
        except StopIteration:
            raise ValueError(
                f"data ran out at step {step}: it gave {step} batches in all (from the start)"
                f" but more steps were asked for; pass an endless stream or fewer steps"
            ) from None
        return unpack_batch(batch, self.where(step))

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def restore(self, step: int, tensors: dict[str, torch.Tensor], saved_fingerprint: str) -> None:
        last = None
        for s in range(step):
            last = self.next(s)
        if last is not None and fingerprint(last) != saved_fingerprint:
            raise ValueError(
                f"batch {step - 1} of data differs from the one the checkpoint was trained on: "
                "resuming needs the same data stream, re-created from its start (same "
                "arguments and seed), not one that was already partly consumed"
            )


def as_batch_list(data: object, name: str = "data", n_batches: int | None = None) -> list[Any]:
    """The batches of an evaluation set, with clear errors for what cannot be one."""
    if n_batches is not None and (
        isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1
    ):
        raise ValueError(f"n_batches must be an int >= 1 or None, got {n_batches!r}")
    if is_batch(data):
        batches = [data]
    elif isinstance(data, Iterable) and not isinstance(data, str | bytes):
        if iter(data) is data and n_batches is None:
            raise ValueError(
                f"{name} is an iterator, which may be endless (e.g. affine_recurrence.batches): "
                "pass n_batches, or a list of batches"
            )
        batches = list(itertools.islice(data, n_batches))
    else:
        raise TypeError(
            f"{name} must be a batch or an iterable of batches, got {type(data).__name__}"
        )
    if n_batches is not None:
        batches = batches[:n_batches]
    if not batches:
        raise ValueError(f"{name} holds no batch")
    return batches


def evaluate(model: torch.nn.Module, data: Any, n_batches: int | None = None) -> float:
    r"""The mean masked MSE of ``model`` over an evaluation set, each batch weighted equally.

    .. math::
        \mathcal{L} = \frac{1}{B} \sum_{b=1}^{B} \mathrm{MSE}_{\text{mask}}(f(x_b), t_b)

    Runs under ``torch.no_grad()`` with the model in eval mode (restored afterwards). Batch
    tensors are moved to the model's device and cast to its dtype.

    Args:
        model: a model mapping ``inputs [batch, pos, d_in]`` to ``[batch, pos, d_out]``.
        data: one batch or an iterable of batches (``.inputs/.targets/.loss_mask`` objects
            or tuples ``(inputs, targets[, loss_mask])``). An iterator needs ``n_batches``
            (it may be endless).
        n_batches: use only the first ``n_batches`` batches.

    Returns:
        The mean of the per-batch masked MSEs, as a float.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.training.data import evaluate
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> x = torch.zeros(3, 4, 2)
        >>> evaluate(model, (x, model(x).detach() + 1.0))
        1.0
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (e.g. a HookedVectorTransformer), got "
            f"{type(model).__name__}"
        )
    return evaluate_batches(model, as_batch_list(data, "data", n_batches), "data")


def evaluate_batches(model: torch.nn.Module, batches: list[Any], name: str) -> float:
    """:func:`evaluate` on a list of batches that errors call ``name`` (``"eval_data"``).

    A NaN/inf target at a used position is refused (``ValueError`` naming the batch); a
    non-finite loss from finite data (a model whose outputs blew up) is returned as is.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.training.data import evaluate_batches
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> x = torch.zeros(3, 4, 2)
        >>> evaluate_batches(model, [(x, model(x).detach() + 2.0)], "eval_data")
        4.0
    """
    param = next(model.parameters())

    def parts(i: int, b: Any) -> Tensors:
        return to_model(unpack_batch(b, f"batch {i} of {name}"), param.dtype, param.device)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = torch.stack(
                [
                    batch_loss(model, parts(i, b), f"batch {i} of {name}")
                    for i, b in enumerate(batches)
                ]
            )
    finally:
        model.train(was_training)
    value = float(losses.mean())
    if not math.isfinite(value):  # the data's fault, or the model's?
        for i, loss in enumerate(losses.tolist()):
            if not math.isfinite(loss):
                cause = non_finite_targets(parts(i, batches[i]), f"batch {i} of {name}")
                if cause is not None:
                    raise ValueError(cause)
    return value
