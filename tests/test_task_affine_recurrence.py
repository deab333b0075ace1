"""Tests of the affine-recurrence data generator (vecinterp.tasks.affine_recurrence)."""

import dataclasses
import itertools

import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from vecinterp.tasks import affine_recurrence as ar

FIELDS = ("inputs", "targets", "loss_mask", "c", "d", "scale")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    # torch.testing.assert_close costs ~1 s on its first call; a plain max error is enough.
    assert actual.shape == expected.shape
    error = (actual - expected).abs().max().item()
    assert error <= tol, f"max abs error {error:.3g} > {tol:.3g}"


def assert_same_batch(a: ar.AffineBatch, b: ar.AffineBatch) -> None:
    for name in FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# --- the recurrence and its normalisation -------------------------------------------------


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("length", [3, 7, 14])
def test_recurrence_holds_after_normalisation(dtype, tol, length):
    b = ar.generate(64, dim=40, length=length, seed=length, dtype=dtype)
    predicted = b.c[:, None, None] * b.inputs + b.d[:, None, :]
    assert_close(b.targets, predicted, tol)
    assert_close(b.inputs[:, 1:], b.targets[:, :-1], tol)
    for x in (b.inputs, b.targets, b.c, b.d, b.scale):
        assert x.dtype == dtype


def test_worked_example_from_docstring():
    # a_0 = 1, c = 2, d = 1 -> 1, 3, 7, 15; m = 7, u = 1.4 -> scale 5.
    raw = torch.tensor([1.0, 3.0, 7.0, 15.0], dtype=torch.float64)
    scale = raw[:3].abs().max() / 1.4
    normalised = raw / scale
    assert_close(normalised, torch.tensor([0.2, 0.6, 1.4, 3.0], dtype=torch.float64), 1e-12)
    assert_close(2 * normalised[:3] + 1 / scale, normalised[1:], 1e-12)


def test_max_input_norm_in_one_to_two_and_raw_sequence_recovered():
    b = ar.generate(2000, dim=40, seed=1, dtype=torch.float64)
    max_norm = b.inputs.norm(dim=-1).amax(dim=1)
    assert max_norm.min() >= 1 - 1e-12 and max_norm.max() <= 2 + 1e-12
    # u ~ U(1, 2): the max norms spread over the whole interval.
    assert max_norm.min() < 1.01 and max_norm.max() > 1.99
    # Undoing the scale gives a_0 and d in [-2, 2].
    raw_a0 = b.scale[:, None] * b.inputs[:, 0]
    raw_d = b.scale[:, None] * b.d
    for raw in (raw_a0, raw_d):
        assert raw.abs().max() <= 2 + 1e-12
        assert raw.abs().max() > 1.99
    # The last target may exceed 2, but not the documented bound of 10.
    assert b.targets.norm(dim=-1).max() <= 10


def test_max_input_norm_float32():
    b = ar.generate(500, dim=40, seed=2)
    max_norm = b.inputs.norm(dim=-1).amax(dim=1)
    assert max_norm.min() >= 1 - 1e-6 and max_norm.max() <= 2 + 1e-6


# --- shapes, mask, lengths -----------------------------------------------------------------


@pytest.mark.parametrize("length", [3, 4, 14])
def test_loss_mask_false_at_0_and_1_then_true(length):
    b = ar.generate(5, dim=3, length=length, seed=0)
    assert b.loss_mask.dtype == torch.bool
    assert b.loss_mask.shape == (5, length)
    assert not b.loss_mask[:, :2].any()
    assert b.loss_mask[:, 2:].all()
    assert int(b.loss_mask.sum()) == 5 * (length - 2)


def test_shapes_and_fixed_length_honoured():
    b = ar.generate(6, dim=5, length=9, seed=0)
    assert b.inputs.shape == b.targets.shape == (6, 9, 5)
    assert b.c.shape == b.scale.shape == (6,)
    assert b.d.shape == (6, 5)
    assert b.length == 9
    # A fixed length may go beyond the training range, e.g. to probe generalisation.
    assert ar.generate(2, dim=3, length=20, seed=0).inputs.shape == (2, 20, 3)


def test_drawn_lengths_cover_range_and_stay_inside():
    # 150 draws miss one of 12 lengths with probability 12 * (11/12) ** 150 < 3e-5.
    stream = ar.batches(1, seed=3, dim=2)
    lengths = {next(stream).length for _ in range(150)}
    assert lengths == set(range(3, 15))
    narrow = ar.batches(1, seed=3, dim=2, min_len=5, max_len=6)
    assert {next(narrow).length for _ in range(30)} == {5, 6}


def test_one_length_per_batch_many_sequences():
    b = ar.generate(32, dim=4, seed=5)
    assert 3 <= b.length <= 14
    assert b.loss_mask.shape == (32, b.length)


def test_lengths_share_recurrences_for_one_seed():
    short = ar.generate(8, dim=4, length=4, seed=11, dtype=torch.float64)
    long = ar.generate(8, dim=4, length=10, seed=11, dtype=torch.float64)
    assert torch.equal(short.c, long.c)
    raw_short = short.scale[:, None, None] * short.inputs
    raw_long = long.scale[:, None, None] * long.inputs[:, :4]
    assert_close(raw_short, raw_long, 1e-10)


def test_returned_tensors_do_not_share_storage():
    b = ar.generate(1, dim=3, length=4, seed=0, dtype=torch.float64)
    b.inputs[0, 1] = 123.0
    assert not (b.targets == 123.0).any()


# --- c: range, one per sequence, statistics -------------------------------------------------


def test_c_in_range_and_shared_by_all_dims():
    b = ar.generate(256, dim=40, length=5, seed=4, dtype=torch.float64)
    assert b.c.shape == (256,)
    assert b.c.abs().max() <= 2
    # Per dim, c_k = (a_{t+2} - a_{t+1}) / (a_{t+1} - a_t) recovers the same scalar.
    diffs = b.inputs[:, 1:] - b.inputs[:, :-1]
    ratio = diffs[:, 1:] / diffs[:, :-1]  # [batch, pos, dim]
    assert_close(ratio, b.c[:, None, None].expand_as(ratio), 1e-6)


def test_c_statistics_roughly_uniform():
    # 20,000 draws: the mean's standard error is 4 / sqrt(12) / sqrt(2e4) = 0.008 and a
    # fraction's at most 0.0035; tolerances of 6 to 9 standard errors cannot flake.
    b = ar.generate(20_000, dim=2, length=3, seed=123)
    assert abs(b.c.mean().item()) < 0.05
    assert b.alternating.dtype == torch.bool
    assert torch.equal(b.alternating, b.c < 0)
    assert abs(b.alternating.float().mean().item() - 0.5) < 0.03
    quarter_counts = torch.histc(b.c, bins=4, min=-2, max=2) / b.c.numel()
    assert ((quarter_counts - 0.25).abs() < 0.03).all()


# --- determinism ---------------------------------------------------------------------------


def test_same_seed_same_batch_different_seed_different():
    assert_same_batch(ar.generate(4, dim=3, seed=7), ar.generate(4, dim=3, seed=7))
    a, b = ar.generate(4, dim=3, length=5, seed=7), ar.generate(4, dim=3, length=5, seed=8)
    assert not torch.equal(a.inputs, b.inputs)
    assert not torch.equal(a.c, b.c)


def test_generator_matches_seed_and_advances():
    g = torch.Generator().manual_seed(7)
    first = ar.generate(4, dim=3, generator=g)
    assert_same_batch(first, ar.generate(4, dim=3, seed=7))
    second = ar.generate(4, dim=3, length=first.length, generator=g)
    assert not torch.equal(first.c, second.c)


def test_global_rng_used_without_seed():
    torch.manual_seed(0)
    a = ar.generate(3, dim=2)
    torch.manual_seed(0)
    assert_same_batch(a, ar.generate(3, dim=2))


def test_batches_stream_reproducible_and_starts_at_generate():
    s1 = list(itertools.islice(ar.batches(4, seed=9, dim=3), 5))
    s2 = list(itertools.islice(ar.batches(4, seed=9, dim=3), 5))
    for a, b in zip(s1, s2):
        assert_same_batch(a, b)
    assert_same_batch(s1[0], ar.generate(4, dim=3, seed=9))
    assert not torch.equal(s1[0].c, s1[1].c)


def test_fixed_eval_set_cycles_lengths_and_is_reproducible():
    evals = ar.fixed_eval_set(14, 8, seed=1234, dim=3)
    assert [b.length for b in evals] == [*range(3, 15), 3, 4]
    again = ar.fixed_eval_set(14, 8, seed=1234, dim=3)
    for a, b in zip(evals, again):
        assert_same_batch(a, b)
    other = ar.fixed_eval_set(2, 8, seed=99, dim=3, min_len=6, max_len=6)
    assert [b.length for b in other] == [6, 6]


# --- dataclass, presets ---------------------------------------------------------------------


def test_affine_batch_is_frozen():
    b = ar.generate(2, dim=2, seed=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.c = torch.zeros(2)


def test_affine_batch_shapes_are_runtime_checked():
    # Guards against a jaxtyping/typeguard pairing that silently checks nothing.
    b = ar.generate(2, dim=3, length=4, seed=0)
    with pytest.raises(Exception, match="batch|d_in|pos|shape|type"):
        ar.AffineBatch(
            inputs=b.inputs,
            targets=b.targets,
            loss_mask=b.loss_mask,
            c=b.c,
            d=torch.zeros(2, 5),
            scale=b.scale,
        )


def test_presets_match_paper():
    assert ar.MODEL_CONFIG_KWARGS["d_in"] == ar.MODEL_CONFIG_KWARGS["d_out"] == ar.DEFAULT_DIM
    assert ar.MODEL_CONFIG_KWARGS["n_ctx"] >= ar.DEFAULT_MAX_LEN
    assert (ar.MODEL_CONFIG_KWARGS["n_heads"], ar.MODEL_CONFIG_KWARGS["n_layers"]) == (8, 3)
    assert ar.PAPER_RECIPE == dict(
        steps=100_000, batch_size=16, lr=1e-4, weight_decay=0.01, optimizer="AdamW"
    )


def test_fast_recipe_is_a_valid_train_schedule_from_peak_to_floor():
    r = ar.FAST_RECIPE
    sched = dict(
        lr=r["lr"], steps=r["steps"], warmup_steps=r["warmup_steps"],
        schedule=r["schedule"], min_lr=r["min_lr"],
    )  # fmt: skip
    assert vi.lr_at(0, **sched) == pytest.approx(r["lr"] / r["warmup_steps"])
    assert vi.lr_at(r["warmup_steps"], **sched) == pytest.approx(r["lr"])
    assert vi.lr_at(r["steps"] - 1, **sched) == pytest.approx(r["min_lr"], rel=1e-3)
    # same optimiser and weight decay as the paper: only batch, schedule and clipping differ
    assert {k: r[k] for k in ("optimizer", "weight_decay")} == {
        k: ar.PAPER_RECIPE[k] for k in ("optimizer", "weight_decay")
    }


# --- argument validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(batch_size=0), "batch_size must be an int >= 1"),
        (dict(batch_size=True), "batch_size must be an int >= 1"),
        (dict(dim=0), "dim must be an int >= 1"),
        (dict(length=2), "length must be an int >= 3"),
        (dict(min_len=2), "min_len must be an int >= 3"),
        (dict(min_len=6, max_len=5), r"max_len must be an int >= 6 \(min_len is 6\)"),
        (dict(dtype=torch.int64), "dtype must be one of .*float32"),
        (dict(seed=-1), r"seed must be an int in \[0, 2\*\*64\)"),
        (dict(seed=2**64), r"seed must be an int in \[0, 2\*\*64\)"),
        (dict(seed=1, generator=torch.Generator()), "at most one of seed and generator"),
        (dict(device="not_a_device"), "device must be a valid torch device"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, message):
    kwargs = {"batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        ar.generate(**kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a non-CPU generator")
def test_generate_rejects_non_cpu_generator():
    with pytest.raises(ValueError, match="generator must be a CPU torch.Generator"):
        ar.generate(2, generator=torch.Generator(device="cuda"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(batch_size=0), "batch_size must be an int >= 1"),
        (dict(seed=-5), "seed must be an int"),
        (dict(max_len=2), "max_len must be an int >= 3"),
        (dict(length=1), "length must be an int >= 3"),
    ],
)
def test_batches_rejects_bad_arguments_eagerly(kwargs, message):
    kwargs = {"batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ar.batches(**kwargs)  # no next(): the check happens at the call


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n_batches=0), "n_batches must be an int >= 1"),
        (dict(batch_size=-1), "batch_size must be an int >= 1"),
        (dict(seed=-1), "seed must be an int"),
        (dict(min_len=0), "min_len must be an int >= 3"),
        (dict(dtype=torch.bool), "dtype must be one of"),
    ],
)
def test_fixed_eval_set_rejects_bad_arguments(kwargs, message):
    kwargs = {"n_batches": 2, "batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ar.fixed_eval_set(**kwargs)


# ------------------------------------------------ normalise="all" (§3.1's other reading)


def test_normalise_all_scales_by_every_vector_and_keeps_the_draws():
    inputs_only = ar.generate(64, length=9, seed=3, dtype=torch.float64)
    every = ar.generate(64, length=9, seed=3, dtype=torch.float64, normalise="all")
    assert torch.equal(inputs_only.c, every.c)  # the same recurrences ...
    raw_a = inputs_only.inputs * inputs_only.scale[:, None, None]
    raw_b = every.inputs * every.scale[:, None, None]
    assert torch.allclose(raw_a, raw_b, rtol=1e-12, atol=1e-12)  # ... scaled differently
    norms = torch.cat([every.inputs, every.targets[:, -1:]], 1).norm(dim=-1).amax(1)
    assert bool(((norms >= 1) & (norms < 2)).all())  # the largest of ALL vectors is u
    assert bool((inputs_only.targets.norm(dim=-1).amax(1) > 2).any())  # not so by default
    # the recurrence still holds with the same c and the rescaled d
    rebuilt = every.c[:, None, None] * every.inputs + every.d[:, None, :]
    assert torch.allclose(rebuilt, every.targets, rtol=1e-12, atol=1e-12)


def test_normalise_reaches_the_stream_the_eval_set_and_the_claims():
    stream = ar.batches(8, seed=5, dim=3, normalise="all")
    assert torch.equal(next(stream).inputs, ar.generate(8, dim=3, seed=5, normalise="all").inputs)
    evals = ar.fixed_eval_set(12, 2, seed=7, dim=3, normalise="all")
    first = ar.generate(2, dim=3, length=3, generator=torch.Generator().manual_seed(7),
                        normalise="all")  # fmt: skip
    assert torch.equal(evals[0].inputs, first.inputs)
    for bad in ("targets", "", None):
        with unchecked(), pytest.raises(ValueError, match="normalise"):
            ar.generate(2, normalise=bad)
        with unchecked(), pytest.raises(ValueError, match="normalise"):
            ar.fixed_eval_set(2, 2, seed=0, normalise=bad)


def test_measure_claims_judges_on_data_normalised_its_own_way():
    from vecinterp.tasks import affine_claims as ac

    cfg = vi.VectorTransformerConfig(
        d_in=4, d_model=16, d_head=4, n_heads=5, n_layers=3, d_mlp=16, n_ctx=16
    )
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    sizes = dict(analysis_batch=8, population=12, eval_batches=12, eval_batch_size=2,
                 sweep_batches=2, sweep_batch_size=2, n_random=4)  # fmt: skip
    res = ac.measure_claims(model, normalise="all", **sizes)
    evals = ar.fixed_eval_set(12, 2, seed=10_000, dim=4, dtype=torch.float64, normalise="all")
    assert res.values["normalise"] == "all" and res.info["normalise"] == "all"
    assert res.values["mse"] == pytest.approx(vi.evaluate(vi.process_weights(model), evals),
                                              rel=1e-12)  # fmt: skip
    with unchecked(), pytest.raises(ValueError, match="normalise"):
        ac.measure_claims(model, normalise="targets", **sizes)
