"""The steps a training run has taken but not yet checked on the host.

Each step's loss, gradient norm and inputs-are-finite flag stay on the device until
:meth:`PendingSteps.check` reads every pending step's in one transfer; the first bad step
is then named exactly as a check after each step would have named it.
"""

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import torch

from .data import Tensors, inputs_error, no_used_position, non_finite_targets, to_model
from .result import TrainHistory, TrainingDivergedError


@dataclasses.dataclass
class _Step:
    step: int
    rate: float
    values: torch.Tensor  # [loss, gradient norm, inputs finite (1/0)], in the loss's dtype
    parts: Tensors  # the batch, to explain a bad value
    wall: float = math.nan
    read: tuple[float, float] | None = None  # (loss, gradient norm) once checked


class PendingSteps:
    """The steps since the last check: their values, read on the host all at once.

    Args:
        where: how errors name batch ``s`` (``"make_batch(3, ...)"``).
        dtype, device: the model's, to which a batch is moved to explain a bad value.
    """

    def __init__(self, where: Callable[[int], str], dtype: torch.dtype, device: torch.device):
        self.where, self.dtype, self.device = where, dtype, device
        self.steps: list[_Step] = []

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, rate: float, values: torch.Tensor, parts: Tensors) -> None:
        """Step ``step`` trained at ``rate``; ``values`` (still on the device) are
        ``[loss, grad_norm, inputs_finite]``."""
        self.steps.append(_Step(step, rate, values, parts))

    def finished(self, wall: float) -> None:
        """The newest step's update is done, ``wall`` seconds into the run."""
        self.steps[-1].wall = wall

    def check(self, checkpoint: Path | None) -> None:
        """Read the unread steps' values (one host transfer) and raise for the first bad
        step, in the order of a per-step check: NaN/inf inputs (``ValueError`` naming the
        batch and the first bad index), then a ``loss_mask`` that selects nothing
        (``ValueError``), a non-finite loss (:class:`TrainingDivergedError`, with the
        targets named if they are to blame), a non-finite gradient norm. The pending steps
        are dropped before raising. ``checkpoint``: the newest one, named by the error."""
        unread = [s for s in self.steps if s.read is None]
        if not unread:
            return
        values = torch.stack([s.values for s in unread]).tolist()
        for s, (loss, norm, finite) in zip(unread, values, strict=True):
            s.read = (loss, norm)
            if finite and math.isfinite(loss) and math.isfinite(norm):
                continue
            self.steps.clear()
            where = self.where(s.step)
            if not finite:
                raise inputs_error(s.parts[0], where)
            if not math.isfinite(loss):  # the data's fault (named), or divergence
                batch = to_model(s.parts, self.dtype, self.device)
                if no_used_position(batch):
                    raise ValueError(f"{where}: loss_mask selects no position")
                cause = non_finite_targets(batch, where)
                raise TrainingDivergedError(s.step, "loss", loss, checkpoint, cause=cause)
            raise TrainingDivergedError(s.step, "gradient norm", norm, checkpoint)

    def check_before(self, checkpoint: Path | None) -> None:
        """For an error raised in a later step of the window (data that ran out, a batch
        of the wrong shape): raise the error of an earlier bad step instead, the one a
        per-step check would have raised first; return if every pending step is good."""
        try:
            self.check(checkpoint)
        except (TrainingDivergedError, ValueError) as first:
            raise first from None

    def commit(self, history: TrainHistory) -> list[tuple[int, dict[str, float]]]:
        """Append the checked steps to ``history`` and drop them; each step's metrics."""
        out = []
        for s in self.steps:
            assert s.read is not None, "commit() before check()"
            loss, norm = s.read
            history.steps.append(s.step)
            history.train_loss.append(loss)
            history.lr.append(s.rate)
            history.grad_norm.append(norm)
            history.wall_time.append(s.wall)
            out.append((s.step, {"loss": loss, "lr": s.rate, "grad_norm": norm}))
        self.steps.clear()
        return out
