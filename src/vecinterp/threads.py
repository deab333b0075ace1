"""How many CPU threads long work uses: one rule for the library and its examples.

On a CPU whose cores other processes keep busy, torch's default of one intra-op thread per
core makes every matrix product wait for the threads whose cores are taken: the same run
was 5-7x slower at load 3-10 on a 2-core machine (a small model trained ~15x slower with
the default threads than with one, on 2 cores with one busy). The rule
(:func:`choose_threads`): as many threads as there are idle cores, at least one and at
most torch's current setting. :func:`use_threads` applies a count (or the rule) for a
``with`` block and restores torch's setting after it; :func:`vecinterp.train` and
:func:`vecinterp.train_ensemble` apply the rule by default (and record the count in their
checkpoints), and the long analyses take ``threads=`` (see :doc:`/getting_started`).
"""

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["choose_threads", "idle_cores", "use_threads"]

AUTO = "auto"
"""The ``threads=`` value that asks for :func:`choose_threads`."""


def idle_cores(window: float = 0.2) -> int:
    """The number of this machine's cores that are idle now (at least 1), at most the
    number this process may run on.

    On Linux: the idle share of every core's time over ``window`` seconds (``/proc/stat``:
    idle and iowait ticks over all ticks) times the number of cores, rounded. Elsewhere:
    the cores minus the 1-minute load average (``os.getloadavg``), or all the cores where
    there is none. ``window`` is spent sleeping (this process is idle meanwhile).

    Example:
        >>> from vecinterp.threads import idle_cores
        >>> 1 <= idle_cores(window=0.05) <= (os.cpu_count() or 1)
        True
    """
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0:
        raise ValueError(f"window must be a positive number of seconds, got {window!r}")
    allowed = _usable_cores()
    ticks = _idle_share(window)
    if ticks is not None:
        share, cores = ticks
        idle = round(share * cores)
    else:
        try:
            idle = round(allowed - os.getloadavg()[0])
        except (AttributeError, OSError):  # no load average (Windows)
            idle = allowed
    return max(1, min(idle, allowed))


def choose_threads(window: float = 0.2) -> int:
    """The intra-op thread count for long work started now: the idle cores
    (:func:`idle_cores`), at least 1 and at most torch's current setting
    (``torch.get_num_threads()``: one per core by default, or what ``OMP_NUM_THREADS`` or
    ``torch.set_num_threads`` set). With torch at one thread it returns 1 at once, without
    measuring.

    On an idle machine this is torch's default; with every core busy, one thread (which
    then runs at a core's speed instead of waiting for the others).

    Example:
        >>> import torch, vecinterp as vi
        >>> 1 <= vi.choose_threads() <= torch.get_num_threads()
        True
    """
    ceiling = torch.get_num_threads()
    if ceiling <= 1:
        return 1
    return min(ceiling, idle_cores(window))


@contextlib.contextmanager
def use_threads(count: int | str | None = AUTO) -> Iterator[int]:
    """Run the ``with`` block with torch's intra-op threads set to ``count`` and restore
    torch's setting after it, however the block ends; yields the count in use.

    ``count``: an int >= 1; ``"auto"`` (default): :func:`choose_threads`; ``None``: leave
    torch's setting as it is. The setting is the process's, so other threads of the
    process see it while the block runs.

    Example:
        >>> import torch, vecinterp as vi
        >>> before = torch.get_num_threads()
        >>> with vi.use_threads(1) as n:
        ...     n, torch.get_num_threads()
        (1, 1)
        >>> torch.get_num_threads() == before
        True
    """
    count = check_threads("count", count)
    before = torch.get_num_threads()
    if count is None:
        yield before
        return
    chosen = choose_threads() if count == AUTO else int(count)
    torch.set_num_threads(chosen)
    try:
        yield chosen
    finally:
        torch.set_num_threads(before)


def check_threads(name: str, value: object) -> int | str | None:
    """``value`` if it is ``None``, ``"auto"`` or an int >= 1; else ``ValueError`` naming
    the argument ``name``."""
    if value is None or (isinstance(value, str) and value == AUTO):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be an int >= 1, 'auto' (the idle cores, at most torch's setting) "
            f"or None (torch's setting as it is), got {value!r}"
        )
    return value


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _idle_share(window: float) -> tuple[float, int] | None:
    """(idle share of all cores' ticks over ``window`` s, number of cores) from
    ``/proc/stat``, or ``None`` where it cannot be read."""
    stat = Path("/proc/stat")
    try:
        first = stat.read_text()
        time.sleep(window)
        second = stat.read_text()
        before = [int(v) for v in first.split()[1:9]]  # all cores: user .. steal
        after = [int(v) for v in second.split()[1:9]]
        cores = sum(1 for line in second.splitlines() if line[:3] == "cpu" and line[3:4].isdigit())
    except (OSError, ValueError):
        return None
    ticks = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(ticks)
    if total <= 0 or cores < 1:
        return None
    return (ticks[3] + ticks[4]) / total, cores
