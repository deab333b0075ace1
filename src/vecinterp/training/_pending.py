"""The steps a training run has taken but not yet checked on the host.

Each step's loss, gradient norm and inputs-are-finite flag stay on the device until
:meth:`PendingSteps.check` reads every pending step's in one transfer; the first bad step
is then named exactly as a check after each step would have named it. :class:`MemberSteps`
does the same for the K members of an ensemble
(:func:`~vecinterp.training.ensemble.train_ensemble`), where a bad member may be frozen
while the others train on.
"""

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import torch

from ._stacked import member_inputs_error
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


def member_error(member: int, err: TrainingDivergedError) -> TrainingDivergedError:
    """``err``, its message prefixed with the ensemble member it is about."""
    err.args = (f"ensemble member {member}: {err.args[0]}",)
    return err


def all_diverged(diverged: list[TrainingDivergedError | None]) -> TrainingDivergedError:
    """The error when every member of an ensemble has diverged: the last one's, its
    message naming each member and its step."""
    last = max((e for e in diverged if e is not None), key=lambda e: e.step)
    when = ", ".join(
        f"member {i} at step {e.step}" for i, e in enumerate(diverged) if e is not None
    )
    last.args = (f"every member of the ensemble diverged ({when}); {last.args[0]}",)
    return last


@dataclasses.dataclass
class _MemberStep:
    step: int
    rates: list[float]  # each member's learning rate
    values: torch.Tensor  # [4, n]: losses, gradient norms, used positions, inputs finite (1/0)
    batches: list[Tensors]  # the members' batches on the device: to explain a bad value
    where: list[str]  # how errors name each member's batch
    wall: float = math.nan
    read: list[tuple[float, float] | None] | None = None  # (loss, norm) of each live member


class MemberSteps:
    """An ensemble's steps since the last check: each member's loss, gradient norm, number
    of positions its loss uses and whether its inputs are finite, read on the host all at
    once.

    A check names the first bad value of each member exactly as a check after every step
    would, in the same order, and freezes a diverged member (``on_divergence="freeze"``)
    from that step on: its values after it are not read. Restoring its state to the one
    before that step is the caller's (the device may have updated it since).

    Args:
        first: the ensemble's index of the first member here (errors name members by it).
        on_divergence: ``"freeze"`` or ``"raise"``, as
            :func:`~vecinterp.training.ensemble.train_ensemble` takes it.
        stop: raise when no member is left (one process; across ranks, the step's check
            across ranks does, since other ranks' members may live on).
    """

    def __init__(self, first: int, on_divergence: str, stop: bool):
        self.first, self.on_divergence, self.stop = first, on_divergence, stop
        self.steps: list[_MemberStep] = []

    def __len__(self) -> int:
        return len(self.steps)

    def add(
        self,
        step: int,
        rates: list[float],
        values: torch.Tensor,
        batches: list[Tensors],
        where: list[str],
    ) -> None:
        """Step ``step`` trained member ``j`` at ``rates[j]``; ``values`` (on the device)
        are ``[losses, grad_norms, used_positions, inputs_finite]``, each ``[n]``."""
        self.steps.append(_MemberStep(step, rates, values, batches, where))

    def finished(self, wall: float) -> None:
        """The newest step's update is queued, ``wall`` seconds into the run."""
        self.steps[-1].wall = wall

    def check_inputs(self, finite: torch.Tensor, batches: list[Tensors], where: list[str]) -> None:
        """Refuse NaN/inf inputs of one step at once (this reads the device): ``finite``
        holds each member's flag."""
        for j, ok in enumerate(finite.tolist()):
            if not ok:
                raise member_inputs_error(self.first + j, batches[j][0], where[j])

    def check(
        self,
        diverged: list[TrainingDivergedError | None],
        checkpoints: list[Path | None],
    ) -> dict[int, int]:
        """Read the unread steps' values (one host transfer) and check them in order, each
        step as a check after it would: NaN/inf inputs of any member (``ValueError`` naming
        the member, its batch and the first bad index), then for each live member in turn
        a ``loss_mask`` that selects nothing (``ValueError``), a non-finite loss
        (:class:`TrainingDivergedError`; raised at once if the member's targets are to
        blame), a non-finite gradient norm. A diverged member is frozen (recorded in
        ``diverged``) or the error raised, per ``on_divergence``; with ``stop``, the
        error of :func:`all_diverged` is raised when no member is left. The pending steps
        are dropped before raising. ``checkpoints``: each member's newest, which its error
        names.

        Returns:
            ``{member: step}`` for each member frozen by this check (this process's
            index), at the step of its first bad value.
        """
        unread = [s for s in self.steps if s.read is None]
        if not unread:
            return {}
        values = torch.stack([s.values for s in unread]).tolist()
        frozen: dict[int, int] = {}
        try:
            for s, (losses, norms, counts, finite) in zip(unread, values, strict=True):
                for j, ok in enumerate(finite):  # every member's, as stack_batches's check was
                    if not ok:
                        raise member_inputs_error(self.first + j, s.batches[j][0], s.where[j])
                s.read = [None] * len(losses)
                for j in [j for j, e in enumerate(diverged) if e is None]:
                    i = self.first + j
                    if counts[j] == 0:
                        raise ValueError(f"member {i}: {s.where[j]}: loss_mask selects no position")
                    err = None
                    if not math.isfinite(losses[j]):
                        cause = non_finite_targets(s.batches[j], s.where[j])
                        err = TrainingDivergedError(
                            s.step, "loss", losses[j], checkpoints[j], cause=cause
                        )
                        if cause is not None:
                            raise member_error(i, err)
                    elif not math.isfinite(norms[j]):
                        err = TrainingDivergedError(
                            s.step, "gradient norm", norms[j], checkpoints[j]
                        )
                    if err is None:
                        s.read[j] = (losses[j], norms[j])
                        continue
                    if self.on_divergence == "raise":
                        raise member_error(i, err)
                    diverged[j] = member_error(i, err)
                    frozen[j] = s.step
                if self.stop and all(e is not None for e in diverged):
                    raise all_diverged(list(diverged))
        except (TrainingDivergedError, ValueError):
            self.steps.clear()
            raise
        return frozen

    def check_before(
        self,
        diverged: list[TrainingDivergedError | None],
        checkpoints: list[Path | None],
    ) -> None:
        """For an error raised in a later step of the window (data that ran out, a batch
        of the wrong shape): raise the error of an earlier bad step instead, the one a
        check after each step would have raised first; return if no pending step raises
        (members it froze are recorded in ``diverged``)."""
        try:
            self.check(diverged, checkpoints)
        except (TrainingDivergedError, ValueError) as first:
            raise first from None

    def commit(self, histories: list[TrainHistory], updates: list[int]) -> list[dict[str, float]]:
        """Append the checked steps to the live members' ``histories`` (and their number of
        ``updates``) and drop them; the newest step's metrics of each member (``{}`` for a
        frozen one)."""
        metrics: list[dict[str, float]] = []
        for s in self.steps:
            assert s.read is not None, "commit() before check()"
            metrics = []
            for j, read in enumerate(s.read):
                if read is None:
                    metrics.append({})
                    continue
                loss, norm = read
                h = histories[j]
                h.steps.append(s.step)
                h.train_loss.append(loss)
                h.lr.append(s.rates[j])
                h.grad_norm.append(norm)
                h.wall_time.append(s.wall)
                updates[j] = s.step + 1
                metrics.append({"loss": loss, "lr": s.rates[j], "grad_norm": norm})
        self.steps.clear()
        return metrics
