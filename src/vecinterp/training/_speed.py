"""The pace of a training run: the number of CPU threads it uses (``threads=``), and a
warning when its steps become far slower than its first steps.

On busy cores, torch's default of one thread per core makes each matrix product wait for
threads whose cores are taken by other processes: a training run of a small model was
about 15x slower with the default threads than with one (9.5 s vs 144 s for 300 steps,
on 2 cores with one busy). :func:`threads` sets the count for one run;
:class:`StepPace` notices when steps slow down far beyond the first ones and says so with
a :class:`SlowTrainingWarning`.
"""

import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..threads import AUTO, choose_threads

_clock: Callable[[], float] = time.perf_counter


class SlowTrainingWarning(UserWarning):
    """Warned (once per run) by :func:`vecinterp.train` and
    :func:`vecinterp.train_ensemble` when training steps have become far slower than the
    first steps of the run: the mean time of the newest 50 or more steps is more than 10
    times that of the first steps, and those steps took at least 10 s in all (see
    :class:`~vecinterp.training._speed.StepPace`). Only training steps are timed (evaluations and
    checkpoints are not), and only over steps whose values were read from the device, so
    a GPU's asynchronous queue does not look like a slow-down.

    The usual cause on a CPU is other processes taking the cores that torch's threads
    wait for: pass ``threads=1`` (or the number of idle cores) to ``vi.train``. Turn the
    warning into an error with ``warnings.simplefilter("error", vi.SlowTrainingWarning)``,
    or silence it with ``"ignore"``.

    Example:
        >>> import warnings, vecinterp as vi
        >>> issubclass(vi.SlowTrainingWarning, UserWarning)
        True
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", vi.SlowTrainingWarning)  # no warning shown
    """


class RunThreads:
    """The CPU threads of one training run (``threads=`` of :func:`vecinterp.train` and
    :func:`vecinterp.train_ensemble`): chosen once, before the first step, kept for the
    whole run, recorded in its checkpoints; torch's setting is restored when the run ends.

    ``threads``: an int (that count, from the start), ``"auto"`` (:meth:`settle` applies
    the count a resumed checkpoint recorded, else :func:`~vecinterp.choose_threads`) or
    ``None`` (torch's setting, left alone)."""

    def __init__(self, threads: int | str | None):
        self.threads = threads
        self.before = torch.get_num_threads()
        self.count = self.before

    def __enter__(self) -> "RunThreads":
        self.before = torch.get_num_threads()
        if isinstance(self.threads, int):
            torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.before)

    def settle(self, record: dict[str, Any] | None, where: object = None) -> int:
        """Fix the run's count before its first step and return it: with ``"auto"``, the
        count in ``record`` (the checkpoint resumed from, named ``where`` in errors) if it
        holds one, so that a resume on a differently loaded machine computes exactly as the
        run it continues; else :func:`~vecinterp.choose_threads`."""
        if self.threads == AUTO:
            recorded = None if record is None else record.get("threads")
            if recorded is not None and (
                isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 1
            ):
                raise ValueError(
                    f"{where}: field 'threads' must be an int >= 1 (the run's CPU threads), "
                    f"got {recorded!r}"
                )
            torch.set_num_threads(recorded if recorded is not None else choose_threads())
        self.count = torch.get_num_threads()
        return self.count


class StepPace:
    """Times training steps and warns once (:class:`SlowTrainingWarning`) when they become
    far slower than the first steps of the run.

    The caller brackets each training step with :meth:`begin` and :meth:`end`, saying at
    :meth:`end` whether the step's values were read from the device (``read``). Only at
    such reads is the time of the steps before exact on an asynchronous device (a GPU:
    steps are queued quickly, then a read waits for them all), so the comparison uses
    sums over the steps between reads: the *baseline* is the mean step time from the
    first read after ``skip`` steps to the first read at least ``first`` steps later
    (steps before ``skip`` set things up); a read at least ``window`` steps after another
    is compared with it. The warning needs both a step time more than ``factor`` times the
    baseline and at least ``min_seconds`` spent on those steps, so that a short stall (a
    busy test machine) never triggers it: with the defaults, 50 steps or more that take
    over 10 s together where the first steps took under 20 ms each.

    Args:
        clock: seconds, monotonic (default ``time.perf_counter``, through this module's
            ``_clock``, which tests replace to time a whole run with a fake clock).
        warn: called with the message (rank 0 warns; other ranks pass ``None``: no check).
        device: where training runs; the message suggests ``threads=`` on a CPU.
        offset: the run's step number of the first step timed (a resumed run's start).
        skip, first, window, factor, min_seconds: as described above.

    Example:
        >>> import warnings
        >>> from vecinterp.training._speed import StepPace
        >>> now = [0.0]
        >>> pace = StepPace(clock=lambda: now[0], warn=print)
        >>> for step in range(200):
        ...     pace.begin()
        ...     now[0] += 0.01 if step < 100 else 1.0  # 100x slower from step 100
        ...     pace.end(read=step % 10 == 9)
        training steps 60-110 took 0.208 s each, 21x the first steps' 0.01 s (steps 10-30): ...
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        warn: Callable[[str], None] | None = None,
        device: torch.device | None = None,
        offset: int = 0,
        skip: int = 5,
        first: int = 20,
        window: int = 50,
        factor: float = 10.0,
        min_seconds: float = 10.0,
    ):
        self.clock = _clock if clock is None else clock
        self.warn, self.device, self.offset = warn, device, offset
        self.skip, self.first, self.window = skip, first, window
        self.factor, self.min_seconds = factor, min_seconds
        self.steps = 0  # steps timed
        self.seconds = 0.0  # their total time
        self.marks: list[tuple[int, float]] = []  # (steps, seconds) at reads since the baseline
        self.start: tuple[int, float] | None = None
        self.baseline: float | None = None  # seconds per step
        self.warned = False
        self._began = 0.0

    def begin(self) -> None:
        """A training step starts."""
        self._began = self.clock()

    def end(self, read: bool) -> None:
        """The step ends; ``read``: its values (and those of the steps before) were read
        from the device."""
        self.seconds += self.clock() - self._began
        self.steps += 1
        if read and self.warn is not None and not self.warned:
            self._at_read()

    def _at_read(self) -> None:
        now = (self.steps, self.seconds)
        if self.baseline is None:
            if self.start is None:
                if self.steps >= self.skip:
                    self.start = now
            elif self.steps - self.start[0] >= self.first:
                self.baseline = (now[1] - self.start[1]) / (now[0] - self.start[0])
                self.marks = [now]
            return
        earlier = [m for m in self.marks if now[0] - m[0] >= self.window]
        self.marks.append(now)
        if not earlier:
            return
        before = earlier[-1]
        self.marks = self.marks[self.marks.index(before) :]
        n, spent = now[0] - before[0], now[1] - before[1]
        per_step = spent / n
        if spent >= self.min_seconds and per_step > self.factor * max(self.baseline, 1e-9):
            self.warned = True
            assert self.start is not None and self.warn is not None
            self.warn(self._message(before[0], now[0], per_step))

    def _message(self, a: int, b: int, per_step: float) -> str:
        assert self.baseline is not None and self.start is not None
        o = self.offset
        first_steps = f"steps {o + self.start[0]}-{o + self.start[0] + self.first}"
        text = (
            f"training steps {o + a}-{o + b} took {per_step:.3g} s each, "
            f"{per_step / self.baseline:.0f}x the first steps' {self.baseline:.3g} s "
            f"({first_steps}): "
        )
        if self.device is None or self.device.type == "cpu":
            return text + (
                f"are other processes using the CPU cores? torch uses "
                f"{torch.get_num_threads()} thread(s) here; on busy cores its threads wait "
                "for each other (a small model trained ~15x slower with one thread per core "
                "than with one thread): pass threads=1 (or the number of idle cores)"
            )
        return text + "is something else using the device or the host's CPU cores?"


def warn_slow(message: str) -> None:
    """Issue ``message`` as a :class:`SlowTrainingWarning` pointing at the caller of
    ``vi.train`` / ``vi.train_ensemble`` (the first frame outside vecinterp and the
    runtime type checkers that may wrap its functions)."""
    level = 1
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_INSIDE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, SlowTrainingWarning, stacklevel=level + 1)


_INSIDE = ("vecinterp.", "jaxtyping", "beartype", "typeguard")
