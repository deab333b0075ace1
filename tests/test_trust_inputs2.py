"""Inputs you can trust, part 2 (issue 12): the bad inputs the adversarial harness
(``benchmarks/bad_inputs.py``) still found answered badly outside the cache and saving.

Non-finite values that gave NaN results are refused with the argument named; arguments of
the wrong type (seeds, dtypes, devices, bool flags, non-models) get the library's message
instead of a raw torch/Python error or a silent truthy reading; training and evaluation
name the batch and which of its parts is bad; TransformerLens habits say what to use."""

import math
import re

import numpy as np
import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.analysis.ablation import ablate_heads
from vecinterp.analysis.detectors import (
    detect_heads,
    induction_score,
    pattern_score,
    position_k_score,
    previous_position_score,
    previous_position_target,
    repeated_random_vectors,
)
from vecinterp.analysis.geometry import fit_line, fraction_outside_embedding
from vecinterp.analysis.patching import patch_qk_identity
from vecinterp.tasks import retrieval
from vecinterp.training.data import evaluate

F64 = torch.float64
NAN, INF = math.nan, math.inf
PROCESSING = [
    vi.process_weights,
    vi.fold_layer_norm,
    vi.center_writing_weights,
    vi.fold_value_biases,
]


@pytest.fixture(scope="module")
def model() -> vi.HookedVectorTransformer:
    # d_in=3, d_out=5, d_model=8, d_head=4, n_heads=2, n_layers=2, d_mlp=16, n_ctx=7, float64
    return random_model(tiny_cfg())


@pytest.fixture(scope="module")
def x(model) -> torch.Tensor:
    return random_input(model.cfg, batch=2)


def square_model(dtype: torch.dtype = torch.float32) -> vi.HookedVectorTransformer:
    """d_in == d_out == 4: training data and next-vector targets."""
    cfg = vi.VectorTransformerConfig(d_in=4, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=6)
    return vi.HookedVectorTransformer(cfg, seed=0, dtype=dtype)


def with_bad_weight(model: vi.HookedVectorTransformer, value: float) -> vi.HookedVectorTransformer:
    bad = random_model(model.cfg)
    with torch.no_grad():
        bad.blocks[1].attn.W_V[1, 2, 3] = value
    return bad


# -- non-finite values ------------------------------------------------------------------------


@pytest.mark.parametrize("fn", PROCESSING, ids=lambda f: f.__name__)
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_weight_processing_refuses_a_non_finite_weight_naming_it(model, fn, value):
    bad = with_bad_weight(model, value)
    n_nan, n_inf = (1, 0) if math.isnan(value) else (0, 1)
    with pytest.raises(
        ValueError, match=re.escape(f"blocks.1.attn.W_V ({n_nan} NaN, {n_inf} inf)")
    ):
        fn(bad)
    # the refused model is left as it was, and a finite one still processes exactly
    w = bad.blocks[1].attn.W_V[1, 2, 3].item()
    assert w == value or (math.isnan(w) and math.isnan(value))
    x = random_input(model.cfg, batch=2)
    assert torch.allclose(fn(model)(x), model(x), rtol=0, atol=1e-10)


def test_masked_mse_refuses_a_nan_target_where_the_loss_reads_it():
    pred, target = torch.zeros(2, 3, 2), torch.ones(2, 3, 2)
    target[1, 2, 0] = NAN
    with pytest.raises(
        ValueError,
        match=re.escape("target contains NaN or inf at a position the loss uses (first at index "
                        "[1, 2, 0])"),
    ):  # fmt: skip
        vi.masked_mse(pred, target)
    for reduction in ("sum", "none"):
        with pytest.raises(ValueError, match="target contains NaN or inf"):
            vi.masked_mse(pred, target, reduction=reduction)
    # where the mask leaves it out it is allowed, and the loss is exact
    mask = torch.tensor([True, True, False])
    assert vi.masked_mse(pred, target, mask).item() == 1.0
    assert vi.masked_mse(pred, target, mask, reduction="sum").item() == 4.0


def test_the_unchecked_mse_of_training_is_bit_identical_to_masked_mse():
    from vecinterp.loss import mse_at  # new with the checks (named here: a failure on old code)

    gen = torch.Generator().manual_seed(0)
    pred, target = torch.randn(4, 6, 3, generator=gen), torch.randn(4, 6, 3, generator=gen)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    for reduction in ("mean", "sum", "none"):
        checked = vi.masked_mse(pred, target, mask, reduction=reduction)
        assert torch.equal(mse_at(pred, target, mask, reduction), checked)
    # and it does not check: a NaN target gives a NaN loss (training then names the batch)
    target[0, 0, 0] = NAN
    assert mse_at(pred, target, None).isnan()


@pytest.mark.parametrize("scale", [NAN, INF, -INF])
def test_patch_qk_identity_refuses_a_non_finite_scale(model, scale):
    with pytest.raises(ValueError, match=re.escape(f"scale must be a finite number, got {scale}")):
        patch_qk_identity(model, 0, [0], scale=scale)


def test_next_vector_targets_refuses_a_non_finite_final():
    net = square_model(F64)
    x = torch.randn(2, 5, 4, dtype=F64)
    final = torch.zeros(2, 4, dtype=F64)
    final[1, 2] = INF
    with pytest.raises(
        ValueError, match=re.escape("final contains NaN or inf (first at index [1, 2])")
    ):
        vi.next_vector_targets(net, x, final=final)
    final[1, 2] = 0.0
    assert torch.equal(vi.next_vector_targets(net, x, final=final)[:, -1], final)


def test_fraction_outside_embedding_of_a_zero_vector_is_zero_not_nan(model):
    vectors = torch.randn(3, 4, model.cfg.d_model, dtype=F64)
    fractions = fraction_outside_embedding(vectors, model)
    squared = fraction_outside_embedding(vectors, model, squared=True)
    vectors[2, 1] = 0.0
    expected = fractions.clone()
    expected[2, 1] = 0.0  # nothing of it is outside; every other vector's fraction unchanged
    assert torch.equal(fraction_outside_embedding(vectors, model), expected)
    expected_sq = squared.clone()
    expected_sq[2, 1] = 0.0
    assert torch.equal(fraction_outside_embedding(vectors, model, squared=True), expected_sq)
    # a tiny or huge vector is not zero: its fraction is its direction's, although its
    # norm underflows to 0 or overflows to inf
    v = vectors[0, 0]
    for scale in (1e-300, 1e300):
        assert torch.allclose(
            fraction_outside_embedding(scale * v, model), fractions[0, 0], rtol=1e-12, atol=0
        )


@pytest.mark.parametrize("bad", ["x", "y"])
def test_fit_line_refuses_non_finite_points_naming_the_axis(bad):
    points = {"x": torch.arange(5.0), "y": 2 * torch.arange(5.0) + 1}
    points[bad][3] = NAN
    with pytest.raises(
        ValueError, match=re.escape(f"{bad} contains NaN or inf (first at index [3])")
    ):
        fit_line(points["x"], points["y"])


SCORES = {
    "induction_score": lambda A: induction_score(A),
    "previous_position_score": previous_position_score,
    "position_k_score": lambda A: position_k_score(A, 1),
    "pattern_score": lambda A: pattern_score(A, previous_position_target(4)),
}


@pytest.mark.parametrize("score", SCORES)
def test_detector_scores_refuse_nan_patterns(score):
    A = (torch.ones(4, 4).tril() / torch.arange(1, 5)[:, None]).expand(2, 3, 4, 4).clone()
    finite = SCORES[score](A)
    assert finite.isfinite().all()
    A[1, 2, 3, 0] = NAN
    with pytest.raises(
        ValueError, match=re.escape("patterns contains NaN or inf (first at index [1, 2, 3, 0])")
    ):
        SCORES[score](A)


# -- raw torch/Python errors become the library's --------------------------------------------


@pytest.mark.parametrize("seed", ["0", 1.5, True, [0]])
def test_seeds_of_the_wrong_type_are_refused_by_name(model, seed):
    cfg = model.cfg
    calls = {
        "HookedVectorTransformer": lambda: vi.HookedVectorTransformer(cfg, seed=seed),
        "init_weights": lambda: vi.HookedVectorTransformer(cfg).init_weights(seed=seed),
        "ablate_heads": lambda: ablate_heads(
            model,
            random_input(cfg, batch=2),
            [(0, 0)],
            kind="resample",
            population=random_input(cfg, batch=4),
            seed=seed,
        ),  # fmt: skip
        "patch_qk_identity": lambda: patch_qk_identity(model, 0, [0], seed=seed),
        "repeated_random_vectors": lambda: repeated_random_vectors(2, 3, 4, seed=seed),
    }
    for name, call in calls.items():
        with unchecked(), pytest.raises(TypeError, match="seed must be an int"):
            call()
            pytest.fail(f"{name} accepted seed={seed!r}")


def test_an_integer_seed_of_numpy_is_the_same_seed(model):
    cfg = model.cfg
    with unchecked():  # the annotation says int; an integer of NumPy is one all the same
        a = vi.HookedVectorTransformer(cfg, seed=np.int64(3))
    b = vi.HookedVectorTransformer(cfg, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    with (
        unchecked(),
        pytest.raises(ValueError, match=re.escape("seed must be an int in [-2**63, 2**64)")),
    ):
        vi.HookedVectorTransformer(cfg, seed=2**64)


@pytest.mark.parametrize("dtype", ["float32", None, np.float32, torch.int64, torch.complex64])
def test_a_dtype_that_is_not_a_float_torch_dtype_is_refused(model, dtype):
    with unchecked(), pytest.raises(TypeError, match="dtype must be a floating-point dtype, got"):
        vi.HookedVectorTransformer(model.cfg, dtype=dtype)
    with unchecked(), pytest.raises(TypeError, match="dtype must be a floating-point dtype, got"):
        repeated_random_vectors(2, 3, 4, dtype=dtype)


def test_a_cuda_device_that_does_not_exist_is_refused_by_name(model):
    if torch.cuda.is_available():
        message = "device='cuda:99' but there is no such GPU: this machine has"
    else:
        message = "device='cuda:99' but CUDA is not available here"
    with pytest.raises(ValueError, match=re.escape(message)):
        vi.HookedVectorTransformer(model.cfg, device="cuda:99")
    with pytest.raises(ValueError, match=re.escape("device must be a torch device such as 'cpu'")):
        vi.HookedVectorTransformer(model.cfg, device="nope")


@pytest.mark.parametrize("fn", PROCESSING, ids=lambda f: f.__name__)
def test_weight_processing_of_something_else_than_a_model_is_refused(model, fn):
    for thing, got in [
        ("model", "str"),
        (model.state_dict(), "OrderedDict"),
        (model.cfg, "VectorTransformerConfig"),
    ]:
        with (
            unchecked(),
            pytest.raises(TypeError, match=f"model must be a HookedVectorTransformer, got {got}"),
        ):
            fn(thing)


def test_evaluate_of_something_else_than_a_model_is_refused():
    batch = (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with unchecked(), pytest.raises(TypeError, match="model must be a torch.nn.Module .* got str"):
        evaluate("model", [batch])


@pytest.mark.parametrize(
    ("points", "message"),
    [
        (
            ([0.0, 1.0, 2.0], torch.arange(3.0)),
            "x must be a floating-point tensor [*fit, n], got list",
        ),
        (
            (torch.arange(3.0), (0.0, 1.0, 2.0)),
            "y must be a floating-point tensor [*fit, n], got tuple",
        ),
        (
            (torch.arange(3), torch.arange(3.0)),
            "x must be a floating-point tensor, got torch.int64",
        ),
    ],
)
def test_fit_line_refuses_lists_and_integer_tensors(points, message):
    with unchecked(), pytest.raises(TypeError, match=re.escape(message)):
        fit_line(*points)


def test_masked_mse_refuses_a_list_pred():
    with (
        unchecked(),
        pytest.raises(
            TypeError, match=re.escape("pred must be a tensor [batch, pos, d_out], got list")
        ),
    ):
        vi.masked_mse([[[0.0]]], torch.zeros(1, 1, 1))


def test_a_loss_mask_that_cannot_reach_the_outputs_is_refused(model, x):
    targets = torch.zeros(*x.shape[:2], model.cfg.d_out, dtype=F64)
    mask = torch.ones(x.shape[:2], dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="loss_mask is on meta and cannot be moved to cpu"):
        model(x, targets=targets, loss_mask=mask, return_type="loss")


# -- training and evaluation name the batch and its part -------------------------------------


def batches(bad: str | None = None, at: int = 0, where=(0, 1, 2)):
    """make_batch(step, gen) of a square model's data; ``bad`` ('inputs' or 'targets')
    holds NaN at ``where`` in batch ``at``."""

    def make_batch(step, gen):
        parts = {"inputs": torch.randn(4, 5, 4, generator=gen)}
        parts["targets"] = -parts["inputs"]
        if step == at and bad is not None:
            parts[bad] = parts[bad].clone()
            parts[bad][where] = NAN
        return parts["inputs"], parts["targets"]

    return make_batch


def train(data, **kw):
    return vi.train(square_model(), data, steps=3, lr=1e-3, progress=False, device="cpu", **kw)


def test_train_names_the_batch_whose_inputs_are_not_finite():
    with pytest.raises(
        ValueError,
        match=re.escape("make_batch(1, ...): inputs contain NaN or inf (first at index [0, 1, 2])"),
    ):
        train(batches("inputs", at=1))
    gen = torch.Generator().manual_seed(0)
    stream = [batches("inputs", at=2)(step, gen) for step in range(3)]
    with pytest.raises(ValueError, match=re.escape("batch 2 of data: inputs contain NaN")):
        train(stream)


def test_train_names_the_batch_whose_targets_are_not_finite():
    with pytest.raises(vi.TrainingDivergedError) as info:
        train(batches("targets", at=2, where=(3, 4, 0)))
    err = info.value
    assert err.step == 2 and err.quantity == "loss" and math.isnan(err.value)
    assert err.cause == (
        "make_batch(2, ...): targets contain NaN or inf at a position the loss uses "
        "(first at index [3, 4, 0])"
    )
    assert "because make_batch(2, ...): targets contain NaN" in str(err)


def test_train_names_the_targets_of_the_wrong_shape():
    def make_batch(step, gen):
        x = torch.randn(4, 5, 4, generator=gen)
        return x, x[..., :3]

    with pytest.raises(
        ValueError,
        match=re.escape(
            "make_batch(0, ...): targets have shape (4, 5, 3), but the model's outputs "
            "[batch, pos, d_out] have (4, 5, 4)"
        ),
    ):
        train(make_batch)


def test_train_names_eval_data():
    gen = torch.Generator().manual_seed(0)
    bad_inputs = [batches("inputs")(0, gen)]
    with pytest.raises(ValueError, match=re.escape("batch 0 of eval_data: inputs contain NaN")):
        train(batches(), eval_data=bad_inputs, eval_every=1)
    bad_targets = [batches()(0, gen), batches("targets")(0, gen)]
    with pytest.raises(
        ValueError,
        match=re.escape(
            "batch 1 of eval_data: targets contain NaN or inf at a position the loss uses "
            "(first at index [0, 1, 2])"
        ),
    ):
        train(batches(), eval_data=bad_targets, eval_every=1)
    with (
        unchecked(),
        pytest.raises(
            TypeError, match="eval_data must be a batch or an iterable of batches, got str"
        ),
    ):
        train(batches(), eval_data="x", eval_every=1)


def test_a_make_batch_that_cannot_take_step_and_generator_is_refused():
    with pytest.raises(
        TypeError,
        match=re.escape(
            "data: a callable must be make_batch(step, generator) -> batch, but "
            "<lambda>(step) cannot"
        ),
    ):
        train(lambda step: (torch.zeros(4, 5, 4),) * 2)


def test_evaluate_names_the_bad_batch_and_keeps_masked_out_nans():
    net = square_model()
    gen = torch.Generator().manual_seed(0)
    good, bad = batches()(0, gen), batches("targets")(0, gen)
    with pytest.raises(ValueError, match=re.escape("batch 1 of data: targets contain NaN")):
        evaluate(net, [good, bad])
    with pytest.raises(ValueError, match=re.escape("batch 0 of data: inputs contain NaN")):
        evaluate(net, [batches("inputs")(0, gen)])
    # a NaN target where the mask leaves it out: the mean of the per-batch exact losses
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[0, 1] = False
    value = evaluate(net, [good, (*bad, mask)])
    with torch.no_grad():
        expected = (
            vi.masked_mse(net(good[0]), good[1]) + vi.masked_mse(net(bad[0]), bad[1], mask)
        ) / 2
    assert value == pytest.approx(expected.item(), rel=1e-6)


def test_positional_code_names_its_own_arguments():
    with pytest.raises(
        ValueError, match=re.escape("base must be a positive finite number, got nan")
    ):
        retrieval.positional_code(torch.arange(3), 4, NAN)
    with (
        unchecked(),
        pytest.raises(TypeError, match="indices must be an integer tensor .*torch.float32"),
    ):
        retrieval.positional_code(torch.tensor([0.5]), 4)


# -- flags given strings are refused, not read as true ---------------------------------------


def test_bool_flags_refuse_strings(model, x):
    net = square_model()
    calls = {
        "fold_ln": lambda: vi.process_weights(model, fold_ln="yes"),
        "center_writing_weights": lambda: vi.process_weights(model, center_writing_weights="no"),
        "fold_value_biases": lambda: vi.process_weights(model, fold_value_biases="no"),
        "center_weights": lambda: vi.fold_layer_norm(model, center_weights="no"),
        "zero_biases": lambda: patch_qk_identity(model, 0, [0], zero_biases="yes"),
        "minus_current": lambda: vi.next_vector_targets(
            net, torch.randn(2, 5, 4), minus_current="yes"
        ),
        "is_permanent": lambda: model.add_hook(
            "blocks.0.hook_resid_pre", lambda a, hook: a, is_permanent="yes"
        ),
        "including_permanent": lambda: model.reset_hooks(including_permanent="no"),
        "use_attn_result": lambda: model.set_use_attn_result("yes"),
    }
    for name, call in calls.items():
        with (
            unchecked(),
            pytest.raises(TypeError, match=re.escape(f"{name} must be True or False, got str")),
        ):
            call()
    # the refused add_hook attached nothing
    assert torch.equal(model(x), model.run_with_hooks(x, fwd_hooks=[]))
    assert not model.hook_dict["blocks.0.hook_resid_pre"]._forward_hooks


def test_detect_heads_refuses_a_nan_threshold(model, x):
    with pytest.raises(ValueError, match=re.escape("threshold must be a finite number, got nan")):
        detect_heads(model, x, "previous_position", NAN)


# -- TransformerLens habits ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tl_name", "ours"),
    [("d_vocab", "d_in"), ("d_vocab_out", "d_out"), ("normalization_type", "normalization")],
)
def test_transformer_lens_config_attributes_say_what_to_use(model, tl_name, ours):
    with pytest.raises(
        AttributeError, match=re.escape(f"that is TransformerLens's name; here use {ours}")
    ):
        getattr(model.cfg, tl_name)
    assert getattr(model.cfg, "d_hidden", None) is None  # other names: a plain AttributeError


def test_from_pretrained_says_there_is_no_zoo():
    with pytest.raises(
        NotImplementedError, match="no pretrained models .*'gpt2'.*vecinterp.load.*load_reference"
    ):
        vi.HookedVectorTransformer.from_pretrained("gpt2")


def test_set_use_attn_result_is_a_no_op(model, x):
    y, before = model.run_with_cache(x)
    model.set_use_attn_result(True)
    y_after, after = model.run_with_cache(x)
    assert torch.equal(y, y_after) and torch.equal(before["result", 1], after["result", 1])
    model.set_use_attn_result(False)  # hook_result stays
    assert torch.equal(model.run_with_cache(x)[1]["result", 0], before["result", 0])


def test_config_from_dict_refuses_a_string():
    with unchecked(), pytest.raises(TypeError, match=re.escape("from_dict needs a dict of fields")):
        vi.VectorTransformerConfig.from_dict("d_in=4")


def test_emergence_names_the_checkpoint_that_is_not_a_model():
    with (
        unchecked(),
        pytest.raises(
            TypeError,
            match=re.escape(
                "checkpoints[1][1], the model of a (step, model) pair: expected a "
                "HookedVectorTransformer, got str"
            ),
        ),
    ):
        vi.emergence([(0, square_model()), (1, "m")], losses=lambda m: {}, progress=False)
