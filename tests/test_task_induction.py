"""The vector-induction task: generator invariants, the loss mask, seeding, presets, bad input."""

import dataclasses
import inspect

import pytest
import torch

import vecinterp as vi
from vecinterp.analysis.detectors import induction_target, repeated_random_vectors
from vecinterp.tasks import induction


def _gen(**kwargs) -> induction.InductionBatch:
    kwargs = {"batch_size": 4, "m": 5, "dim": 3, "seed": 0, "dtype": torch.float64, **kwargs}
    return induction.generate(**kwargs)


# ------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("m", [2, 3, 7])
def test_shapes_and_dtypes(m):
    b = _gen(batch_size=6, m=m, dim=4)
    assert b.m == m and b.length == 2 * m and b.first_scored == m
    assert b.inputs.shape == b.targets.shape == (6, 2 * m, 4)
    assert b.loss_mask.shape == (6, 2 * m) and b.loss_mask.dtype == torch.bool
    assert b.vectors.shape == (6, m, 4)
    assert b.inputs.dtype == b.targets.dtype == b.vectors.dtype == torch.float64


def test_dtype_is_a_cast_of_the_float64_draw():
    b64 = _gen(dtype=torch.float64)
    b32 = _gen(dtype=torch.float32)
    assert b32.inputs.dtype == torch.float32
    assert torch.equal(b32.inputs, b64.inputs.float())
    assert torch.equal(b32.targets, b64.targets.float())


# -------------------------------------------------------------------------- invariants


def test_vectors_are_unit_norm():
    b = _gen(batch_size=16, m=9, dim=5)
    for t in (b.vectors, b.inputs, b.targets):
        assert (t.norm(dim=-1) - 1).abs().max() < 1e-12


def test_second_half_repeats_the_first():
    b = _gen(batch_size=8, m=6)
    assert torch.equal(b.inputs[:, :6], b.inputs[:, 6:])
    assert torch.equal(b.inputs[:, :6], b.vectors)


def test_inputs_and_targets_follow_the_period_position_by_position():
    b = _gen(batch_size=3, m=4)
    for t in range(b.length):
        assert torch.equal(b.inputs[:, t], b.vectors[:, t % 4]), t
        assert torch.equal(b.targets[:, t], b.vectors[:, (t + 1) % 4]), t


def test_targets_are_the_next_vector():
    b = _gen(batch_size=5, m=7)
    assert torch.equal(b.targets[:, :-1], b.inputs[:, 1:])
    # the last target continues the period: r_1, which followed r_m's first occurrence
    assert torch.equal(b.targets[:, -1], b.vectors[:, 0])
    assert torch.equal(b.targets[:, -1], b.inputs[:, b.m])


def test_loss_mask_is_exactly_the_repeated_half():
    b = _gen(batch_size=3, m=3)
    assert b.loss_mask.tolist() == [[False, False, False, True, True, True]] * 3
    for m in (2, 5, 8):
        mask = _gen(m=m).loss_mask
        assert torch.equal(mask, (torch.arange(2 * m) >= m).expand(4, -1))


def test_mask_rows_and_targets_match_the_induction_map():
    # The scored positions are exactly the rows of the detectors' induction map, and there
    # the target is the input at the position that map points to (t - m + 1).
    b = _gen(batch_size=4, m=6)
    target_map = induction_target(b.length, b.m)
    assert torch.equal(target_map.any(dim=-1), b.loss_mask[0])
    for t in range(b.m, b.length):
        src = int(target_map[t].argmax())
        assert src == t - b.m + 1
        assert torch.equal(b.targets[:, t], b.inputs[:, src])


def test_unscored_targets_are_not_in_the_past():
    # Before position m - 1 every target is a vector not seen yet (so nothing predicts it).
    b = _gen(batch_size=4, m=6)
    for t in range(b.m - 1):
        seen = b.inputs[:, : t + 1]
        assert not (seen == b.targets[:, t : t + 1]).all(-1).any()


def test_predicting_zero_scores_exactly_one_over_dim():
    b = _gen(batch_size=16, m=6, dim=5)
    mse = vi.masked_mse(torch.zeros_like(b.targets), b.targets, b.loss_mask).item()
    assert mse * 5 == pytest.approx(1.0, abs=1e-12)


def test_vectors_differ_across_positions_and_sequences():
    b = _gen(batch_size=8, m=6, dim=4)
    flat = b.vectors.reshape(-1, 4)
    gram = flat @ flat.T
    off = gram - torch.eye(len(flat), dtype=gram.dtype)
    assert off.abs().max() < 1 - 1e-6  # no two vectors equal


def test_vectors_look_uniform_on_the_sphere():
    v = _gen(batch_size=2000, m=4, dim=3).vectors.reshape(-1, 3)
    assert v.mean(0).abs().max() < 0.03  # 8000 draws: std of a mean ~ 0.006
    second = (v.T @ v) / len(v)  # E[v v^T] = I / dim
    assert (second - torch.eye(3, dtype=v.dtype) / 3).abs().max() < 0.03


# ------------------------------------------------------------------------- periods


def test_m_is_drawn_from_the_range_and_covers_it():
    g = torch.Generator().manual_seed(0)
    ms = [induction.generate(1, dim=2, min_m=3, max_m=6, generator=g).m for _ in range(200)]
    assert set(ms) == {3, 4, 5, 6}


def test_given_m_overrides_the_range():
    assert _gen(m=9, min_m=2, max_m=4).m == 9


def test_default_range_is_the_documented_one():
    g = torch.Generator().manual_seed(1)
    ms = {induction.generate(1, dim=2, generator=g).m for _ in range(400)}
    assert ms == set(range(induction.DEFAULT_MIN_M, induction.DEFAULT_MAX_M + 1))


# ------------------------------------------------------------------------- seeding


def test_same_seed_same_batch_other_seed_other_batch():
    a, b, c = _gen(seed=7), _gen(seed=7), _gen(seed=8)
    for name in ("inputs", "targets", "loss_mask", "vectors"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.inputs, c.inputs)


def test_seed_equals_a_generator_seeded_with_it():
    a = induction.generate(3, dim=4, seed=11)
    b = induction.generate(3, dim=4, generator=torch.Generator().manual_seed(11))
    assert a.m == b.m and torch.equal(a.inputs, b.inputs)


def test_documented_draw_order_reuses_repeated_random_vectors():
    # m first (only when not given), then one vector seed in [0, 2**62).
    g = torch.Generator().manual_seed(5)
    m = int(torch.randint(2, 7, (1,), generator=g).item())
    vector_seed = int(torch.randint(0, 2**62, (1,), generator=g).item())
    b = induction.generate(3, dim=4, min_m=2, max_m=6, seed=5, dtype=torch.float64)
    assert b.m == m
    expected = repeated_random_vectors(3, m, 4, seed=vector_seed, dtype=torch.float64)
    assert torch.equal(b.inputs, expected)

    g = torch.Generator().manual_seed(5)
    vector_seed = int(torch.randint(0, 2**62, (1,), generator=g).item())
    b = induction.generate(3, m=4, dim=4, seed=5, dtype=torch.float64)
    assert torch.equal(
        b.vectors,
        repeated_random_vectors(3, 4, 4, seed=vector_seed, repeats=1, dtype=torch.float64),
    )


def test_generator_state_advances():
    g = torch.Generator().manual_seed(0)
    a = induction.generate(2, m=3, dim=2, generator=g)
    b = induction.generate(2, m=3, dim=2, generator=g)
    assert not torch.equal(a.inputs, b.inputs)


def test_global_rng_when_unseeded_and_untouched_when_seeded():
    torch.manual_seed(123)
    a = induction.generate(2, dim=3)
    torch.manual_seed(123)
    b = induction.generate(2, dim=3)
    assert a.m == b.m and torch.equal(a.inputs, b.inputs)

    torch.manual_seed(0)
    state = torch.get_rng_state()
    induction.generate(2, dim=3, seed=1)
    assert torch.equal(torch.get_rng_state(), state)


def test_batch_fields_are_separate_copies():
    b = _gen()
    before = b.targets.clone()
    b.inputs.zero_()
    assert torch.equal(b.targets, before)


# ------------------------------------------------------------ batches and eval sets


def test_batches_stream_starts_with_generate_and_is_reproducible():
    s1 = induction.batches(3, seed=4, dim=2)
    s2 = induction.batches(3, seed=4, dim=2)
    first = next(s1)
    assert torch.equal(first.inputs, induction.generate(3, dim=2, seed=4).inputs)
    assert torch.equal(next(s2).inputs, first.inputs)
    a, b = next(s1), next(s2)
    assert a.m == b.m and torch.equal(a.inputs, b.inputs)
    assert not (a.m == first.m and torch.equal(a.inputs, first.inputs))


def test_batches_with_fixed_m():
    stream = induction.batches(2, seed=0, m=4, dim=2)
    assert {next(stream).m for _ in range(5)} == {4}


def test_fixed_eval_set_cycles_the_periods_and_is_fixed():
    evals = induction.fixed_eval_set(7, 2, seed=9, dim=3, min_m=2, max_m=4)
    assert [b.m for b in evals] == [2, 3, 4, 2, 3, 4, 2]
    again = induction.fixed_eval_set(7, 2, seed=9, dim=3, min_m=2, max_m=4)
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(evals, again, strict=True))
    assert not torch.equal(evals[0].inputs, evals[3].inputs)


# --------------------------------------------------------------- model and recipe


def test_model_config_preset():
    cfg = induction.model_config()
    assert (cfg.n_layers, cfg.attn_only, cfg.positional, cfg.normalization) == (
        2,
        True,
        "rotary",
        "LN",
    )
    assert cfg.d_in == cfg.d_out == induction.DEFAULT_DIM
    assert cfg.n_ctx == 2 * induction.DEFAULT_MAX_M
    small = induction.model_config(5, 7, d_model=16, n_heads=2, d_head=8, positional="learned")
    assert (small.d_in, small.n_ctx, small.d_model, small.positional) == (5, 14, 16, "learned")


def test_the_preset_model_reads_the_longest_batch():
    cfg = induction.model_config(3, 6, d_model=8, n_heads=2, d_head=4)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    b = induction.generate(2, m=6, dim=3, seed=0, dtype=torch.float64)
    assert model(b.inputs).shape == b.targets.shape


def test_recipe_is_batch_size_plus_train_arguments():
    recipe = dict(induction.RECIPE)
    assert isinstance(recipe.pop("batch_size"), int)
    params = inspect.signature(vi.train).parameters
    assert set(recipe) <= set(params), set(recipe) - set(params)


def test_train_accepts_induction_batches():
    cfg = induction.model_config(3, 4, d_model=8, n_heads=2, d_head=4)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    result = vi.train(
        model,
        lambda step, g: induction.generate(4, dim=3, min_m=2, max_m=4, generator=g),
        steps=3,
        lr=1e-3,
        progress=False,
        device="cpu",
    )
    assert len(result.history.train_loss) == 3


# ----------------------------------------------------------------------- bad input


def test_batch_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _gen().m = 3


def test_batch_shapes_are_checked():
    # Guards against a jaxtyping/beartype pairing that silently checks nothing.
    b = _gen()
    with pytest.raises(Exception, match="batch|d_in|pos|shape|type"):
        induction.InductionBatch(
            inputs=b.inputs,
            targets=b.targets[:, :-1],
            loss_mask=b.loss_mask,
            vectors=b.vectors,
            m=b.m,
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"batch_size": True}, "batch_size must be an int >= 1"),
        ({"dim": 0}, "dim must be an int >= 1"),
        ({"m": 1}, r"m must be an int >= 2 \(with m = 1"),
        ({"m": None, "min_m": 1}, "min_m must be an int >= 2"),
        ({"m": None, "min_m": 5, "max_m": 4}, r"max_m must be an int >= 5 \(min_m is 5\)"),
        ({"seed": -1}, r"seed must be an int in \[0, 2\*\*64\)"),
        ({"seed": 2**64}, r"seed must be an int in \[0, 2\*\*64\)"),
        ({"generator": torch.Generator()}, "at most one of seed and generator"),
        ({"dtype": torch.int64}, "dtype must be one of"),
        ({"device": "no_such_device"}, "device must be a valid torch device"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _gen(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"m": 1}, "m must be an int >= 2"),
        ({"min_m": 3, "max_m": 2}, "max_m must be an int >= 3"),
        ({"seed": -5}, "seed must be an int"),
    ],
)
def test_batches_rejects_bad_arguments_eagerly(kwargs, message):
    kwargs = {"batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        induction.batches(**kwargs)  # no next(): the check happens at the call


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_batches": 0}, "n_batches must be an int >= 1"),
        ({"min_m": 1}, "min_m must be an int >= 2"),
        ({"dim": -1}, "dim must be an int >= 1"),
    ],
)
def test_fixed_eval_set_rejects_bad_arguments(kwargs, message):
    kwargs = {"n_batches": 2, "batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        induction.fixed_eval_set(**kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {}, "dim must be an int >= 1"),
        ((4, 1), {}, "max_m must be an int >= 2"),
        ((4, 4), {"positional": "wobbly"}, "positional must be one of"),
    ],
)
def test_model_config_rejects_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        induction.model_config(*args, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a non-CPU generator")
def test_generate_rejects_non_cpu_generator():
    with pytest.raises(ValueError, match="generator must be a CPU torch.Generator"):
        induction.generate(2, generator=torch.Generator(device="cuda"))


def test_train_preset_is_vi_train_with_the_recipe():
    steps = 40
    ours = induction.train_preset(seed=3, steps=steps, lr=2e-3)
    recipe = dict(induction.RECIPE, steps=steps, warmup_steps=2, lr=2e-3)  # 100 * 40 // 2000
    batch_size = recipe.pop("batch_size")
    model = vi.HookedVectorTransformer(induction.model_config(), seed=3)
    by_hand = vi.train(
        model,
        lambda step, gen: induction.generate(batch_size, generator=gen),
        **recipe,
        seed=3,
        device="cpu",
        progress=False,
    )
    assert ours.history.train_loss == by_hand.history.train_loss
    for (name, a), b in zip(
        ours.model.state_dict().items(), by_hand.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
