"""Keeping freed memory for reuse: why a full ``run_with_cache`` on a CPU can cost far
more than the forward it records, and the opt-in that removes it.

glibc's ``malloc`` (Linux) serves large blocks from fresh pages and, when a large freed
block sits at the top of its heap, returns the pages to the operating system
(``M_TRIM_THRESHOLD``; blocks above ``M_MMAP_THRESHOLD`` are unmapped at once). A forward
frees each activation as soon as the next layer has read it, and the next activation
reuses its pages. A cache keeps every activation until it is dropped, so the whole
cache (28 MB for the paper's affine model at batch 16) is freed at once, its pages go
back, and the next call touches every one of them again: about 3,500-5,300 page faults
per ``run_with_cache`` on the 2-core development VM, where the forward takes none.
Each fault costs a kernel entry and a zeroed page, and with several threads the faults of
one parallel kernel wait for each other. Measured there (``benchmarks/hook_overhead.py``,
one thread, batch 16, paper widths): ``run_with_cache`` 1.49x a plain PyTorch forward
with glibc's defaults, 1.15x after :func:`keep_freed_memory`, with no page faults left.

:func:`keep_freed_memory` raises both thresholds with ``mallopt``, so freed blocks stay
in the process for reuse. It is a process-wide setting that glibc cannot report or undo
(there is no getter), so the library never calls it by itself: call it once at the start
of a script that caches repeatedly. The cost is memory: the process keeps up to the
largest amount it has freed (its peak) instead of returning it. Elsewhere than on glibc
(macOS, Windows, musl) it changes nothing and returns ``False``; those allocators keep
their own caches.
"""

import ctypes
import ctypes.util
import platform

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD = -1
"""``mallopt``'s parameter number for the trim threshold (glibc's ``malloc.h``)."""
M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the mmap threshold (glibc's ``malloc.h``)."""
MAX_MMAP_THRESHOLD = 32 * 2**20
"""The largest mmap threshold glibc accepts on a 64-bit system (``HEAP_MAX_SIZE / 2``)."""


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def keep_freed_memory(
    *, mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 2**30
) -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse instead of returning it to the
    operating system (see the module's text); ``True`` if applied, ``False`` where the C
    library is not glibc (nothing changed).

    Args:
        mmap_threshold: blocks at least this large (bytes) are mapped and unmapped on
            their own; at most :data:`MAX_MMAP_THRESHOLD` (32 MiB), the most glibc takes.
        trim_threshold: free memory at the top of the heap beyond this (bytes) is
            returned to the operating system.

    Raises:
        TypeError: a threshold that is not an int (bools included).
        ValueError: a negative threshold, an mmap threshold above 32 MiB, or a value
            glibc refused.

    Example:
        >>> from vecinterp import keep_freed_memory
        >>> keep_freed_memory() in (True, False)   # False off glibc
        True
    """
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int (bytes), got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0 bytes, got {value}")
    if mmap_threshold > MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"mmap_threshold must be at most {MAX_MMAP_THRESHOLD} bytes (32 MiB, glibc's "
            f"largest), got {mmap_threshold}"
        )
    libc = _glibc()
    if libc is None:
        return False
    for param, value, name in (
        (M_MMAP_THRESHOLD, mmap_threshold, "mmap_threshold"),
        (M_TRIM_THRESHOLD, trim_threshold, "trim_threshold"),
    ):
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(min(value, 2**31 - 1))) != 1:
            raise ValueError(f"glibc's mallopt refused {name}={value}")
    return True
