"""Ensembles: each member equals vi.train of the same model, seed, data and lr (float64, to
rounding), the batched pieces equal their one-model definitions, divergence of one member,
checkpoints and exact resume, and one clear error per bad argument. One file: the tests of
one function and its batched pieces, in sections."""

import itertools
import json
import math

import pytest
import torch

import vecinterp as vi
from helpers import ACT_FNS, NORMALIZATIONS, POSITIONALS, random_model, tiny_cfg, unchecked
from vecinterp.training import _ensemble_checkpoint as ensemble_checkpoint
from vecinterp.training import _stacked as stacked
from vecinterp.training._stacked import (
    adamw_step,
    clip_per_member,
    forward,
    masked_losses,
    stack_weights,
)
from vecinterp.training.checkpoint import own_directory

F64 = torch.float64
CFG = tiny_cfg()  # d_in=3, d_out=5, n_ctx=7, 2 layers
MAP = torch.linspace(-1.0, 1.0, 15, dtype=F64).reshape(3, 5)
CPU = torch.device("cpu")
RECIPE = dict(
    steps=20, warmup_steps=3, schedule="cosine", min_lr=1e-4, grad_clip=0.5,
    weight_decay=0.1, progress=False, device="cpu",
)  # fmt: skip
LRS = [1e-2, 1e-2, 3e-3]


def short(steps: int) -> dict:
    return dict(RECIPE, steps=steps, warmup_steps=1)


class Crash(Exception):
    """Stands for the process being killed."""


def make_batch(step: int, gen: torch.Generator):
    """targets = inputs @ MAP, scored from position 1 on."""
    x = torch.randn(4, 5, 3, generator=gen, dtype=F64)
    return x, x @ MAP, torch.arange(5).ge(1).expand(4, 5)


def blows_up_at(bad_step: int, value: float = 1e200):
    """make_batch whose targets at ``bad_step`` are finite but so large the loss is inf."""

    def make(step: int, gen: torch.Generator):
        x, t, mask = make_batch(step, gen)
        return x, (t + value if step == bad_step else t), mask

    return make


def crash_at(step: int):
    def callback(s: int, metrics: list) -> None:
        if s == step:
            raise Crash

    return callback


@pytest.fixture
def models():
    return [random_model(CFG, seed=s) for s in range(3)]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-10) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], rtol=0, atol=atol, msg=name)


def assert_same_history(a: vi.TrainHistory, b: vi.TrainHistory, tol: float = 1e-12) -> None:
    assert a.steps == b.steps and a.eval_steps == b.eval_steps
    for field in ("train_loss", "lr", "grad_norm", "eval_loss"):
        x, y = getattr(a, field), getattr(b, field)
        assert len(x) == len(y), field
        assert all(math.isclose(u, v, rel_tol=tol, abs_tol=tol) for u, v in zip(x, y)), field


def assert_identical(a: vi.EnsembleResult, b: vi.EnsembleResult) -> None:
    """Bit for bit: weights, optimizer state, histories (all but the wall time)."""
    for ra, rb in zip(a, b, strict=True):
        for x, y in zip(ra.model.state_dict().values(), rb.model.state_dict().values()):
            assert torch.equal(x, y)
        sa, sb = ra.optimizer.state_dict()["state"], rb.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for j in sa:
            assert all(torch.equal(sa[j][key], sb[j][key]) for key in sa[j])
        for field in ("steps", "train_loss", "lr", "grad_norm", "eval_steps", "eval_loss"):
            assert getattr(ra.history, field) == getattr(rb.history, field)
    assert [str(e) for e in a.diverged] == [str(e) for e in b.diverged]


# --- each member equals vi.train of the same model, seed, data and lr -----------------------


def test_each_member_equals_train_alone(models):
    eval_set = [make_batch(0, torch.Generator().manual_seed(99))]
    kw = dict(RECIPE, eval_data=eval_set, eval_every=5)
    out = vi.train_ensemble(models, make_batch, lr=LRS, seed=[0, 1, 2], **kw)
    assert len(out) == 3 and out.diverged == [None] * 3
    for i, model in enumerate(models):
        alone = vi.train(model, make_batch, lr=LRS[i], seed=i, **kw)
        assert_same_weights(out[i].model, alone.model)
        assert_same_history(out[i].history, alone.history)
        # the optimizer holds what torch's AdamW holds after the same updates
        mine, theirs = out[i].optimizer.state_dict(), alone.optimizer.state_dict()
        assert mine["param_groups"][0]["lr"] == theirs["param_groups"][0]["lr"]
        for j, state in theirs["state"].items():
            assert float(mine["state"][j]["step"]) == float(state["step"]) == 20
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(mine["state"][j][key], state[key], rtol=0, atol=1e-10)
    # the members differ from each other: their seeds and lrs were used
    assert not torch.equal(out[0].model.W_E, out[1].model.W_E)
    assert out[0].history.train_loss != out[1].history.train_loss


def test_one_member_equals_train_with_a_stream_and_a_weight_average(models):
    def stream():
        gen = torch.Generator().manual_seed(5)
        return (make_batch(s, gen) for s in itertools.count())

    kw = dict(RECIPE, ema_decay=0.8, ema_start=4, lr=1e-2)
    out = vi.train_ensemble(models[:1], stream(), **kw)
    alone = vi.train(models[0], stream(), **kw)
    assert_same_weights(out[0].model, alone.model)
    assert_same_weights(out[0].raw_model, alone.raw_model)
    assert out[0].model is not out[0].raw_model
    assert_same_history(out[0].history, alone.history)


def test_one_data_source_per_member(models):
    def stream(seed):
        gen = torch.Generator().manual_seed(seed)
        return (make_batch(s, gen) for s in itertools.count())

    data = [stream(10), make_batch, stream(12)]
    out = vi.train_ensemble(models, data, lr=1e-2, seed=[0, 7, 0], **RECIPE)
    for i, d in enumerate([stream(10), make_batch, stream(12)]):
        alone = vi.train(models[i], d, lr=1e-2, seed=[0, 7, 0][i], **RECIPE)
        assert_same_weights(out[i].model, alone.model)


def test_one_seed_for_all_members_gives_them_the_same_batches(models):
    seen = []
    out = vi.train_ensemble(
        models[:2], lambda s, g: seen.append(g.initial_seed()) or make_batch(s, g), lr=1e-2,
        seed=3, **short(2),
    )  # fmt: skip
    assert seen == [3, 3, 3, 3]
    assert out[0].history.train_loss != out[1].history.train_loss  # other initial weights


def test_the_results_are_ordinary_independent_models(models):
    out = vi.train_ensemble(models, make_batch, lr=1e-2, **short(3))
    before = out[1].model.W_E.detach().clone()
    with torch.no_grad():
        out[0].model.W_E.add_(1.0)
    assert torch.equal(out[1].model.W_E, before)
    x = torch.randn(2, 5, 3, dtype=F64)
    y, cache = out[2].model.run_with_cache(x)  # hook points of its own
    assert torch.equal(y, out[2].model(x)) and "blocks.0.attn.hook_pattern" in cache
    assert all(not torch.equal(a.W_E, b.W_E) for a, b in zip(models, out.models))  # copies


def test_callback_gets_one_metrics_dict_per_member(models):
    calls = []
    vi.train_ensemble(models[:2], make_batch, lr=1e-2, callback=lambda s, m: calls.append((s, m)),
                      **short(2))  # fmt: skip
    assert [s for s, _ in calls] == [0, 1]
    assert all(len(m) == 2 and set(m[0]) == {"loss", "lr", "grad_norm"} for _, m in calls)


def test_progress_bar_shows_the_members_mean_loss(models, capsys):
    out = vi.train_ensemble(models[:2], make_batch, lr=1e-2, log_every=2,
                            **dict(short(4), progress=True))  # fmt: skip
    err = capsys.readouterr().err
    mean = sum(sum(h.train_loss[2:4]) / 2 for h in out.histories) / 2
    assert f"loss={mean:.3e}" in err and "4/4" in err and "train x2" in err


# --- the batched pieces equal their one-model definitions ---------------------------------

VARIANTS = (
    [dict(positional=p) for p in POSITIONALS]
    + [dict(normalization=n) for n in NORMALIZATIONS]
    + [dict(act_fn=a) for a in ACT_FNS]
    + [dict(attn_only=True), dict(causal=False), dict(embed_bias=True), dict(d_head=3)]
)


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: "-".join(map(str, o.values())))
def test_batched_forward_equals_each_models_forward(overrides):
    cfg = tiny_cfg(**overrides)
    members = [random_model(cfg, seed=s) for s in range(3)]
    x = torch.randn(3, 2, 6, 3, generator=torch.Generator().manual_seed(7), dtype=F64)
    out = forward(cfg, stack_weights(members, CPU), x)
    for i, m in enumerate(members):
        # float64, the same sums associated differently (batched matmuls): a few ulps of the
        # output's size, which without normalisation reaches ~100 (relative, not absolute)
        torch.testing.assert_close(out[i], m(x[i]), rtol=1e-13, atol=1e-12)


def test_masked_losses_by_hand():
    out = torch.zeros(2, 1, 3, 2, dtype=F64)
    targets = torch.tensor([[[[1.0, 1.0], [2.0, 0.0], [9.0, 9.0]]],
                            [[[0.0, 4.0], [0.0, 0.0], [3.0, 3.0]]]], dtype=F64)  # fmt: skip
    mask = torch.tensor([[[True, True, False]], [[True, False, True]]])
    # member 0: ((1+1)/2 + (4+0)/2) / 2 = 1.5; member 1: ((0+16)/2 + (9+9)/2) / 2 = 8.5
    assert masked_losses(out, targets, mask).tolist() == [1.5, 8.5]


def test_clipping_is_per_member_by_hand():
    # member 0: total norm 5 (3, 4 in two tensors), clipped to 1; member 1: 0.5, kept
    grads = [torch.tensor([[3.0], [0.3]], dtype=F64), torch.tensor([[[4.0]], [[0.4]]], dtype=F64)]
    norms = clip_per_member(grads, 1.0)
    assert torch.allclose(norms, torch.tensor([5.0, 0.5], dtype=F64), rtol=0, atol=1e-15)
    scale = 1.0 / (5.0 + 1e-6)
    assert grads[0].flatten().tolist() == [3.0 * scale, 0.3]
    assert grads[1].flatten().tolist() == [4.0 * scale, 0.4]


@pytest.mark.parametrize("lrs", [[1e-2, 3e-3, 1.0], [1e-2, 3e-3, 1e-2], [3e-3] * 3])
@pytest.mark.parametrize("fused", [True, False])
def test_adamw_step_equals_torch_adamw_per_member(fused, lrs, monkeypatch):
    if not fused:  # the fallback for devices and dtypes without torch's fused kernel
        monkeypatch.setattr(stacked, "fused_available", lambda t: False)
    else:
        assert stacked.fused_available(torch.zeros(1, dtype=F64))
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 4, 5), (3, 7)]
    params = [torch.randn(s, generator=gen, dtype=F64) for s in shapes]
    refs = [[p[i].clone().requires_grad_() for p in params] for i in range(3)]
    opts = [
        torch.optim.AdamW(r, lr=lr, weight_decay=0.1, foreach=False) for r, lr in zip(refs, lrs)
    ]
    avgs, sqs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    for step in range(1, 6):
        grads = [torch.randn(s, generator=gen, dtype=F64) for s in shapes]
        grads[0] = grads[0].transpose(1, 2).contiguous().transpose(1, 2)  # strided, as
        assert not grads[0].is_contiguous()  # autograd.grad returns some
        adamw_step(params, grads, avgs, sqs, step=step, lrs=lrs,
                   weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)  # fmt: skip
        for i, (ref, opt) in enumerate(zip(refs, opts)):
            for r, g in zip(ref, grads):
                r.grad = g[i].clone()
            opt.step()
    for i, ref in enumerate(refs):
        for p, r in zip(params, ref):
            torch.testing.assert_close(p[i], r.detach(), rtol=0, atol=1e-15)


# --- divergence of one member -------------------------------------------------------------


def test_a_diverging_member_is_frozen_and_the_others_train_on(models):
    kw = dict(RECIPE, schedule="constant", min_lr=0.0, warmup_steps=0)
    data = [make_batch, blows_up_at(3), make_batch]
    out = vi.train_ensemble(models, data, lr=1e-2, seed=[0, 1, 2], **kw)
    err = out.diverged[1]
    assert out.diverged[0] is None and out.diverged[2] is None
    assert isinstance(err, vi.TrainingDivergedError)
    assert (err.step, err.quantity, err.value) == (3, "loss", math.inf)
    assert str(err).startswith("ensemble member 1: training diverged: the loss is inf at step 3")
    assert len(out[1].history.train_loss) == 3 and len(out[0].history.train_loss) == 20
    # member 1 is its state after 3 updates; the others are untouched by its divergence
    frozen = vi.train(models[1], data[1], lr=1e-2, seed=1, **dict(kw, steps=3))
    assert_same_weights(out[1].model, frozen.model)
    assert float(out[1].optimizer.state_dict()["state"][0]["step"]) == 3
    for i in (0, 2):
        assert_same_weights(
            out[i].model, vi.train(models[i], make_batch, lr=1e-2, seed=i, **kw).model
        )


def test_on_divergence_raise_stops_the_ensemble_naming_the_member(models):
    data = [make_batch, make_batch, blows_up_at(2)]
    with pytest.raises(vi.TrainingDivergedError, match="^ensemble member 2: .* at step 2") as info:
        vi.train_ensemble(models, data, lr=1e-2, on_divergence="raise", **RECIPE)
    assert info.value.step == 2


def test_when_every_member_diverged_the_ensemble_raises(models):
    data = [blows_up_at(1), blows_up_at(4)]
    with pytest.raises(vi.TrainingDivergedError, match="every member of the ensemble diverged "
                       r"\(member 0 at step 1, member 1 at step 4\)") as info:  # fmt: skip
        vi.train_ensemble(models[:2], data, lr=1e-2, **RECIPE)
    assert info.value.step == 4


def test_nan_targets_stop_the_ensemble_naming_member_and_batch(models):
    def bad(step, gen):
        x, t, mask = make_batch(step, gen)
        if step == 2:
            t[1, 3, 0] = math.nan
        return x, t, mask

    with pytest.raises(vi.TrainingDivergedError, match=r"^ensemble member 1: .*make_batch\(2, "
                       r"\.\.\.\): targets contain NaN or inf .* \[1, 3, 0\]"):  # fmt: skip
        vi.train_ensemble(models[:2], [make_batch, bad], lr=1e-2, **RECIPE)


def test_non_finite_eval_loss_stops_the_ensemble(models):
    calls = itertools.count()
    fn = lambda m: math.nan if next(calls) == 4 else 1.0  # noqa: E731 - member 1 at step 1
    with pytest.raises(vi.TrainingDivergedError, match="^ensemble member 1: .*eval loss"):
        vi.train_ensemble(models[:3], make_batch, lr=1e-2, eval_data=fn, eval_every=1, **RECIPE)


# --- checkpoints and resume ----------------------------------------------------------------


def test_resume_after_a_crash_is_bit_identical_with_a_frozen_member(models, tmp_path):
    data = [make_batch, blows_up_at(3), make_batch]
    kw = dict(RECIPE, lr=LRS, seed=[0, 1, 2], checkpoint_every=5, keep_last=1, ema_decay=0.9)
    whole = vi.train_ensemble(models, data, checkpoint_dir=tmp_path / "whole", **kw)
    run = tmp_path / "run"
    with pytest.raises(Crash):
        vi.train_ensemble(models, data, checkpoint_dir=run, callback=crash_at(12), **kw)
    assert json.loads((run / "ensemble.json").read_text())["step"] == 10
    resumed = vi.train_ensemble(models, data, checkpoint_dir=run, resume=True, **kw)
    assert whole.diverged[1] is not None and whole.diverged[1].step == 3
    assert_identical(whole, resumed)
    assert [r.checkpoint.name for r in resumed] == ["step_00000020"] * 3
    assert sorted(p.name for p in run.iterdir()) == [
        "ensemble.json", "member_000", "member_001", "member_002",
    ]  # fmt: skip
    assert [p.name for p in (run / "member_001").iterdir()] == ["step_00000020"]


def test_a_crash_between_members_resumes_from_the_last_complete_step(models, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    kw = dict(RECIPE, lr=1e-2, seed=[0, 1, 2], checkpoint_every=5, keep_last=1)
    whole = vi.train_ensemble(models, make_batch, checkpoint_dir=tmp_path / "whole", **kw)
    run = tmp_path / "run"
    real = ensemble_checkpoint.write_checkpoint

    def dies_at_member_1_step_10(directory, step, *args, **kwargs):
        if step == 10 and directory.name == "member_001":
            raise Crash
        return real(directory, step, *args, **kwargs)

    monkeypatch.setattr(ensemble_checkpoint, "write_checkpoint", dies_at_member_1_step_10)
    with pytest.raises(Crash):
        vi.train_ensemble(models, make_batch, checkpoint_dir=run, **kw)
    monkeypatch.undo()
    # member 0 wrote step 10, but not every member did: the ensemble names step 5
    assert json.loads((run / "ensemble.json").read_text())["step"] == 5
    assert (run / "member_000" / "step_00000010").is_dir()
    assert (run / "member_001" / "step_00000005").is_dir()
    resumed = vi.train_ensemble(models, make_batch, checkpoint_dir=run, resume=True, **kw)
    assert_identical(whole, resumed)


def test_a_members_checkpoint_is_vi_trains(models, tmp_path):
    kw = dict(RECIPE, lr=LRS, seed=[0, 1, 2], checkpoint_every=10, keep_last=None)
    out = vi.train_ensemble(models, make_batch, checkpoint_dir=tmp_path, **kw)
    member = tmp_path / "member_002"
    assert vi.latest_checkpoint(member) == out[2].checkpoint
    assert torch.equal(vi.load(out[2].checkpoint / "model").W_E, out[2].model.W_E)
    # vi.train resumes member 2 alone from its step-10 checkpoint, to the same end
    (member / "step_00000020").rename(tmp_path / "moved_away")
    alone = vi.train(
        models[2],
        make_batch,
        lr=LRS[2],
        seed=2,
        checkpoint_dir=member,
        resume=True,
        **{k: v for k, v in kw.items() if k not in ("lr", "seed")},
    )
    assert alone.history.steps == list(range(20))
    assert_same_weights(alone.model, out[2].model)


def test_existing_checkpoints_need_resume(models, tmp_path):
    kw = dict(short(2), lr=1e-2, checkpoint_dir=tmp_path)
    vi.train_ensemble(models, make_batch, **kw)
    with pytest.raises(FileExistsError, match="resume=True"):
        vi.train_ensemble(models, make_batch, **kw)
    with pytest.raises(ValueError, match="an ensemble of 3 members; this one has 2"):
        vi.train_ensemble(models[:2], make_batch, resume=True, **kw)
    with pytest.raises(ValueError, match="different config .*lr: checkpoint 0.01, now 0.02"):
        vi.train_ensemble(models, make_batch, resume=True, **dict(kw, lr=2e-2))


def test_a_second_run_on_the_directory_is_refused(models, tmp_path):
    owner = own_directory(tmp_path)
    try:
        with pytest.raises(ValueError, match="is in use by another training run"):
            vi.train_ensemble(models, make_batch, lr=1e-2, checkpoint_dir=tmp_path, **RECIPE)
    finally:
        owner.release()
    assert not list(tmp_path.glob("member_*"))


# --- bad arguments ------------------------------------------------------------------------


def test_bad_arguments_are_refused_by_name(models):
    run = lambda ms=models, data=make_batch, **kw: vi.train_ensemble(  # noqa: E731
        ms, data, **{**RECIPE, "lr": 1e-2, **kw}
    )
    other_cfg = random_model(tiny_cfg(n_heads=4), seed=0)
    cases = [
        (dict(ms=[]), ValueError, "models is empty: an ensemble needs K >= 1 members"),
        (dict(ms=models[0]), TypeError, "models must be a list of HookedVectorTransformer"),
        (dict(ms=[models[0], "x"]), TypeError, r"models\[1\] must be a HookedVectorTransformer"),
        (dict(ms=[models[0], other_cfg]), ValueError, r"models\[1\]'s config differs .* n_heads"),
        (dict(ms=[models[0], random_model(CFG, 1, torch.float32)]), ValueError, "one dtype"),
        (dict(lr=[1e-2, 1e-2]), ValueError, "lr has 2 values but the ensemble has 3 members"),
        (dict(lr=[1e-2, math.nan, 1e-2]), ValueError, "lr must be a finite number > 0, got nan"),
        (dict(lr=[1e-2, math.inf, 1e-2]), ValueError, "lr must be a finite number > 0, got inf"),
        (dict(lr=torch.tensor([1e-2] * 3)), TypeError, "not a tensor"),
        (dict(lr=[1e-2, 1e-5, 1e-2], min_lr=1e-4), ValueError, "min_lr must be a number in"),
        (dict(seed=[0, 1]), ValueError, "seed has 2 values but the ensemble has 3 members"),
        (dict(seed=[0, -1, 2]), ValueError, "seed must be an int in"),
        (dict(steps=0), ValueError, "steps must be an int >= 1"),
        (dict(on_divergence="skip"), ValueError, "on_divergence must be one of"),
        (dict(data=[make_batch(0, torch.Generator())] * 5), ValueError, "one iterable of batches"),
        (dict(data=[make_batch, make_batch]), ValueError, "data holds 2 data sources but the"),
        (dict(data=42), TypeError, "data must be an iterable of batches or a callable"),
        (dict(data=make_batch(0, torch.Generator())[:2]), TypeError, "data is a single batch"),
    ]
    for kwargs, error, message in cases:
        with unchecked(), pytest.raises(error, match=message):
            run(**kwargs)


def test_batches_of_other_sizes_are_padded_exactly(models):
    def varying(step, gen):  # a length and a batch size of its own for each member and step
        n, b = (int(torch.randint(lo, hi, (), generator=gen)) for lo, hi in ((2, 8), (1, 5)))
        x = torch.randn(b, n, 3, generator=gen, dtype=F64)
        return x, x @ MAP, None if step % 2 else torch.arange(n).ge(1)

    out = vi.train_ensemble(models, varying, lr=LRS, seed=[0, 1, 2], **RECIPE)
    for i, model in enumerate(models):
        alone = vi.train(model, varying, lr=LRS[i], seed=i, **RECIPE)
        assert_same_weights(out[i].model, alone.model)
        assert_same_history(out[i].history, alone.history)


def test_bad_batches_are_refused_naming_the_member(models):
    def shorter(step, gen):
        x, t, mask = make_batch(step, gen)
        return x[:, :4], t[:, :4], mask[:, :4]

    def nan_inputs(step, gen):
        x, t, mask = make_batch(step, gen)
        x[2, 1, 0] = math.inf
        return x, t, mask

    def wrong_targets(step, gen):
        x, t, mask = make_batch(step, gen)
        return x, t[..., :4], mask

    def wrong_mask(step, gen):
        x, t, mask = make_batch(step, gen)
        return x, t, mask[:, :3]

    cases = [
        (nan_inputs, r"member 1: make_batch\(0, \.\.\.\): inputs contain NaN or inf \(first at "
                     r"index \[2, 1, 0\]\)"),
        (wrong_targets, r"member 1: make_batch\(0, \.\.\.\): targets have shape \(4, 5, 4\)"),
        (wrong_mask, r"member 1: make_batch\(0, \.\.\.\): loss_mask must have shape"),
    ]  # fmt: skip
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            vi.train_ensemble(models[:2], [make_batch, bad], lr=1e-2, **RECIPE)
    bidirectional = [random_model(tiny_cfg(causal=False), seed=s) for s in range(2)]
    with pytest.raises(
        ValueError,
        match=r"member 1: make_batch\(0, \.\.\.\): 4 positions, but "
        "member 0's batch has 5: a non-causal model's batches cannot be padded",
    ):
        vi.train_ensemble(bidirectional, [make_batch, shorter], lr=1e-2, **RECIPE)
