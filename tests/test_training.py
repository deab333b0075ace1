"""The training loop: learning, exact resume, atomic checkpoints, divergence, schedule,
clipping, evaluation, and one clear error per bad argument."""

import doctest
import importlib
import itertools
import math
import os
import re
from pathlib import Path

import pytest
import safetensors.torch
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.tasks import affine_recurrence as ar
from vecinterp.training import (
    TrainHistory,
    TrainingDivergedError,
    default_device,
    evaluate,
    latest_checkpoint,
    lr_at,
    train,
)
from vecinterp.training import checkpoint as checkpoint_module

F64 = torch.float64
CFG = tiny_cfg()  # d_in=3, d_out=5, n_ctx=7, 2 layers
MAP = torch.linspace(-1.0, 1.0, 15, dtype=F64).reshape(3, 5)  # the learnable target map
HISTORY_FIELDS = ("steps", "train_loss", "lr", "grad_norm", "eval_steps", "eval_loss")


class Crash(Exception):
    """Stands for the process being killed."""


def make_batch(step: int, gen: torch.Generator):
    """A learnable toy task: targets = inputs @ MAP, scored from position 1 on."""
    x = torch.randn(4, 5, 3, generator=gen, dtype=F64)
    mask = torch.arange(5).ge(1).expand(4, 5)
    return x, x @ MAP, mask


def stream(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (make_batch(s, gen) for s in itertools.count())


def crash_at(step: int):
    def callback(s: int, metrics: dict) -> None:
        if s == step:
            raise Crash

    return callback


@pytest.fixture
def model() -> vi.HookedVectorTransformer:
    return random_model(CFG, scale=0.1)


@pytest.fixture(scope="module")
def eval_set():
    gen = torch.Generator().manual_seed(99)
    return [make_batch(i, gen) for i in range(2)]


def run(model, data=make_batch, **kwargs):
    kwargs = {"steps": 8, "lr": 1e-2, "progress": False, "device": "cpu", **kwargs}
    return train(model, data, **kwargs)


def assert_same_run(a, b) -> None:
    """Bitwise-equal weights, optimizer state and history (wall times aside)."""
    for (name, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for index in sa["state"]:
        for key, value in sa["state"][index].items():
            assert torch.equal(value, sb["state"][index][key]), (index, key)
    for field in HISTORY_FIELDS:
        assert getattr(a.history, field) == getattr(b.history, field), field


# --- learning ---------------------------------------------------------------------------


def test_loss_decreases_on_a_learnable_task(model, eval_set):
    result = run(model, steps=40, lr=3e-2, eval_data=eval_set, eval_every=20)
    loss = result.history.train_loss
    assert sum(loss[-10:]) < 0.2 * sum(loss[:10])
    assert result.history.eval_steps == [0, 20, 40]
    assert result.history.eval_loss[-1] < 0.2 * result.history.eval_loss[0]
    assert result.history.eval_loss[-1] == evaluate(result.model, eval_set)
    assert result.history.steps == list(range(40))
    assert len(result.history.wall_time) == 40
    assert result.history.wall_time == sorted(result.history.wall_time)


def test_the_model_passed_in_is_left_unchanged(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = run(model, steps=3)
    assert result.model is not model
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not torch.equal(result.model.embed.W_E, model.embed.W_E)


@pytest.mark.parametrize("fused", [True, False])
def test_update_equals_a_hand_written_adamw_loop(model, fused):
    """Schedule, clipping and AdamW: the loop equals the textbook loop, bit for bit with the
    same (fused) AdamW kernel and to rounding with torch's per-tensor one."""
    steps, peak, floor, warmup, clip = 9, 5e-2, 1e-3, 3, 0.5

    def hand_lr(s: int) -> float:
        if s < warmup:
            return peak * (s + 1) / warmup
        return floor + 0.5 * (peak - floor) * (
            1 + math.cos(math.pi * (s - warmup) / (steps - warmup))
        )

    result = run(model, steps=steps, lr=peak, min_lr=floor, warmup_steps=warmup,
                 schedule="cosine", grad_clip=clip, weight_decay=0.1, seed=5)  # fmt: skip
    ref = vi.HookedVectorTransformer(CFG, dtype=F64)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(ref.parameters(), lr=peak, weight_decay=0.1, fused=fused)
    gen = torch.Generator().manual_seed(5)
    for s in range(steps):
        x, t, m = make_batch(s, gen)
        for group in opt.param_groups:
            group["lr"] = hand_lr(s)
        opt.zero_grad()
        vi.masked_mse(ref(x), t, m).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        opt.step()
    for (name, p), q in zip(result.model.named_parameters(), ref.parameters()):
        if fused:
            assert torch.equal(p, q), name
        elif not name.endswith("b_K"):
            # b_K's true gradient is 0 (softmax ignores a constant per row): it receives
            # rounding noise, which Adam's g / sqrt(v) turns into lr-sized steps in either
            # kernel, so only the other parameters can agree to rounding.
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14, msg=name)
    assert result.history.lr == [hand_lr(s) for s in range(steps)]


# --- schedule and clipping ----------------------------------------------------------------


# --- weight average ---------------------------------------------------------------------


def test_weight_average_equals_the_hand_formula(model, eval_set):
    """avg_t = theta_t up to ema_start, then decay * avg_{t-1} + (1 - decay) * theta_t, where
    theta_t is the last iterate after t updates (the same for every run length: constant
    schedule, same batches)."""
    decay, start, steps = 0.75, 2, 5
    iterates = [dict(run(model, steps=t).model.named_parameters()) for t in range(1, steps + 1)]
    result = run(model, steps=steps, ema_decay=decay, ema_start=start, eval_data=eval_set)
    plain = run(model, steps=steps)
    for name, p in result.raw_model.named_parameters():  # averaging leaves training alone
        assert torch.equal(p, dict(plain.model.named_parameters())[name]), name
    for name, avg in result.model.named_parameters():
        expected = iterates[start - 1][name]
        for t in range(start + 1, steps + 1):
            expected = decay * expected + (1 - decay) * iterates[t - 1][name]
        torch.testing.assert_close(avg, expected, rtol=1e-12, atol=1e-15, msg=name)
    assert result.model is not result.raw_model
    assert not torch.equal(result.model.embed.W_E, result.raw_model.embed.W_E)
    # the history evaluates the average: what result.model is
    assert result.history.eval_loss[-1] == evaluate(result.model, eval_set)
    assert result.history.eval_loss[0] == evaluate(model, eval_set)
    assert result.model.training and result.raw_model.training


def test_weight_average_reduces_the_noise_of_a_high_learning_rate(model, eval_set):
    steps = 60
    result = run(model, steps=steps, lr=5e-2, ema_decay=0.9, ema_start=30, eval_data=eval_set)
    assert evaluate(result.model, eval_set) < evaluate(result.raw_model, eval_set)


def test_resume_with_a_weight_average_is_bit_identical(model, eval_set, tmp_path):
    kw = dict(steps=8, ema_decay=0.8, ema_start=2, eval_data=eval_set, eval_every=3,
              checkpoint_every=3, checkpoint_dir=tmp_path / "a")  # fmt: skip
    whole = run(model, **{**kw, "checkpoint_dir": tmp_path / "whole"})
    with pytest.raises(Crash):
        run(model, callback=crash_at(4), **kw)  # dies after the checkpoint of step 3
    resumed = run(model, resume=True, **kw)
    assert_same_run(whole, resumed)
    for (name, p), (_, q) in zip(
        whole.raw_model.named_parameters(), resumed.raw_model.named_parameters()
    ):
        assert torch.equal(p, q), name
    files = sorted(p.name for p in (latest_checkpoint(tmp_path / "a") / "average").iterdir())
    assert files == ["config.json", "model.safetensors"]


def test_resume_with_another_weight_average_is_refused(model, tmp_path):
    run(model, steps=4, ema_decay=0.9, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match=r"ema_decay: checkpoint 0.9, now 0.8"):
        run(model, steps=6, ema_decay=0.8, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"ema_decay: checkpoint 0.9, now None"):
        run(model, steps=6, checkpoint_dir=tmp_path, resume=True)


def test_warmup_cosine_values_equal_the_hand_formula():
    kw = dict(lr=0.1, steps=20, warmup_steps=4, schedule="cosine", min_lr=0.01)
    assert lr_at(0, **kw) == pytest.approx(0.025, abs=1e-15)
    assert lr_at(1, **kw) == pytest.approx(0.05, abs=1e-15)
    assert lr_at(3, **kw) == pytest.approx(0.1, abs=1e-15)
    assert lr_at(4, **kw) == pytest.approx(0.1, abs=1e-15)  # cos(0): the peak
    assert lr_at(12, **kw) == pytest.approx(0.055, abs=1e-15)  # cos(pi/2): half-way
    assert lr_at(19, **kw) == pytest.approx(0.01 + 0.045 * (1 + math.cos(math.pi * 15 / 16)))
    const = dict(lr=0.1, steps=20, warmup_steps=4)
    assert [lr_at(s, **const) for s in (0, 3, 4, 19)] == [0.025, 0.1, 0.1, 0.1]
    assert lr_at(0, lr=0.1, steps=5, schedule="cosine") == 0.1  # no warm-up: starts at peak


def test_warmup_linear_values_equal_the_hand_formula():
    kw = dict(lr=0.1, steps=20, warmup_steps=4, schedule="linear", min_lr=0.01)
    assert lr_at(0, **kw) == pytest.approx(0.025, abs=1e-15)
    assert lr_at(3, **kw) == pytest.approx(0.1, abs=1e-15)
    assert lr_at(4, **kw) == pytest.approx(0.1, abs=1e-15)  # the decay starts at the peak
    assert lr_at(12, **kw) == pytest.approx(0.055, abs=1e-15)  # half-way: (0.1 + 0.01) / 2
    assert lr_at(19, **kw) == pytest.approx(0.01 + 0.09 / 16, abs=1e-15)  # one step before S
    to_zero = [lr_at(s, lr=0.8, steps=4, schedule="linear") for s in range(4)]
    assert to_zero == pytest.approx([0.8, 0.6, 0.4, 0.2], abs=1e-15)  # ends one step above 0
    # linear lies below the cosine in the first half of the decay, above it in the second
    both = dict(lr=0.1, steps=20, warmup_steps=4, min_lr=0.01)
    assert lr_at(8, schedule="linear", **both) < lr_at(8, schedule="cosine", **both)
    assert lr_at(16, schedule="linear", **both) > lr_at(16, schedule="cosine", **both)


def test_lr_at_rejects_a_step_outside_the_run():
    with pytest.raises(ValueError, match=r"step must be an int in \[0, steps=5\), got 5"):
        lr_at(5, lr=0.1, steps=5)


def test_gradient_clipping_caps_the_total_norm(model):
    clip = 1e-3
    for steps in (1, 3):
        result = run(model, steps=steps, grad_clip=clip)
        # the last update's gradients stay on the parameters, as after optimizer.step()
        grads = [p.grad for p in result.model.parameters()]
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        assert result.history.grad_norm[-1] > 10 * clip  # the cap was active
        assert total.item() == pytest.approx(clip, rel=1e-6)
    unclipped = run(model, steps=1)
    grads = [p.grad for p in unclipped.model.parameters()]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert unclipped.history.grad_norm == [total.item()]


# --- checkpoints and resume ---------------------------------------------------------------


def test_resume_after_a_crash_is_bit_identical(model, eval_set, tmp_path):
    kw = dict(steps=12, lr=2e-2, warmup_steps=3, schedule="cosine", grad_clip=1.0,
              eval_data=eval_set, eval_every=5, checkpoint_every=4)  # fmt: skip
    full = run(model, checkpoint_dir=tmp_path / "full", **kw)
    with pytest.raises(Crash):
        run(model, checkpoint_dir=tmp_path / "cut", callback=crash_at(6), **kw)
    assert latest_checkpoint(tmp_path / "cut").name == "step_00000004"
    resumed = run(model, checkpoint_dir=tmp_path / "cut", resume=True, **kw)
    assert_same_run(full, resumed)
    assert resumed.checkpoint.name == "step_00000012"
    # the final checkpoints agree too, file by file
    for name in ("optimizer.safetensors", "model/model.safetensors", "history.safetensors"):
        a = safetensors.torch.load_file(str(full.checkpoint / name))
        b = safetensors.torch.load_file(str(resumed.checkpoint / name))
        assert a.keys() == b.keys()
        for key in a:
            if key != "wall_time":
                assert torch.equal(a[key], b[key]), (name, key)


def test_resume_of_a_stream_is_bit_identical(model, tmp_path):
    kw = dict(steps=9, checkpoint_every=3)
    full = run(model, stream(), checkpoint_dir=tmp_path / "full", **kw)
    with pytest.raises(Crash):
        run(model, stream(), checkpoint_dir=tmp_path / "cut", callback=crash_at(7), **kw)
    resumed = run(model, stream(), checkpoint_dir=tmp_path / "cut", resume=True, **kw)
    assert_same_run(full, resumed)


def test_resume_restores_the_global_rng(model, tmp_path):
    """Data drawing from torch's global generator resumes exactly too."""

    def noisy(step, gen):
        x, t, m = make_batch(step, gen)
        return x, t + 0.1 * torch.randn(t.shape, dtype=F64), m

    kw = dict(steps=6, checkpoint_every=2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        full = run(model, noisy, checkpoint_dir=tmp_path / "full", **kw)
        torch.manual_seed(0)
        with pytest.raises(Crash):
            run(model, noisy, checkpoint_dir=tmp_path / "cut", callback=crash_at(3), **kw)
        torch.manual_seed(1)  # the new process starts elsewhere
        resumed = run(model, noisy, checkpoint_dir=tmp_path / "cut", resume=True, **kw)
    assert_same_run(full, resumed)


def test_resume_of_a_partly_consumed_stream_is_refused(model, tmp_path):
    run(model, stream(), steps=4, checkpoint_dir=tmp_path)
    used = stream()
    next(used)
    with pytest.raises(ValueError, match="batch 3 of data differs from the one the checkpoint"):
        run(model, used, steps=6, checkpoint_dir=tmp_path, resume=True)


def test_resume_extends_a_constant_schedule_exactly(model, tmp_path):
    full = run(model, steps=10)
    run(model, steps=6, checkpoint_dir=tmp_path)
    extended = run(model, steps=10, checkpoint_dir=tmp_path, resume=True)
    assert_same_run(full, extended)


def test_resume_at_the_last_step_trains_no_more(model, tmp_path):
    first = run(model, steps=5, checkpoint_dir=tmp_path)
    again = run(model, steps=5, checkpoint_dir=tmp_path, resume=True)
    assert_same_run(first, again)


def test_resume_without_a_checkpoint_starts_afresh(model, tmp_path):
    assert_same_run(run(model, steps=4), run(model, steps=4, checkpoint_dir=tmp_path, resume=True))


def test_crash_mid_write_keeps_the_previous_checkpoint(model, tmp_path, monkeypatch):
    kw = dict(steps=8, checkpoint_every=2, checkpoint_dir=tmp_path)
    real_save_file = checkpoint_module.save_file

    def failing_save_file(tensors, filename, *args, **kwargs):
        # the model and optimizer of step 4 are already on disk when the history fails
        if ".step_00000004." in filename and filename.endswith("history.safetensors"):
            raise Crash("killed mid-write")
        return real_save_file(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_file", failing_save_file)
    with pytest.raises(Crash, match="killed mid-write"):
        run(model, **kw)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["step_00000002"]  # no partial step 4 anywhere
    kept = latest_checkpoint(tmp_path)
    assert vi.load(kept / "model").cfg == CFG
    # a killed process leaves its staging directory behind: the next run ignores it
    (tmp_path / ".step_00000004.leftover.tmp").mkdir()
    (tmp_path / ".step_00000004.leftover.tmp" / "trainer.json").write_text("{")
    resumed = run(model, resume=True, **kw)
    assert_same_run(run(model, steps=8), resumed)
    assert sorted(os.listdir(tmp_path)) == ["step_00000006", "step_00000008"]


def test_checkpoint_files_are_safetensors_and_json(model, tmp_path):
    result = run(model, steps=3, checkpoint_dir=tmp_path)
    path = result.checkpoint
    assert path == tmp_path / "step_00000003"
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert files == ["history.safetensors", "model/config.json", "model/model.safetensors",
                     "optimizer.safetensors", "rng.safetensors", "trainer.json"]  # fmt: skip
    optimizer = safetensors.torch.load_file(str(path / "optimizer.safetensors"))
    n_params = len(list(model.parameters()))
    assert set(optimizer) == {
        f"state.{i}.{k}" for i in range(n_params) for k in ("exp_avg", "exp_avg_sq", "step")
    }
    assert set(safetensors.torch.load_file(str(path / "rng.safetensors"))) == {
        "torch_cpu", "data_generator"
    }  # fmt: skip
    loaded = vi.load(path / "model")
    for (name, p), q in zip(loaded.state_dict().items(), result.model.state_dict().values()):
        assert torch.equal(p, q), name


def test_keep_last_prunes_old_checkpoints(model, tmp_path):
    run(model, steps=5, checkpoint_every=1, keep_last=2, checkpoint_dir=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["step_00000004", "step_00000005"]
    run(model, steps=3, checkpoint_every=1, keep_last=None, checkpoint_dir=tmp_path / "all")
    assert len(os.listdir(tmp_path / "all")) == 3


def test_history_round_trips_through_tensors_exactly():
    history = TrainHistory([0, 1], [0.1, 1 / 3], [1e-3, 2e-3], [2.5, 0.7], [0.01, 0.02],
                           [0, 2], [math.pi, 1e-300])  # fmt: skip
    assert TrainHistory.from_tensors(history.to_tensors()) == history


# --- divergence ---------------------------------------------------------------------------


def poisoned(bad_step: int, position: int):
    def data(step, gen):
        x, t, m = make_batch(step, gen)
        if step == bad_step:
            t = t.clone()
            t[0, position, 0] = math.inf
        return x, t, m

    return data


def test_non_finite_loss_stops_naming_the_step(model, tmp_path):
    with pytest.raises(TrainingDivergedError, match="the loss is inf at step 3") as info:
        run(model, poisoned(3, position=2), checkpoint_every=1, checkpoint_dir=tmp_path)
    assert isinstance(info.value, FloatingPointError)
    assert info.value.step == 3
    assert info.value.checkpoint == tmp_path / "step_00000003"
    assert "step_00000003" in str(info.value)
    # the last good checkpoint is intact and holds the weights of 3 clean updates
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000003"
    clean = run(model, steps=3)
    kept = vi.load(tmp_path / "step_00000003" / "model")
    for (name, p), q in zip(kept.state_dict().items(), clean.model.state_dict().values()):
        assert torch.equal(p, q), name


def test_inf_at_a_masked_out_position_is_ignored(model):
    assert_same_run(run(model, poisoned(3, position=0), steps=5), run(model, steps=5))


def test_non_finite_eval_loss_stops_training(model):
    values = iter([1.0, math.nan])  # the initial evaluation is fine, the one at step 2 not
    with pytest.raises(TrainingDivergedError, match="the eval loss is nan at step 2"):
        run(model, eval_data=lambda m: next(values), eval_every=2)


# --- evaluation ---------------------------------------------------------------------------


def test_evaluate_weights_every_batch_equally(model):
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    with torch.no_grad():
        y = model(x)
    mask = torch.tensor([False, True, True, True])
    first = (x, y + 1.0, mask)  # MSE 1 over 6 scored positions
    second = (x[:1, :2], y[:1, :2] + 2.0)  # MSE 4 over 2 positions
    assert evaluate(model, [first, second]) == pytest.approx(2.5, abs=1e-12)
    assert evaluate(model, first) == pytest.approx(1.0, abs=1e-12)
    assert evaluate(model, iter([second, first]), n_batches=1) == pytest.approx(4.0, abs=1e-12)
    assert model.training  # the mode is restored


def test_evaluate_casts_batches_to_the_model_dtype(model):
    batch = make_batch(0, torch.Generator().manual_seed(0))
    as_f32 = tuple(t.float() if t.is_floating_point() else t for t in batch)
    assert evaluate(model, as_f32) == pytest.approx(evaluate(model, batch), rel=1e-6)


def test_eval_callable_runs_at_the_right_steps(model):
    calls = []

    def eval_fn(m):
        calls.append(m.training)
        return 0.5

    result = run(model, steps=7, eval_data=eval_fn, eval_every=3)
    assert result.history.eval_steps == [0, 3, 6, 7]
    assert result.history.eval_loss == [0.5] * 4


# --- the affine-recurrence task, end to end -----------------------------------------------


def test_affine_recurrence_trains_and_resumes(tmp_path):
    cfg = tiny_cfg(d_in=4, d_out=4, n_ctx=14)
    model = random_model(cfg, scale=0.1)
    evals = ar.fixed_eval_set(2, 4, seed=1, dim=4, dtype=F64)
    kw = dict(steps=6, lr=1e-2, eval_data=evals, checkpoint_every=2)

    def fresh():
        return ar.batches(4, seed=0, dim=4, dtype=F64)

    full = run(model, fresh(), checkpoint_dir=tmp_path / "full", **kw)
    assert all(math.isfinite(v) for v in full.history.train_loss + full.history.eval_loss)
    with pytest.raises(Crash):
        run(model, fresh(), checkpoint_dir=tmp_path / "cut", callback=crash_at(3), **kw)
    resumed = run(model, fresh(), checkpoint_dir=tmp_path / "cut", resume=True, **kw)
    assert_same_run(full, resumed)
    # the callable form: same batches as the stream, drawn from the loop's own generator
    del kw["checkpoint_every"]
    as_callable = run(model, lambda s, g: ar.generate(4, dim=4, generator=g, dtype=F64), **kw)
    assert_same_run(full, as_callable)


# --- device and progress ------------------------------------------------------------------


def test_default_device():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device() == torch.device(expected)


def test_device_none_picks_the_default(model):
    result = train(model, make_batch, steps=1, lr=1e-3, progress=False)
    assert result.device == default_device()
    assert result.model.embed.W_E.device.type == default_device().type


def test_progress_bar_shows_the_running_loss(model, capsys):
    result = run(model, steps=4, progress=True, log_every=2)
    err = capsys.readouterr().err
    expected = sum(result.history.train_loss[2:4]) / 2
    assert f"loss={expected:.3e}" in err
    assert "4/4" in err


# --- bad arguments ------------------------------------------------------------------------

BAD = [
    (dict(steps=0), ValueError, "steps must be an int >= 1, got 0"),
    (dict(steps=2.5), ValueError, "steps must be an int >= 1, got 2.5"),
    (dict(lr=0.0), ValueError, "lr must be a finite number > 0, got 0.0"),
    (dict(lr=-1e-3), ValueError, "lr must be a finite number > 0, got -0.001"),
    (dict(lr=math.nan), ValueError, "lr must be a finite number > 0, got nan"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay must be a finite number >= 0"),
    (dict(betas=(1.0, 0.9)), ValueError, "betas must be a pair of numbers in [0, 1)"),
    (dict(eps=0.0), ValueError, "eps must be a finite number > 0"),
    (dict(warmup_steps=9), ValueError, "warmup_steps must be <= steps=8, got 9"),
    (dict(warmup_steps=-1), ValueError, "warmup_steps must be an int >= 0, got -1"),
    (dict(schedule="step"), ValueError, "schedule must be one of ('constant', 'cosine', 'linear')"),
    (dict(schedule="cosine", min_lr=1.0), ValueError, "min_lr must be a number in [0, lr=0.01]"),
    (dict(min_lr=1e-4), ValueError, "min_lr applies only to a decaying schedule"),
    (dict(schedule="linear", min_lr=1.0), ValueError, "min_lr must be a number in [0, lr=0.01]"),
    (dict(grad_clip=0.0), ValueError, "grad_clip must be a finite number > 0"),
    (dict(eval_every=5), ValueError, "eval_every needs eval_data"),
    (dict(checkpoint_every=5), ValueError, "checkpoint_every needs checkpoint_dir"),
    (dict(keep_last=0, checkpoint_dir="x"), ValueError, "keep_last must be an int >= 1, got 0"),
    (dict(resume=True), ValueError, "resume=True needs checkpoint_dir"),
    (dict(resume=1), TypeError, "resume must be True or False, got 1"),
    (dict(seed=-1), ValueError, "seed must be an int in [0, 2**64), got -1"),
    (dict(log_every=0), ValueError, "log_every must be an int >= 1, got 0"),
    (dict(progress="yes"), TypeError, "progress must be True or False"),
    (dict(callback=3), TypeError, "callback must be callable(step, metrics), got int"),
    (dict(device="gpu"), ValueError, "device must be a torch device such as 'cpu'"),
    (dict(data=3), TypeError, "data must be an iterable of batches or a callable make_batch"),
    (dict(data=(torch.zeros(1, 2, 3), torch.zeros(1, 2, 5))), TypeError,
     "data is a single batch; pass an iterable of batches (itertools.repeat(batch)"),
    (dict(eval_data=iter([])), ValueError, "eval_data is an iterator, which would be used up"),
    (dict(eval_data=[]), ValueError, "eval_data holds no batch"),
    (dict(eval_data=3), TypeError, "eval_data must be a batch or an iterable of batches"),
    (dict(ema_decay=1.0), ValueError, "ema_decay must be a number in (0, 1) or None, got 1.0"),
    (dict(ema_decay=0.0), ValueError, "ema_decay must be a number in (0, 1) or None, got 0.0"),
    (dict(ema_decay=True), ValueError, "ema_decay must be a number in (0, 1) or None, got True"),
    (dict(ema_start=2), ValueError, "ema_start needs ema_decay"),
    (dict(ema_decay=0.9, ema_start=-1), ValueError, "ema_start must be an int >= 0, got -1"),
    (dict(ema_decay=0.9, ema_start=8), ValueError, "ema_start must be < steps=8, got 8"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD, ids=[m for _, _, m in BAD])
def test_bad_argument(model, tmp_path, kwargs, error, message):
    kwargs = dict(kwargs)
    if kwargs.get("checkpoint_dir") == "x":
        kwargs["checkpoint_dir"] = tmp_path
    with unchecked(), pytest.raises(error, match=re.escape(message)):
        run(model, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda(model):
    with pytest.raises(ValueError, match=re.escape("device='cuda' but CUDA is not available")):
        run(model, device="cuda")


def test_model_must_be_a_vector_transformer():
    with unchecked(), pytest.raises(TypeError, match="model must be a HookedVectorTransformer"):
        run(torch.nn.Linear(3, 5))


def test_data_that_runs_out(model):
    with pytest.raises(ValueError, match="data ran out at step 3: it gave 3 batches"):
        run(model, [make_batch(0, torch.Generator())] * 3)


def test_batch_of_the_wrong_form(model):
    with pytest.raises(TypeError, match=r"make_batch\(0, ...\) must be an object with \.inputs"):
        run(model, lambda s, g: "not a batch")
    with pytest.raises(TypeError, match="batch 0 of data: loss_mask must be a bool"):
        run(model, itertools.repeat((torch.zeros(1, 2, 3), torch.zeros(1, 2, 5), torch.ones(2))))


def test_eval_callable_returning_a_non_number(model):
    with pytest.raises(TypeError, match="eval_data\\(model\\) must return a number, got str"):
        run(model, eval_data=lambda m: "low")


def test_existing_checkpoints_need_resume(model, tmp_path):
    run(model, steps=2, checkpoint_dir=tmp_path)
    with pytest.raises(FileExistsError, match="already holds checkpoints .newest: step_00000002"):
        run(model, steps=2, checkpoint_dir=tmp_path)


def test_resume_with_another_config_is_refused(model, tmp_path):
    run(model, steps=4, checkpoint_dir=tmp_path, schedule="cosine")
    with pytest.raises(ValueError, match=re.escape("lr: checkpoint 0.01, now 0.02")):
        run(model, steps=4, lr=2e-2, checkpoint_dir=tmp_path, resume=True, schedule="cosine")
    with pytest.raises(ValueError, match=re.escape("steps: checkpoint 4, now 6")):
        run(model, steps=6, checkpoint_dir=tmp_path, resume=True, schedule="cosine")
    other = random_model(tiny_cfg(d_model=12, d_head=6))
    with pytest.raises(ValueError, match="it was trained with a different config .model:"):
        run(other, steps=4, checkpoint_dir=tmp_path, resume=True, schedule="cosine")


def test_resume_past_the_end_is_refused(model, tmp_path):
    run(model, steps=4, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="it is at step 4 > steps=3"):
        run(model, steps=3, checkpoint_dir=tmp_path, resume=True)


def test_evaluate_bad_input(model):
    with pytest.raises(ValueError, match="data is an iterator, which may be endless"):
        evaluate(model, stream())
    with pytest.raises(ValueError, match="n_batches must be an int >= 1 or None, got 0"):
        evaluate(model, [make_batch(0, torch.Generator())], n_batches=0)
    with pytest.raises(ValueError, match="data holds no batch"):
        evaluate(model, [])


def test_an_unreadable_checkpoint_is_reported(model, tmp_path):
    run(model, steps=2, checkpoint_dir=tmp_path)
    (tmp_path / "step_00000002" / "trainer.json").write_text("{not json")
    with pytest.raises(ValueError, match="trainer.json is not a readable checkpoint record"):
        run(model, steps=4, checkpoint_dir=tmp_path, resume=True)


def test_checkpoint_dir_may_be_a_string(model, tmp_path):
    result = run(model, steps=2, checkpoint_dir=str(tmp_path))
    assert result.checkpoint == Path(tmp_path) / "step_00000002"


# --- docs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["loop", "data", "schedule", "checkpoint", "result", "setup"])
def test_docstring_examples_run(name):
    module = importlib.import_module(f"vecinterp.training.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_gradient_norm_is_the_norm_of_the_per_tensor_norms_to_the_bit():
    from vecinterp.training.loop import _grad_norm

    model = random_model(tiny_cfg(), dtype=torch.float32)
    x = random_input(model.cfg, dtype=torch.float32)
    model(x, targets=torch.zeros(3, 7, 5), return_type="loss").backward()
    params = list(model.parameters())
    by_definition = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
    )
    assert torch.equal(_grad_norm(params, None), by_definition)
    # and what clip_grad_norm_ reports (the grad_clip path), clipping nothing
    assert torch.equal(_grad_norm(params, 1e30), by_definition)
