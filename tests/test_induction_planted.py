"""A 2-layer attention-only model with a HAND-PLANTED induction circuit.

Residual stream layout (``d_model = 3 D + N``, ``D = d_in``, ``N = n_ctx``)::

    [ A: current vector (D) | B: previous vector (D) | P: one-hot position (N) | C: output (D) ]

- ``W_E`` writes the input into A, ``W_pos`` the one-hot position into P.
- Layer 0, head ``PREV``: query ``e_d`` (from P, times ``ALPHA``), key ``e_{s+1}`` (P shifted
  by one), so it attends to ``s = d - 1`` (position 0 to itself); it copies A into B. After
  layer 0, position ``d`` holds ``x_{d-1}`` in B (``x_0`` at positions 0 and 1).
- Layer 1, head ``IND``: query ``BETA * A`` (the current vector), key B (what the
  previous-position head wrote), so it attends to the position right after an earlier
  occurrence of the current vector; it copies that position's A into C, which ``W_U`` reads.
  Position 0's key also carries ``-KAPPA`` (through a "constant" query dimension fed by every
  position's one-hot), because position 0's B holds ``x_0`` like position 1's: without it a
  query ``x_0`` at ``d = m`` would split its attention between positions 0 and 1.
- Every other head has small random weights (it must not be mistaken for either).

K-composition of the planted pair, by hand: ``OV_prev = E_A^T E_B`` (A to B, identity), and
``QK_ind = BETA E_A^T E_B - KAPPA 1_P^T e_{P0}`` (query rows, key columns), so
``OV_prev QK_ind^T = BETA E_A^T E_A`` and the score is
``BETA sqrt(D) / (sqrt(D) sqrt(BETA^2 D + KAPPA^2 N)) = BETA / sqrt(BETA^2 D + KAPPA^2 N)``.
Q- and V-composition of the pair are exactly 0: the previous-position head writes only
into B, which the induction head's query and value never read.
"""

import math

import pytest
import torch

import vecinterp as vi
from helpers import tiny_cfg
from vecinterp.analysis.detectors import detect_heads, induction_score
from vecinterp.analysis.scores import composition_baseline, composition_scores
from vecinterp.tasks import induction

D, N, N_HEADS = 6, 12, 3
PREV, IND = (0, 1), (1, 2)  # planted heads, away from index 0 on purpose
ALPHA, BETA, KAPPA = 60.0, 100.0, 40.0
A, B, P, C = (slice(0, D), slice(D, 2 * D), slice(2 * D, 2 * D + N), slice(2 * D + N, 3 * D + N))


def planted_model(seed: int = 0, noise: float = 0.05) -> vi.HookedVectorTransformer:
    cfg = tiny_cfg(
        d_in=D,
        d_out=D,
        d_model=3 * D + N,
        d_head=N,
        n_heads=N_HEADS,
        n_ctx=N,
        attn_only=True,
        normalization=None,
        positional="learned",
    )
    model = vi.HookedVectorTransformer(cfg, seed=seed, dtype=torch.float64)
    eye_d = torch.eye(D, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".W_Q", ".W_K", ".W_V", ".W_O")):
                p.mul_(noise / cfg.init_range)  # the unplanted heads: small random weights
            elif not name.endswith((".W_E", ".W_pos", ".W_U")):
                p.zero_()  # biases
        model.embed.W_E.zero_()
        model.embed.W_E[:, A] = eye_d
        model.pos_embed.W_pos.zero_()
        model.pos_embed.W_pos[:, P] = torch.eye(N, dtype=torch.float64)
        model.unembed.W_U.zero_()
        model.unembed.W_U[C, :] = eye_d

        layer, head = PREV
        attn = model.blocks[layer].attn
        for w in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
            w[head].zero_()
        attn.W_Q[head][P, :] = ALPHA * torch.eye(N, dtype=torch.float64)  # query e_d
        attn.W_K[head][P, :] = torch.eye(N, dtype=torch.float64).roll(1, dims=1)  # key e_{s+1}
        attn.W_K[head][P.start + N - 1, :] = 0.0  # the last position has no s + 1
        attn.W_V[head][A, :D] = eye_d
        attn.W_O[head][:D, B] = eye_d

        layer, head = IND
        attn = model.blocks[layer].attn
        for w in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
            w[head].zero_()
        attn.W_Q[head][A, :D] = BETA * eye_d  # query: the current vector
        attn.W_K[head][B, :D] = eye_d  # key: the previous vector
        attn.W_Q[head][P, D] = 1.0  # a constant query dimension ...
        attn.W_K[head][P.start, D] = -KAPPA  # ... that pushes position 0 away
        attn.W_V[head][A, :D] = eye_d
        attn.W_O[head][:D, C] = eye_d
    return model


@pytest.fixture(scope="module")
def model():
    return planted_model()


@pytest.fixture(scope="module")
def batch():
    return induction.generate(32, m=5, dim=D, dtype=torch.float64, seed=0)  # 10 positions


def test_planted_heads_do_what_they_were_built_for(model, batch):
    patterns = vi.attention_patterns(model, batch.inputs)
    prev = patterns[PREV[0], :, PREV[1]]  # [batch, dest, src]
    rows = torch.arange(1, batch.length)
    assert prev[:, rows, rows - 1].min() > 0.999
    ind = patterns[IND[0], :, IND[1]]
    dest = torch.arange(batch.m, batch.length)
    assert ind[:, dest, dest - batch.m + 1].mean() > 0.99


def test_planted_model_solves_the_repeated_half(model, batch):
    with torch.no_grad():
        out = model(batch.inputs)
    mse = vi.masked_mse(out, batch.targets, batch.loss_mask).item()
    # 1 / D is the MSE of predicting 0 (unit targets); the planted circuit is far below
    assert mse * D < 0.02
    first_half = vi.masked_mse(out, batch.targets, ~batch.loss_mask).item()
    assert first_half * D > 0.5  # nothing predicts the fresh vectors of the first half


def test_detectors_find_exactly_the_planted_heads(model, batch):
    prev_heads, prev_scores = detect_heads(
        model, batch.inputs, "previous_position", 0.5, return_scores=True
    )
    ind_heads, ind_scores = detect_heads(
        model, batch.inputs, "induction", 0.5, m=batch.m, return_scores=True
    )
    assert prev_heads == [PREV]
    assert ind_heads == [IND]
    assert prev_scores[PREV] > 0.999
    assert ind_scores[IND] > 0.99
    others = torch.ones(2, N_HEADS, dtype=torch.bool)
    others[PREV] = others[IND] = False
    assert prev_scores[others].max() < 0.4 and ind_scores[others].max() < 0.4


def swapped_planted_model() -> vi.HookedVectorTransformer:
    """:func:`planted_model` with the previous-token head moved to head 0.2 and the
    induction head to head 1.0 (each swapped with the head at that index)."""
    model, swapped = planted_model(), planted_model()
    with torch.no_grad():
        for layer, (a, b) in ((0, (PREV[1], 2)), (1, (IND[1], 0))):
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                w = getattr(swapped.blocks[layer].attn, name)
                src = getattr(model.blocks[layer].attn, name)
                w[a], w[b] = src[b].clone(), src[a].clone()
    return swapped


def test_detectors_follow_the_planted_heads_to_other_indices():
    # The same circuit at other indices is found there: the detectors read the patterns,
    # not an index that happens to be right.
    swapped = swapped_planted_model()
    x = induction.generate(16, m=4, dim=D, dtype=torch.float64, seed=3).inputs
    assert detect_heads(swapped, x, "previous_position", 0.5) == [(0, 2)]
    assert detect_heads(swapped, x, "induction", 0.5, m=4) == [(1, 0)]


def test_k_composition_of_the_planted_pair_is_the_hand_worked_value(model):
    k = composition_scores(model, kind="K")
    expected = BETA / math.sqrt(BETA**2 * D + KAPPA**2 * N)
    assert k[PREV[0], PREV[1], IND[0], IND[1]].item() == pytest.approx(expected, rel=1e-12)


def test_q_and_v_composition_of_the_planted_pair_are_zero(model):
    for kind in ("Q", "V"):
        score = composition_scores(model, kind=kind)[PREV[0], PREV[1], IND[0], IND[1]]
        assert score.item() == pytest.approx(0.0, abs=1e-12), kind


def test_k_composition_of_the_planted_pair_stands_out_from_the_baseline(model):
    k = composition_scores(model, kind="K")
    base = composition_baseline(model, "K", n_samples=500, seed=0)
    pair = k[PREV[0], PREV[1], IND[0], IND[1]].item()
    assert pair > base.mean + 5 * base.std
    assert pair > base.samples.max().item()
    # and it is the largest K-composition score of all layer-0 -> layer-1 pairs
    assert pair == k[0, :, 1, :].max().item()


def test_k_composition_of_a_random_pair_does_not_stand_out():
    # The control: the same test on the unplanted random heads is not passed, so the
    # "stands out" check above can fail.
    model = planted_model()
    k = composition_scores(model, kind="K")
    base = composition_baseline(model, "K", n_samples=500, seed=0)
    random_pair = k[0, 2, 1, 0].item()
    assert random_pair < base.mean + 5 * base.std


def test_induction_score_needs_the_previous_position_head(model, batch):
    # K-composition is causal here: zero the previous-position head's output and the
    # induction head loses its stripe.
    hook = vi.zero_ablation_hook(heads=PREV[1])
    with model.hooks(fwd_hooks=[(f"blocks.{PREV[0]}.attn.hook_z", hook)]):
        patterns = vi.attention_patterns(model, batch.inputs)
    after = induction_score(patterns, m=batch.m)[IND]
    assert after < 0.3
