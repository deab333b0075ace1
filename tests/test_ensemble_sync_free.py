"""The ensemble reads its members' losses on the host every ``sync_every`` steps: the same
run (weights, optimizer state, histories, checkpoints, bit for bit), the same errors naming
the same member and step, a member frozen mid-window at its state before its bad step, no
checkpoint past a bad step, an exact resume, and no host read per step between two reads."""

import json
import math
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vecinterp as vi
from helpers import random_model, unchecked
from test_ensemble import CFG, LRS, RECIPE, Crash, blows_up_at, make_batch
from vecinterp.training.checkpoint import read_checkpoint

SYNCS = (1, 7, 50)  # every step; windows of 7 (a bad step inside one); one window per run
FIELDS = ("steps", "train_loss", "lr", "grad_norm", "eval_steps", "eval_loss")
PLAIN = dict(RECIPE, schedule="constant", min_lr=0.0, warmup_steps=0)  # no decay


@pytest.fixture
def models():
    return [random_model(CFG, seed=s) for s in range(3)]


def spoiled(at: int, part: str, index=(1, 3, 0), value=math.nan, crash_at=None):
    """``make_batch`` with ``value`` written into ``part`` (``"inputs"``, ``"targets"``;
    ``"mask"``: a loss_mask that selects nothing) of batch ``at``, raising ``Crash`` when
    asked for batch ``crash_at``."""

    def data(step, gen):
        if step == crash_at:
            raise Crash
        x, t, m = make_batch(step, gen)
        if step == at:
            if part == "mask":
                m = torch.zeros_like(m)
            else:
                x, t = x.clone(), t.clone()
                (x if part == "inputs" else t)[index] = value
        return x, t, m

    return data


def run(models, data=make_batch, **kwargs):
    kw = {**RECIPE, "lr": LRS, "seed": [0, 1, 2], **kwargs}
    return vi.train_ensemble(models, data, **kw)


def assert_same_run(a: vi.EnsembleResult, b: vi.EnsembleResult) -> None:
    """Bit for bit: the weights and the last iterate, the AdamW state, the histories (wall
    times aside), the divergences and the newest checkpoints' names."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        for x, y in ((ra.model, rb.model), (ra.raw_model, rb.raw_model)):
            for (name, p), q in zip(x.state_dict().items(), y.state_dict().values(), strict=True):
                assert torch.equal(p, q), name
        sa, sb = ra.optimizer.state_dict(), rb.optimizer.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        assert sa["state"].keys() == sb["state"].keys()
        for j in sa["state"]:
            for key, value in sa["state"][j].items():
                assert torch.equal(value, sb["state"][j][key]), (j, key)
        for field in FIELDS:
            assert getattr(ra.history, field) == getattr(rb.history, field), field
        assert (ra.checkpoint and ra.checkpoint.name) == (rb.checkpoint and rb.checkpoint.name)
    assert [described(e) for e in a.diverged] == [described(e) for e in b.diverged]


def described(err: vi.TrainingDivergedError | None) -> tuple | None:
    """What a divergence says, its checkpoint named within the run's directory."""
    if err is None:
        return None
    text, where = str(err), None
    if err.checkpoint is not None:
        where = err.checkpoint.relative_to(err.checkpoint.parents[1])
        text = text.replace(str(err.checkpoint), str(where))
    return type(err), text, err.step, err.quantity, repr(err.value), err.cause, where


def assert_same_checkpoints(a, b) -> None:
    """The two checkpoint directories hold the same members' steps, each with the same
    tensors (model, average, optimizer, RNG, history but its wall times) and record (but
    the elapsed time)."""
    members = sorted(p.name for p in a.glob("member_*"))
    assert members == sorted(p.name for p in b.glob("member_*")) and members
    assert (a / "ensemble.json").read_text() == (b / "ensemble.json").read_text()
    for member in members:
        steps = sorted(p.name for p in (a / member).glob("step_*"))
        assert steps == sorted(p.name for p in (b / member).glob("step_*")) and steps
        for step in steps:
            x, y = read_checkpoint(a / member / step), read_checkpoint(b / member / step)
            for key in ("model", "average"):
                if x[key] is None:
                    assert y[key] is None
                    continue
                for (name, p), q in zip(x[key].state_dict().items(),
                                        y[key].state_dict().values(), strict=True):  # fmt: skip
                    assert torch.equal(p, q), (member, step, key, name)
            for j, state in x["optimizer"]["state"].items():
                for key, value in state.items():
                    assert torch.equal(value, y["optimizer"]["state"][j][key]), (step, j, key)
            for key in ("rng", "history"):
                assert x[key].keys() == y[key].keys()
                for name, value in x[key].items():
                    if name != "wall_time":
                        assert torch.equal(value, y[key][name]), (member, step, key, name)
            x["record"].pop("elapsed"), y["record"].pop("elapsed")
            # a divergence's message names the checkpoint kept, in its own directory
            texts = [json.dumps(r["record"]).replace(str(d), "") for r, d in ((x, a), (y, b))]
            assert texts[0] == texts[1], (member, step)


def error_of(fn, kind=vi.TrainingDivergedError) -> BaseException:
    with pytest.raises(kind) as info:
        fn()
    return info.value


# --- the same run ---------------------------------------------------------------------------


def test_weights_histories_and_checkpoints_do_not_depend_on_sync_every(models, tmp_path):
    """Member 1 diverges at step 10, inside the window 9-12 (read at 12 for the evaluation
    after 13 updates) with sync_every 7 and 50: its state is restored to the one before
    step 10 at that read; the others train on."""
    gen = torch.Generator().manual_seed(99)
    evals = [make_batch(i, gen) for i in range(2)]
    data = [make_batch, blows_up_at(10), make_batch]
    kw = dict(steps=23, ema_decay=0.9, eval_data=evals, eval_every=13, checkpoint_every=9,
              keep_last=None)  # fmt: skip
    runs = [run(models, data, sync_every=s, checkpoint_dir=tmp_path / str(s), **kw) for s in SYNCS]
    for other in runs[1:]:
        assert_same_run(runs[0], other)
    for s in SYNCS[1:]:
        assert_same_checkpoints(tmp_path / "1", tmp_path / str(s))
    err = runs[0].diverged[1]
    assert (err.step, err.quantity, err.value) == (10, "loss", math.inf)
    assert runs[0][1].history.steps == list(range(10))
    assert runs[0][0].history.steps == list(range(23))
    assert runs[0][0].history.eval_steps == [0, 13, 23] and runs[0][1].history.eval_steps == [0]
    # the frozen member holds its state after 10 updates, in the result and checkpoints 18, 23
    for step in ("step_00000018", "step_00000023"):
        saved = vi.load(tmp_path / "50" / "member_001" / step / "model")
        for p, q in zip(saved.state_dict().values(), runs[2][1].raw_model.state_dict().values()):
            assert torch.equal(p, q), step
    assert float(runs[2][1].optimizer.state_dict()["state"][0]["step"]) == 10
    wall = runs[2][0].history.wall_time
    assert len(wall) == 23 and all(b >= a for a, b in zip(wall, wall[1:]))


@pytest.mark.parametrize("grad_clip", [None, 0.5])
def test_an_infinite_gradient_mid_window_freezes_the_member_at_its_step(models, grad_clip):
    """Member 1's rate of 1e4 sends its gradient norm to inf (a finite loss) at step 17: in
    the middle of the window 14-20 (sync_every=7) and of the only one (50)."""
    kw = dict(PLAIN, steps=24, lr=[1e-2, 1e4, 3e-3], grad_clip=grad_clip)
    runs = [run(models, sync_every=s, **kw) for s in SYNCS]
    err = runs[0].diverged[1]
    assert (err.step, err.quantity, err.value, err.cause) == (17, "gradient norm", math.inf, None)
    assert str(err).startswith("ensemble member 1: training diverged: the gradient norm is inf")
    for other in runs[1:]:
        assert_same_run(runs[0], other)
    assert runs[0].diverged[0] is None and runs[0].diverged[2] is None


def test_members_frozen_in_one_window_at_different_steps(models):
    """Members 0 and 2 diverge at steps 3 and 5 of one window; member 1 trains on."""
    data = [blows_up_at(3), make_batch, blows_up_at(5)]
    runs = [run(models, data, sync_every=s, **dict(PLAIN, ema_decay=0.8)) for s in (1, 50)]
    assert_same_run(*runs)
    assert [e and e.step for e in runs[1].diverged] == [3, None, 5]


def test_a_frozen_members_later_bad_batches_are_not_checked_but_its_inputs_are(models):
    """After member 0 is frozen at step 3, its empty loss_mask at step 5 is ignored (as a
    check after each step ignores it); NaN inputs are refused for any member."""
    mask_later = spoiled(5, "mask")

    def frozen_then_empty(step, gen):
        return blows_up_at(3)(step, gen) if step != 5 else mask_later(step, gen)

    data = [frozen_then_empty, make_batch, make_batch]
    runs = [run(models, data, sync_every=s, **PLAIN) for s in SYNCS]
    for other in runs[1:]:
        assert_same_run(runs[0], other)
    assert runs[0].diverged[0].step == 3
    message = "member 0: make_batch(8, ...): inputs contain NaN or inf (first at index [1, 3, 0])"
    nan_later = spoiled(8, "inputs")
    data[0] = lambda step, gen: blows_up_at(3)(step, gen) if step != 8 else nan_later(step, gen)
    for s in SYNCS:
        with pytest.raises(ValueError, match=re.escape(message)):
            run(models, data, sync_every=s, **PLAIN)


def test_the_callback_sees_every_step_with_the_history_values(models):
    seen = []
    out = run(models, [make_batch, blows_up_at(4), make_batch], sync_every=50,
              callback=lambda s, m: seen.append((s, m)))  # fmt: skip
    assert [s for s, _ in seen] == list(range(20))
    assert [m[0]["loss"] for _, m in seen] == out[0].history.train_loss
    assert [m[1] for _, m in seen[4:]] == [{}] * 16  # frozen from step 4 on
    assert [m[1]["grad_norm"] for _, m in seen[:4]] == out[1].history.grad_norm


def test_the_progress_bar_shows_the_loss_read_at_each_log(models, capsys):
    out = run(models[:2], lr=1e-2, seed=[0, 1], sync_every=50, log_every=3,
              **dict(PLAIN, steps=7, progress=True))  # fmt: skip
    err = capsys.readouterr().err
    mean = sum(sum(h.train_loss[4:7]) / 3 for h in out.histories) / 2
    assert f"loss={mean:.3e}" in err and "7/7" in err


# --- errors named at their member and step --------------------------------------------------


def same_error_for_every_sync(fn, kind=vi.TrainingDivergedError) -> BaseException:
    errors = [error_of(lambda s=s: fn(s), kind) for s in SYNCS]
    for err in errors[1:]:
        if isinstance(err, vi.TrainingDivergedError):
            assert described(err) == described(errors[0])
        else:
            assert type(err) is type(errors[0]) and str(err) == str(errors[0])
    return errors[0]


def test_nan_targets_mid_window_are_named_with_member_and_batch(models, tmp_path):
    def fn(s):
        data = [make_batch, spoiled(11, "targets", (2, 3, 4)), make_batch]
        return run(models, data, sync_every=s, checkpoint_dir=tmp_path / str(s),
                   checkpoint_every=4, keep_last=None)  # fmt: skip

    err = same_error_for_every_sync(fn)
    assert (err.step, err.quantity) == (11, "loss") and math.isnan(err.value)
    assert str(err).startswith("ensemble member 1: training stopped: the loss is nan at step 11 ")
    assert err.cause == ("make_batch(11, ...): targets contain NaN or inf at a position the "
                         "loss uses (first at index [2, 3, 4])")  # fmt: skip
    assert err.checkpoint == tmp_path / "1" / "member_001" / "step_00000008"
    # no checkpoint past the bad step, and those written are the same for every sync_every
    assert [p.name for p in sorted((tmp_path / "50" / "member_001").iterdir())] == [
        "step_00000004", "step_00000008",
    ]  # fmt: skip
    for s in SYNCS[1:]:
        assert_same_checkpoints(tmp_path / "1", tmp_path / str(s))


def test_nan_inputs_mid_window_are_named_with_member_and_index(models):
    message = "member 2: make_batch(9, ...): inputs contain NaN or inf (first at index [0, 4, 2])"
    data = [make_batch, make_batch, spoiled(9, "inputs", (0, 4, 2), value=-math.inf)]
    err = same_error_for_every_sync(lambda s: run(models, data, sync_every=s), ValueError)
    assert str(err) == message


def test_nan_inputs_at_the_first_step_come_before_the_forward_check(models):
    data = [make_batch, spoiled(0, "inputs"), make_batch]
    err = same_error_for_every_sync(lambda s: run(models, data, sync_every=s), ValueError)
    assert str(err) == (
        "member 1: make_batch(0, ...): inputs contain NaN or inf (first at index [1, 3, 0])"
    )


def test_an_empty_loss_mask_mid_window_is_named(models):
    data = [make_batch, make_batch, spoiled(6, "mask")]
    err = same_error_for_every_sync(lambda s: run(models, data, sync_every=s), ValueError)
    assert str(err) == "member 2: make_batch(6, ...): loss_mask selects no position"


def test_on_divergence_raise_names_the_first_bad_member_and_step(models):
    data = [blows_up_at(12), blows_up_at(9), make_batch]
    err = same_error_for_every_sync(
        lambda s: run(models, data, sync_every=s, on_divergence="raise", **PLAIN)
    )
    assert err.step == 9 and str(err).startswith("ensemble member 1: training diverged")


def test_every_member_diverged_mid_window(models):
    data = [blows_up_at(4), blows_up_at(9), blows_up_at(6)]
    err = same_error_for_every_sync(lambda s: run(models, data, sync_every=s, **PLAIN))
    assert err.step == 9
    assert str(err).startswith("every member of the ensemble diverged (member 0 at step 4, "
                               "member 1 at step 9, member 2 at step 6)")  # fmt: skip


def test_a_freeze_then_a_later_bad_batch_in_the_same_window(models):
    """Member 0 freezes at step 3, member 1's mask selects nothing at step 5."""
    data = [blows_up_at(3), spoiled(5, "mask"), make_batch]
    err = same_error_for_every_sync(lambda s: run(models, data, sync_every=s, **PLAIN), ValueError)
    assert str(err) == "member 1: make_batch(5, ...): loss_mask selects no position"


def test_the_first_bad_step_wins_over_a_later_error_in_its_window(models):
    """Member 1's targets are bad at step 5, and batch 6 of member 2 cannot be drawn."""
    data = [make_batch, spoiled(5, "targets"), spoiled(-1, "", crash_at=6)]
    err = same_error_for_every_sync(lambda s: run(models, data, sync_every=s, **PLAIN))
    assert err.step == 5 and "make_batch(5, ...)" in err.cause
    assert err.__suppress_context__ or err.__context__ is None
    # a member frozen earlier in the window does not stop the later error
    data = [make_batch, blows_up_at(5), spoiled(-1, "", crash_at=6)]
    for s in SYNCS:
        error_of(lambda s=s: run(models, data, sync_every=s, **PLAIN), Crash)


# --- resume ---------------------------------------------------------------------------------


def test_resume_after_a_crash_mid_window_is_bit_identical(models, tmp_path):
    """Member 1 is frozen at step 3; the run is killed while drawing batch 13 (steps 10-12
    trained, not read); resumed from step 10 with another sync_every."""
    data = [make_batch, blows_up_at(3), make_batch]
    kw = dict(checkpoint_every=5, keep_last=1, ema_decay=0.9)
    whole = run(models, data, sync_every=1, checkpoint_dir=tmp_path / "whole", **kw)
    crashing = [make_batch, blows_up_at(3), spoiled(-1, "", crash_at=13)]
    error_of(lambda: run(models, crashing, sync_every=7, checkpoint_dir=tmp_path / "cut", **kw),
             Crash)  # fmt: skip
    assert (tmp_path / "cut" / "ensemble.json").read_text().count('"step": 10') == 1
    resumed = run(models, data, sync_every=50, checkpoint_dir=tmp_path / "cut", resume=True, **kw)
    assert_same_run(whole, resumed)
    assert_same_checkpoints(tmp_path / "whole", tmp_path / "cut")


# --- host reads -----------------------------------------------------------------------------


class _Reads(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host that go through the dispatcher:
    ``item``, ``bool(t)``, ``float(t)`` (``_local_scalar_dense``) and copies from another
    device to the CPU (none on a CPU-only run; each waits for a GPU)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        elif func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            target = args[0] if func is torch.ops.aten.copy_.default else out
            if source.device.type != "cpu" and target.device.type == "cpu":
                self.count += 1
        return out


def count_host_reads(monkeypatch, fn) -> int:
    """How many times ``fn`` reads a tensor's value on the host: the dispatcher's reads,
    plus ``tolist``, ``numpy`` and ``cpu``, which read a CPU tensor without it."""
    count = 0
    for name in ("tolist", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, **kwargs):
            nonlocal count
            count += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    try:
        with _Reads() as mode:
            fn()
    finally:
        monkeypatch.undo()
    return count + mode.count


# the first step reads the device 4 times, once a run: the members' inputs-are-finite flags
# (one transfer, so that NaN inputs are refused before the forward check, as before), and
# the check of the batched forward against one member's own (that model's check of its
# inputs, the two norms compared); and once before it, the members' weights are checked
# finite (one read for all members)
FIRST_STEP_READS = 5


@pytest.mark.parametrize(("steps", "sync_every"), [(10, 10), (20, 10), (20, 20), (23, 7),
                                                   (20, 1), (3, 50)])  # fmt: skip
def test_steps_between_two_reads_read_nothing_on_the_host(models, monkeypatch, steps, sync_every):
    """One transfer per window of ``sync_every`` steps (the last one shorter), and nothing
    else but the first step's fixed reads, in a run without evaluation or checkpoints."""
    reads = count_host_reads(
        monkeypatch, lambda: run(models, steps=steps, sync_every=sync_every, progress=False)
    )
    assert reads == math.ceil(steps / sync_every) + FIRST_STEP_READS


def test_a_member_frozen_mid_window_costs_no_read_after_its_window(models, monkeypatch):
    data = [make_batch, blows_up_at(3), make_batch]
    reads = count_host_reads(monkeypatch, lambda: run(models, data, steps=20, sync_every=10))
    # two windows; one more read to explain the non-finite loss (are the targets to blame?)
    assert reads == 2 + FIRST_STEP_READS + 1


def test_sync_every_must_be_a_positive_int(models):
    for bad in (0, -1, 1.5, True):
        message = f"sync_every must be an int >= 1, got {bad!r}"
        with unchecked(), pytest.raises(ValueError, match=re.escape(message)):
            run(models, sync_every=bad)
