"""What an ensemble's checkpoints trust, attacked (issue 33, items 6, 7 and 10): a member's
directory reached through ``"."`` or a symbolic link while the ensemble holds it,
``ensemble.json`` and a member's ``trainer.json`` that are not regular files, member
directories swapped, and ``ensemble.json`` lost while every member holds checkpoints."""

import json
import os
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg
from test_trust_io import assert_same_run, fork, make_batch, stop, wait
from vecinterp.training.checkpoint import own_directory

KW = dict(steps=4, lr=1e-2, checkpoint_every=2, keep_last=None, progress=False,
          device="cpu", seed=[0, 1])  # fmt: skip


def members(k: int = 2) -> list[vi.HookedVectorTransformer]:
    return [random_model(tiny_cfg(), seed=s) for s in range(k)]


def ensemble(directory: Path, resume: bool = False, **kw) -> vi.EnsembleResult:
    return vi.train_ensemble(members(), make_batch, checkpoint_dir=directory, resume=resume,
                             **{**KW, **kw})  # fmt: skip


def listing(directory: Path) -> list[tuple[str, int]]:
    """Every entry under ``directory`` with its size (what a run there would change)."""
    return sorted((str(p.relative_to(directory)), p.lstat().st_size) for p in directory.rglob("*"))


@contextmanager
def cwd(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def refused_in_child(fn) -> None:
    """Run ``fn`` (which asserts the refusal) in a forked child with 3 GiB of address space
    beyond what the process already maps (a suite run that has imported everything maps
    several GiB), killed after 60 s: before the fix a FIFO blocked the read forever and
    /dev/zero was read until memory ran out, inside C code that no signal handler
    interrupts."""

    def limited() -> None:
        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + (3 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        fn()

    pid = fork(limited)
    try:
        code = wait(pid, 60.0)
    finally:
        stop(pid)
    assert code == 0, "the child did not see the refusal (its traceback is above)"


# ---------------------------------------------------------------- item 6: the lock


@pytest.mark.parametrize("how", ["cwd", "symlink"])
def test_a_members_directory_is_locked_by_what_it_is_not_by_its_name(tmp_path, how):
    """vi.train(checkpoint_dir=".", resume=True) from inside member_000, or through a link
    named otherwise, used to pass the member check (it looked at the path's last name) and
    remove the ensemble's staged step and prune its steps. Now refused, touching nothing."""
    shared = tmp_path / "shared"
    ensemble(shared, steps=2)
    held = own_directory(shared)  # as the running ensemble holds it
    before = listing(shared)
    try:
        train = dict(steps=4, lr=1e-2, checkpoint_every=2, keep_last=1, resume=True,
                     progress=False, device="cpu")  # fmt: skip
        match = r"is a member's directory of the ensemble training in .*shared"
        if how == "cwd":
            with cwd(shared / "member_000"), pytest.raises(ValueError, match=match):
                vi.train(members()[0], make_batch, checkpoint_dir=".", **train)
        else:
            link = tmp_path / "run"
            link.symlink_to(shared / "member_000")
            with pytest.raises(ValueError, match=r"run \(that is, .*member_000\) " + match):
                vi.train(members()[0], make_batch, checkpoint_dir=link, **train)
        assert listing(shared) == before
    finally:
        held.release()


# ---------------------------------------------------------------- item 7: regular files


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_ensemble_json_that_is_not_a_regular_file_is_refused_naming_it(tmp_path, kind):
    """ensemble.json used to be read whatever it was: a link to /dev/zero read until memory
    ran out, a FIFO blocked forever."""
    ensemble(tmp_path, steps=2)
    marker = tmp_path / "ensemble.json"
    marker.unlink()
    if kind == "fifo":
        os.mkfifo(marker)
        what = "a FIFO"
    else:
        marker.symlink_to("/dev/zero")
        what = "a character device"

    def resume() -> None:
        with pytest.raises(ValueError, match=rf"record .*ensemble.json is {what}.*, not a regular"):
            ensemble(tmp_path, resume=True)

    refused_in_child(resume)


def test_a_members_trainer_json_linked_to_dev_zero_is_not_called_missing(tmp_path):
    ensemble(tmp_path, steps=2)
    record = tmp_path / "member_001" / "step_00000002" / "trainer.json"
    record.unlink()
    record.symlink_to("/dev/zero")

    def resume() -> None:
        with pytest.raises(ValueError) as err:
            ensemble(tmp_path, resume=True)
        assert "is a character device, not a regular file" in str(err.value)
        assert "missing" not in str(err.value)

    refused_in_child(resume)


# ---------------------------------------------------------------- item 10: trusting names


def test_swapped_member_directories_are_refused_not_loaded_into_the_wrong_models(tmp_path):
    """Each member's trainer.json records its index; it used to be ignored, and member 1's
    state loaded into models[0] without a word."""
    ensemble(tmp_path, steps=2)
    (tmp_path / "member_000").rename(tmp_path / "swap")
    (tmp_path / "member_001").rename(tmp_path / "member_000")
    (tmp_path / "swap").rename(tmp_path / "member_001")
    with pytest.raises(ValueError, match=r"is member 1's, but it lies in member 0's directory "
                                         r"member_000.*models\[0\]"):  # fmt: skip
        ensemble(tmp_path, resume=True)


def test_a_plain_runs_checkpoint_in_a_members_directory_is_refused(tmp_path):
    ensemble(tmp_path, steps=2)
    shutil.rmtree(tmp_path / "member_001")
    vi.train(members()[1], make_batch, steps=2, lr=1e-2, seed=1, checkpoint_dir=tmp_path /
             "member_001", progress=False, device="cpu")  # fmt: skip
    with pytest.raises(ValueError, match=r"is no ensemble member's"):
        ensemble(tmp_path, resume=True)


def test_a_lost_ensemble_json_is_refused_not_restarted_from_step_0(tmp_path):
    """With ensemble.json gone and every member holding checkpoints, resume=True used to
    start from step 0 over them. Refused, naming the step to resume from; writing the
    file the message gives resumes bit-identically to an uninterrupted run."""
    whole = ensemble(tmp_path / "whole")
    ensemble(tmp_path / "cut", steps=4, checkpoint_every=2)
    (tmp_path / "cut" / "member_001" / "step_00000004").rename(tmp_path / "aside")
    (tmp_path / "cut" / "ensemble.json").unlink()
    with pytest.raises(ValueError, match=r"ensemble.json is missing, but all 2 members' "
                                         r"directories hold checkpoints") as err:  # fmt: skip
        ensemble(tmp_path / "cut", resume=True)
    assert "to resume from step 2, the newest step every member holds" in str(err.value)
    text = str(err.value).split("holds (")[1].split("); ")[0]
    (tmp_path / "cut" / "ensemble.json").write_text(text)
    resumed = ensemble(tmp_path / "cut", resume=True)
    for a, b in zip(resumed, whole, strict=True):
        assert_same_run(a, b)


def test_a_crash_before_the_first_ensemble_json_still_starts_afresh(tmp_path):
    """Only some members wrote the first checkpoint (the crash came before ensemble.json):
    nothing was completed, and resume=True starts from step 0 as before."""
    whole = ensemble(tmp_path / "whole")
    ensemble(tmp_path / "cut", steps=2)
    (tmp_path / "cut" / "ensemble.json").unlink()
    shutil.rmtree(tmp_path / "cut" / "member_001")
    resumed = ensemble(tmp_path / "cut", resume=True)
    for a, b in zip(resumed, whole, strict=True):
        assert_same_run(a, b)
    assert json.loads((tmp_path / "cut" / "ensemble.json").read_text())["step"] == 4
    assert torch.equal(resumed[0].model.W_E, whole[0].model.W_E)
