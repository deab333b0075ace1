"""vecinterp.tasks.induction_claims: the induction-head claims measured, judged and saved.

Exact values: the verdicts at their thresholds and the rendered rows of a hand-built values
dict; the measurement on the hand-planted circuit of tests/test_induction_planted.py,
where the heads, their K/Q/V composition and the effect of the ablations are known.
Equivalences: the copy-the-current-vector loss against its cosine formula, the
composition numbers against ``composition_scores``, the ablations against a hand-made
hook. Invariants: a JSON round trip (values dict or ``results.json``) gives the same
claims; bad inputs are refused with the argument named. The trained model's numbers are
checked by tests/test_example_induction.py.
"""

import copy
import inspect
import json
import math

import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from test_induction_planted import BETA, IND, KAPPA, PREV, D, N, planted_model
from vecinterp.tasks import induction
from vecinterp.tasks import induction_claims as ic

SIZES = dict(
    m=5,
    min_m=3,
    max_m=6,
    analysis_batch=16,
    population=32,
    eval_batches=4,
    eval_batch_size=8,
    baseline_samples=200,
)


@pytest.fixture(scope="module")
def planted():
    model = planted_model()
    return model, ic.measure_claims(model, **SIZES)


def hand_values() -> dict:
    """A values dict written by hand, every claim clearly "holds"."""
    return {
        "rel_mse": 0.0012,
        "rel_mse_copy_current": 2.0,
        "heads": {
            "prev_scores": [[0.1, 0.865], [0.2, 0.1]],
            "induction_scores": [[0.0, 0.1], [0.9, 0.996]],
            "prev_head": [0, 1],
            "induction_head": [1, 1],
            "prev_score": 0.865,
            "induction_score": 0.996,
            "induction_score_by_m": {"16": 0.997, "4": 0.988},  # out of order on purpose
            "prev_heads": [[0, 1]],
            "induction_heads": [[1, 0], [1, 1]],
        },
        "composition": {
            "pair": {"K": 0.31, "Q": 0.015, "V": 0.016},
            "z": {"K": 26.0, "Q": -15.0, "V": -15.5},
            "baseline_mean": 0.125,
            "baseline_std": 0.007,
            "baseline_max": 0.15,
            "rank_in_column": 1,
            "runner_up": 0.219,
        },
        "ablation": {
            "prev_heads": [[0, 1]],
            "induction_heads": [[1, 0], [1, 1]],
            "score_before": 0.996,
            "score_after": 0.028,
            "rel_mse_before": 0.0014,
            "rel_mse_after": 1.04,
            "rel_mse_after_prev": 1.88,
        },
    }


def verdict(values: dict, number: int) -> str:
    return ic.judge_claims(values)[number - 1].verdict


# ---------------------------------------------------------------------- judging, by hand


def test_level_truth_table():
    assert ic.level(True, True) == ic.level(True, False) == "holds"
    assert ic.level(False, True) == "partly"
    assert ic.level(False, False) == "does not hold"
    assert ic.VERDICTS == ("holds", "partly", "does not hold")


def test_hand_values_give_the_hand_written_rows():
    claims = ic.judge_claims(hand_values())
    assert [c.number for c in claims] == list(range(1, 8))
    assert [c.claim for c in claims] == [ic.CLAIMS[n] for n in range(1, 8)]
    assert [c.verdict for c in claims] == ["holds"] * 7
    assert [c.ours for c in claims] == [
        "0.0012 (copying the current vector: 2.00)",
        "L0H1: score 0.865 (heads >= 0.5: L0H1)",
        "L1H1: score 0.996 (m=4: 0.988, m=16: 0.997; heads >= 0.5: L1H0, L1H1)",
        "L0H1 -> L1H1: K 0.310 vs random 0.125 +- 0.007 (z = 26.0; random max 0.150); "
        "rank 1 of the layer-0 heads into L1H1 (next best 0.219)",
        "K 0.310, Q 0.015, V 0.016 (z: 26.0, -15.0, -15.5)",
        "L0H1 ablated: L1H1 induction score 0.996 -> 0.028 (x0.03)",
        "L1H0, L1H1 ablated: MSE x dim 0.0014 -> 1.040 (ablating L0H1 instead: 1.880)",
    ]
    values = [c.value for c in claims]
    assert values[:5] == [0.0012, 0.865, 0.996, 26.0, 0.31 - 0.016]
    assert values[5] == 0.028 / 0.996 and values[6] == 1.04


@pytest.mark.parametrize(
    ("mse", "expected"),
    [(0.05, "holds"), (0.0501, "partly"), (0.5, "partly"), (0.5001, "does not hold")],
)
def test_claim_1_thresholds_are_inclusive(mse, expected):
    values = hand_values()
    values["rel_mse"] = mse
    assert verdict(values, 1) == expected


@pytest.mark.parametrize(
    ("score", "expected"),
    [(0.5, "holds"), (0.4999, "partly"), (0.3, "partly"), (0.2999, "does not hold")],
)
def test_claims_2_and_3_head_score_thresholds(score, expected):
    values = hand_values()
    values["heads"]["prev_score"] = values["heads"]["induction_score"] = score
    assert verdict(values, 2) == verdict(values, 3) == expected


@pytest.mark.parametrize(
    ("z", "rank", "expected"),
    [
        (5.0, 1, "holds"),
        (5.0, 2, "partly"),  # z is enough, but another layer-0 head writes more
        (4.99, 1, "partly"),
        (2.0, 1, "partly"),
        (1.99, 1, "does not hold"),
    ],
)
def test_claim_4_needs_z_and_the_top_rank(z, rank, expected):
    values = hand_values()
    values["composition"]["z"]["K"] = z
    values["composition"]["rank_in_column"] = rank
    assert verdict(values, 4) == expected


@pytest.mark.parametrize(
    ("k", "q", "v", "z", "expected"),
    [
        (0.3, 0.1, 0.2, 5.0, "holds"),
        (0.3, 0.1, 0.2, 4.9, "partly"),  # K the largest, but not far from random
        (0.15, 0.1, 0.2, 9.0, "partly"),  # K above Q only
        (0.2, 0.2, 0.3, 9.0, "does not hold"),  # ties are not "above"
    ],
)
def test_claim_5_compares_k_with_q_and_v(k, q, v, z, expected):
    values = hand_values()
    values["composition"]["pair"] = {"K": k, "Q": q, "V": v}
    values["composition"]["z"]["K"] = z
    claim = ic.judge_claims(values)[4]
    assert claim.verdict == expected
    assert claim.value == k - max(q, v)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (1.0, 0.5, "holds"),
        (1.0, 0.5001, "partly"),
        (0.5, 0.4, "partly"),  # x0.8 exactly
        (1.0, 0.81, "does not hold"),
        (0.0, 0.0, "does not hold"),  # no score to lose: the ratio is nan
    ],
)
def test_claim_6_ratio_thresholds(before, after, expected):
    values = hand_values()
    values["ablation"].update(score_before=before, score_after=after)
    claim = ic.judge_claims(values)[5]
    assert claim.verdict == expected
    if before > 0:
        assert claim.value == after / before
    else:
        assert math.isnan(claim.value) and "xnan" in claim.ours


@pytest.mark.parametrize(
    ("after", "expected"),
    [(0.5, "holds"), (0.4999, "partly"), (0.2, "partly"), (0.1999, "does not hold")],
)
def test_claim_7_thresholds(after, expected):
    values = hand_values()
    values["ablation"]["rel_mse_after"] = after
    assert verdict(values, 7) == expected


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (0.0625, 0.625, "holds"),  # a rise of exactly x10
        (0.0626, 0.625, "partly"),  # just under x10, above x3
        (0.125, 0.375, "partly"),  # exactly x3
        (0.1251, 0.375, "does not hold"),
        (1.0, 1.1, "does not hold"),  # a high loss either way: the model never learnt
        (0.0, 0.6, "holds"),  # a perfect model: any loss is an infinite rise
    ],
)
def test_claim_7_needs_the_loss_to_rise(before, after, expected):
    values = hand_values()
    values["ablation"].update(rel_mse_before=before, rel_mse_after=after)
    assert verdict(values, 7) == expected


def test_no_head_above_the_threshold_reads_none():
    values = hand_values()
    values["heads"]["prev_heads"] = []
    assert ic.judge_claims(values)[1].ours.endswith("(heads >= 0.5: none)")


# ------------------------------------------------------------- the planted circuit


def test_planted_heads_are_found(planted):
    _, result = planted
    h = result.values["heads"]
    assert h["prev_head"] == list(PREV) and h["induction_head"] == list(IND)
    assert h["prev_heads"] == [list(PREV)] and h["induction_heads"] == [list(IND)]
    assert h["prev_score"] > 0.999 and h["induction_score"] > 0.99
    assert sorted(h["induction_score_by_m"]) == ["3", "6"]
    assert min(h["induction_score_by_m"].values()) > 0.95
    assert h["prev_scores"][PREV[0]][PREV[1]] == h["prev_score"]


def test_planted_composition_is_the_hand_worked_value(planted):
    model, result = planted
    c = result.values["composition"]
    assert c["pair"]["K"] == pytest.approx(BETA / math.sqrt(BETA**2 * D + KAPPA**2 * N), 1e-12)
    assert c["pair"]["Q"] == pytest.approx(0.0, abs=1e-12)
    assert c["pair"]["V"] == pytest.approx(0.0, abs=1e-12)
    k = vi.composition_scores(model, kind="K")[0, :, 1, :]
    assert c["k_grid"] == k.tolist()
    others = [k[h, IND[1]].item() for h in range(k.shape[0]) if h != PREV[1]]
    assert c["rank_in_column"] == 1 and c["runner_up"] == max(others)
    base = vi.composition_baseline(model, "K", n_samples=SIZES["baseline_samples"], seed=0)
    assert c["baseline_mean"] == base.mean and c["baseline_std"] == base.std
    for kind in "KQV":
        assert c["z"][kind] == (c["pair"][kind] - base.mean) / base.std


def test_planted_losses_and_ablations(planted):
    model, result = planted
    v, a = result.values, result.values["ablation"]
    assert v["rel_mse"] < 0.02  # the planted circuit predicts the repeated half
    assert a["score_before"] == v["heads"]["induction_score"]
    assert a["score_after"] < 0.3  # without the previous-position head, no stripe
    assert a["rel_mse_before"] < 0.02
    assert 0.5 < a["rel_mse_after"] < 1.5  # about predicting 0: nothing else writes C
    assert a["rel_mse_after_prev"] > 0.5
    assert a["prev_heads"] == [list(PREV)] and a["population"] == SIZES["population"]


def test_planted_circuit_holds_every_claim(planted):
    _, result = planted
    assert [c.verdict for c in result.claims] == ["holds"] * 7
    assert result[4].value > ic.THRESHOLDS["z_holds"]


def test_copying_the_current_vector_is_two_minus_two_cosines(planted):
    # The loss of predicting the current vector, from the cosine of unit vectors:
    # |r - r'|^2 / dim = (2 - 2 cos) / dim, so MSE x dim is the mean of 2 - 2 cos.
    model, result = planted
    eval_set = induction.fixed_eval_set(
        SIZES["eval_batches"], SIZES["eval_batch_size"], ic.EVAL_SEED, dim=D,
        min_m=SIZES["min_m"], max_m=SIZES["max_m"], dtype=torch.float64,
    )  # fmt: skip
    per_batch = []
    for b in eval_set:
        cos = torch.nn.functional.cosine_similarity(b.inputs, b.targets, dim=-1)
        per_batch.append((2 - 2 * cos)[b.loss_mask].mean().item())
    expected = sum(per_batch) / len(per_batch)
    assert result.values["rel_mse_copy_current"] == pytest.approx(expected, rel=1e-12)
    assert result.values["rel_mse"] == pytest.approx(vi.evaluate(model, eval_set) * D, 1e-12)


def test_ablation_equals_a_hand_made_mean_hook(planted):
    # Claim 7's number, by hand: the induction head's hook_z replaced by its per-position
    # mean over the population, on the analysis batch.
    model, result = planted
    batch = induction.generate(
        SIZES["analysis_batch"], m=SIZES["m"], seed=ic.ANALYSIS_SEED, dim=D, dtype=torch.float64
    )
    population = induction.generate(
        SIZES["population"], m=SIZES["m"], seed=ic.POPULATION_SEED, dim=D, dtype=torch.float64
    ).inputs
    _, cache = model.run_with_cache(population)
    mean_z = cache["blocks.1.attn.hook_z"].mean(dim=0)  # [pos, head, d_head]

    def hook(z, hook):
        z = z.clone()
        z[:, :, IND[1]] = mean_z[:, IND[1]]
        return z

    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", hook)]):
        out = model(batch.inputs)
    expected = vi.masked_mse(out, batch.targets, batch.loss_mask).item() * D
    assert result.values["ablation"]["rel_mse_after"] == pytest.approx(expected, rel=1e-10)


def test_an_untrained_model_does_not_hold_the_head_claims():
    # The control: the same measurement on random weights finds no circuit.
    model = vi.HookedVectorTransformer(
        induction.model_config(D, 6, d_model=16, n_heads=2, d_head=4), seed=0
    )
    result = ic.measure_claims(vi.process_weights(model), **{**SIZES, "baseline_samples": 50})
    assert [result[n].verdict for n in (1, 2, 3, 4, 6, 7)] == ["does not hold"] * 6
    assert result.info["dim"] == D and result.info["sizes"]["m"] == SIZES["m"]
    assert result.info["config"] == ic.describe_model(model.cfg)


# ------------------------------------------------------------- saving and re-judging


def test_values_survive_a_json_round_trip(planted):
    _, result = planted
    values = json.loads(json.dumps(result.values))
    assert values == result.values
    assert ic.judge_claims(values) == result.claims


def test_saved_outputs_are_rejudged_to_the_same_claims(planted, tmp_path):
    _, result = planted
    meta = {"training": "planted by hand", "wall": 1.5, "train_seconds": 0.0}
    paths = ic.save_outputs(result, tmp_path, meta=meta, figures=False)
    payload = json.loads(paths["results"].read_text())
    assert ic.judge_claims(payload) == result.claims  # the whole file, as written
    assert payload["rows"] == [
        dict(number=c.number, claim=c.claim, ours=c.ours, value=c.value, verdict=c.verdict)
        for c in result.claims
    ]
    assert payload["meta"] == meta and payload["thresholds"] == ic.THRESHOLDS
    report = paths["report"].read_text()
    assert ic.claims_table(result) in report
    assert "Training: planted by hand." in report and "Wall time: 1.5 s (training 0.0 s)." in report
    assert f"Model: {result.info['config']}." in report
    assert paths["figures"] == [] and "## Figures" not in report


def test_figures_are_drawn_and_saved(planted, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, result = planted
    assert list(ic.claim_figures(result)) == list(ic.FIGURES[1:])
    plt.close("all")
    history = dict(steps=[1, 2, 3], train_loss=[0.2, 0.1, 0.05], eval_steps=[3], eval_loss=[0.06])
    paths = ic.save_outputs(result, tmp_path, history=history, dpi=30)
    assert [p.name for p in paths["figures"]] == [f"{name}.png" for name in ic.FIGURES]
    report = paths["report"].read_text()
    for path in paths["figures"]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({path.name})" in report


# ------------------------------------------------------------------------- settings


def test_full_recipe_is_the_library_recipe():
    recipe = ic.FULL.recipe()
    assert recipe.keys() == induction.RECIPE.keys()
    assert recipe["min_lr"] == pytest.approx(induction.RECIPE["min_lr"], rel=1e-15)
    assert {**recipe, "min_lr": 0} == {**induction.RECIPE, "min_lr": 0}
    assert ic.FULL.model_config() == induction.model_config()


def test_recipe_overrides_scale_the_schedule():
    recipe = ic.FAST.recipe(steps=10, lr=1e-2, batch_size=7)
    assert (recipe["steps"], recipe["lr"], recipe["batch_size"]) == (10, 1e-2, 7)
    assert recipe["warmup_steps"] == 10  # cut to the steps
    assert recipe["min_lr"] == pytest.approx(1e-2 * 1.5e-4 / 3e-3)  # the recipe's 1/20
    assert ic.FAST.recipe()["warmup_steps"] == ic.FAST.warmup_steps == 20


def test_measure_kwargs_are_accepted_by_measure_claims():
    kwargs = ic.FAST.measure_kwargs()
    assert kwargs["m"] == ic.FAST.analysis_m
    assert set(kwargs) <= set(inspect.signature(ic.measure_claims).parameters)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(analysis_m=9), "analysis_m must be <= max_m"),
        (dict(min_m=1), "min_m must be an int >= 2"),
        (dict(max_m=2), "max_m must be an int >= 3"),
        (dict(lr=0.0), "lr must be a positive"),
        (dict(steps=0), "steps must be an int >= 1"),
        (dict(baseline_samples=1), "baseline_samples must be an int >= 2"),
    ],
)
def test_bad_settings_are_refused(change, match):
    fields = {**ic.FAST.__dict__, **change}
    with pytest.raises(ValueError, match=match):
        ic.Settings(**fields)


# ------------------------------------------------------------------------ bad inputs


def test_judge_refuses_what_is_not_a_values_dict():
    with unchecked(), pytest.raises(TypeError, match="values must be the dict"):
        ic.judge_claims([1, 2])
    values = hand_values()
    del values["composition"]["z"]
    with pytest.raises(ValueError, match="'z'"):
        ic.judge_claims(values)
    values = copy.deepcopy(hand_values())
    values["heads"] = None
    with pytest.raises(ValueError, match="another form"):
        ic.judge_claims(values)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (dict(n_layers=3), "must have 2 layers"),
        (dict(d_out=D + 1), "d_out == d_in"),
        (dict(n_ctx=10), "2 \\* 6 = 12 positions, more than the model's n_ctx = 10"),
    ],
)
def test_measure_refuses_models_of_another_shape(cfg, match):
    kwargs = dict(d_in=D, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=12, attn_only=True)
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**{**kwargs, **cfg}))
    with pytest.raises(ValueError, match=match):
        ic.measure_claims(model, **SIZES)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(m=1), "m must be an int >= 2"),
        (dict(min_m=4, max_m=3), "max_m must be an int >= 4"),
        (dict(baseline_samples=1), "baseline_samples must be an int >= 2"),
        (dict(population=0), "population must be an int >= 1"),
        (dict(eval_seed=-1), "seed must be an int in"),
        (dict(m=7), "2 \\* 7 = 14 positions"),
    ],
)
def test_measure_refuses_bad_sizes(planted, change, match):
    model, _ = planted
    with pytest.raises(ValueError, match=match):
        ic.measure_claims(model, **{**SIZES, **change})


def test_measure_refuses_what_is_not_a_model():
    with unchecked(), pytest.raises(TypeError, match="HookedVectorTransformer"):
        ic.measure_claims(torch.nn.Linear(2, 2))


def test_rendering_refuses_other_objects(planted):
    _, result = planted
    with unchecked():
        with pytest.raises(TypeError, match="Claim"):
            ic.claims_table(["a row"])
        with pytest.raises(TypeError, match="ClaimsResult"):
            ic.results_payload(result.values)
        with pytest.raises(TypeError, match="ClaimsResult"):
            ic.save_outputs(result.claims, "unused")
    rebuilt = ic.ClaimsResult(result.claims, result.values, result.info)  # no data
    with pytest.raises(ValueError, match="with its data"):
        ic.claim_figures(rebuilt)
    with pytest.raises(KeyError, match="no claim 8"):
        result[8]
