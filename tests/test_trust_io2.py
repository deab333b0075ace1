"""Loading from a hostile file system (issue 25, round three): a FIFO, a device or a
directory where a save's file should be, and loads racing saves that keep swapping the
directory in, with and without ``renameat2``.

A read of ``/dev/zero`` or of a FIFO without a writer never ends on its own, so each such
load runs in a forked child with a memory limit and a time limit: on code that reads
anyway, the child runs out of memory or is killed, and the test fails instead of the
machine."""

import os
import re
import resource
import signal
import threading
import time
from pathlib import Path

import pytest

import vecinterp as vi
from helpers import random_model, tiny_cfg
from test_trust_io import assert_same_weights, load_checked, make_batch, two_models
from vecinterp.model import io
from vecinterp.model.atomic import directory_lock

HEADROOM = 512 * 2**20  # the child may allocate this much beyond what it holds


def outcome_in_child(action, timeout: float = 20.0) -> str:
    """Run ``action`` in a forked child with a memory and a time limit: ``"ok"``, or the
    type and message of what it raised, ``"MemoryError"``, or ``"timed out"``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            vsize = int(Path("/proc/self/stat").read_text().split()[22])
            resource.setrlimit(resource.RLIMIT_AS, (vsize + HEADROOM, vsize + HEADROOM))
            action()
            text = "ok"
        except MemoryError:
            text = "MemoryError"
        except BaseException as err:
            text = f"{type(err).__name__}: {err}"
        os.write(write, text.encode()[:60000])
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            with os.fdopen(read, "rb") as pipe:
                return pipe.read().decode() or "the child died without a word"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read)
    return "timed out"


@pytest.fixture
def saved(tmp_path) -> Path:
    return vi.save(random_model(tiny_cfg()), tmp_path / "run")


def replace_with(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()


KINDS = {
    "/dev/zero": "a character device",
    "FIFO": "a FIFO (named pipe)",
    "directory": "a directory",
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_load_refuses_a_file_that_is_not_a_regular_file(saved, name, kind):
    """config.json linked to /dev/zero used to be read until the OOM killer came, a FIFO
    blocked forever, a directory gave "Is a directory: 4" (a descriptor, not the path)."""
    replace_with(saved / name, kind)
    expected = f"ValueError: {saved / name} is {KINDS[kind]}, not a regular file"
    assert outcome_in_child(lambda: vi.load(saved)) == expected
    if name == "config.json":
        assert outcome_in_child(lambda: io.read_config(saved)) == expected


@pytest.mark.parametrize("kind", ["/dev/zero", "FIFO"])
@pytest.mark.parametrize("name", ["trainer.json", "optimizer.safetensors"])
def test_resume_refuses_a_checkpoint_file_that_is_not_a_regular_file(tmp_path, name, kind):
    kw = dict(steps=2, lr=1e-2, checkpoint_dir=tmp_path, progress=False, device="cpu")
    vi.train(random_model(tiny_cfg()), make_batch, **kw)
    file = tmp_path / "step_00000002" / name
    replace_with(file, kind)
    got = outcome_in_child(
        lambda: vi.train(random_model(tiny_cfg()), make_batch, resume=True, **dict(kw, steps=4))
    )
    assert got.startswith(f"ValueError: {file} is {KINDS[kind]}, not a regular file"), got


# ---------------------------------------------------------------- loads racing saves


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_load_that_keeps_meeting_saves_waits_for_them_and_reads_one_whole_save(
    tmp_path, monkeypatch, exchange
):
    """The worst case of a load racing saves in a loop: a whole save lands between the
    load's opening of the directory and its reading of the files, at every try (12 tries,
    more than the load makes). With two renames (no renameat2) one load in 1,065 used to
    fail with "kept changing"; here every try would. The load now waits for the parent's
    lock after a few tries, reads under it, and returns one whole save."""
    if not exchange:
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    models = two_models()
    target = tmp_path / "saves" / "run"
    vi.save(models["a"], target, metadata={"id": "a"})
    real_open = os.open
    injected = []

    def open_with_a_save_first(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None and path == io.CONFIG_FILE and len(injected) < 12:
            try:  # a save runs now, unless the load holds the parent's lock (as saves do)
                with directory_lock(target.parent, blocking=False):
                    free = True
            except BlockingIOError:
                free = False
            if free:
                name = "ba"[len(injected) % 2]
                monkeypatch.setattr(os, "open", real_open)  # the save's own opens
                try:
                    vi.save(models[name], target, metadata={"id": name})
                finally:
                    monkeypatch.setattr(os, "open", open_with_a_save_first)
                injected.append(name)
        if dir_fd is None:
            return real_open(path, flags, mode)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "supports_dir_fd", os.supports_dir_fd | {open_with_a_save_first})
    monkeypatch.setattr(os, "open", open_with_a_save_first)
    loaded = vi.load(target)
    monkeypatch.setattr(os, "open", real_open)
    assert 1 <= len(injected) < 12  # saves landed, then the load locked them out
    assert_same_weights(loaded, models[injected[-1]])  # the newest save, whole
    assert load_checked(target, models) == injected[-1]
    assert sorted(os.listdir(target.parent)) == ["run"]  # no debris


def test_a_load_meeting_the_gap_between_two_renames_waits_for_the_save(tmp_path, monkeypatch):
    """Without renameat2 the directory is missing between a save's two renames. A load
    arriving then (from another thread) waits for the save to finish and returns the new
    save whole, not "no saved model"."""
    monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    models = two_models()
    target = tmp_path / "run"
    vi.save(models["a"], target, metadata={"id": "a"})
    real_rename = os.rename
    state: dict = {}

    def load() -> None:
        try:
            state["loaded"] = vi.load(target)
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            state["error"] = err

    def rename_then_load(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if ".run.vecinterp-old-" in str(dst) and "thread" not in state:
            assert not target.exists()  # the gap
            state["thread"] = threading.Thread(target=load)
            state["thread"].start()
            state["thread"].join(0.5)
            state["waited"] = state["thread"].is_alive()

    monkeypatch.setattr(os, "rename", rename_then_load)
    vi.save(models["b"], target, metadata={"id": "b"})
    monkeypatch.setattr(os, "rename", real_rename)
    state["thread"].join(30)
    assert "error" not in state, state.get("error")
    assert state["waited"]  # it waited for the save's lock
    assert_same_weights(state["loaded"], models["b"])


def test_a_plain_missing_path_is_still_reported_at_once(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"no saved model at {tmp_path / 'x'}")):
        vi.load(tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="no saved model at"):
        vi.load(tmp_path / "no" / "parent")
