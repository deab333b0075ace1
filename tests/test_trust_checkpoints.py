"""What training trusts, attacked (issue 25, round three): flipped bits and edited optimizer
settings in ``trainer.json``, a record written before its checksum existed, a member's
directory used by ``vi.train`` while its ensemble runs, one stream given to two members,
hooked or NaN models, bad ``weight_decay``, ``threads=`` and the slow-step warning."""

import functools
import itertools
import json
import os
import random
import re
import threading
import warnings
from pathlib import Path

import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg, unchecked
from test_trust_io import assert_same_run, fork, make_batch, stop, wait, wait_for
from vecinterp.training import _speed, checkpoint
from vecinterp.training._speed import SlowTrainingWarning, StepPace
from vecinterp.training.checkpoint import own_directory, read_checkpoint

F64 = torch.float64
CHECKSUM = "vecinterp.sha256"


def run(checkpoint_dir: Path | None, steps: int, resume: bool = False, **kw) -> vi.TrainResult:
    args = dict(steps=steps, lr=1e-2, progress=False, device="cpu", weight_decay=0.1)
    if checkpoint_dir is not None:
        args.update(checkpoint_dir=checkpoint_dir, checkpoint_every=2, keep_last=None)
    return vi.train(random_model(tiny_cfg()), make_batch, resume=resume, **{**args, **kw})


def as_old_record(file: Path, edit=lambda record: None) -> None:
    """Rewrite ``file`` as vecinterp wrote records before their checksum (format_version 1,
    no checksum entry), with ``edit`` applied."""
    record = json.loads(file.read_text())
    record.pop(CHECKSUM, None)
    record["format_version"] = 1
    edit(record)
    file.write_text(json.dumps(record, indent=2, sort_keys=True))


def groups(record: dict) -> dict:
    return record["optimizer"]["param_groups"][0]


# ---------------------------------------------------------------- trainer.json (item 3)


def test_no_flipped_bit_of_trainer_json_is_read_as_another_record(tmp_path, monkeypatch):
    """Single-bit flips of trainer.json: each is refused (ValueError naming the file) or
    reads as exactly the record written. The flips: two bits (the lowest and one of the
    next six, in turn) of every character of the optimizer's settings (betas, eps, weight
    decay, the parameter indices, the "fused" key; not the indentation) and 100 random
    bits anywhere."""
    run(tmp_path, steps=2)
    path = tmp_path / "step_00000002"
    file = path / "trainer.json"
    # the tensor files and the model do not change: read them once (thousands of reads)
    for name in ("read_tensors", "load_model"):
        monkeypatch.setattr(checkpoint, name, functools.cache(getattr(checkpoint, name)))
    original = file.read_bytes()
    expected = json.loads(original)
    expected.pop(CHECKSUM, None)
    start = original.index(b'"param_groups"')
    settings = [
        i for i in range(start, original.index(b'"type"', start)) if original[i] not in b" \n"
    ]
    rng = random.Random(0)
    flips = [(i, b) for i in settings for b in {0, 1 + i % 6}] + [  # bit 0: "0.9" -> "1.9"
        (rng.randrange(len(original)), rng.randrange(8)) for _ in range(100)
    ]
    accepted_other = []
    for position, bit in flips:
        data = bytearray(original)
        data[position] ^= 1 << bit
        file.write_bytes(bytes(data))
        try:
            record = read_checkpoint(path)["record"]
        except ValueError as err:
            assert str(file) in str(err) or str(path) in str(err), err
            continue
        record.pop(CHECKSUM, None)
        if record != expected:
            accepted_other.append((position, bit, chr(original[position]), chr(data[position])))
    assert len(flips) > 600
    assert accepted_other == [], f"{len(accepted_other)} flips read as another record"


def test_a_record_written_before_its_checksum_resumes_bit_identically(tmp_path):
    """The records of runs started before the checksum existed (the running examples' own)
    still resume, to the same bits as a run never interrupted."""
    whole = run(None, steps=6)
    run(tmp_path, steps=4)
    for step in (2, 4):
        as_old_record(tmp_path / f"step_0000000{step}" / "trainer.json")
    assert_same_run(run(tmp_path, steps=6, resume=True), whole)


def test_a_record_from_before_init_range_was_stored_as_a_number_resumes(tmp_path):
    """The background runs of examples/train_affine.py --init transformer_lens were started
    when a default init_range was recorded as null; today's record holds the number. The
    two are one model config, and the run resumes to the same bits as one never stopped."""
    cfg = tiny_cfg(init="transformer_lens")
    kw = dict(lr=1e-2, progress=False, device="cpu")

    def train(steps: int, **more) -> vi.TrainResult:
        return vi.train(vi.HookedVectorTransformer(cfg, seed=0, dtype=F64), make_batch,
                        steps=steps, **kw, **more)  # fmt: skip

    whole = train(4)
    train(2, checkpoint_dir=tmp_path)
    file = tmp_path / "step_00000002" / "trainer.json"
    as_old_record(file, lambda r: r["config"]["model"].update(init_range=None))
    assert_same_run(train(4, checkpoint_dir=tmp_path, resume=True), whole)


def _swap(indices: list) -> None:
    indices[2], indices[3] = indices[3], indices[2]  # blocks.0.ln1.w and .b: same shape


EDITS = {
    "beta1 1.9": (lambda r: groups(r).update(betas=[1.9, 0.999]), "'betas'"),
    "beta2": (lambda r: groups(r).update(betas=[0.9, 0.899]), "'betas'"),
    "eps": (lambda r: groups(r).update(eps=1e-7), "'eps'"),
    "weight decay": (lambda r: groups(r).update(weight_decay=0.3), "'weight_decay'"),
    "amsgrad": (lambda r: groups(r).update(amsgrad=True), "'amsgrad'"),
    "swapped indices": (lambda r: _swap(groups(r)["params"]), "parameter indices"),
    "repeated index": (lambda r: groups(r)["params"].__setitem__(3, 2), "parameter indices"),
    "missing index": (lambda r: groups(r)["params"].pop(), "parameter indices"),
}


@pytest.mark.parametrize("checksummed", [True, False], ids=["checksummed", "old-format"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_optimizer_setting_is_refused_not_trained_on(tmp_path, edit, checksummed):
    """Each edit used to resume silently (to other weights) or blow up as a "divergence"
    (beta1 = 1.9), or crash in AdamW (a repeated index). Now: a ValueError naming
    trainer.json: its checksum, or (a record from before checksums) the setting that
    differs from the run's own."""
    run(tmp_path, steps=2)
    file = tmp_path / "step_00000002" / "trainer.json"
    change, setting = EDITS[edit]
    if checksummed:
        record = json.loads(file.read_text())
        change(record)
        file.write_text(json.dumps(record, indent=2, sort_keys=True))
        message = re.escape(f"{file} is corrupted")
    else:
        as_old_record(file, change)
        message = re.escape(f"{file}: ") + ".*" + re.escape(setting)
    with pytest.raises(ValueError, match=message):
        run(tmp_path, steps=4, resume=True)


def test_an_unknown_or_missing_implementation_setting_trains_as_the_run_would(tmp_path):
    """A record whose "fused" key is garbled (one flipped bit: "fusee") gives no reason to
    switch AdamW's implementation: the resumed run keeps its own and ends bit-identical to
    an uninterrupted one (it used to fall back to another kernel, other bits)."""
    whole = run(None, steps=4)
    run(tmp_path, steps=2)
    file = tmp_path / "step_00000002" / "trainer.json"
    as_old_record(file, lambda r: groups(r).__setitem__("fusee", groups(r).pop("fused")))
    assert_same_run(run(tmp_path, steps=4, resume=True), whole)


def test_a_record_of_the_current_format_without_its_checksum_is_refused(tmp_path):
    run(tmp_path, steps=2)
    file = tmp_path / "step_00000002" / "trainer.json"
    record = json.loads(file.read_text())
    record[CHECKSUM + "x"] = record.pop(CHECKSUM)  # a flip in the key's name
    file.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=re.escape(f"{file} is corrupted: it has no")):
        run(tmp_path, steps=4, resume=True)


# ---------------------------------------------------------------- ensembles (items 6, 9, 12)


def members(k: int = 2) -> list[vi.HookedVectorTransformer]:
    return [random_model(tiny_cfg(), seed=s) for s in range(k)]


def stream(seed: int):
    gen = torch.Generator().manual_seed(seed)
    for step in itertools.count():
        yield make_batch(step, gen)


def test_one_stream_object_given_to_two_members_is_refused():
    shared = stream(0)
    with pytest.raises(ValueError, match=r"data\[0\] and data\[2\] are the same iterable"):
        vi.train_ensemble(members(3), [shared, stream(1), shared], steps=2, lr=1e-2,
                          progress=False, device="cpu")  # fmt: skip
    # one make_batch for two members is fine (each calls it with its own generator), and
    # each member then trains as vi.train does alone
    out = vi.train_ensemble(members(2), [make_batch, make_batch], steps=3, lr=1e-2,
                            seed=[0, 1], progress=False, device="cpu")  # fmt: skip
    alone = vi.train(members(2)[1], make_batch, steps=3, lr=1e-2, seed=1, progress=False,
                     device="cpu")  # fmt: skip
    torch.testing.assert_close(out[1].model.W_E, alone.model.W_E, rtol=1e-10, atol=1e-12)


def test_a_member_directory_is_locked_while_its_ensemble_runs(tmp_path):
    """vi.train(resume=True) on member_000 during the ensemble used to delete the
    checkpoint the ensemble was staging there (which then crashed) and prune the step
    ensemble.json names. Now it is refused, naming the ensemble's process; the ensemble
    ends as a run alone does, and the member's directory is free afterwards."""
    kw = dict(steps=8, lr=1e-2, checkpoint_every=2, keep_last=1, progress=False,
              device="cpu", seed=[0, 1])  # fmt: skip
    alone = vi.train_ensemble(members(), make_batch, checkpoint_dir=tmp_path / "alone", **kw)
    shared, started = tmp_path / "shared", tmp_path / "started"

    def ensemble() -> None:
        def callback(step, metrics):
            if step == 2:
                started.touch()
            if step >= 2:
                threading.Event().wait(0.1)

        out = vi.train_ensemble(members(), make_batch, checkpoint_dir=shared, callback=callback,
                                **kw)  # fmt: skip
        vi.save(out[0].model, tmp_path / "member_0_result")

    pid = fork(ensemble)
    try:
        wait_for(started.exists, pid)
        with pytest.raises(ValueError, match=rf"member_000 is a member's directory of the "
                                             rf"ensemble training in .* \(pid {pid} "):  # fmt: skip
            vi.train(members()[0], make_batch, steps=8, lr=1e-2, checkpoint_dir=shared /
                     "member_000", checkpoint_every=2, resume=True, progress=False,
                     device="cpu")  # fmt: skip
        assert wait(pid) == 0, "the ensemble failed"
    finally:
        stop(pid)
    result = vi.load(tmp_path / "member_0_result")
    assert all(torch.equal(a, b) for a, b in zip(result.state_dict().values(),
                                                 alone[0].model.state_dict().values()))  # fmt: skip
    again = vi.train(members()[0], make_batch, steps=8, lr=1e-2, checkpoint_dir=shared /
                     "member_000", checkpoint_every=2, resume=True, progress=False,
                     device="cpu")  # fmt: skip
    assert_same_run(again, alone[0])  # resumed at its last step: the ensemble's member 0
    assert os.listdir(shared / "member_000") == ["step_00000008"]  # no lock file left


def test_an_ensemble_is_refused_while_a_run_holds_a_members_directory(tmp_path):
    """The other order: vi.train owns member_001 (here, its lock held by this process), and
    the ensemble is refused before it writes a file."""
    held = own_directory(tmp_path / "member_001")
    try:
        with pytest.raises(ValueError, match=r"member_001 is in use by another training run"):
            vi.train_ensemble(members(), make_batch, steps=2, lr=1e-2, checkpoint_dir=tmp_path,
                              progress=False, device="cpu")  # fmt: skip
        assert sorted(os.listdir(tmp_path)) == ["member_001"]
    finally:
        held.release()


def nan_model(seed: int = 1) -> vi.HookedVectorTransformer:
    model = random_model(tiny_cfg(), seed=seed)
    with torch.no_grad():
        model.blocks[1].attn.W_V[0, 2, 1] = float("nan")
    return model


def test_a_member_with_a_nan_weight_is_named_not_reported_as_a_bug():
    with pytest.raises(ValueError, match=r"models\[1\] cannot be trained: it holds NaN/inf "
                                         r"weights.*blocks\.1\.attn\.W_V \(1 NaN"):  # fmt: skip
        vi.train_ensemble([random_model(tiny_cfg()), nan_model()], make_batch, steps=2,
                          lr=1e-2, progress=False, device="cpu")  # fmt: skip
    with pytest.raises(ValueError, match=r"model cannot be trained: it holds NaN/inf weights"):
        vi.train(nan_model(), make_batch, steps=2, lr=1e-2, progress=False, device="cpu")


# ---------------------------------------------------------------- hooks (item 8)


def _knock_out_head_0(z, hook):
    z = z.clone()
    z[:, :, 0] = 0
    return z


HOOKINGS = {
    "add_hook": lambda m: m.add_hook("blocks.0.attn.hook_z", _knock_out_head_0),
    "permanent": lambda m: m.add_hook(
        "blocks.0.attn.hook_z", _knock_out_head_0, is_permanent=True
    ),  # fmt: skip
    "PyTorch module hook": lambda m: m.blocks[0].attn.register_forward_hook(
        lambda module, args, out: out
    ),
}


@pytest.mark.parametrize("how", list(HOOKINGS))
def test_training_a_hooked_model_is_refused(how):
    """Training runs on a copy rebuilt from the config and weights, which carries no hooks:
    the knocked-out head would silently be trained intact."""
    model = random_model(tiny_cfg())
    HOOKINGS[how](model)
    with pytest.raises(ValueError, match="model has hooks attached .*blocks.0"):
        vi.train(model, make_batch, steps=2, lr=1e-2, progress=False, device="cpu")
    with pytest.raises(ValueError, match=r"models\[1\] has hooks attached"):
        vi.train_ensemble([random_model(tiny_cfg()), model], make_batch, steps=2, lr=1e-2,
                          progress=False, device="cpu")  # fmt: skip


def test_training_inside_a_hooks_context_is_refused_but_another_threads_context_is_not():
    model = random_model(tiny_cfg())
    kw = dict(steps=3, lr=1e-2, progress=False, device="cpu")
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", _knock_out_head_0)]):
        with pytest.raises(ValueError, match=r"model has hooks attached \(blocks.0.attn.hook_z"):
            vi.train(model, make_batch, **kw)
    opened, done = threading.Event(), threading.Event()

    def other_thread() -> None:  # another analysis of the same model, in its own thread
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", _knock_out_head_0)]):
            opened.set()
            done.wait(30)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        opened.wait(30)
        trained = vi.train(model, make_batch, **kw)
    finally:
        done.set()
        thread.join()
    alone = vi.train(random_model(tiny_cfg()), make_batch, **kw)
    assert_same_run(trained, alone)


# ---------------------------------------------------------------- still silent


@pytest.mark.parametrize("value", [True, False])
def test_weight_decay_must_be_a_number_not_a_bool(value):
    with unchecked():
        with pytest.raises(ValueError, match=f"weight_decay must be a finite number >= 0, got "
                                             f"{value}"):  # fmt: skip
            vi.train(random_model(tiny_cfg()), make_batch, steps=1, lr=1e-2, weight_decay=value,
                     progress=False, device="cpu")  # fmt: skip
        with pytest.raises(ValueError, match="weight_decay must be a finite number"):
            vi.train_ensemble(members(), make_batch, steps=1, lr=1e-2, weight_decay=value,
                              progress=False, device="cpu")  # fmt: skip


def test_an_init_range_whose_draws_overflow_is_refused():
    with pytest.raises(ValueError, match=r"init_range must be at most 1000, got 1e\+300"):
        tiny_cfg(init_range=1e300)
    with pytest.raises(ValueError, match="init_range must be at most 1000"):
        tiny_cfg(init_range=1e5)  # float16's largest is 65504
    # the largest allowed draws finite weights even in float16
    model = vi.HookedVectorTransformer(tiny_cfg(init_range=1000.0), seed=0, dtype=torch.float16)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert float(model.W_E.detach().abs().max()) > 1000.0  # the scale asked for, not clipped


def test_targets_with_return_type_output_are_refused():
    model = random_model(tiny_cfg())
    x, t = make_batch(0, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="targets were given with return_type='output'"):
        model(x, targets=t)
    loss = model(x, targets=t, return_type="loss")  # the loss is what targets are for
    torch.testing.assert_close(loss, ((model(x) - t) ** 2).mean(), rtol=1e-12, atol=0)


# ---------------------------------------------------------------- threads (issue 24)


def test_threads_sets_torch_threads_for_the_run_and_restores_them():
    before = torch.get_num_threads()
    seen = []
    kw = dict(steps=2, lr=1e-2, progress=False, device="cpu")
    callback = lambda step, metrics: seen.append(torch.get_num_threads())  # noqa: E731
    vi.train(random_model(tiny_cfg()), make_batch, threads=before + 1, callback=callback, **kw)
    vi.train_ensemble(members(), make_batch, threads=before + 2, callback=callback, **kw)
    assert seen == [before + 1] * 2 + [before + 2] * 2
    assert torch.get_num_threads() == before
    for bad in (0, True, 1.5, "2"):
        with unchecked(), pytest.raises(ValueError, match="threads must be an int >= 1"):
            vi.train(random_model(tiny_cfg()), make_batch, threads=bad, **kw)


def pace_with(times: list[float], reads: list[bool]) -> list[str]:
    """The warnings a StepPace gives for steps of the given durations (s) and reads."""
    now = [0.0]
    warned: list[str] = []
    pace = StepPace(clock=lambda: now[0], warn=warned.append)
    for seconds, read in zip(times, reads, strict=True):
        pace.begin()
        now[0] += seconds
        pace.end(read)
    return warned


def test_the_slow_step_check_warns_once_for_a_lasting_slow_down_only():
    every = [True] * 400
    # 100 steps of 20 ms, then 1 s each: one warning, naming the slow steps
    warned = pace_with([0.02] * 100 + [1.0] * 300, every)
    assert len(warned) == 1 and re.match(r"training steps \d+-\d+ took [\d.]+ s each", warned[0])
    assert "threads=1" in warned[0]
    # steady steps, even slow ones: none
    assert pace_with([0.5] * 400, every) == []
    # 15x slower, but the slow steps take under 10 s in all (a stalled test machine): none
    assert pace_with([0.002] * 100 + [0.03] * 300, every) == []
    # a GPU's queue: steps return at once and each read waits for the steps queued before
    # it (every 25th step); the mean step time does not change: none
    queued = [0.5 if s % 25 == 24 else 0.0005 for s in range(400)]
    assert pace_with(queued, [s % 25 == 24 for s in range(400)]) == []


class FakeClock:
    """A clock that advances by ``rate`` seconds at each reading: a step's begin and end
    are one reading apart, so each step takes ``rate``."""

    def __init__(self) -> None:
        self.now, self.rate = 0.0, 0.02

    def __call__(self) -> float:
        self.now += self.rate
        return self.now


@pytest.mark.parametrize("trainer", ["train", "train_ensemble"])
def test_a_run_whose_steps_slow_down_warns(monkeypatch, trainer):
    """With a fake clock: 50 steps of 20 ms, then 1 s each, as if the cores became busy.
    One warning, pointing at the call; the same run at a steady pace gives none."""
    clock = FakeClock()
    monkeypatch.setattr(_speed, "_clock", clock)

    def callback(step, metrics):
        clock.rate = 0.02 if step < 50 else 1.0

    train = vi.train if trainer == "train" else vi.train_ensemble
    model = random_model(tiny_cfg()) if trainer == "train" else members()
    kw = dict(steps=100, lr=1e-3, progress=False, device="cpu")
    pattern = r"training steps \d+-\d+ took [\d.]+ s each"
    with pytest.warns(SlowTrainingWarning, match=pattern) as seen:
        train(model, make_batch, callback=callback, **kw)
    assert len([w for w in seen if w.category is SlowTrainingWarning]) == 1
    assert seen[0].filename == __file__  # it points at the call of vi.train
    clock.rate = 0.02
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # steady steps: no warning
        train(model, make_batch, callback=lambda step, metrics: None, **kw)
