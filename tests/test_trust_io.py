"""What saving and checkpoints guarantee, tried as a hostile world would: processes killed
(SIGKILL, or os._exit before any file operation) in the middle of a save, two training runs
on one directory, flipped bytes, truncated files, corrupt records, NaN weights."""

import hashlib
import itertools
import json
import os
import random
import re
import signal
import socket
import stat
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import safetensors.torch
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg, unchecked
from vecinterp.model import io
from vecinterp.model.io import read_config
from vecinterp.training import latest_checkpoint
from vecinterp.training._record import sealed

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64
KILLED = 137
# audit events of the file operations a save makes (Python's own, before each operation)
FILE_EVENTS = {
    "open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.chmod",
    "tempfile.mkdtemp", "tempfile.mkstemp", "os.link", "os.symlink", "os.truncate",
}  # fmt: skip


# ---------------------------------------------------------------- helpers


def fork(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child; its pid. The child exits 0, or 1 on an exception."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def wait(pid: int, timeout: float = 60.0) -> int:
    """The exit code of child ``pid`` (killed by a signal: 128 + signal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not finish in {timeout} s")


def stop(pid: int) -> None:
    """SIGKILL child ``pid`` if it still runs, and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):  # already reaped
        pass


def die_before_file_operation(k: int, action: Callable[[], None]) -> Callable[[], None]:
    """``action``, in a process that dies (os._exit, as SIGKILL would: no clean-up runs)
    just before its ``k``-th file operation."""

    def run() -> None:
        count = itertools.count(1)

        def hook(event: str, args: tuple) -> None:
            if event in FILE_EVENTS and next(count) == k:
                os._exit(KILLED)

        sys.addaudithook(hook)
        action()

    return run


def assert_same_weights(a: vi.HookedVectorTransformer, b: vi.HookedVectorTransformer) -> None:
    assert a.cfg == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def load_checked(path: Path, models: dict[str, vi.HookedVectorTransformer]) -> str:
    """Load ``path``; assert its weights are exactly the model its metadata names."""
    loaded = vi.load(path)
    name = read_config(path)[1]["id"]
    assert_same_weights(loaded, models[name])
    return name


def data_offset(file: Path) -> int:
    """Where the tensor data of a safetensors file starts."""
    return 8 + int.from_bytes(file.read_bytes()[:8], "little")


def flip_byte(file: Path, position: int) -> None:
    data = bytearray(file.read_bytes())
    data[position] ^= 0x10
    file.write_bytes(bytes(data))


def two_models() -> dict[str, vi.HookedVectorTransformer]:
    """Two models whose configs differ in shape, so that a config paired with the other
    model's weights cannot load."""
    return {"a": random_model(tiny_cfg(), seed=0), "b": random_model(tiny_cfg(d_mlp=12), seed=1)}


# ---------------------------------------------------------------- all-or-nothing saves


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_save_killed_before_any_file_operation_leaves_the_old_or_the_new(
    tmp_path, monkeypatch, exchange
):
    """Kill the save before its 1st, 2nd, ... file operation until it completes: after each
    kill the path loads as exactly the old save or exactly the new one (weights, config and
    metadata of one save), a plain file beside it survives, and the next save leaves no
    debris."""
    if not exchange:  # the fallback where renameat2 is missing: two renames, recovered
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    models = two_models()
    parent = tmp_path / "saves"
    target = parent / "run"
    seen = set()
    for k in itertools.count(1):
        vi.save(models["a"], target, metadata={"id": "a"})
        (target / "notes.txt").write_text("kept")
        save_b = lambda: vi.save(models["b"], target, metadata={"id": "b"})  # noqa: E731
        code = wait(fork(die_before_file_operation(k, save_b)))
        seen.add(load_checked(target, models))
        assert (target / "notes.txt").read_text() == "kept"
        if code == 0:
            break
        assert code == KILLED, f"the save failed (exit {code}) instead of being killed"
        vi.save(models["a"], target, metadata={"id": "a"})  # cleans what the kill left
        assert sorted(os.listdir(parent)) == ["run"], f"debris after a kill before op {k}"
        assert sorted(os.listdir(target)) == ["config.json", "model.safetensors", "notes.txt"]
    assert k > 5 and seen == {"a", "b"}
    assert load_checked(target, models) == "b"


def test_saves_killed_at_random_instants(tmp_path):
    """Real SIGKILLs at random instants of a process that saves two models in turn: the path
    always loads as one whole save, and one more save leaves no debris."""
    cfg = tiny_cfg(d_model=64, d_head=16, n_heads=4, d_mlp=256)
    models = {"a": random_model(cfg, seed=0), "b": random_model(cfg, seed=1)}
    parent = tmp_path / "saves"
    target = parent / "run"
    vi.save(models["a"], target, metadata={"id": "a"})

    def save_forever() -> None:
        for i in itertools.count():
            name = "ab"[i % 2]
            vi.save(models[name], target, metadata={"id": name})

    rng = random.Random(0)
    for _ in range(8):
        pid = fork(save_forever)
        time.sleep(rng.uniform(0.02, 0.15))
        os.kill(pid, signal.SIGKILL)
        assert wait(pid) == 128 + signal.SIGKILL
        load_checked(target, models)
    vi.save(models["a"], target, metadata={"id": "a"})
    assert sorted(os.listdir(parent)) == ["run"]
    assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]


def test_loads_during_saves_read_one_whole_save(tmp_path):
    """A process saves two models in turn over one path while this one loads it: every load
    returns one save's config, metadata and weights together."""
    models = two_models()
    target = tmp_path / "run"
    vi.save(models["a"], target, metadata={"id": "a"})

    def save_forever() -> None:
        for i in itertools.count():
            name = "ab"[i % 2]
            vi.save(models[name], target, metadata={"id": name})

    pid = fork(save_forever)
    try:
        seen = []
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            loaded = vi.load(target)
            name = "a" if loaded.cfg == models["a"].cfg else "b"
            assert_same_weights(loaded, models[name])
            seen.append(name)
    finally:
        stop(pid)
    assert len(seen) > 10


def test_save_keeps_plain_files_and_refuses_a_folder(tmp_path):
    models = two_models()
    target = tmp_path / "run"
    vi.save(models["a"], target, metadata={"id": "a"})
    (target / "history.json").write_text("[1, 2]")
    (target / "plots").mkdir()
    with pytest.raises(ValueError, match=r"holds the folder 'plots'.*replaces the directory"):
        vi.save(models["b"], target, metadata={"id": "b"})
    assert load_checked(target, models) == "a"
    (target / "plots").rmdir()
    vi.save(models["b"], target, metadata={"id": "b"})
    assert load_checked(target, models) == "b"
    assert (target / "history.json").read_text() == "[1, 2]"
    assert sorted(os.listdir(tmp_path)) == ["run"]
    mode = stat.S_IMODE(target.stat().st_mode)
    assert mode == 0o777 & ~_umask()  # as mkdir makes it, not mkdtemp's 0700


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------- checksums


def test_the_checksum_is_the_sha256_of_the_files_tensor_bytes(tmp_path):
    """The header's checksum equals a SHA-256 computed from the file's own bytes (names,
    dtypes, shapes, then each tensor's byte range, names sorted)."""
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        model = random_model(tiny_cfg(), dtype=dtype)
        file = vi.save(model, tmp_path / str(dtype)) / "model.safetensors"
        raw = file.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        digest = hashlib.sha256(b"vecinterp-tensors-1\n")
        for name in sorted(k for k in header if k != "__metadata__"):
            start, end = header[name]["data_offsets"]
            entry = [name, str(dtype), header[name]["shape"]]
            digest.update(json.dumps(entry).encode() + b"\n" + raw[8 + n + start : 8 + n + end])
        assert header["__metadata__"]["vecinterp.sha256"] == digest.hexdigest()


def test_one_flipped_byte_in_the_weights_is_refused_and_old_files_still_load(tmp_path):
    model = random_model(tiny_cfg())
    file = vi.save(model, tmp_path / "run") / "model.safetensors"
    size = file.stat().st_size
    for position in (data_offset(file), (data_offset(file) + size) // 2, size - 1):
        original = file.read_bytes()
        flip_byte(file, position)
        with pytest.raises(ValueError, match=re.escape(f"{file} is corrupted")):
            vi.load(tmp_path / "run")
        file.write_bytes(original)
    assert_same_weights(vi.load(tmp_path / "run"), model)
    # a file written before checksums existed (no checksum in its header) loads
    tensors = safetensors.torch.load_file(str(file))
    header = {
        "format": "vecinterp-model",
        "config": json.dumps(model.cfg.to_dict(), sort_keys=True),
    }
    safetensors.torch.save_file(tensors, str(file), metadata=header)
    assert_same_weights(vi.load(tmp_path / "run"), model)
    # the shipped reference model (saved before checksums) loads, untouched
    shipped = [
        p.parent
        for p in itertools.chain(ROOT.glob("checkpoints/*/model.safetensors"),
                                 ROOT.glob("src/vecinterp/**/model.safetensors"))
    ]  # fmt: skip
    assert shipped, "the shipped reference checkpoint was not found"
    for directory in shipped:
        before = (directory / "model.safetensors").read_bytes()
        assert vi.load(directory).cfg == read_config(directory)[0]
        assert (directory / "model.safetensors").read_bytes() == before


# ---------------------------------------------------------------- non-finite weights


def test_save_refuses_non_finite_weights_naming_them(tmp_path):
    model = random_model(tiny_cfg())
    vi.save(model, tmp_path / "run")
    bad = random_model(tiny_cfg(), seed=3)
    with torch.no_grad():
        bad.blocks[1].attn.W_Q[0, 0, 0] = float("nan")
        bad.unembed.b_U[2] = float("-inf")
    pattern = r"non-finite.*blocks\.1\.attn\.W_Q \(1 NaN, 0 inf\), unembed\.b_U \(0 NaN, 1 inf\)"
    with pytest.raises(ValueError, match=pattern):
        vi.save(bad, tmp_path / "run")
    assert_same_weights(vi.load(tmp_path / "run"), model)  # the previous save is untouched
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_load_refuses_non_finite_weights_naming_the_file_and_tensor(tmp_path):
    model = random_model(tiny_cfg())
    file = vi.save(model, tmp_path / "run") / "model.safetensors"
    tensors = safetensors.torch.load_file(str(file))
    tensors["ln_final.w"][1] = float("inf")
    header = {
        "format": "vecinterp-model",
        "config": json.dumps(model.cfg.to_dict(), sort_keys=True),
    }
    safetensors.torch.save_file(tensors, str(file), metadata=header)  # as another writer would
    with pytest.raises(ValueError, match=re.escape(str(file)) + r".*ln_final\.w \(0 NaN, 1 inf\)"):
        vi.load(tmp_path / "run")


# ---------------------------------------------------------------- messages


def test_a_config_that_disagrees_with_its_weights_gives_a_short_message(tmp_path):
    model = random_model(tiny_cfg())
    directory = vi.save(model, tmp_path / "run")
    record = json.loads((directory / "config.json").read_text())
    record["config"]["d_model"] = 12
    (directory / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError) as err:
        vi.load(directory)
    message = str(err.value).replace(str(directory), "<dir>")
    assert message == (
        "<dir>/model.safetensors does not match its config (29 tensor(s) differ): wrong "
        "shapes: embed.W_E: expected (3, 12), got (3, 8); pos_embed.W_pos: expected (7, 12), "
        "got (7, 8); blocks.0.ln1.w: expected (12,), got (8,); … and 26 more"
    )


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m, d: vi.save(m, 123), TypeError, "path must be a str or os.PathLike"),
        (lambda m, d: vi.load(None), TypeError, "path must be a str or os.PathLike"),
        (lambda m, d: vi.save(m, d / "f" / "run"), ValueError, "a file is in the way"),
        (lambda m, d: vi.save(m, d / "m", metadata=[1]), TypeError, "metadata must be a dict"),
        (lambda m, d: vi.save(m, d / "m", metadata={"x": object()}), TypeError,
         "metadata must be JSON-serialisable"),
        (lambda m, d: vi.save(m, d / "m", metadata={"x": float("nan")}), ValueError,
         "metadata must be JSON-serialisable, but holds a NaN"),
        (lambda m, d: latest_checkpoint(d / "f"), ValueError, "checkpoint_dir must be a directory"),
        (lambda m, d: latest_checkpoint(7), TypeError, "checkpoint_dir must be a path"),
    ],
    ids=["save-int", "load-none", "under-a-file", "meta-list", "meta-object", "meta-nan",
         "latest-file", "latest-int"],
)  # fmt: skip
def test_save_and_load_name_the_bad_argument(tmp_path, call, error, message):
    (tmp_path / "f").write_text("a file")
    with unchecked(), pytest.raises(error, match=re.escape(message)):
        call(random_model(tiny_cfg()), tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["f"]  # nothing written


# ---------------------------------------------------------------- training checkpoints


def make_batch(step: int, gen: torch.Generator):
    x = torch.randn(4, 5, 3, generator=gen, dtype=F64)
    return x, torch.tanh(x.sum(-1, keepdim=True)).expand(4, 5, 5)


def train_run(
    checkpoint_dir: Path, steps: int = 12, resume: bool = False, slow: float = 0.0,
    started: Path | None = None,
) -> vi.TrainResult:  # fmt: skip
    def callback(step: int, metrics: dict) -> None:
        if started is not None and step == 0:
            started.touch()
        time.sleep(slow)

    return vi.train(
        random_model(tiny_cfg()), make_batch, steps=steps, lr=1e-2, checkpoint_dir=checkpoint_dir,
        checkpoint_every=2, keep_last=None, resume=resume, progress=False, device="cpu",
        callback=callback,
    )  # fmt: skip


def assert_same_run(a: vi.TrainResult, b: vi.TrainResult) -> None:
    assert_same_weights(a.model, b.model)
    assert a.history.train_loss == b.history.train_loss


def wait_for(condition: Callable[[], bool], pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        done, _ = os.waitpid(pid, os.WNOHANG)
        assert not done, "the first run ended early"
        assert time.monotonic() < deadline, "the first run did not get there in time"
        time.sleep(0.01)


def holder_pattern(pid: int) -> str:
    return (
        r"checkpoint_dir .*shared is in use by another training run "
        rf"\(pid {pid} on host {re.escape(socket.gethostname())}, started "
    )


def test_a_second_run_on_a_live_runs_directory_is_refused(tmp_path):
    """Two real processes on one checkpoint_dir: the second is refused at once, naming the
    first, and the first ends bit-identical to a run alone."""
    solo = train_run(tmp_path / "solo")
    shared, started = tmp_path / "shared", tmp_path / "started"
    pid = fork(lambda: train_run(shared, slow=0.05, started=started))
    try:
        wait_for(started.exists, pid)
        for resume in (False, True):
            with pytest.raises(ValueError, match=holder_pattern(pid)):
                train_run(shared, resume=resume, started=tmp_path / "second")
            assert not (tmp_path / "second").exists()  # refused before its first step
        assert wait(pid) == 0
    finally:
        stop(pid)
    alone = vi.load(solo.checkpoint / "model")
    first = vi.load(shared / "step_00000012" / "model")
    assert_same_weights(first, alone)
    for name in ("optimizer", "history"):
        a = safetensors.torch.load_file(str(solo.checkpoint / f"{name}.safetensors"))
        b = safetensors.torch.load_file(str(shared / "step_00000012" / f"{name}.safetensors"))
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a if k != "wall_time")
    assert sorted(os.listdir(shared)) == [f"step_{s:08d}" for s in range(2, 13, 2)]


def test_the_lock_dies_with_a_killed_run_and_resume_is_bit_identical(tmp_path):
    solo = train_run(tmp_path / "solo")
    shared = tmp_path / "shared"
    pid = fork(lambda: train_run(shared, slow=0.05))
    try:
        wait_for(lambda: (shared / "step_00000004").is_dir(), pid)
        with pytest.raises(ValueError, match=holder_pattern(pid)):
            train_run(shared, resume=True)
    finally:
        stop(pid)
    resumed = train_run(shared, resume=True)
    assert_same_run(solo, resumed)
    assert latest_checkpoint(shared).name == "step_00000012"
    assert all(name.startswith("step_") for name in os.listdir(shared))  # no lock, no debris


def test_checkpoint_dir_that_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("keep me")
    with pytest.raises(ValueError, match=r"checkpoint_dir must be a directory .*taken is a file"):
        train_run(tmp_path / "taken")
    assert (tmp_path / "taken").read_text() == "keep me"


@pytest.mark.parametrize(
    "name", ["optimizer.safetensors", "rng.safetensors", "history.safetensors",
             "model/model.safetensors", "average/model.safetensors"],
)  # fmt: skip
def test_one_flipped_byte_in_a_checkpoint_is_refused_on_resume(tmp_path, name):
    kw = dict(steps=6, lr=1e-2, checkpoint_dir=tmp_path, checkpoint_every=2, progress=False,
              device="cpu", ema_decay=0.9)  # fmt: skip
    vi.train(random_model(tiny_cfg()), make_batch, **{**kw, "steps": 4})
    file = tmp_path / "step_00000004" / name
    flip_byte(file, (data_offset(file) + file.stat().st_size) // 2)
    with pytest.raises(ValueError, match=re.escape(f"{file} is corrupted")):
        vi.train(random_model(tiny_cfg()), make_batch, resume=True, **kw)


@pytest.mark.parametrize("name", ["optimizer", "rng", "history"])
def test_a_truncated_checkpoint_file_is_named(tmp_path, name):
    train_run(tmp_path, steps=2)
    file = tmp_path / "step_00000002" / f"{name}.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ValueError, match=re.escape(f"{file} is not a readable safetensors")):
        train_run(tmp_path, steps=4, resume=True)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(step="2"), "field 'step' must be an int >= 0, got '2'"),
        (lambda r: r.update(step=3), "field 'step' is 3 but the checkpoint's folder is step_0000"),
        (lambda r: r.pop("step"), "the field 'step' is missing"),
        (lambda r: r.pop("data_fingerprint"), "the field 'data_fingerprint' is missing"),
        (lambda r: r.update(elapsed=None), "field 'elapsed' must be a finite number"),
        (lambda r: r.update(config=[]), "field 'config' must be an object"),
        (lambda r: r["optimizer"].pop("param_groups"), "field 'optimizer' must be an object"),
    ],
    ids=["step-str", "step-other", "no-step", "no-fingerprint", "elapsed", "config", "groups"],
)  # fmt: skip
def test_a_corrupt_trainer_record_names_the_file_and_field(tmp_path, edit, message):
    """A record whose checksum matches (one written by a faulty writer, not corrupted on
    disk) is still checked field by field."""
    train_run(tmp_path, steps=2)
    file = tmp_path / "step_00000002" / "trainer.json"
    record = json.loads(file.read_text())
    edit(record)
    file.write_text(json.dumps(sealed(record)))
    with pytest.raises(ValueError, match=re.escape(f"{file}: ") + ".*" + re.escape(message)):
        train_run(tmp_path, steps=4, resume=True)
