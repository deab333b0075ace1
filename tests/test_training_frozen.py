"""``vi.train(frozen=...)``: frozen parameters keep their bits (no gradient step, no weight
decay, no weight average), the run equals a plain AdamW loop given the other parameters
only, resumes bit for bit, refuses a resume with another frozen set, and refuses each bad
argument naming it; ``train_ensemble`` refuses the option; ``compile=True`` keeps it;
``examples/train_affine.py --freeze`` passes it through and names its runs apart."""

import functools
import importlib.util
import json
from pathlib import Path

import jaxtyping
import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg, unchecked
from vecinterp.tasks import affine_recurrence as ar

F64 = torch.float64
CFG = tiny_cfg()  # d_in=3, d_out=5, n_ctx=7, 2 layers: 38 parameters
MAP = torch.linspace(-1.0, 1.0, 15, dtype=F64).reshape(3, 5)
ROOT = Path(__file__).resolve().parents[1]
B_U = "unembed.b_U"


class Crash(Exception):
    """Stands for the process being killed."""


def make_batch(step: int, gen: torch.Generator):
    """targets = inputs @ MAP + 0.7 (an offset, so that b_U's gradient is far from 0),
    scored from position 1 on."""
    x = torch.randn(4, 5, 3, generator=gen, dtype=F64)
    mask = torch.arange(5).ge(1).expand(4, 5)
    return x, x @ MAP + 0.7, mask


@pytest.fixture
def model() -> vi.HookedVectorTransformer:
    # every parameter random, b_U included: weight decay would visibly shrink it
    return random_model(CFG, scale=0.1)


def run(model, **kwargs) -> vi.TrainResult:
    kwargs = {"steps": 6, "lr": 1e-2, "progress": False, "device": "cpu", **kwargs}
    return vi.train(model, make_batch, **kwargs)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --- what a frozen parameter is --------------------------------------------------------


def test_frozen_parameters_keep_their_bits_and_the_others_train(model):
    """lr 0.5 and weight decay 0.1: one AdamW step moves every trained entry by ~0.5 and
    decays it by 5 %, so a frozen parameter that any of them reached would show it."""
    before = params(model)
    frozen = [B_U, "blocks.1.attn.W_Q"]
    kw = dict(steps=4, lr=0.5, weight_decay=0.1, grad_clip=1.0, ema_decay=0.5)
    result = run(model, frozen=frozen, **kw)
    for trained in (result.model, result.raw_model):  # the average and the last iterate
        for name, p in trained.named_parameters():
            if name in frozen:
                assert torch.equal(p, before[name]), name
            else:
                assert not torch.equal(p, before[name]), name
            assert p.requires_grad, name  # the returned models are like any other
    # the control: the same run without frozen moves both
    plain = run(model, **kw)
    for name in frozen:
        assert not torch.equal(dict(plain.model.named_parameters())[name], before[name])
    # the model passed in: weights and flags as they were
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.requires_grad, name
    # the optimizer holds the trained parameters alone, in the model's order
    held = result.optimizer.param_groups[0]["params"]
    expected = [p for name, p in result.raw_model.named_parameters() if name not in frozen]
    assert len(held) == 36 and all(a is b for a, b in zip(held, expected, strict=True))


def test_no_frozen_parameter_is_the_default_run_and_is_not_recorded(model, tmp_path):
    a = run(model, steps=3, checkpoint_dir=tmp_path / "a")
    b = run(model, steps=3, frozen=[], checkpoint_dir=tmp_path / "b")
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    for run_dir in ("a", "b"):  # older checkpoints, which have no "frozen", still resume
        record = json.loads((tmp_path / run_dir / "step_00000003" / "trainer.json").read_text())
        assert "frozen" not in record["config"]


def test_training_equals_a_plain_adamw_loop_without_the_frozen_parameter(model):
    """The plain loop gives AdamW and clip_grad_norm_ every parameter but b_U (which still
    takes gradients there): bit for bit, the same (fused) AdamW kernel on the same
    gradients. The clipped norm is the trained parameters' norm: with b_U's gradient in
    it, the norm would differ."""
    steps, lr, clip = 6, 5e-2, 0.5
    result = run(model, steps=steps, lr=lr, weight_decay=0.1, grad_clip=clip, seed=5,
                 frozen=B_U)  # fmt: skip
    ref = vi.HookedVectorTransformer(CFG, dtype=F64)
    ref.load_state_dict(model.state_dict())
    trained = [p for name, p in ref.named_parameters() if name != B_U]
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=0.1, fused=True)
    gen = torch.Generator().manual_seed(5)
    norms, with_b_U = [], []
    for s in range(steps):
        x, t, m = make_batch(s, gen)
        opt.zero_grad()
        ref.unembed.b_U.grad = None
        vi.masked_mse(ref(x), t, m).backward()
        every = [p.grad for p in ref.parameters()]
        with_b_U.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in every])).item())
        norms.append(torch.nn.utils.clip_grad_norm_(trained, clip).item())
        opt.step()
    for (name, p), q in zip(result.model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert torch.equal(ref.unembed.b_U, model.unembed.b_U)
    assert result.history.grad_norm == norms
    assert max(norms) > clip  # clipping was exercised
    assert all(abs(a - b) > 1e-3 * b for a, b in zip(with_b_U, norms, strict=True))


# --- checkpoints ------------------------------------------------------------------------


def test_resume_with_frozen_parameters_is_bit_identical(model, tmp_path):
    eval_set = [make_batch(0, torch.Generator().manual_seed(99))]
    kw = dict(steps=8, lr=5e-2, weight_decay=0.1, grad_clip=0.5, ema_decay=0.8, ema_start=2,
              eval_data=eval_set, eval_every=3, checkpoint_every=4,
              frozen=[B_U, lambda name: name.endswith(".ln1.w")])  # fmt: skip
    whole = run(model, checkpoint_dir=tmp_path / "whole", **kw)

    def crash(step: int, metrics: dict) -> None:
        if step == 5:
            raise Crash  # after the checkpoint of step 4

    with pytest.raises(Crash):
        run(model, checkpoint_dir=tmp_path / "cut", callback=crash, **kw)
    resumed = run(model, checkpoint_dir=tmp_path / "cut", resume=True, **kw)
    assert resumed.history.steps == whole.history.steps == list(range(8))
    assert resumed.history.train_loss == whole.history.train_loss
    assert resumed.history.eval_loss == whole.history.eval_loss
    for a, b in ((whole.model, resumed.model), (whole.raw_model, resumed.raw_model)):
        for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q), name
    sa, sb = whole.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for index, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][index][key]), (index, key)
    for name in (B_U, "blocks.0.ln1.w", "blocks.1.ln1.w"):
        before = dict(model.named_parameters())[name]
        assert torch.equal(dict(resumed.model.named_parameters())[name], before), name
        assert torch.equal(dict(resumed.raw_model.named_parameters())[name], before), name


def test_checkpoints_record_the_frozen_set_and_a_resume_with_another_is_refused(model, tmp_path):
    names = ["blocks.0.attn.b_K", "blocks.1.attn.b_K", B_U]
    chosen = [B_U, lambda name: name.endswith("attn.b_K")]
    run(model, steps=2, checkpoint_dir=tmp_path / "a", frozen=chosen)
    record = json.loads((tmp_path / "a" / "step_00000002" / "trainer.json").read_text())
    assert record["config"]["frozen"] == names  # resolved and sorted
    shown = r"\['blocks.0.attn.b_K', 'blocks.1.attn.b_K', 'unembed.b_U'\]"
    for other, now in ((None, r"\[\]"), ([B_U], r"\['unembed.b_U'\]")):
        with pytest.raises(ValueError, match=rf"different config \(frozen: checkpoint {shown}, "
                           rf"now {now}\)"):  # fmt: skip
            run(model, steps=4, checkpoint_dir=tmp_path / "a", resume=True, frozen=other)
    # the same set, chosen another way, resumes
    same = [*reversed(names)]
    resumed = run(model, steps=4, checkpoint_dir=tmp_path / "a", resume=True, frozen=same)
    assert resumed.history.steps == [0, 1, 2, 3]
    # and a run with nothing frozen does not resume with something frozen
    run(model, steps=2, checkpoint_dir=tmp_path / "b")
    with pytest.raises(ValueError, match=r"frozen: checkpoint \[\], now \['unembed.b_U'\]"):
        run(model, steps=4, checkpoint_dir=tmp_path / "b", resume=True, frozen=B_U)


# --- bad arguments ----------------------------------------------------------------------


def _raises(name: str) -> bool:
    raise KeyError(f"no rule for {name}")


BAD = [
    ("unembed.b_u", ValueError,
     r"^frozen: 'unembed.b_u' is not a parameter of the model \(did you mean 'unembed.b_U'\?\)"),
    (["blocks.0.attn.W_q"], ValueError,
     r"^frozen\[0\]: 'blocks.0.attn.W_q' is not a parameter .*'blocks.0.attn.W_Q'"),
    (["W_U"], ValueError, r"its parameters, as model.named_parameters\(\) names them: "
     r"embed.W_E, pos_embed.W_pos, blocks.<i>.ln1.w, .*unembed.b_U \(i = 0..1\)$"),
    ([B_U, "embed.W_E", B_U], ValueError, r"^frozen names the parameter 'unembed.b_U' twice"),
    ([B_U, 3], TypeError, r"^frozen\[1\] must be a parameter name \(str\) or a predicate "
     r"name -> bool, got int 3"),
    ([b"unembed.b_U"], TypeError, r"^frozen\[0\] must be a parameter name \(str\)"),
    (5, TypeError, r"^frozen must be a parameter name, a predicate name -> bool, a list of "
     r"names and predicates, or None; got int"),
    ({B_U: True}, TypeError, r"^frozen must be a parameter name.*got dict"),
    (_raises, ValueError, r"^frozen: the predicate _raises raised KeyError on the parameter "
     r"name 'embed.W_E': 'no rule for embed.W_E'"),
    ([B_U, lambda name: None], TypeError, r"^frozen\[1\]: the predicate <lambda> must return "
     r"True or False, but returned NoneType None for 'embed.W_E'"),
    (lambda name: name == "unembed.b_u", ValueError, r"^frozen: the predicate <lambda> "
     r"selects no parameter of the model .*; pass frozen=None to train every parameter"),
    (lambda name: True, ValueError, r"^frozen selects every parameter of the model \(38\): "
     r"nothing would be trained"),
    ([lambda name: name != "embed.W_E", "embed.W_E"], ValueError,
     r"^frozen selects every parameter of the model \(38\)"),
]  # fmt: skip


@pytest.mark.parametrize("frozen, error, message", BAD)
def test_bad_frozen_is_refused_naming_it_before_any_file_is_written(
    model, tmp_path, frozen, error, message
):
    # unchecked: the suite's runtime type checker would refuse a mistyped one first
    with unchecked(), pytest.raises(error, match=message) as caught:
        run(model, steps=1, frozen=frozen, checkpoint_dir=tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
    if frozen is _raises:  # the predicate's own error is kept as the cause
        assert isinstance(caught.value.__cause__, KeyError)


def test_train_ensemble_refuses_frozen(model):
    with pytest.raises(NotImplementedError, match=r"train_ensemble does not support frozen="):
        vi.train_ensemble([model, model], make_batch, steps=1, lr=1e-2, frozen=[B_U],
                          progress=False, device="cpu")  # fmt: skip


# --- compile ----------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compiled_training_keeps_frozen_parameters(model, monkeypatch):
    """The compiled step (AOTAutograd's forward and backward graphs; the ``aot_eager``
    backend skips inductor's C++ build, which changes no gradient flow) gives frozen
    parameters no gradient and trains the others as eager training does."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # dynamo cannot trace it
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    kw = dict(steps=3, lr=5e-2, weight_decay=0.1, grad_clip=0.5, frozen=[B_U])
    eager = run(model, **kw)
    compiled = run(model, compile=True, **kw)
    assert torch.equal(compiled.model.unembed.b_U, model.unembed.b_U)
    for (name, p), q in zip(compiled.model.named_parameters(), eager.model.parameters()):
        if not name.endswith("b_K"):  # b_K's gradient is rounding noise (test_training.py)
            torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=name)
    torch.testing.assert_close(
        torch.tensor(compiled.history.grad_norm), torch.tensor(eager.history.grad_norm),
        rtol=1e-9, atol=0,
    )  # fmt: skip


# --- examples/train_affine.py --freeze ------------------------------------------------------


def _train_affine():
    path = ROOT / "examples" / "train_affine.py"
    spec = importlib.util.spec_from_file_location("train_affine_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_affine_freeze_passes_through_names_the_run_and_records_it(tmp_path, monkeypatch):
    example = _train_affine()
    # the paper's model, smaller, and a small evaluation set: the same code path in a second
    small = dict(ar.MODEL_CONFIG_KWARGS, d_model=16, d_head=4, n_heads=2, n_layers=1, d_mlp=8)
    monkeypatch.setattr(ar, "MODEL_CONFIG_KWARGS", small)
    small_eval = functools.partial(ar.fixed_eval_set, 1, 4)
    monkeypatch.setattr(ar, "fixed_eval_set", lambda n, size, **kw: small_eval(**kw))
    args = ["--recipe", "paper", "--steps", "2", "--batch-size", "2", "--threads", "1"]
    out = tmp_path / "models"
    meta = example.main([*args, "--setup", "arena", "--freeze", B_U,
                         "--out", str(out / "frozen")])  # fmt: skip
    assert meta["frozen"] == [B_U] and meta["setup"] == "arena"
    model, saved = vi.load(out / "frozen"), json.loads((out / "frozen" / "config.json").read_text())
    assert torch.count_nonzero(model.unembed.b_U) == 0  # kept at its initial zeros
    assert not torch.equal(model.unembed.W_U, vi.HookedVectorTransformer(model.cfg, seed=0).W_U)
    assert "unembed.b_U" in json.dumps(saved)  # the metadata went into the saved folder
    runs = out / "_train_runs"
    assert [p.name for p in runs.iterdir()] == ["paper_arena_frozen-b_U_seed0"]
    # --setup arena alone freezes nothing, and its run has its own name
    meta = example.main([*args, "--setup", "arena", "--out", str(out / "arena")])
    assert meta["frozen"] == []
    assert torch.count_nonzero(vi.load(out / "arena").unembed.b_U) > 0
    assert sorted(p.name for p in runs.iterdir()) == [
        "paper_arena_frozen-b_U_seed0", "paper_arena_seed0"
    ]  # fmt: skip


def test_train_affine_frozen_tag_keeps_names_apart():
    example = _train_affine()
    model = vi.HookedVectorTransformer(tiny_cfg())
    assert example.frozen_tag([], model) == ""
    assert example.frozen_tag([B_U], model) == "_frozen-b_U"
    # the last part where it is unique, the whole name where layers share it; sorted
    assert example.frozen_tag(["blocks.1.attn.b_K", B_U, "embed.W_E"], model) == (
        "_frozen-blocks.1.attn.b_K-W_E-b_U"
    )
