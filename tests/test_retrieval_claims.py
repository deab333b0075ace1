"""vecinterp.tasks.retrieval_claims: the claims of Musat (2024) measured, judged, tabulated.

Exact values on hand-built layouts and attention patterns (the worked layout of
vecinterp.tasks.retrieval's docstring), the vectorised maps against their loop definition
and against the emergence table's path attention, invariants of causal attention and of
the ablation search, the verdict thresholds at their boundaries on hand-made numbers, and
verdicts recomputed from a JSON round-trip. The whole run on trained models is checked by
tests/test_example_retrieval.py.
"""

import dataclasses
import json

import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from vecinterp.tasks import retrieval as R
from vecinterp.tasks import retrieval_claims as rc

# The worked layout of vecinterp.tasks.retrieval (N = 2 chains a, b; D = 2) as sequence 0,
# and a second sequence with the other orders:
#   sequence 0: b_0 b_1 a_0 a_1 | a_1 a_2 b_1 b_2 | b_0 a_0      (Q of b at 8, of a at 9)
#   sequence 1: a_0 a_1 b_0 b_1 | b_1 b_2 a_1 a_2 | a_0 b_0      (Q of a at 8, of b at 9)
LEFT = [[[2, 4], [0, 6]], [[0, 6], [2, 4]]]  # [batch, chain, step]
QUERY = [[9, 8], [8, 9]]  # [batch, chain]
QUERY_CHAIN = [[1, 0], [0, 1]]  # [batch, query slot]


def layout_batch(ic: bool = True) -> R.RetrievalBatch:
    """A batch with the hand-written positions above (values zero: only positions matter)."""
    left = torch.tensor(LEFT)
    d_out = 8 if ic else 4
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[:, 8:] = True
    return R.RetrievalBatch(
        inputs=torch.zeros(2, 10, 8),
        targets=torch.zeros(2, 10, d_out),
        loss_mask=mask,
        symbols=torch.zeros(2, 2, 3, 4),
        left_pos=left,
        right_pos=left + 1,
        query_pos=torch.tensor(QUERY),
        query_chain=torch.tensor(QUERY_CHAIN),
        implicit_curriculum=ic,
    )


def path(layer: int, head: int, dest: int, src: int, value: float = 1.0) -> rc.ChainPath:
    names = R.role_names(2)
    return rc.ChainPath(
        layer=layer, head=head, dest=dest, src=src, value=value,
        name=f"L{layer}H{head} {names[dest]}->{names[src]}",
    )  # fmt: skip


L0, R0, L1, R1, Q = range(5)  # the roles of a depth-2 chain


def tiny_settings(**kw) -> rc.Settings:
    return dataclasses.replace(rc.FAST, eval_size=16, analysis_size=8, **kw)


# ----------------------------------------------------------------------- chain-aligned maps


def test_the_hand_built_layout_is_the_docstring_s():
    batch = layout_batch()
    assert batch.role_positions[0].tolist() == [[2, 3, 4, 5, 9], [0, 1, 6, 7, 8]]
    assert rc.position_labels(batch, 0) == [
        "b:L0", "b:R0", "a:L0", "a:R0", "a:L1", "a:R1", "b:L1", "b:R1", "b:Q", "a:Q",
    ]  # fmt: skip
    assert rc.position_labels(batch, 1)[8:] == ["a:Q", "b:Q"]


def test_chain_aligned_maps_hand_worked():
    batch = layout_batch()
    eye = torch.eye(10)
    patterns = eye.repeat(1, 2, 3, 1, 1)  # [1 layer, 2 sequences, 3 heads, 10, 10]
    for b in range(2):
        for c in range(2):
            q, r0 = QUERY[b][c], LEFT[b][c][0] + 1
            # head 0: every query 0.75 on its own chain's R0, 0.25 on itself
            patterns[0, b, 0, q] = 0.25 * eye[q] + 0.75 * eye[r0]
            # head 1: sequence 0 reads its own chain's R0, sequence 1 the other chain's
            other_r0 = LEFT[b][1 - c][0] + 1
            patterns[0, b, 1, q] = eye[r0] if b == 0 else eye[other_r0]
    maps = rc.chain_aligned_maps(patterns, batch)
    assert maps.shape == (1, 3, 5, 5)
    expected = torch.eye(5)
    expected[Q] = torch.tensor([0.0, 0.75, 0.0, 0.0, 0.25])
    torch.testing.assert_close(maps[0, 0], expected, rtol=0, atol=1e-7)
    # the map follows the chain, not the position: half the (sequence, chain) pairs
    assert maps[0, 1, Q, R0] == 0.5 and maps[0, 1, Q, Q] == 0.0
    torch.testing.assert_close(maps[0, 2], torch.eye(5), rtol=0, atol=0)  # identity head


def test_previous_position_head_links_each_pair():
    batch = layout_batch()
    previous = torch.eye(10).roll(-1, dims=1).tril()  # row p on p - 1 ...
    previous[0, 0] = 1.0  # ... and position 0 on itself
    maps = rc.chain_aligned_maps(previous.expand(1, 2, 1, 10, 10), batch)[0, 0]
    assert maps[R0, L0] == 1.0 and maps[R1, L1] == 1.0  # a pair's tokens are adjacent
    # L1 of a chain follows its own R0 only in sequence 0's chain a and sequence 1's b
    assert maps[L1, R0] == 0.5
    # the queries: b's query (8) follows b's R1 (7) in sequence 0, a's (8) a's R1 (7) in 1
    assert maps[Q, R1] == 0.5


def _maps_by_loops(patterns: torch.Tensor, batch: R.RetrievalBatch) -> torch.Tensor:
    n_layers, n_batch, n_heads = patterns.shape[:3]
    pos = batch.role_positions
    n_chains, n_roles = pos.shape[1:]
    out = torch.zeros(n_layers, n_heads, n_roles, n_roles, dtype=patterns.dtype)
    for layer in range(n_layers):
        for head in range(n_heads):
            for r in range(n_roles):
                for s in range(n_roles):
                    total = sum(
                        patterns[layer, b, head, pos[b, c, r], pos[b, c, s]]
                        for b in range(n_batch)
                        for c in range(n_chains)
                    )
                    out[layer, head, r, s] = total / (n_batch * n_chains)
    return out


def test_chain_aligned_maps_equal_their_loop_definition():
    batch = R.generate(5, 2, n_chains=3, seed=3)
    gen = torch.Generator().manual_seed(0)
    patterns = torch.randn(2, 5, 3, batch.n_pos, batch.n_pos, generator=gen).softmax(-1)
    torch.testing.assert_close(
        rc.chain_aligned_maps(patterns, batch), _maps_by_loops(patterns, batch)
    )


def test_role_maps_of_a_causal_model_look_only_back():
    """Roles are in sequence order within a chain, so causal attention gives a lower
    triangular map; its entries are shares of attention, its rows sum to at most 1."""
    batch = R.generate(16, 2, n_chains=3, seed=1)
    cfg = R.model_config(2, 2, n_chains=3, d_model=16, n_heads=2, attn_only=True)
    model = vi.HookedVectorTransformer(cfg, seed=0)
    maps = rc.role_maps(model, batch)
    torch.testing.assert_close(
        maps, rc.chain_aligned_maps(vi.attention_patterns(model, batch.inputs), batch)
    )
    assert torch.equal(maps.triu(1), torch.zeros_like(maps))
    assert (maps >= 0).all() and (maps.sum(-1) <= 1 + 1e-6).all()
    assert (maps.diagonal(dim1=-2, dim2=-1) > 0).all()  # every token sees itself


def test_chain_aligned_maps_refuse_patterns_of_another_batch():
    batch = layout_batch()
    with pytest.raises(ValueError, match="do not belong to the batch"):
        rc.chain_aligned_maps(torch.zeros(1, 3, 1, 10, 10), batch)
    with unchecked(), pytest.raises(ValueError, match=r"n_layers, batch, n_heads, pos, pos"):
        rc.chain_aligned_maps(torch.zeros(2, 1, 10, 10), batch)
    with unchecked(), pytest.raises(TypeError, match="RetrievalBatch"):
        rc.chain_aligned_maps(torch.zeros(1, 2, 1, 10, 10), batch.inputs)


# ------------------------------------------------------------------------ paths and maps


def test_find_paths_hand_worked():
    maps = torch.zeros(2, 2, 5, 5)
    maps[0, 1, Q, R0] = 0.7  # found
    maps[0, 1, R1, R1] = 0.9  # a token on itself: never a path
    maps[0, 0, L1, R0] = 0.4  # below the threshold
    maps[1, 0, R0, L0] = 0.5  # at the threshold: found
    found = rc.find_paths(maps, 0.5)
    assert [(p["layer"], p["head"], p["dest"], p["src"], p["name"]) for p in found] == [
        (0, 1, Q, R0, "L0H1 Q->R0"),
        (1, 0, R0, L0, "L1H0 R0->L0"),
    ]
    assert found[0]["value"] == pytest.approx(0.7)
    assert rc.find_paths(maps) == found  # THRESHOLDS["path"] is 0.5
    assert [p["name"] for p in rc.find_paths(maps, 0.3)] == [
        "L0H0 L1->R0",
        "L0H1 Q->R0",
        "L1H0 R0->L0",
    ]


@pytest.mark.parametrize(
    ("maps", "threshold", "error", "match"),
    [
        (torch.zeros(2, 5, 5), 0.5, ValueError, "n_layers, n_heads"),
        (torch.zeros(1, 1, 4, 4), 0.5, ValueError, "2D \\+ 1 roles"),
        (torch.zeros(1, 1, 5, 5), 0.0, ValueError, r"\(0, 1\]"),
        (torch.zeros(1, 1, 5, 5), 1.5, ValueError, r"\(0, 1\]"),
        (torch.zeros(1, 1, 5, 5), True, TypeError, "number"),
    ],
)
def test_find_paths_refuses_bad_input(maps, threshold, error, match):
    with unchecked(), pytest.raises(error, match=match):
        rc.find_paths(maps, threshold)


def test_one_hot_map_hand_worked():
    batch = layout_batch()
    attn = rc.one_hot_map(batch, [path(0, 0, R0, L0), path(0, 0, Q, R1)])
    expected = torch.eye(10).repeat(2, 1, 1)
    # sequence 0: a's R0 (3) -> a's L0 (2), b's R0 (1) -> b's L0 (0); queries 9 (a), 8 (b)
    # on their chain's R1: a's at 5, b's at 7
    for b, rows in enumerate([{3: 2, 1: 0, 9: 5, 8: 7}, {1: 0, 3: 2, 8: 7, 9: 5}]):
        for row, col in rows.items():
            expected[b, row] = torch.eye(10)[col]
    assert torch.equal(attn, expected)
    # rows untouched by a path come from base; a removed path's rows are identity
    base = torch.eye(10).roll(-1, dims=1)
    attn = rc.one_hot_map(batch, [path(0, 0, R0, L0)], base, removed=[path(0, 0, Q, R1)])
    for b in range(2):
        for row in range(10):
            if row in (1, 3):
                want = 0 if row == 1 else 2
            elif row in (8, 9):
                want = row
            else:
                want = (row - 1) % 10
            assert attn[b, row].argmax() == want and attn[b, row].sum() == 1.0


def test_one_hot_map_refuses_roles_and_bases_that_do_not_fit():
    batch = layout_batch()
    beyond = rc.ChainPath(layer=0, head=0, dest=5, src=0, value=1.0, name="L0H0 ?->L0")
    with pytest.raises(ValueError, match="role outside 0..4"):
        rc.one_hot_map(batch, [beyond])
    with pytest.raises(ValueError, match=r"base must be \[pos, pos\]"):
        rc.one_hot_map(batch, [], torch.eye(9))


def test_positional_maps_hand_worked():
    patterns = torch.zeros(1, 2, 1, 3, 3)
    patterns[0, 0, 0] = torch.tensor([[1.0, 0, 0], [0.6, 0.4, 0], [0.1, 0.1, 0.8]])
    patterns[0, 1, 0] = torch.tensor([[1.0, 0, 0], [0.0, 1.0, 0], [0.1, 0.8, 0.1]])
    # means: row 1 (0.3, 0.7) -> 1; row 2 (0.1, 0.45, 0.45): the first maximum, 1
    expected = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 1, 0]])
    assert torch.equal(rc.positional_maps(patterns)[0, 0], expected)


# ------------------------------------------------------------------ the ablation search


def _model(n_layers: int = 2, n_heads: int = 2, seed: int = 0) -> vi.HookedVectorTransformer:
    cfg = R.model_config(2, n_layers, n_chains=2, d_model=16, n_heads=n_heads, attn_only=True)
    return vi.HookedVectorTransformer(cfg, seed=seed)


def test_validate_circuit_on_a_model_whose_attention_writes_nothing():
    """W_O = 0: every ablation leaves the outputs as they are, so every loss is the base
    loss, ties go to the simplest hypothesis (uniform) and no head carries anything."""
    model = _model()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.zero_()
    batch = R.generate(8, 2, n_chains=2, seed=0)
    patterns = vi.attention_patterns(model, batch.inputs)
    paths = [path(1, 0, Q, R0, 0.6)]
    v = rc.validate_circuit(model, batch, paths, rc.positional_maps(patterns))
    with torch.no_grad():
        base = float(vi.masked_mse(model(batch.inputs), batch.targets, batch.loss_mask))
    assert v["base"] == pytest.approx(base, abs=1e-6)
    for key in ("full", "combined", "all_uniform"):
        assert v[key] == pytest.approx(base, abs=1e-6)
    assert v["limit"] == pytest.approx(max(0.05, 1.5 * base))
    assert v["choice"] == dict.fromkeys(["L0H0", "L0H1", "L1H0", "L1H1"], "uniform")
    assert sorted(v["single"]["L1H0"]) == sorted(rc.CANDIDATES)  # it has a path
    assert "paths" not in v["single"]["L0H0"]  # no path: no "paths" hypothesis
    assert v["carrying"] == v["positional"] == [] and v["kept"] == [] and v["without"] == {}
    assert v["dropped"] == paths and v["found_heads"] == ["L1H0"]
    json.dumps(v)  # JSON-ready


def _loss_with(model, batch, paths, positional, choice: dict[str, str]) -> float:
    """The combined-ablation loss of a choice, built directly from its definition."""
    maps = {}
    for label, kind in choice.items():
        layer, head = (int(x) for x in label[1:].split("H"))
        mine = [p for p in paths if (p["layer"], p["head"]) == (layer, head)]
        if kind in rc.IDLE:
            maps[(layer, head)] = kind
        else:
            base = positional[layer, head] if kind == "paths+positional" else None
            maps[(layer, head)] = rc.one_hot_map(batch, mine, base)
    out = vi.ablate_patterns(model, batch.inputs, maps)
    return float(vi.masked_mse(out, batch.targets, batch.loss_mask))


def test_validate_circuit_losses_match_their_definitions():
    model = _model(seed=3)
    batch = R.generate(16, 2, n_chains=2, seed=1)
    patterns = vi.attention_patterns(model, batch.inputs)
    positional = rc.positional_maps(patterns)
    paths = rc.find_paths(rc.chain_aligned_maps(patterns, batch), 0.3)
    assert paths, "the test wants some candidate paths"
    v = rc.validate_circuit(model, batch, paths, positional)
    heads = ["L0H0", "L0H1", "L1H0", "L1H1"]
    # each head alone, each hypothesis
    for label in heads:
        for kind, loss in v["single"][label].items():
            assert loss == pytest.approx(
                _loss_with(model, batch, paths, positional, {label: kind}), abs=1e-6
            )
    # the combined ablation is the loss of the reported choice, within the bound
    assert v["combined"] == pytest.approx(
        _loss_with(model, batch, paths, positional, v["choice"]), abs=1e-6
    )
    assert v["combined"] <= max(v["limit"], v["full"]) + 1e-9
    assert v["all_uniform"] == pytest.approx(
        _loss_with(model, batch, paths, positional, dict.fromkeys(heads, "uniform")), abs=1e-6
    )
    # the classification is consistent with the choice
    busy = {h for h, kind in v["choice"].items() if kind not in rc.IDLE}
    assert set(v["carrying"]) | set(v["positional"]) == busy
    assert not set(v["carrying"]) & set(v["positional"])
    assert {p["name"] for p in v["kept"]} | {p["name"] for p in v["dropped"]} == {
        p["name"] for p in paths
    }
    for p in v["kept"]:
        assert f"L{p['layer']}H{p['head']}" in v["carrying"]
    assert set(v["without"]) == {p["name"] for p in v["kept"]}


def test_validate_circuit_refuses_bad_input():
    model = _model()
    batch = R.generate(4, 2, n_chains=2, seed=0)
    positional = torch.zeros(2, 2, 10, 10)
    non_ic = R.generate(4, 2, n_chains=2, seed=0, implicit_curriculum=False)
    with pytest.raises(ValueError, match="IC batch"):
        rc.validate_circuit(model, non_ic, [], positional)
    with pytest.raises(ValueError, match="positional must be"):
        rc.validate_circuit(model, batch, [], torch.zeros(2, 2, 9, 9))
    with pytest.raises(ValueError, match="head the model does not have"):
        rc.validate_circuit(model, batch, [path(5, 0, Q, R0)], positional)
    with pytest.raises(ValueError, match="sweeps"):
        rc.validate_circuit(model, batch, [], positional, sweeps=-1)


# ------------------------------------------------------------------------------ judging


def values(**changes) -> dict:
    """Hand-made numbers under which every claim holds (16 heads, D = 2)."""
    kept = [path(1, 0, R0, L0, 0.98), path(2, 1, Q, R0, 0.9), path(3, 0, Q, R1, 0.95)]
    v = {
        "ic_loss": 0.01,
        "partial": [0.005, 0.015],
        "non_ic_loss": 0.74,
        "non_ic_steps": 600,
        "checkpoint_every": 25,
        "n_heads_total": 16,
        "paths": kept,
        "loss_crossing": {"x_1": 96.0, "x_2": 152.0},
        "path_crossing": {"L1H0 R0->L0": 110.0, "L2H1 Q->R0": 108.0, "L3H0 Q->R1": 158.0},
        "validation": {
            "base": 0.01, "full": 0.03, "combined": 0.04, "limit": 0.05, "all_uniform": 1.0,
            "kept": kept, "dropped": [], "carrying": ["L1H0", "L2H1", "L3H0"],
            "positional": ["L0H1"], "found_heads": ["L1H0", "L2H1", "L3H0"],
            "without": {"L1H0 R0->L0": 0.5, "L2H1 Q->R0": 0.6, "L3H0 Q->R1": 0.045},
            "choice": {"L1H0": "paths"}, "single": {"L1H0": {"uniform": 0.9, "paths": 0.02}},
        },
    }  # fmt: skip
    for key, value in changes.items():
        if key in v["validation"]:
            v["validation"][key] = value
        else:
            v[key] = value
    return v


def verdicts(**changes) -> list[str]:
    return [c.verdict for c in rc.judge_claims(values(**changes))]


def test_judge_claims_all_hold_with_their_texts():
    claims = rc.judge_claims(values())
    assert [c.verdict for c in claims] == [rc.HOLDS] * 6
    assert [c.number for c in claims] == [1, 2, 3, 4, 5, 6]
    assert claims[0].ours == "final IC loss 0.0100 (partial: x_1 0.0050, x_2 0.0150)"
    assert claims[1].ours == (
        "non-IC loss 0.7400 after 600 steps (IC model on x_2: 0.0150; predicting 0: 1)"
    )
    assert claims[2].claim == "partial losses fall below 0.5 in chain order"
    assert claims[2].ours == "steps x_1: 96, x_2: 152" and claims[2].value == 2.0
    assert claims[3].ours.startswith("3 of 16 heads carry: L1H0 R0->L0 (0.98), ")
    assert "positional one-hot heads: L0H1; the other 12 idle" in claims[3].ours
    assert claims[4].ours == (
        "0.0100 -> 0.0400 (limit 0.0500; all heads uniform: 1.0000); removing one circuit "
        "path: 2 of 3 raise it above the limit"
    )
    assert claims[5].ours == (
        "x_1 < 0.5 at 96: L1H0 R0->L0 (110), L2H1 Q->R0 (108); x_2 < 0.5 at 152: L3H0 Q->R1 (158)"
    )
    assert claims[5].value == 3.0
    assert claims[1].paper == "loss > 0.7 in 100 % of runs"


@pytest.mark.parametrize(
    ("ic_loss", "verdict"),
    [(0.05, rc.HOLDS), (0.0501, rc.PARTLY), (0.3, rc.PARTLY), (0.3001, rc.NO)],
)
def test_claim_1_thresholds(ic_loss, verdict):
    assert verdicts(ic_loss=ic_loss)[0] == verdict


@pytest.mark.parametrize(
    ("non_ic", "x_last", "verdict"),
    [(0.74, 0.015, rc.HOLDS), (0.74, 0.8, rc.PARTLY), (0.7, 0.015, rc.NO)],
)
def test_claim_2_needs_non_ic_above_and_ic_below_the_paper_s_line(non_ic, x_last, verdict):
    assert verdicts(non_ic_loss=non_ic, partial=[0.005, x_last])[1] == verdict


@pytest.mark.parametrize(
    ("crossing", "verdict", "value"),
    [
        ({"x_1": 96.0, "x_2": 152.0}, rc.HOLDS, 2),
        ({"x_1": 96.0, "x_2": None}, rc.PARTLY, 1),  # x_1 fell, x_2 not yet
        ({"x_1": 152.0, "x_2": 96.0}, rc.NO, 2),  # out of order
        ({"x_1": None, "x_2": 96.0}, rc.NO, 1),  # x_2 without x_1
        ({"x_1": None, "x_2": None}, rc.NO, 0),
    ],
)
def test_claim_3_order_of_the_partial_losses(crossing, verdict, value):
    claim = rc.judge_claims(values(loss_crossing=crossing))[2]
    assert (claim.verdict, claim.value) == (verdict, value)


@pytest.mark.parametrize(
    ("carrying", "positional", "verdict"),
    [
        (4, 4, rc.HOLDS),  # 8 of 16 heads busy: half
        (5, 4, rc.PARTLY),  # 9 of 16
        (0, 0, rc.NO),
        (16, 0, rc.NO),  # every head carries
    ],
)
def test_claim_4_a_few_heads(carrying, positional, verdict):
    heads = [f"L{i // 4}H{i % 4}" for i in range(16)]
    v = values(carrying=heads[:carrying], positional=heads[carrying : carrying + positional])
    assert rc.judge_claims(v)[3].verdict == verdict


@pytest.mark.parametrize(
    ("combined", "carrying", "verdict"),
    [
        (0.05, ["L1H0"], rc.HOLDS),  # at the limit
        (0.49, ["L1H0"], rc.PARTLY),  # below half the all-uniform loss
        (0.5, ["L1H0"], rc.NO),
        (0.01, [], rc.NO),  # no circuit
    ],
)
def test_claim_5_combined_ablation(combined, carrying, verdict):
    assert verdicts(combined=combined, carrying=carrying)[4] == verdict


def test_claim_6_emergence():
    assert verdicts()[5] == rc.HOLDS
    late = values(path_crossing={"L1H0 R0->L0": 110.0, "L2H1 Q->R0": 200.0})
    claim = rc.judge_claims(late)[5]
    assert claim.verdict == rc.PARTLY  # x_2's fall brought no new path
    assert claim.ours.endswith("x_2 < 0.5 at 152: no new path; later: L2H1 Q->R0 (200)")
    never = values(path_crossing={"L1H0 R0->L0": 110.0, "L3H0 Q->R1": None})
    assert rc.judge_claims(never)[5].ours.endswith("; never: L3H0 Q->R1")
    assert rc.judge_claims(never)[5].verdict == rc.PARTLY
    nothing = rc.judge_claims(values(path_crossing={}))[5]
    assert (nothing.verdict, nothing.value) == (rc.NO, 0.0)


def test_emergence_groups_hand_worked():
    groups = rc.emergence_groups(
        {"x_1": 100.0, "x_2": None, "x_3": 50.0},
        {"a": 75.0, "b": 125.0, "c": 126.0, "d": None, "e": 40.0},
        25,
    )
    # in the order the losses fell; a path counts with a fall up to one interval later
    assert groups == [("x_3", 50.0, ["a", "e"]), ("x_1", 100.0, ["b"]), ("x_2", None, [])]


def test_verdicts_are_recomputed_from_a_saved_values_dict():
    v = values(loss_crossing={"x_1": 96.0, "x_2": None}, path_crossing={"L1H0 R0->L0": None})
    saved = json.loads(json.dumps(v))
    assert rc.judge_claims(saved) == rc.judge_claims(v)


def test_judge_claims_refuses_what_is_not_a_values_dict():
    with unchecked(), pytest.raises(TypeError, match="ClaimsResult.values"):
        rc.judge_claims([1, 2])
    v = values()
    del v["non_ic_loss"]
    with pytest.raises(ValueError, match="'non_ic_loss'"):
        rc.judge_claims(v)


# ----------------------------------------------------------------------------- rendering


def test_claims_table_hand_worked():
    claims = [rc.Claim(1, "a | b", "p", "x", 1.0, rc.HOLDS)]
    assert rc.claims_table(claims) == (
        "| # | claim | paper | ours | verdict |\n"
        "|---|---|---|---|---|\n"
        "| 1 | a \\| b | p | x | holds |"
    )
    with unchecked(), pytest.raises(TypeError, match="Claim"):
        rc.claims_table([{"number": 1}])


def test_claims_report_holds_the_table_the_ablation_and_the_thresholds():
    v = values()
    result = rc.ClaimsResult(rc.judge_claims(v), v, rc.FULL.summary())
    text = rc.claims_report(result, figures=["loss.png"], wall=12.34, train_time=5.0)
    assert rc.claims_table(result) in text
    assert "Task: N = 4 chains, D = 2 steps, K = 4 dims. Models: 4 attention-only layers" in text
    assert "Wall time: 12.3 s (training 5.0 s)." in text
    assert "| L1H0 | 0.9000 | - | 0.0200 | - | paths |" in text
    assert "| L3H0 Q->R1 | 0.0450 |" in text
    assert "ablation_factor = 1.5" in text and "![loss.png](loss.png)" in text
    assert "## Figures" not in rc.claims_report(result)
    with unchecked(), pytest.raises(TypeError, match="ClaimsResult"):
        rc.claims_report(result.claims)


# ----------------------------------------------------------------------- settings, runs


def test_settings_summaries_and_checks():
    assert rc.FULL.summary() == {
        "task": "N = 4 chains, D = 2 steps, K = 4 dims",
        "model": "4 attention-only layers x 4 heads, d_model 64 (d_head 16), LayerNorm, no "
        "positional embedding",
        "training": "AdamW lr 0.003 (cosine to 0.0003), weight decay 0.1, batch 128, 1000 IC "
        "/ 600 non-IC steps, checkpoint every 25",
    }
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        dataclasses.replace(rc.FAST, steps=0)
    with pytest.raises(ValueError, match="dim must be even"):
        dataclasses.replace(rc.FAST, dim=3)
    with pytest.raises(ValueError, match="not a multiple of n_heads"):
        dataclasses.replace(rc.FAST, d_model=33)
    with pytest.raises(ValueError, match="lr must be a positive number"):
        dataclasses.replace(rc.FAST, lr=0.0)


def test_train_model_follows_the_settings(tmp_path):
    s = tiny_settings(steps=4, non_ic_steps=2, checkpoint_every=2)
    ic = rc.train_model(s, ic=True, seed=5, checkpoint_dir=tmp_path)
    assert len(ic.history.train_loss) == 4 and ic.model.cfg.d_out == s.depth * s.dim
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000002", "step_00000004"]
    non_ic = rc.train_model(s, ic=False, seed=5)
    assert len(non_ic.history.train_loss) == 2 and non_ic.model.cfg.d_out == s.dim
    again = rc.train_model(s, ic=True, seed=5)
    for a, b in zip(ic.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with unchecked(), pytest.raises(TypeError, match="Settings"):
        rc.train_model(dataclasses.asdict(s), ic=True)


@pytest.fixture(scope="module")
def measured():
    s = tiny_settings()
    ic = vi.HookedVectorTransformer(rc.model_config(s), seed=1)
    later = vi.HookedVectorTransformer(rc.model_config(s), seed=2)
    non_ic = vi.HookedVectorTransformer(rc.model_config(s, ic=False), seed=1)
    return s, ic, rc.measure_claims(ic, non_ic, s, [(0, later), (30, ic)])


def test_measure_claims_numbers_agree_with_their_definitions(measured):
    s, ic, result = measured
    v = result.values
    assert v["ic_loss"] == pytest.approx(sum(v["partial"]) / len(v["partial"]), abs=1e-6)
    val = rc.eval_batch(s, s.eval_size, rc.EVAL_SEED)
    with torch.no_grad():
        loss = float(vi.masked_mse(ic(val.inputs), val.targets, val.loss_mask))
    assert v["ic_loss"] == pytest.approx(loss, abs=1e-6)
    analysis = result.data["analysis_batch"]
    assert torch.equal(analysis.inputs, rc.eval_batch(s, s.analysis_size, rc.ANALYSIS_SEED).inputs)
    torch.testing.assert_close(result.data["role_maps"], rc.role_maps(ic, analysis))
    assert v["paths"] == rc.find_paths(result.data["role_maps"], rc.THRESHOLDS["path"])
    assert set(v["path_crossing"]) == {p["name"] for p in v["validation"]["kept"]}
    assert set(v["loss_crossing"]) == {"x_1", "x_2"}
    assert result.data["table"].steps == [0, 30]
    assert result.claims == rc.judge_claims(json.loads(json.dumps(v)))
    assert result.info == s.summary()


def test_emergence_path_attention_is_the_chain_aligned_map(measured):
    """track_emergence (through vecinterp's emergence) and chain_aligned_maps define a
    path's attention the same way."""
    s, ic, result = measured
    analysis = result.data["analysis_batch"]
    paths = [path(layer, head, Q, R0) for layer in range(3) for head in range(2)]
    table = rc.track_emergence([(30, ic)], analysis, paths)
    maps = rc.role_maps(ic, analysis)
    for p in paths:
        assert table.value(30, p["name"]) == pytest.approx(
            float(maps[p["layer"], p["head"], Q, R0]), abs=1e-6
        )


def test_measure_claims_refuses_models_that_do_not_fit():
    s = tiny_settings()
    ic = vi.HookedVectorTransformer(rc.model_config(s), seed=0)
    with pytest.raises(ValueError, match="non_ic_model does not fit"):
        rc.measure_claims(ic, ic, s, [(0, ic)])
    with unchecked(), pytest.raises(TypeError, match="Settings"):
        rc.measure_claims(ic, ic, "fast", [(0, ic)])


def test_claim_figures(measured):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, ic, result = measured
    history = vi.TrainHistory(steps=[0, 1], train_loss=[1.0, 0.5])
    figures = rc.claim_figures(result, ic_history=history, non_ic_history=history)
    assert tuple(figures) == rc.FIGURES
    plt.close("all")
    with pytest.raises(ValueError, match="with its data"):
        rc.claim_figures(rc.ClaimsResult(result.claims, result.values, result.info))
