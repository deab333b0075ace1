"""The retrieval-problem generator (Musat 2024, §6): layout, codes, targets, seeds, errors."""

import math

import pytest
import torch

import vecinterp as vi
from vecinterp.tasks import retrieval as R


@pytest.fixture(scope="module")
def batch():
    return R.generate(64, 3, n_chains=4, dim=4, seed=0, dtype=torch.float64)


def _tokens(b):
    K = b.dim
    return b.inputs[..., :K], b.inputs[..., K:]


# ------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize(
    "n_chains, depth, dim, ic",
    [(4, 3, 4, True), (2, 1, 2, False), (3, 5, 6, True), (1, 2, 4, False)],
)
def test_shapes(n_chains, depth, dim, ic):
    b = R.generate(5, depth, n_chains=n_chains, dim=dim, implicit_curriculum=ic, seed=1)
    n_pos = n_chains * (2 * depth + 1)
    d_out = depth * dim if ic else dim
    assert b.inputs.shape == (5, n_pos, 2 * dim)
    assert b.targets.shape == (5, n_pos, d_out)
    assert b.loss_mask.shape == (5, n_pos) and b.loss_mask.dtype == torch.bool
    assert b.symbols.shape == (5, n_chains, depth + 1, dim)
    assert b.left_pos.shape == b.right_pos.shape == (5, n_chains, depth)
    assert b.query_pos.shape == b.query_chain.shape == (5, n_chains)
    assert b.role_positions.shape == (5, n_chains, 2 * depth + 1)
    assert (b.n_chains, b.depth, b.dim, b.n_pos) == (n_chains, depth, dim, n_pos)
    assert b.first_query == 2 * n_chains * depth
    assert b.left_pos.dtype == b.query_pos.dtype == torch.int64


def test_model_config_matches_the_data():
    for ic in (True, False):
        cfg = R.model_config(3, 2, implicit_curriculum=ic, n_chains=2, dim=6, d_model=16, n_heads=2)
        b = R.generate(2, 3, n_chains=2, dim=6, implicit_curriculum=ic, seed=0)
        assert (cfg.d_in, cfg.d_out, cfg.n_ctx) == (
            b.inputs.shape[-1],
            b.targets.shape[-1],
            b.n_pos,
        )
        assert cfg.positional == "none" and cfg.normalization == "LN" and cfg.causal
        model = vi.HookedVectorTransformer(cfg, seed=0)
        assert model(b.inputs).shape == b.targets.shape
    paper = R.model_config(5, 8)
    assert (paper.n_heads, paper.d_model, paper.d_head, paper.d_mlp) == (8, 128, 16, 512)
    assert (paper.d_in, paper.d_out, paper.n_ctx) == (8, 20, 44)
    assert R.PAPER_RECIPE["lr"] == 1e-3 and R.PAPER_RECIPE["weight_decay"] == 0.1
    assert R.PAPER_RECIPE["batch_size"] == 512


# ------------------------------------------------------------------------------ layout


def test_every_position_is_one_chain_token_exactly_once(batch):
    roles = batch.role_positions.reshape(batch.inputs.shape[0], -1)
    for row in roles:
        assert sorted(row.tolist()) == list(range(batch.n_pos))


def test_pairs_are_interleaved_step_by_step(batch):
    N = batch.n_chains
    assert torch.equal(batch.right_pos, batch.left_pos + 1)
    assert bool((batch.left_pos % 2 == 0).all())
    # pair i of every chain lies in the block of step i: positions [2 N i, 2 N (i + 1))
    step = batch.left_pos // (2 * N)
    assert torch.equal(step, torch.arange(batch.depth).expand_as(step))
    # queries after all pairs
    assert bool((batch.query_pos >= 2 * N * batch.depth).all())


def test_tokens_hold_the_right_symbols(batch):
    sym, _ = _tokens(batch)
    B, N, D = batch.inputs.shape[0], batch.n_chains, batch.depth
    for b in range(0, B, 7):
        for c in range(N):
            for i in range(D):
                assert torch.equal(sym[b, batch.left_pos[b, c, i]], batch.symbols[b, c, i])
                assert torch.equal(sym[b, batch.right_pos[b, c, i]], batch.symbols[b, c, i + 1])
            assert torch.equal(sym[b, batch.query_pos[b, c]], batch.symbols[b, c, 0])


def test_query_chain_is_the_inverse_of_query_pos(batch):
    slot = batch.query_pos - batch.first_query
    chains = torch.arange(batch.n_chains).expand_as(slot)
    assert torch.equal(batch.query_chain.gather(1, slot), chains)


def test_orders_are_shuffled(batch):
    # with 64 sequences of 4 chains, some step and the queries must show a non-identity
    # order (a fixed order would let the model read a chain off its slot)
    slots = (batch.left_pos % (2 * batch.n_chains)) // 2  # [B, N, D]
    identity = torch.arange(batch.n_chains)[None, :, None]
    assert bool((slots != identity).any())
    assert bool((batch.query_chain != torch.arange(batch.n_chains)).any())
    # every permutation appears roughly uniformly: chain 0 is in each slot sometimes
    assert set(slots[:, 0, 0].tolist()) == set(range(batch.n_chains))


def test_positional_codes_shared_within_a_pair_and_own_for_queries(batch):
    _, code = _tokens(batch)
    N, D, K = batch.n_chains, batch.depth, batch.dim
    # the code depends on the position only (not on the sequence)
    assert torch.equal(code, code[:1].expand_as(code))
    table = code[0]
    assert torch.equal(table[0::2][: N * D], table[1::2][: N * D])  # left == right of a pair
    pair_index = torch.cat([torch.arange(N * D).repeat_interleave(2), N * D + torch.arange(N)])
    expected = R.positional_code(pair_index, K).to(table.dtype)
    assert torch.equal(table, expected)
    distinct = torch.unique(table, dim=0)
    assert distinct.shape[0] == N * D + N  # one per pair, one per query


def test_positional_code_hand_worked():
    code = R.positional_code(torch.tensor([0, 1, 2]), 4, base=100.0)
    # w_0 = 1, w_1 = 100^(-1/2) = 0.1
    expected = torch.tensor(
        [[math.sin(p), math.cos(p), math.sin(0.1 * p), math.cos(0.1 * p)] for p in (0, 1, 2)],
        dtype=torch.float64,
    )
    assert torch.allclose(code, expected, rtol=0, atol=1e-15)


def test_targets_match_the_chain_and_mask_only_at_queries(batch):
    B, N, D, K = batch.inputs.shape[0], batch.n_chains, batch.depth, batch.dim
    assert torch.equal(batch.loss_mask, (torch.arange(batch.n_pos) >= 2 * N * D).expand(B, -1))
    assert bool((batch.targets[~batch.loss_mask] == 0).all())
    for b in range(B):
        for c in range(N):
            q = batch.query_pos[b, c]
            assert torch.equal(batch.targets[b, q].reshape(D, K), batch.symbols[b, c, 1:])
    non_ic = R.generate(64, 3, implicit_curriculum=False, seed=0, dtype=torch.float64)
    assert torch.equal(non_ic.inputs, batch.inputs)  # same draws, other targets
    for c in range(N):
        q = non_ic.query_pos[:, c]
        assert torch.equal(non_ic.targets[torch.arange(B), q], non_ic.symbols[:, c, D])


def test_worked_layout_of_the_docstring():
    # N = 2, D = 2: find a seed whose orders are those of the docstring's worked layout
    for seed in range(200):
        b = R.generate(1, 2, n_chains=2, seed=seed)
        if b.left_pos[0].tolist() == [[2, 4], [0, 6]] and b.query_pos[0].tolist() == [9, 8]:
            break
    else:  # pragma: no cover - 1 in 8 seeds has these orders
        pytest.fail("no seed gave the docstring's orders")
    assert b.query_chain[0].tolist() == [1, 0]
    a_, b_ = b.symbols[0, 0], b.symbols[0, 1]
    expected = torch.stack([b_[0], b_[1], a_[0], a_[1], a_[1], a_[2], b_[1], b_[2], b_[0], a_[0]])
    assert torch.equal(b.inputs[0, :, :4], expected)
    pair_index = [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]
    assert torch.equal(b.inputs[0, :, 4:], R.positional_code(torch.tensor(pair_index), 4).float())
    assert R.role_names(2) == ["L0", "R0", "L1", "R1", "Q"]
    assert b.role_positions[0].tolist() == [[2, 3, 4, 5, 9], [0, 1, 6, 7, 8]]


def test_symbols_are_standard_normal():
    b = R.generate(2000, 2, seed=3, dtype=torch.float64)
    s = b.symbols.flatten()
    assert abs(float(s.mean())) < 0.02 and abs(float(s.std()) - 1) < 0.02


# ------------------------------------------------------------------------------ losses


def test_partial_losses_hand_worked_and_mean_is_the_masked_mse(batch):
    out = batch.targets.clone()
    D, K = batch.depth, batch.dim
    out[..., K : 2 * K] += 1.0  # x_2 block off by 1 in every component
    out[..., 2 * K :] += 2.0  # x_3 block off by 2
    out[~batch.loss_mask] = 123.0  # ignored
    parts = R.partial_losses(out, batch)
    assert parts.tolist() == [0.0, 1.0, 4.0]
    total = vi.masked_mse(out, batch.targets, batch.loss_mask)
    assert torch.allclose(parts.mean(), total, rtol=0, atol=1e-12)
    assert parts.shape == (D,)


def test_partial_losses_keep_the_graph():
    b = R.generate(4, 2, seed=0)
    out = torch.zeros_like(b.targets, requires_grad=True)
    R.partial_losses(out, b).sum().backward()
    assert out.grad is not None and bool((out.grad[~b.loss_mask] == 0).all())


def test_min_layers_is_log3_of_2d():
    for depth in range(1, 50):
        t = R.min_layers(depth)
        assert 3**t >= 2 * depth and (t == 1 or 3 ** (t - 1) < 2 * depth)


def test_training_on_batches_runs():
    cfg = R.model_config(1, 1, n_chains=2, d_model=8, n_heads=2, d_mlp=8)
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    result = vi.train(model, R.batches(8, 1, seed=0, n_chains=2), steps=2, lr=1e-3,
                      progress=False, device="cpu")  # fmt: skip
    assert len(result.history.train_loss) == 2


# ------------------------------------------------------------------------------ seeds


def test_seeded_determinism():
    a = R.generate(8, 3, seed=5)
    b = R.generate(8, 3, seed=5)
    c = R.generate(8, 3, seed=6)
    for name in ("inputs", "targets", "loss_mask", "symbols", "left_pos", "query_pos"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.inputs, c.inputs)
    g = torch.Generator().manual_seed(5)
    d = R.generate(8, 3, generator=g)
    assert torch.equal(d.inputs, a.inputs)
    e = R.generate(8, 3, generator=g)  # the generator advanced
    assert not torch.equal(e.inputs, a.inputs)
    stream = R.batches(8, 3, seed=5)
    assert torch.equal(next(stream).inputs, a.inputs)
    assert torch.equal(next(stream).inputs, e.inputs)


def test_global_rng_without_seed():
    torch.manual_seed(11)
    a = R.generate(4, 2)
    torch.manual_seed(11)
    b = R.generate(4, 2)
    assert torch.equal(a.inputs, b.inputs)


def test_dtype_and_cast():
    b64 = R.generate(4, 2, seed=0, dtype=torch.float64)
    b32 = R.generate(4, 2, seed=0)
    assert b64.inputs.dtype == torch.float64 and b32.inputs.dtype == torch.float32
    assert torch.equal(b64.inputs.float(), b32.inputs)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size must be an int >= 1"),
        (dict(batch_size=True), "batch_size must be an int >= 1"),
        (dict(depth=0), "depth must be an int >= 1"),
        (dict(n_chains=0), "n_chains must be an int >= 1"),
        (dict(dim=3), "dim must be an even int >= 2"),
        (dict(dim=0), "dim must be an even int >= 2"),
        (dict(rotary_base=0.0), "rotary_base must be a positive finite number"),
        (dict(rotary_base=float("inf")), "rotary_base must be a positive finite number"),
        (dict(dtype=torch.int64), "dtype must be one of"),
        (dict(seed=-1), r"seed must be an int in \[0, 2\*\*64\)"),
        (dict(device="nonsense"), "device must be a valid torch device"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(batch_size=2, depth=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        R.generate(args.pop("batch_size"), args.pop("depth"), **args)


def test_seed_and_generator_together():
    with pytest.raises(ValueError, match="at most one of seed and generator"):
        R.generate(2, 2, seed=0, generator=torch.Generator())


def test_implicit_curriculum_must_be_bool():
    with pytest.raises(TypeError, match="implicit_curriculum"):
        R.generate(2, 2, implicit_curriculum=1)


def test_batches_checks_arguments_at_once():
    with pytest.raises(ValueError, match="dim must be an even int"):
        R.batches(2, 2, seed=0, dim=5)


def test_partial_losses_bad_inputs(batch):
    non_ic = R.generate(4, 3, implicit_curriculum=False, seed=0)
    with pytest.raises(ValueError, match="needs an implicit-curriculum batch"):
        R.partial_losses(non_ic.targets, non_ic)
    with pytest.raises(ValueError, match="must have the targets' shape"):
        R.partial_losses(batch.targets[:, :-1], batch)
    with pytest.raises(TypeError, match="batch"):
        R.partial_losses(batch.targets, (batch.inputs, batch.targets))


def test_model_config_bad_inputs():
    with pytest.raises(ValueError, match="n_layers must be an int >= 1"):
        R.model_config(3, 0)
    with pytest.raises(ValueError, match="not a multiple of n_heads"):
        R.model_config(3, 2, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="dim must be an even int"):
        R.model_config(3, 2, dim=3)
    assert R.model_config(3, 2, d_model=30, n_heads=4, d_head=8).d_head == 8


def test_role_names_and_min_layers_bad_depth():
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        R.role_names(0)
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        R.min_layers(0)
