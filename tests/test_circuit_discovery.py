"""Circuit discovery (ACDC): the layered forward split by sender reproduces the model; the
batched edge patching equals the slow definition (hooks on the model itself, one set of
removed edges per run); the batched, speculative search equals the plain one-edge-at-a-
time loop; the planted induction circuit is recovered edge for edge; a hand-worked case;
invariants; bad inputs refused.

One file because every test drives the one search, and the equivalences share the slow
hook-based definition they are checked against."""

import functools
import math
import re
from collections import defaultdict

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from test_induction_planted import IND, PREV, D, planted_model, swapped_planted_model
from vecinterp.analysis._circuit_graph import EdgeGraph, forward, run_clean
from vecinterp.analysis.circuit_discovery import _spec
from vecinterp.tasks import induction


def acdc(*args, **kwargs):
    return vi.discover_circuit(*args, progress=False, **kwargs)


CONFIGS = {
    "LN+MLP": dict(),
    "LN attn-only": dict(attn_only=True),
    "no norm+MLP": dict(normalization=None),
    "no norm attn-only": dict(normalization=None, attn_only=True),
    "RMS rotary gelu": dict(normalization="RMS", positional="rotary", act_fn="gelu"),
    "LNPre sinusoidal bidirectional": dict(
        normalization="LNPre", positional="sinusoidal", causal=False, embed_bias=True
    ),
    "3 layers": dict(n_layers=3, n_heads=3),
}


def setup(name: str, dtype=torch.float64, seed=0):
    cfg = tiny_cfg(**CONFIGS[name])
    model = random_model(cfg, seed=seed, dtype=dtype)
    return (
        model,
        random_input(cfg, 4, seed=1, dtype=dtype),
        random_input(cfg, 4, seed=2, dtype=dtype),
    )


# ---------------------------------------------------------------- the slow definition


def senders(cfg) -> list:
    out: list = ["embed"]
    for layer in range(cfg.n_layers):
        out += [(layer, h) for h in range(cfg.n_heads)]
        out += [] if cfg.attn_only else [("mlp", layer)]
    return out


def receivers(cfg) -> list:
    """In forward order; ACDC visits them backwards."""
    out: list = []
    for layer in range(cfg.n_layers):
        out += [(layer, h, c) for c in "qkv" for h in range(cfg.n_heads)]
        out += [] if cfg.attn_only else [("mlp", layer)]
    return [*out, "output"]


def senders_before(cfg, receiver) -> list:
    every = senders(cfg)
    if receiver == "output":
        return every
    layer = receiver[1] if receiver[0] == "mlp" else receiver[0]
    own_heads = receiver[0] == "mlp"

    def before(s):
        if s == "embed":
            return True
        s_layer = s[1] if s[0] == "mlp" else s[0]
        return s_layer < layer or (own_heads and s_layer == layer and s[0] != "mlp")

    return [s for s in every if before(s)]


def sender_outputs(model, x) -> dict:
    """Each sender's output in a plain run, read from the model's own hook points."""
    _, cache = model.run_with_cache(x)
    outs = {"embed": cache["hook_embed"]}
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            outs[(layer, h)] = cache["result", layer][:, :, h]
        if not model.cfg.attn_only:
            outs[("mlp", layer)] = cache["mlp_out", layer]
    return outs


def slow_output(model, x, corr: dict, removed) -> torch.Tensor:
    """The model run on ``x`` through its own forward, with hooks that give each receiver
    with removed edges the input ``resid - sum_removed (out_s - corr_s)``: a head's slice of
    hook_q/k/v recomputed from it through ln1 and its weights, an MLP's hook_pre through
    ln2 and W_in, the final resid_post directly."""
    cfg = model.cfg
    into = defaultdict(list)
    for s, r in removed:
        into[r].append(s)
    outs: dict = {}
    resid: dict = {}

    def patch(r):
        return sum(outs[s] - corr[s] for s in into[r])

    def record(key):
        def hook(act, hook):
            if key == "result":
                for h in range(cfg.n_heads):
                    outs[(int(hook.name.split(".")[1]), h)] = act[:, :, h].clone()
            elif key == "resid":
                resid[hook.name] = act.clone()
            else:
                outs[key] = act.clone()

        return hook

    def qkv(layer, c):
        block = model.blocks[layer]
        w, b = getattr(block.attn, f"W_{c.upper()}"), getattr(block.attn, f"b_{c.upper()}")

        def hook(act, hook):
            act = act.clone()
            for h in range(cfg.n_heads):
                if into[(layer, h, c)]:
                    inp = resid[f"blocks.{layer}.hook_resid_pre"] - patch((layer, h, c))
                    act[:, :, h] = block.ln1(inp) @ w[h] + b[h]
            return act

        return hook

    def mlp_pre(layer):
        block = model.blocks[layer]

        def hook(act, hook):
            r = ("mlp", layer)
            if not into[r]:
                return act
            inp = resid[f"blocks.{layer}.hook_resid_mid"] - patch(r)
            return block.ln2(inp) @ block.mlp.W_in + block.mlp.b_in

        return hook

    hooks = [("hook_embed", record("embed"))]
    for layer in range(cfg.n_layers):
        hooks += [(f"blocks.{layer}.hook_resid_pre", record("resid"))]
        hooks += [(f"blocks.{layer}.attn.hook_{c}", qkv(layer, c)) for c in "qkv"]
        hooks += [(f"blocks.{layer}.attn.hook_result", record("result"))]
        if not cfg.attn_only:
            hooks += [(f"blocks.{layer}.hook_resid_mid", record("resid"))]
            hooks += [(f"blocks.{layer}.mlp.hook_pre", mlp_pre(layer))]
            hooks += [(f"blocks.{layer}.hook_mlp_out", record(("mlp", layer)))]
    last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
    hooks += [(last, lambda act, hook: act - patch("output") if into["output"] else act)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        return model(x)


def mse_to(reference):
    return lambda y: (y - reference).pow(2).mean()


def slow_acdc(model, clean, corr: dict, metric, tau: float, prune: bool = True):
    """ACDC as the docstring states it, one run of the hooked model per trial; then (with
    ``prune``, for a corrupted input) the edges out of nodes with no incoming edge left
    dropped, in forward order. Returns the kept edges, the scores, and the kept edges
    before that pruning."""
    cfg = model.cfg
    removed: set = set()
    scores: dict = {}
    current = float(metric(slow_output(model, clean, corr, removed)))
    for r in reversed(receivers(cfg)):
        incoming = list(reversed(senders_before(cfg, r)))
        owner = r if r == "output" or r[0] == "mlp" else r[:2]
        alive = r == "output" or any(
            s == owner and (s, rr) not in removed
            for rr in receivers(cfg)
            for s in senders_before(cfg, rr)
        )
        if not alive:
            removed |= {(s, r) for s in incoming}
            continue
        for s in incoming:
            value = float(metric(slow_output(model, clean, corr, removed | {(s, r)})))
            scores[(s, r)] = value - current
            if value - current <= tau:
                removed.add((s, r))
                current = value
    every = [(s, r) for r in receivers(cfg) for s in senders_before(cfg, r)]
    unpruned = [e for e in every if e not in removed]
    for node in senders(cfg)[1:] if prune else []:
        own = [r for r in receivers(cfg) if r == node or (len(r) == 3 and r[:2] == node)]
        if not any((s, r) not in removed for r in own for s in senders_before(cfg, r)):
            removed |= {(s, r) for s, r in every if s == node}
    return [e for e in every if e not in removed], scores, unpruned


# ------------------------------------------------- (a) nothing removed is the model itself


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_split_forward_with_nothing_removed_is_the_model(name, dtype):
    model, x, _ = setup(name, dtype)
    graph = EdgeGraph(model)
    with torch.no_grad():
        state = run_clean(model, graph, x)
        y = model(x)
        # and every pass from a later group, started from the recorded state, too
        for g in range(len(graph.groups)):
            n = graph.groups[g].n_senders
            nothing = torch.zeros(3, *graph.valid.shape, dtype=torch.bool)
            later = forward(model, graph, g, state.resid[g], state.outs[:n], state.outs, nothing)
            assert (later - y).abs().max() <= (1e-12 if dtype == torch.float64 else 1e-5)
    assert (state.output - y).abs().max() <= (1e-12 if dtype == torch.float64 else 1e-5)


def test_the_graph_counts_its_edges():
    model, *_ = setup("LN+MLP")  # 2 layers x 2 heads + MLPs
    graph = EdgeGraph(model)
    # layer-0 q/k/v: embed (6 receivers); MLP 0: embed + 2 heads; layer-1 q/k/v: 4 senders
    # each (6 receivers); MLP 1: 6; output: 7
    assert graph.n_edges == 6 * 1 + 3 + 6 * 4 + 6 + 7 == 46
    assert [_spec(s) for s in graph.senders] == senders(model.cfg)
    assert [_spec(r) for r in graph.receivers] == receivers(model.cfg)


def test_every_edge_removed_is_the_corrupted_model():
    model, x, corrupted = setup("LN+MLP")
    result = acdc(model, x, corrupted, threshold=1e9)
    assert result.n_kept == 0 and result.nodes == []
    with torch.no_grad():
        y_clean, y_corr = model(x), model(corrupted)
    expected = float((y_corr - y_clean).pow(2).mean())
    assert result.corrupted_metric == pytest.approx(expected, rel=1e-10)
    assert result.metric == pytest.approx(expected, rel=1e-10)
    assert result.full_metric == 0.0


# ------------------------------------------ (b) batched edge patching == the slow definition


@pytest.mark.parametrize("name", ["LN+MLP", "no norm attn-only", "RMS rotary gelu", "3 layers"])
@pytest.mark.parametrize("ablation", ["corrupted", "mean"])
def test_batched_edge_patching_equals_the_hooked_model(name, ablation):
    model, x, corrupted = setup(name)
    graph = EdgeGraph(model)
    every = [(s, r) for r in receivers(model.cfg) for s in senders_before(model.cfg, r)]
    gen = torch.Generator().manual_seed(0)
    trials = [set()] + [
        {e for e in every if torch.rand((), generator=gen) < p} for p in (0.1, 0.3, 0.6, 1.0)
    ]
    with torch.no_grad():
        state = run_clean(model, graph, x)
        if ablation == "corrupted":
            corr = sender_outputs(model, corrupted)
            corr_stack = run_clean(model, graph, corrupted).outs
        else:  # the mean over the population (here: a third input) per position
            corr = {s: v.mean(0, keepdim=True) for s, v in sender_outputs(model, corrupted).items()}
            corr_stack = run_clean(model, graph, corrupted).outs.mean(1, keepdim=True)
            corr_stack = corr_stack.expand(-1, x.shape[0], -1, -1)
        sender_at = {_spec(node): i for i, node in enumerate(graph.senders)}
        receiver_at = {_spec(node): i for i, node in enumerate(graph.receivers)}
        removed = torch.zeros(len(trials), *graph.valid.shape, dtype=torch.bool)
        for t, trial in enumerate(trials):
            for s, r in trial:
                removed[t, receiver_at[r], sender_at[s]] = True
        fast = forward(model, graph, 0, state.resid[0], state.outs[:1], corr_stack, removed)
        for t, trial in enumerate(trials):
            slow = slow_output(model, x, corr, trial)
            assert (fast[t] - slow).abs().max() < 1e-11, (t, len(trial))
    if ablation == "corrupted":  # every edge removed: the corrupted run itself
        assert (fast[-1] - model(corrupted)).abs().max() < 1e-11


# ------------------------------ the batched, speculative search == the one-at-a-time loop


@functools.cache
def plain_search(name: str):
    """The model, inputs, tau and the plain loop's kept edges, scores and circuit metric."""
    model, x, corrupted = setup(name)
    with torch.no_grad():
        reference, y_corrupted = model(x), model(corrupted)
    corr = sender_outputs(model, corrupted)
    metric = mse_to(reference)
    assert float(metric(slow_output(model, x, corr, set()))) < 1e-24  # the hooks change nothing
    tau = 0.02 * float(metric(y_corrupted))  # removes some, keeps some
    kept, scores, unpruned = slow_acdc(model, x, corr, metric, tau)
    assert all(abs(v - tau) > 1e-9 * tau for v in scores.values())  # no decision on a knife edge
    every = {(s, r) for r in receivers(model.cfg) for s in senders_before(model.cfg, r)}
    circuit = float(metric(slow_output(model, x, corr, every - set(kept))))
    # pruning drops edges that carry nothing: the same circuit, to rounding
    before = float(metric(slow_output(model, x, corr, every - set(unpruned))))
    assert circuit == pytest.approx(before, rel=1e-9)
    return model, x, corrupted, tau, kept, scores, circuit, len(unpruned) - len(kept)


@pytest.mark.parametrize("name", ["LN+MLP", "no norm attn-only", "RMS rotary gelu"])
@pytest.mark.parametrize("chunk_size", [1, 3, None])
def test_the_search_equals_the_plain_acdc_loop(name, chunk_size):
    model, x, corrupted, tau, kept, scores, circuit, n_pruned = plain_search(name)
    result = acdc(model, x, corrupted, threshold=tau, chunk_size=chunk_size)
    assert 0 < result.n_kept < result.n_edges
    assert result.edges == kept and result.n_pruned == n_pruned
    assert result.scores.keys() == scores.keys()
    for edge, value in scores.items():
        assert result.scores[edge] == pytest.approx(value, rel=1e-9, abs=1e-15), edge
    assert result.metric == pytest.approx(circuit, rel=1e-9)


def test_mean_ablation_search_equals_the_plain_loop():
    model, x, population = setup("LN+MLP")
    corr = {s: v.mean(0, keepdim=True) for s, v in sender_outputs(model, population).items()}
    with torch.no_grad():
        reference = model(x)
    metric = mse_to(reference)
    full_removed = {(s, r) for r in receivers(model.cfg) for s in senders_before(model.cfg, r)}
    tau = 0.02 * float(metric(slow_output(model, x, corr, full_removed)))
    kept, scores, _ = slow_acdc(model, x, corr, metric, tau, prune=False)
    result = acdc(model, x, None, population=population, threshold=tau)
    assert result.ablation == "mean" and result.edges == kept and result.n_pruned == 0
    for edge, value in scores.items():
        assert result.scores[edge] == pytest.approx(value, rel=1e-9, abs=1e-15), edge


def test_a_user_metric_and_abs_value():
    model, x, corrupted = setup("no norm+MLP")
    targets = random_input(model.cfg, 4, seed=5)[..., :1].expand(-1, -1, model.cfg.d_out)

    def metric(y):  # a loss against targets: removing an edge may lower it
        return vi.masked_mse(y, targets)

    for abs_value in (False, True):
        result = acdc(model, x, corrupted, metric=metric, threshold=1e-3, abs_value=abs_value)
        with torch.no_grad():
            assert result.full_metric == pytest.approx(float(metric(model(x))), rel=1e-12)
        changes = result.scores.values()
        kept = [result.scores[e] for e in result.edges]
        test = (lambda v: abs(v)) if abs_value else (lambda v: v)
        assert all(test(v) > 1e-3 for v in kept)
        assert sum(test(v) <= 1e-3 for v in changes) == len(changes) - len(kept)
        if not abs_value:
            assert any(v < -1e-3 for v in changes)  # removed although it improved a lot
        else:
            assert any(v < -1e-3 for v in kept)  # ... and kept, with abs_value


# ------------------------------------------------ (c) the planted induction circuit


PLANTED = [
    ("embed", (*PREV, "v")),  # the previous-position head copies the current vector ...
    ("embed", (*IND, "q")),  # ... the induction head's query is the current vector,
    (PREV, (*IND, "k")),  # its key what the previous-position head wrote (K-composition),
    ("embed", (*IND, "v")),  # its value the vector it copies,
    (IND, "output"),  # which it writes where W_U reads
]


@pytest.fixture(scope="module")
def planted():
    model = planted_model()
    clean = induction.generate(32, m=5, dim=D, dtype=torch.float64, seed=0).inputs
    fresh = induction.generate(32, m=5, dim=D, dtype=torch.float64, seed=1).inputs
    return model, clean, fresh


@pytest.mark.parametrize("ablation", ["corrupted", "mean"])
def test_the_planted_circuit_is_recovered_edge_for_edge(planted, ablation):
    model, clean, fresh = planted
    corrupted, population = (fresh, None) if ablation == "corrupted" else (None, fresh)
    thresholds = [1e-4, 1e-3, 1e-2, 0.1]
    results = vi.circuit_threshold_sweep(
        model, clean, corrupted, population=population, thresholds=thresholds, progress=False
    )
    for result in results:
        assert sorted(map(str, result.edges)) == sorted(map(str, PLANTED)), result.threshold
        assert result.nodes == ["embed", PREV, IND, "output"]
        assert result.metric < 1e-3 * result.corrupted_metric  # the circuit is the model
    # each planted edge matters far more than every edge ACDC removed
    scores = results[0].scores
    removed = [abs(v) for e, v in scores.items() if e not in PLANTED]
    assert min(scores[e] for e in PLANTED) > 1000 * max(removed)


def test_the_planted_circuit_follows_its_heads_to_other_indices(planted):
    # the same circuit at other heads is found there, not at an index that happens to be right
    _, clean, fresh = planted
    result = acdc(swapped_planted_model(), clean, fresh, threshold=1e-3)
    expected = [("embed", (0, 2, "v")), ("embed", (1, 0, "q")), ((0, 2), (1, 0, "k"))]
    expected += [("embed", (1, 0, "v")), ((1, 0), "output")]
    assert sorted(map(str, result.edges)) == sorted(map(str, expected))


def test_a_small_threshold_keeps_more_than_the_planted_edges(planted):
    model, clean, fresh = planted
    result = acdc(model, clean, fresh, threshold=1e-6)
    assert set(PLANTED) < set(result.edges)  # the noise heads' small effects pass 1e-6


# ------------------------------------------------------------- (d) a hand-worked case


def one_number_model() -> vi.HookedVectorTransformer:
    """One head, every width 1, one position, no norm: the pattern is 1, so the head's
    result is ``x W_E W_V W_O = 70 x`` and the output ``(2 x + 70 x) 3 = 216 x``."""
    cfg = vi.VectorTransformerConfig(
        d_in=1, d_model=1, d_head=1, n_heads=1, n_layers=1, n_ctx=1,
        attn_only=True, normalization=None, positional="none",
    )  # fmt: skip
    model = vi.HookedVectorTransformer(cfg, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E.fill_(2.0)
        model.blocks[0].attn.W_Q.fill_(0.3)
        model.blocks[0].attn.W_K.fill_(-1.1)
        model.blocks[0].attn.W_V.fill_(5.0)
        model.blocks[0].attn.W_O.fill_(7.0)
        model.unembed.W_U.fill_(3.0)
    return model


def test_hand_worked_one_number_model():
    # clean x = 1 (output 216), corrupted x = 0 (output 0), metric (y - 216)^2, tau = 10^4.
    # Receivers from the output back: the output's edges, latest sender first --
    #   head -> output removed: resid 2 + 70 - 70 = 2, y = 6, change 210^2 = 44100: kept;
    #   embed -> output removed: resid 72 - 2 = 70, y = 210, change 6^2 = 36: removed (M = 36);
    # then the head's v, k, q inputs (embed each):
    #   embed -> v removed: v = 0, y = 0, change 216^2 - 36 = 46620: kept;
    #   embed -> k, embed -> q: one position, the pattern stays 1, change 0: removed.
    model = one_number_model()
    clean, corrupted = (
        torch.ones(1, 1, 1, dtype=torch.float64),
        torch.zeros(1, 1, 1, dtype=torch.float64),
    )
    assert model(clean).item() == 216.0
    result = acdc(model, clean, corrupted, threshold=1e4)
    assert result.edges == [("embed", (0, 0, "v")), ((0, 0), "output")]
    assert result.scores == {
        ("embed", (0, 0, "q")): 0.0,
        ("embed", (0, 0, "k")): 0.0,
        ("embed", (0, 0, "v")): 46620.0,
        ((0, 0), "output"): 44100.0,
        ("embed", "output"): 36.0,
    }
    assert (result.metric, result.full_metric, result.corrupted_metric) == (36.0, 0.0, 216.0**2)
    assert result.n_edges == 5 and result.nodes == ["embed", (0, 0), "output"]
    # a larger tau removes the head's output edge too; its inputs are then never tried
    result = acdc(model, clean, corrupted, threshold=5e4)
    assert result.edges == [] and set(result.scores) == {((0, 0), "output"), ("embed", "output")}
    assert result.metric == 216.0**2


# ------------------------------------------------------------------------- invariants


def test_tau_zero_keeps_the_model_exactly():
    # every removal kept raises the metric by > 0; every one made leaves it where it was
    model, x, corrupted = setup("LN+MLP")
    result = acdc(model, x, corrupted, threshold=0.0)
    assert result.metric <= 1e-24
    assert all(v <= 0 for e, v in result.scores.items() if e not in result.edges)


def test_with_a_corrupted_input_every_kept_edge_is_on_a_path_from_the_embedding():
    model, x, corrupted = setup("3 layers")
    with torch.no_grad():
        tau = 0.02 * float((model(corrupted) - model(x)).pow(2).mean())
    result = acdc(model, x, corrupted, threshold=tau)
    assert result.n_pruned > 0  # this case strands some nodes
    fed = {"embed"} | {r[:2] if len(r) == 3 else r for _, r in result.edges}
    assert all(s in fed for s, _ in result.edges)
    # mean ablation keeps such edges: a node fed mean inputs is not its mean output
    mean = acdc(model, x, None, threshold=tau)
    assert mean.n_pruned == 0


def test_chunk_size_does_not_change_the_result():
    model, x, corrupted = setup("3 layers")
    tau = 1e-3
    results = [acdc(model, x, corrupted, threshold=tau, chunk_size=c) for c in (1, 3, 64)]
    for r in results[1:]:
        assert r.edges == results[0].edges
        assert r.metric == pytest.approx(results[0].metric, rel=1e-10)
    assert results[-1].n_passes < results[0].n_passes  # batching: fewer passes


def test_the_sweep_is_discover_circuit_at_each_threshold():
    model, x, corrupted = setup("no norm+MLP")
    taus = [1e-4, 1e-2]
    sweep = vi.circuit_threshold_sweep(model, x, corrupted, thresholds=taus, progress=False)
    for tau, swept in zip(taus, sweep, strict=True):
        one = acdc(model, x, corrupted, threshold=tau)
        assert swept.threshold == tau and swept.edges == one.edges and swept.metric == one.metric


def test_the_model_is_left_unchanged():
    model, x, corrupted = setup("LN+MLP")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acdc(model, x, corrupted, threshold=1e-3)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(point.has_hooks for point in model.hook_dict.values())


def test_float32_model_runs_and_summary_lists_the_edges():
    model, x, corrupted = setup("LN+MLP", dtype=torch.float32)
    result = acdc(model, x, corrupted, threshold=1e-3)
    text = result.summary()
    assert f"{result.n_kept} of 46 edges kept" in text
    assert len(text.splitlines()) == 2 + result.n_kept


# ------------------------------------------------------------------- (e) bad inputs


def test_bad_inputs_are_refused():
    model, x, corrupted = setup("LN+MLP")
    for tau in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="threshold must be a finite number >= 0"):
            acdc(model, x, corrupted, threshold=tau)
    with unchecked():
        for tau in (True, "0.1"):
            with pytest.raises(TypeError, match="threshold must be a number"):
                acdc(model, x, corrupted, threshold=tau)
        with pytest.raises(TypeError, match="HookedVectorTransformer"):
            acdc("model", x, corrupted, threshold=0.1)
        with pytest.raises(TypeError, match="metric must be callable"):
            acdc(model, x, corrupted, threshold=0.1, metric="mse")
        with pytest.raises(TypeError, match="abs_value must be True or False"):
            acdc(model, x, corrupted, threshold=0.1, abs_value=1)
        with pytest.raises(TypeError, match="thresholds must be a sequence"):
            vi.circuit_threshold_sweep(model, x, corrupted, thresholds=0.1)
    with pytest.raises(ValueError, match="thresholds is empty"):
        vi.circuit_threshold_sweep(model, x, corrupted, thresholds=[])
    with pytest.raises(ValueError, match=r"thresholds\[1\] must be"):
        vi.circuit_threshold_sweep(model, x, corrupted, thresholds=[0.1, -2.0])
    with pytest.raises(ValueError, match="same shape"):
        acdc(model, x, corrupted[:, :-1], threshold=0.1)
    with pytest.raises(ValueError, match="population is for mean ablation"):
        acdc(model, x, corrupted, population=corrupted, threshold=0.1)
    with pytest.raises(ValueError, match="population must be"):
        acdc(model, x, None, population=corrupted[:, :-1], threshold=0.1)
    bad = x.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="clean_x"):
        acdc(model, bad, corrupted, threshold=0.1)
    with pytest.raises(ValueError, match="chunk_size"):
        acdc(model, x, corrupted, threshold=0.1, chunk_size=0)
    with pytest.raises(ValueError, match="metric must return a scalar"):
        acdc(model, x, corrupted, threshold=0.1, metric=lambda y: y[:, 0])
    handle = model.hook_dict["blocks.0.attn.hook_pattern"].add_hook(lambda a, hook: a)
    try:
        with pytest.raises(ValueError, match="hooks attached.*blocks.0.attn.hook_pattern"):
            acdc(model, x, corrupted, threshold=0.1)
    finally:
        handle.remove()


def test_a_non_finite_metric_is_refused_naming_the_trial():
    # The hand-worked model (test above): the trials run in the order head -> output
    # (y = 6), embed -> output (y = 210), then embed -> v, k, q. A metric that is NaN at
    # y = 210 only is NaN on the second trial, with no edge removed before it.
    model = one_number_model()
    clean, corrupted = (
        torch.ones(1, 1, 1, dtype=torch.float64),
        torch.zeros(1, 1, 1, dtype=torch.float64),
    )

    def nan_at(value):
        return lambda y: torch.where(y == value, torch.nan, (y - 216.0) ** 2).mean()

    with pytest.raises(ValueError, match=r"metric is nan on the trial that removes the edge "
                       r"embed -> output \(with the 0 edges removed before it\)"):  # fmt: skip
        acdc(model, clean, corrupted, threshold=1e4, metric=nan_at(210.0))
    with pytest.raises(ValueError, match="metric is nan with every edge removed"):
        acdc(model, clean, corrupted, threshold=1e4, metric=nan_at(0.0))
    # a log-MSE is -inf on the full model, where the MSE is exactly 0
    with pytest.raises(ValueError, match=r"metric is -inf on the full model.*log\(mse \+ eps\)"):
        acdc(model, clean, corrupted, threshold=1.0, metric=lambda y: (y - 216.0).pow(2).log())
    # with a floor it is finite everywhere, and runs: log(210^2 + 1) = 10.69 > 4 keeps
    # head -> output, log(6^2 + 1) = 3.61 <= 4 removes embed -> output, then removing
    # embed -> v costs log(216^2 + 1) - 3.61 = 7.14 > 4: the circuit of the MSE at tau = 1e4
    floored = acdc(
        model, clean, corrupted, threshold=4.0, metric=lambda y: ((y - 216.0) ** 2 + 1).log()
    )
    assert floored.edges == [("embed", (0, 0, "v")), ((0, 0), "output")]
    assert floored.scores[("embed", "output")] == pytest.approx(math.log(37.0), rel=1e-12)


def test_a_metric_nan_on_a_few_trials_of_a_random_model_is_refused():
    model, x, corrupted = setup("LN+MLP")
    calls = []

    def flaky(y):  # the MSE to the model, NaN on its 5th call (the 4th trial)
        calls.append(None)
        value = (y - reference).pow(2).mean()
        return value * torch.nan if len(calls) == 5 else value

    with torch.no_grad():
        reference = model(x)
    with pytest.raises(ValueError, match="metric is nan on the trial that removes the edge"):
        acdc(model, x, corrupted, threshold=1e-3, metric=flaky, chunk_size=1)


@pytest.mark.parametrize("name", ["blocks.1.attn.W_Q", "unembed.W_U", "blocks.0.ln1.w"])
def test_a_non_finite_weight_is_refused_by_name(name):
    model, x, corrupted = setup("LN+MLP")
    with torch.no_grad():
        model.get_parameter(name).view(-1)[0] = torch.nan if "W_Q" in name else torch.inf
    with pytest.raises(ValueError, match=f"non-finite weights.*{name}"):
        acdc(model, x, corrupted, threshold=1e-3)
    with pytest.raises(ValueError, match=f"non-finite weights.*{name}"):
        vi.circuit_threshold_sweep(model, x, None, relative_thresholds=[0.1], progress=False)


def test_pytorch_module_hooks_are_refused_like_vecinterp_hooks():
    model, x, corrupted = setup("LN+MLP")
    with torch.no_grad():
        plain = model(x)
    found = acdc(model, x, corrupted, threshold=1e-3)

    def zero(module, args, out):
        return out * 0

    cases = {
        "blocks.0.attn (forward hook)": lambda: model.blocks[0].attn.register_forward_hook(zero),
        "blocks.1.mlp (forward pre hook)": lambda: model.blocks[1].mlp.register_forward_pre_hook(
            lambda module, args: (args[0] * 0,)
        ),
        "blocks.0.hook_resid_post (forward hook)": lambda: model.hook_dict[
            "blocks.0.hook_resid_post"
        ].register_forward_hook(zero),
        "unembed (backward hook)": lambda: model.unembed.register_full_backward_hook(
            lambda module, grad_in, grad_out: None
        ),
        "a global forward hook": lambda: torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, out: None
        ),
    }
    for where, attach in cases.items():
        handle = attach()
        try:
            if "forward" in where and "global" not in where:  # the hook changes the model
                with torch.no_grad():
                    assert not torch.allclose(model(x), plain)
            with pytest.raises(
                ValueError, match=re.escape(f"PyTorch module hooks attached: {where}")
            ):
                acdc(model, x, corrupted, threshold=1e-3)
        finally:
            handle.remove()
    assert acdc(model, x, corrupted, threshold=1e-3).edges == found.edges


# --------------------------------------------------------------- relative thresholds


def test_a_relative_threshold_is_a_fraction_of_the_metric_gap_by_hand():
    # The hand-worked model: full metric 0, every edge removed (216 x)^2 = 46656, so the
    # gap is 46656. relative 0.25 is tau = 11664: the scores 44100 and 46620 pass it and
    # 36, 0, 0 do not, the circuit of tau = 1e4. relative 1.0 is tau = 46656, which the
    # head -> output edge (44100) no longer passes: the circuit of tau = 5e4, empty.
    model = one_number_model()
    clean, corrupted = (
        torch.ones(1, 1, 1, dtype=torch.float64),
        torch.zeros(1, 1, 1, dtype=torch.float64),
    )
    for relative, absolute, tau in [(0.25, 1e4, 11664.0), (1.0, 5e4, 46656.0)]:
        got = acdc(model, clean, corrupted, relative_threshold=relative)
        want = acdc(model, clean, corrupted, threshold=absolute)
        assert got.threshold == tau and got.relative_threshold == relative
        assert got.edges == want.edges and got.scores == want.scores
        assert want.relative_threshold is None
        assert f"tau = {tau:g} ({relative:g} of the metric gap)" in got.summary()
    assert acdc(model, clean, corrupted, relative_threshold=0.25).edges == [
        ("embed", (0, 0, "v")),
        ((0, 0), "output"),
    ]


def test_relative_thresholds_recover_the_planted_circuit(planted):
    model, clean, fresh = planted
    with torch.no_grad():  # the gap, computed apart: the default metric of the corrupted model
        gap = float((model(fresh) - model(clean)).pow(2).mean())
    relative = [1e-3, 1e-2, 0.1]
    results = vi.circuit_threshold_sweep(
        model, clean, fresh, relative_thresholds=relative, progress=False
    )
    for r, result in zip(relative, results, strict=True):
        assert sorted(map(str, result.edges)) == sorted(map(str, PLANTED)), r
        assert result.threshold == pytest.approx(r * gap, rel=1e-9)
        same = acdc(model, clean, fresh, threshold=result.threshold)
        assert same.edges == result.edges and same.scores == result.scores


def test_threshold_arguments_say_what_scale_to_use():
    model = one_number_model()
    clean, corrupted = (
        torch.ones(1, 1, 1, dtype=torch.float64),
        torch.zeros(1, 1, 1, dtype=torch.float64),
    )
    # neither: the message gives the gap on these inputs, 216^2 = 46656
    with pytest.raises(TypeError, match=r"discover_circuit needs a threshold.*gap of 4\.666e\+04"):
        acdc(model, clean, corrupted)
    with pytest.raises(TypeError, match=r"circuit_threshold_sweep needs a threshold.*relative_"):
        vi.circuit_threshold_sweep(model, clean, corrupted, progress=False)
    with pytest.raises(ValueError, match="not both"):
        acdc(model, clean, corrupted, threshold=1.0, relative_threshold=0.1)
    with pytest.raises(ValueError, match=r"relative_threshold must be a finite number >= 0 \(a "
                       "fraction of the metric gap"):  # fmt: skip
        acdc(model, clean, corrupted, relative_threshold=-0.1)
    with pytest.raises(ValueError, match=r"relative_thresholds\[1\] must be"):
        vi.circuit_threshold_sweep(
            model, clean, corrupted, relative_thresholds=[0.1, math.nan], progress=False
        )
    with pytest.raises(ValueError, match="relative_threshold: the metric gap is 0"):
        acdc(model, clean, clean, relative_threshold=0.1)  # nothing to corrupt


# ------------------------------------------------------------------------- the drawing


def test_plot_circuit_draws_one_arrow_per_kept_edge(planted):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from vecinterp.plot import plot_circuit

    model, clean, fresh = planted
    result = acdc(model, clean, fresh, threshold=1e-3)
    ax = plot_circuit(result)
    arrows = [p for p in ax.patches if p.get_label() == "edge"]
    boxes = [p for p in ax.patches if p.get_label() == "node"]
    assert len(arrows) == 5 and len(boxes) == 2 * 3 + 2  # every node, unused ones grey
    colours = {tuple(round(c, 3) for c in a.get_edgecolor()[:3]) for a in arrows}
    assert len(colours) == 4  # q, k, v and the output
    assert sorted(t.get_text() for t in ax.texts) == ["0.0", "0.1", "0.2", "1.0", "1.1", "1.2",
                                                      "embed", "output"]  # fmt: skip
    plt.close(ax.figure)
    ax = plot_circuit(result, show_unused=False, widths_by_score=False, title="planted")
    assert len([p for p in ax.patches if p.get_label() == "node"]) == 4
    assert {a.get_linewidth() for a in ax.patches if a.get_label() == "edge"} == {1.4}
    assert ax.get_title() == "planted"
    plt.close(ax.figure)
    with pytest.raises(TypeError, match="CircuitResult"):
        plot_circuit({"edges": []})


def test_the_induction_example_adds_the_circuit_to_its_report(tmp_path):
    # examples/induction_heads.py --acdc: its discover() on an untrained model of the
    # example's --fast shape (the trained run is the example's own test's business)
    pytest.importorskip("matplotlib")
    import importlib.util
    from pathlib import Path

    from vecinterp.tasks.induction_claims import FAST

    path = Path(__file__).resolve().parents[1] / "examples" / "induction_heads.py"
    spec = importlib.util.spec_from_file_location("induction_heads_acdc", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    model = vi.HookedVectorTransformer(FAST.model_config(), seed=0)
    example.discover(model, FAST, report, progress=False)
    text = report.read_text()
    assert text.startswith("# report\n") and "![circuit](circuit.png)" in text
    assert "edges kept" in text
    assert (tmp_path / "circuit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_how_to_page_example_runs(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    pytest.importorskip("matplotlib")
    page = Path(__file__).resolve().parents[1] / "docs" / "howto_circuit_discovery.rst"
    blocks = re.findall(r"^\.\. code-block:: python\n((?:\n|   .*\n)+)", page.read_text(), re.M)
    assert len(blocks) == 1
    code = "\n".join(line[3:] for line in blocks[0].splitlines())
    monkeypatch.chdir(tmp_path)  # it saves circuit.png
    namespace: dict = {}
    exec(compile(code, page.name, "exec"), namespace)
    result, sweep, own = namespace["result"], namespace["sweep"], namespace["own"]
    assert 0 < result.n_kept < result.n_edges == 3 * 4 + 1 + 4 + 3 * 4 * 6 + 1 + 9 + 1 + 10
    assert [r.ablation for r in sweep] == ["mean", "mean"]
    assert [r.relative_threshold for r in sweep] == [0.003, 0.03]
    assert namespace["same"].edges == result.edges  # relative 0.01 = 0.01 * the gap
    assert own.full_metric == 0.0
    assert (tmp_path / "circuit.png").is_file()
