"""Head detectors: exact scores of planted and uniform patterns, the vectorised score
against a per-head loop, detect_heads on a hand-built previous-position head, and errors."""

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from vecinterp.analysis.detectors import (
    attention_patterns,
    detect_heads,
    induction_score,
    induction_target,
    pattern_score,
    position_k_score,
    position_k_target,
    previous_position_score,
    previous_position_target,
    repeated_random_vectors,
)

N = 6  # positions


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_cfg(n_heads=3))


def planted(model, x, patterns: dict):
    """Run with hook_pattern of the given layers overwritten by ``[n_heads, N, N]`` maps."""

    def writer(pattern):
        return lambda act, hook: pattern.to(act).expand_as(act).clone()

    hooks = [(f"blocks.{layer}.attn.hook_pattern", writer(p)) for layer, p in patterns.items()]
    _, cache = model.run_with_cache(x, fwd_hooks=hooks)
    return cache


def one_hot_rows(src: list[int]) -> torch.Tensor:
    return torch.eye(len(src))[src]


PREVIOUS = one_hot_rows([0] + list(range(N - 1)))  # row 0 can only attend to itself
FIRST = one_hot_rows([0] * N)
UNIFORM = torch.ones(N, N).tril() / torch.arange(1, N + 1)[:, None]


def test_planted_patterns_score_exactly(model):
    x = random_input(model.cfg, batch=2, n_pos=N)
    cache = planted(model, x, {0: torch.stack([PREVIOUS, FIRST, UNIFORM]), 1: FIRST[None]})
    prev = previous_position_score(cache)
    assert prev.shape == (2, 3)
    assert prev[0, 0] == 1.0
    # attend-to-0: only row 1's previous position is 0
    assert prev[0, 1].item() == pytest.approx(1 / (N - 1), abs=1e-15)
    # uniform causal: row d puts 1/(d+1) on d-1
    assert prev[0, 2].item() == pytest.approx(sum(1 / (d + 1) for d in range(1, N)) / (N - 1))
    last = position_k_score(cache, N - 1)
    assert last[0, 0] == 0.0 and last[0, 1] == 0.0 and last[1].eq(0).all()
    first = position_k_score(cache, 0)
    assert first[0, 0].item() == pytest.approx(2 / N, abs=1e-15)  # rows 0 and 1
    assert first[0, 1] == 1.0 and first[1].eq(1).all()


def test_uniform_causal_pattern_hand_values():
    # zero queries: every score is 0 before the mask, so the model's own pattern is
    # uniform over the causal prefix, 1/(d+1) per source
    model = random_model(tiny_cfg(n_heads=2))
    x = random_input(model.cfg, batch=3, n_pos=4)
    zero_q = [(lambda name: name.endswith("hook_q"), lambda act, hook: torch.zeros_like(act))]
    _, cache = model.run_with_cache(x, fwd_hooks=zero_q)
    assert torch.allclose(cache["pattern", 1][0, 0], UNIFORM[:4, :4].double(), atol=1e-15)
    full = lambda v: torch.full((2, 2), v, dtype=torch.float64)  # noqa: E731
    # rows 1..3 on d-1: (1/2 + 1/3 + 1/4) / 3
    assert torch.allclose(previous_position_score(cache), full(13 / 36), atol=1e-15)
    # rows 0..3 on 0: (1 + 1/2 + 1/3 + 1/4) / 4
    assert torch.allclose(position_k_score(cache, 0), full(25 / 48), atol=1e-15)
    # rows 2, 3 on 1, 2 (period 2): (1/3 + 1/4) / 2
    assert torch.allclose(induction_score(cache), full(7 / 24), atol=1e-15)
    # a custom map: attend to yourself, every row: (1 + 1/2 + 1/3 + 1/4) / 4
    assert torch.allclose(pattern_score(cache, torch.eye(4)), full(25 / 48), atol=1e-15)


def test_perfect_induction_pattern_scores_one(model):
    m = 3
    x = repeated_random_vectors(2, m, model.cfg.d_in, dtype=torch.float64)
    perfect = induction_target(2 * m, m) + torch.eye(2 * m) * (torch.arange(2 * m) < m)[:, None]
    cache = planted(model, x, {1: torch.stack([perfect, PREVIOUS, UNIFORM])})
    scores = induction_score(cache)
    assert scores[1, 0] == 1.0
    assert scores[1, 1] == 0.0  # previous position is never d - m + 1 when m > 1
    assert scores[1, 2].item() == pytest.approx((1 / 4 + 1 / 5 + 1 / 6) / 3)
    assert torch.equal(induction_score(cache, m=3), scores)


def test_batch_target_is_per_item_and_averaged():
    A = torch.stack([PREVIOUS, FIRST]).unsqueeze(1).double()  # [batch=2, 1 head, N, N]
    target = torch.stack([previous_position_target(N), position_k_target(N, 0)])
    assert torch.equal(pattern_score(A, target), torch.ones(1, dtype=torch.float64))
    swapped = target.flip(0)
    want = (2 / N + 1 / (N - 1)) / 2  # PREVIOUS on attend-to-0, FIRST on previous
    assert pattern_score(A, swapped).item() == pytest.approx(want, abs=1e-15)
    assert torch.equal(pattern_score(A, target.bool()), pattern_score(A, target))


def test_vectorised_score_equals_a_per_head_loop(model):
    x = random_input(model.cfg, batch=3, n_pos=N)
    patterns = attention_patterns(model, x)
    _, cache = model.run_with_cache(x)
    target = torch.rand(N, N, generator=torch.Generator().manual_seed(0)).tril()
    target[2] = 0  # an empty row: left out
    got = pattern_score(cache, target)
    assert torch.equal(pattern_score(patterns, target), got)
    rows = [d for d in range(N) if d != 2]
    for layer in range(2):
        # one layer's [batch, head] scores, not both layers': another reduction shape
        torch.testing.assert_close(
            pattern_score(patterns[layer], target), got[layer], rtol=1e-14, atol=0
        )
        for h in range(3):
            per_item = [
                (A[rows] * target[rows]).sum() / A[rows].sum()
                for A in cache["pattern", layer][:, h]
            ]
            want = torch.stack(per_item).mean()
            assert torch.allclose(got[layer, h], want, rtol=1e-14, atol=0)


def test_targets_by_hand():
    assert torch.equal(
        previous_position_target(3), torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
    )
    assert torch.equal(position_k_target(4, 2)[:, 2], torch.tensor([0.0, 0, 1, 1]))
    assert position_k_target(4, 2).sum() == 2
    t = induction_target(7, 3)
    assert t.nonzero().tolist() == [[3, 1], [4, 2], [5, 3], [6, 4]]


def test_repeated_random_vectors():
    x = repeated_random_vectors(4, 5, 3, seed=1, dtype=torch.float64)
    assert x.shape == (4, 10, 3) and x.dtype == torch.float64
    assert torch.equal(x[:, :5], x[:, 5:])
    assert torch.allclose(x.norm(dim=-1), torch.ones(4, 10, dtype=torch.float64), atol=1e-15)
    assert torch.equal(x, repeated_random_vectors(4, 5, 3, seed=1, dtype=torch.float64))
    assert not torch.equal(x, repeated_random_vectors(4, 5, 3, seed=2, dtype=torch.float64))
    assert not torch.equal(x[0], x[1])
    three = repeated_random_vectors(2, 2, 3, repeats=3)
    assert three.shape == (2, 6, 3) and torch.equal(three[:, :2], three[:, 4:])


def previous_position_model() -> vi.HookedVectorTransformer:
    """Layer 0 head 0 attends to the previous position by construction: one-hot positions
    (W_pos = I), W_Q = c * shift, W_K = I, so its score d -> s is c [s = d - 1]."""
    cfg = vi.VectorTransformerConfig(
        d_in=3, d_model=8, d_head=8, n_heads=2, n_layers=2, n_ctx=8,
        normalization=None, attn_only=True,
    )  # fmt: skip
    model = vi.HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.pos_embed.W_pos.copy_(torch.eye(8))
        model.blocks[0].attn.W_Q[0] = 60.0 * torch.eye(8).roll(-1, dims=1).tril(-1)
        model.blocks[0].attn.W_K[0] = torch.eye(8)
    return model


def test_detect_heads_finds_a_built_previous_position_head():
    model = previous_position_model()
    x = random_input(model.cfg, batch=2, n_pos=7)
    heads, scores = detect_heads(model, x, "previous_position", 0.99, return_scores=True)
    assert heads == [(0, 0)]
    assert scores[0, 0] > 1 - 1e-6 and scores.shape == (2, 2)
    # every other head has zero queries: uniform causal, (1/2 + ... + 1/7) / 6
    uniform = sum(1 / (d + 1) for d in range(1, 7)) / 6
    others = torch.cat([scores[0, 1:], scores[1]])
    assert torch.allclose(others, torch.full_like(others, uniform), atol=1e-14)
    assert detect_heads(model, x, "previous_position", uniform - 1e-9) == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]  # fmt: skip
    assert detect_heads(model, x, "position_k", 0.5, k=0) == []
    assert detect_heads(model, x, "pattern", 0.99, target=previous_position_target(7)) == [(0, 0)]
    assert detect_heads(model, x[:, :6], "induction", 0.99) == []


# -- errors ---------------------------------------------------------------------------
def test_error_target_with_wrong_shape(model):
    A = torch.rand(2, 3, N, N)
    with pytest.raises(ValueError, match=r"target must have shape \[dest_pos, src_pos\]"):
        pattern_score(A, torch.eye(N + 1))
    with pytest.raises(ValueError, match=r"or \[batch, dest_pos, src_pos\] = \(2, 6, 6\)"):
        pattern_score(A, torch.eye(N).expand(3, N, N))


def test_error_target_all_zero():
    with pytest.raises(ValueError, match="target is all zero"):
        pattern_score(torch.rand(2, 1, 3, 3), torch.stack([torch.eye(3), torch.zeros(3, 3)]))


def test_error_patterns_with_wrong_rank_or_type():
    with pytest.raises(ValueError, match="dest_pos == src_pos"):
        previous_position_score(torch.rand(2, 3, 4, 5))


def test_error_bad_k_and_m():
    A = torch.rand(1, 1, 5, 5)
    with pytest.raises(ValueError, match=r"k must be an int in \[0, 4\]"):
        position_k_score(A, 5)
    with pytest.raises(ValueError, match="needs an even number of positions; got 5"):
        induction_score(A)
    with pytest.raises(ValueError, match=r"m \(the period\) must be an int in \[1, 4\]"):
        induction_score(A, m=5)


def test_error_detect_heads_arguments(model):
    x = random_input(model.cfg, batch=1, n_pos=4)
    with pytest.raises(ValueError, match="kind must be one of"):
        detect_heads(model, x, "prev")
    with pytest.raises(ValueError, match="kind='position_k' needs k"):
        detect_heads(model, x, "position_k")
    with pytest.raises(ValueError, match="kind='pattern' needs target"):
        detect_heads(model, x, "pattern")


def test_repeated_random_vectors_from_a_generator():
    gen = torch.Generator().manual_seed(3)
    first = repeated_random_vectors(2, 4, 5, generator=gen, dtype=torch.float64)
    second = repeated_random_vectors(2, 4, 5, generator=gen, dtype=torch.float64)
    assert torch.equal(first, repeated_random_vectors(2, 4, 5, seed=3, dtype=torch.float64))
    assert not torch.equal(first, second)  # the generator advanced
    again = torch.Generator().manual_seed(3)
    repeated_random_vectors(2, 4, 5, generator=again)
    assert torch.equal(
        second, repeated_random_vectors(2, 4, 5, generator=again, dtype=torch.float64)
    )
    with unchecked(), pytest.raises(TypeError, match="generator must be a torch.Generator or"):
        repeated_random_vectors(2, 4, 5, generator=3)


def test_error_repeated_random_vectors_sizes():
    with pytest.raises(ValueError, match="m must be a positive int, got 0"):
        repeated_random_vectors(2, 0, 3)
