"""File-system steps of an all-or-nothing save: atomic file writes, flushes, directory locks,
and the swap of a whole directory with its recovery after a kill.

- :func:`atomic_write`: a file replaced by rename, readers see the old one or the new one.
- :func:`read_regular`: the bytes of a file, refusing what is not a regular file (a FIFO,
  a device, a directory) before reading it.
- :func:`fsync_dir`: flush a directory's entries (after a rename into it).
- :func:`directory_lock`: an ``flock`` on a directory, dropped by the kernel when the
  process dies.
- :func:`_swap_in`: make a staged directory the one at a path, with one
  ``renameat2(RENAME_EXCHANGE)`` where the system has it, else two renames;
  :func:`_recover` rolls a save killed between the two back to the old directory and
  removes the hidden ones (``.{name}.vecinterp-new-*``, ``.{name}.vecinterp-old-*``) that
  killed saves left.

:mod:`vecinterp.model.io` (model saves) and :mod:`vecinterp.training.checkpoint` build on
these; nothing here knows about models.
"""

import contextlib
import ctypes
import errno
import functools
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

_NEW = ".vecinterp-new-"  # ".{name}.vecinterp-new-XXXX": a save being written (or the old one)
_OLD = ".vecinterp-old-"  # ".{name}.vecinterp-old-XXXX": the old save, mid-swap (no renameat2)


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over
    ``path``: readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes 0600 files; a saved file is meant to be shared
    try:
        write(Path(name))
        _fsync_file(Path(name))
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def read_regular(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, shown: object = None
) -> bytes:
    """The bytes of the regular file ``path`` (symbolic links followed; relative to the
    open directory ``dir_fd`` if given; errors name it ``shown``, default ``path``).

    Anything else is refused before a byte is read: a FIFO would block the read until some
    process writes to it (forever, for a forgotten ``mkfifo``), a device such as
    ``/dev/zero`` would be read until memory runs out, and a directory cannot be read. The
    file is opened without blocking (``O_NONBLOCK``, which changes nothing for a regular
    file) and checked with ``fstat`` on the open descriptor, so nothing can be swapped in
    between the check and the read.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is not a regular file (naming it and what it is).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from vecinterp.model.atomic import read_regular
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (Path(d) / "a.json").write_text("{}")
        ...     read_regular(Path(d) / "a.json")
        ...     try:
        ...         read_regular(d)
        ...     except ValueError as err:
        ...         print(str(err).endswith("is a directory, not a regular file"))
        b'{}'
        True
    """
    shown = path if shown is None else shown
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags) if dir_fd is None else os.open(path, flags, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a socket (or a device without its driver)
            raise ValueError(f"{shown} is a socket or device, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
        raise ValueError(f"{shown} is {kind}, not a regular file")
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries to disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def directory_lock(folder: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the directory ``folder`` itself for the ``with`` block.

    Yields ``True`` when the lock is held, ``False`` where the platform or file system has
    no ``flock`` (the caller then skips what needs it). The kernel drops the lock when the
    process dies, however it dies. With ``blocking=False`` a lock held elsewhere raises
    ``BlockingIOError``."""
    if fcntl is None:
        yield False
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            held = True
        except BlockingIOError:
            raise
        except OSError:  # e.g. a network file system without flock on directories
            held = False
        yield held
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@functools.cache
def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, musl
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the two existing paths ``a`` and ``b``; ``False`` where the system or
    file system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(
    stage: Path, directory: Path, exchange: Callable[[Path, Path], bool] | None = None
) -> Path:
    """Make the complete directory ``stage`` the one at ``directory``; return where the
    previous contents of ``directory`` now are (to be deleted). ``exchange`` swaps two
    paths atomically or returns ``False`` (default: :func:`_exchange`)."""
    if (_exchange if exchange is None else exchange)(stage, directory):
        return stage
    # Two renames. A kill between them leaves ``directory`` missing and the old save at
    # ``old``: :func:`_recover` renames it back (the caller holds the parent's lock).
    old = directory.parent / f".{directory.name}{_OLD}{secrets.token_hex(4)}"
    os.rename(directory, old)
    try:
        os.rename(stage, directory)
    except BaseException:
        os.rename(old, directory)
        raise
    return old


def _leftovers(directory: Path) -> tuple[list[Path], list[Path]]:
    """The hidden siblings of ``directory`` that saves made: staged and swapped-out ones."""
    new, old = f".{directory.name}{_NEW}", f".{directory.name}{_OLD}"
    staged: list[Path] = []
    swapped: list[Path] = []
    try:
        with os.scandir(directory.parent) as scan:
            entries = list(scan)
    except OSError:
        return staged, swapped
    for entry in entries:
        if entry.name.startswith(new):
            staged.append(Path(entry.path))
        elif entry.name.startswith(old):
            swapped.append(Path(entry.path))
    return staged, swapped


def _recover(directory: Path, *, clean: bool) -> None:
    """Finish what a killed save left beside ``directory``: roll an interrupted two-rename
    swap back to the old save and (with ``clean``: the caller holds the lock, so no live
    save owns them) remove the hidden directories."""
    staged, swapped = _leftovers(directory)
    if swapped and not os.path.lexists(directory):
        newest = max(swapped, key=lambda p: p.stat().st_mtime)
        os.rename(newest, directory)
        swapped.remove(newest)
        fsync_dir(directory.parent)
    if clean:
        for leftover in staged + swapped:
            shutil.rmtree(leftover, ignore_errors=True)
