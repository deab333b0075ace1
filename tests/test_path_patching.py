"""Path patching: the planted induction circuit (the previous-position head reaches the
induction head through its key and nothing else), hand-worked values, equivalences
(activation patching where the sender's only readers are the receivers, the formula
``ln1(resid_corr + Δ) W_K + b_K``, a plain three-run loop, batched == one at a time),
invariants (clean == corrupted, a sender that writes nothing), bad inputs refused, and
no hook or weight left changed.

One file because every test drives the one function, and the equivalences share their
models and the plain three-run loop they are checked against."""

import re
from pathlib import Path

import pytest
import torch

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg, unchecked
from test_induction_planted import IND, PREV, D, planted_model
from vecinterp.analysis.patching import activation_patching
from vecinterp.analysis.path_patching import path_patching
from vecinterp.tasks import induction


def pp(*args, **kwargs):
    return path_patching(*args, progress=False, **kwargs)


def last_sum(y: torch.Tensor) -> torch.Tensor:
    return y[:, -1].sum()


def square_metric(y: torch.Tensor) -> torch.Tensor:
    """Nonlinear in the output, so that no equality below holds by linearity alone."""
    return (y**2).mean() + y[:, 0, 0].sum()


def corrupted_value(model, x, metric) -> float:
    with torch.no_grad():
        return float(metric(model(x)))


def close(a, b, rel: float = 1e-12) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return bool(((a - b).abs() <= rel * (1 + b.abs())).all())


# ------------------------------------------------------------- the planted induction circuit


@pytest.fixture(scope="module")
def induction_setup():
    """Clean: ``r_1..r_m r_1..r_m``. Corrupted: the first half's even positions replaced by
    fresh vectors. At a scored position ``t = m + j`` (``j`` even) the induction head must
    attend to ``j + 1``, whose input is clean in both runs (so its value is right) but
    whose previous vector, what the previous-position head writes into the key, is not."""
    model = planted_model()
    batch = induction.generate(32, m=5, dim=D, dtype=torch.float64, seed=0)
    fresh = induction.generate(32, m=5, dim=D, dtype=torch.float64, seed=1).inputs
    corrupted = batch.inputs.clone()
    corrupted[:, 0 : batch.m : 2] = fresh[:, 0 : batch.m : 2]
    mask = torch.zeros(32, batch.length, dtype=torch.bool)
    mask[:, batch.m + torch.arange(0, batch.m - 1, 2)] = True

    def metric(y):
        return vi.masked_mse(y, batch.targets, mask)

    return model, batch.inputs, corrupted, metric


def test_planted_prev_head_reaches_the_induction_head_through_its_key_only(induction_setup):
    model, clean, corrupted, metric = induction_setup
    clean_value, corrupted_value_ = (corrupted_value(model, x, metric) for x in (clean, corrupted))
    assert corrupted_value_ > 100 * clean_value  # the corruption breaks induction there
    ind = IND[0], IND[1]
    k = float(pp(model, clean, corrupted, metric, PREV, (*ind, "k")))
    restored = (corrupted_value_ - k) / (corrupted_value_ - clean_value)
    assert restored > 0.99
    # PREV writes only into B, which the induction head's query and value never read:
    # their inputs are the corrupted ones, and so is the metric
    for channel in ("q", "v"):
        value = pp(model, clean, corrupted, metric, PREV, (*ind, channel))
        assert close(value, corrupted_value_), channel


def test_planted_only_the_prev_head_moves_the_induction_key(induction_setup):
    model, clean, corrupted, metric = induction_setup
    base = corrupted_value(model, corrupted, metric)
    grid = pp(model, clean, corrupted, metric, "heads", (IND[0], IND[1], "k"))
    assert grid.shape == (2, 3)
    assert grid[1].isnan().all() and not grid[0].isnan().any()  # layer 1 is not before it
    change = (base - grid[0]).abs()
    others = [h for h in range(3) if h != PREV[1]]
    assert change[PREV[1]] > 100 * change[others].max()


def test_planted_matches_activation_patching_where_the_key_is_the_only_reader(induction_setup):
    # the key path carries all of PREV's effect: patching PREV's whole output agrees
    model, clean, corrupted, metric = induction_setup
    k = pp(model, clean, corrupted, metric, PREV, (IND[0], IND[1], "k"))
    act = activation_patching(model, clean, corrupted, metric, "result", by="head", progress=False)
    assert abs(float(k - act[PREV])) < 0.05 * abs(corrupted_value(model, corrupted, metric))


# ------------------------------------------------------------------------ hand-worked values


def test_linear_model_sender_to_output_is_the_corrupted_output_plus_its_difference():
    # no normalization, attention only: the output is resid_final @ W_U + b_U, and with
    # every other head frozen resid_final = corrupted + Δ_S
    cfg = tiny_cfg(attn_only=True, normalization=None, n_layers=2)
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    _, c_clean = model.run_with_cache(clean)
    y_corr, c_corr = model.run_with_cache(corrupted)
    senders = [(0, 0), (0, 1), (1, 1), "embed"]
    got = pp(model, clean, corrupted, last_sum, senders, "output")
    for value, s in zip(got, senders, strict=True):
        if s == "embed":
            delta = c_clean["hook_embed"] - c_corr["hook_embed"]
        else:
            delta = c_clean["result", s[0]][:, :, s[1]] - c_corr["result", s[0]][:, :, s[1]]
        expected = last_sum(y_corr) + last_sum(delta @ model.W_U)
        assert close(value, expected), s


def test_key_receiver_gets_ln1_of_the_corrupted_residual_plus_the_difference():
    # the definition written out with the model's own LayerNorm, for an LN model with MLPs
    # (frozen) between the sender and the receiver
    cfg = tiny_cfg(normalization="LN", positional="rotary")
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    _, c_clean = model.run_with_cache(clean)
    _, c_corr = model.run_with_cache(corrupted)
    attn = model.blocks[1].attn
    for head, channel in [(0, "k"), (1, "q"), (1, "v")]:
        delta = c_clean["result", 0][:, :, 1] - c_corr["result", 0][:, :, 1]
        resid = model.blocks[1].ln1(c_corr["resid_pre", 1] + delta)
        W, b = {"q": (attn.W_Q, attn.b_Q), "k": (attn.W_K, attn.b_K), "v": (attn.W_V, attn.b_V)}[
            channel
        ]
        new = resid @ W[head] + b[head]

        def paste(act, hook, head=head, new=new):
            act = act.clone()
            act[:, :, head] = new
            return act

        with torch.no_grad():
            expected = square_metric(
                model.run_with_hooks(
                    corrupted, fwd_hooks=[(f"blocks.1.attn.hook_{channel}", paste)]
                )
            )
        got = pp(model, clean, corrupted, square_metric, (0, 1), (1, head, channel))
        assert close(got, expected, rel=1e-10), (head, channel)


# ------------------------------------------------------------------------------ equivalences


@pytest.mark.parametrize("normalization", ["LN", "RMSPre", None])
def test_last_layer_head_to_output_equals_activation_patching_it(normalization):
    # nothing after a last-layer head reads it but the output (attention only), so the path
    # is everything it does
    cfg = tiny_cfg(attn_only=True, normalization=normalization, positional="rotary")
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    got = pp(model, clean, corrupted, square_metric, [(1, 0), (1, 1)], "output")
    act = activation_patching(
        model,
        clean,
        corrupted,
        square_metric,
        "blocks.1.attn.hook_result",
        by="head",
        progress=False,
    )
    assert close(got, act, rel=1e-10)


def test_with_mlps_a_path_into_every_reader_equals_activation_patching():
    cfg = tiny_cfg(normalization="LN")
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    # a last-layer head is read by its own MLP and the output
    got = pp(model, clean, corrupted, square_metric, [(1, 0), (1, 1)], [("mlp", 1), "output"])
    act = activation_patching(
        model, clean, corrupted, square_metric, "result", by="head", progress=False
    )
    assert close(got, act[1], rel=1e-10)
    # ... and, with the MLPs recomputed in run 2, the output alone is the same path
    got = pp(model, clean, corrupted, square_metric, [(1, 0), (1, 1)], "output", freeze_mlps=False)
    assert close(got, act[1], rel=1e-10)
    # the last MLP is read by the output only, whichever way MLPs are treated
    act_mlp = activation_patching(
        model, clean, corrupted, square_metric, "blocks.1.hook_mlp_out", by="layer", progress=False
    )
    for freeze in (True, False):
        got = pp(model, clean, corrupted, square_metric, ("mlp", -1), "output", freeze_mlps=freeze)
        assert close(got, act_mlp, rel=1e-10)


@pytest.mark.parametrize("n_layers", [1, 3])
def test_sender_into_all_of_its_readers_equals_activation_patching(n_layers):
    # attention only: a sender in layer n - 2 (or the embedding of a 1-layer model) is read
    # by the last layer's heads (q, k, v) and the output, none of which read each other
    cfg = tiny_cfg(attn_only=True, normalization="LN", n_layers=n_layers, n_heads=3)
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    last = n_layers - 1
    readers = [(last, h, c) for h in range(3) for c in "qkv"] + ["output"]
    if n_layers == 1:
        got = pp(model, clean, corrupted, square_metric, "embed", readers)
        act = activation_patching(
            model, clean, corrupted, square_metric, "hook_embed", by="layer", progress=False
        )
    else:
        got = pp(model, clean, corrupted, square_metric, [(last - 1, h) for h in range(3)], readers)
        act = activation_patching(
            model, clean, corrupted, square_metric, "result", by="head", progress=False
        )[last - 1]
    assert close(got, act, rel=1e-10)
    # leaving one reader out changes the answer (the equality is not a coincidence)
    partial = pp(model, clean, corrupted, square_metric, "embed", readers[1:])
    full = pp(model, clean, corrupted, square_metric, "embed", readers)
    assert not close(partial, full, rel=1e-6)


def looped_path_patching(model, runs, metric, sender, receivers, freeze_mlps):
    """The three runs written out plainly, one sender at a time, with run_with_hooks;
    ``runs``: the corrupted input and the clean and corrupted caches (run 1)."""
    n = model.cfg.n_layers
    corrupted, c_clean, c_corr = runs

    def set_to(value):
        return lambda act, hook: value

    def result_hook(layer):
        def hook(act, hook):
            out = c_corr["result", layer].clone()
            if sender != "embed" and sender[0] == layer:
                out[:, :, sender[1]] = c_clean["result", layer][:, :, sender[1]]
            return out

        return hook

    hooks = [(f"blocks.{ell}.attn.hook_result", result_hook(ell)) for ell in range(n)]
    if sender == "embed":
        hooks.append(("hook_embed", set_to(c_clean["hook_embed"])))
    for ell in range(n if not model.cfg.attn_only else 0):
        name = f"blocks.{ell}.hook_mlp_out"
        if sender == ("mlp", ell):
            hooks.append((name, set_to(c_clean[name])))
        elif freeze_mlps:
            hooks.append((name, set_to(c_corr[name])))
    names = {
        "output": f"blocks.{n - 1}.hook_resid_post",
        **{r: f"blocks.{r[1]}.mlp.hook_pre" for r in receivers if r[0] == "mlp"},
        **{r: f"blocks.{r[0]}.attn.hook_{r[2]}" for r in receivers if len(r) == 3},
    }
    _, run2 = model.run_with_cache(corrupted, list(names.values()), fwd_hooks=hooks)
    patches = []
    for r in receivers:
        name = names[r]
        if r == "output":
            shift = run2[name] - c_corr[name]
            patches.append((name, lambda act, hook, shift=shift: act + shift))
        elif r[0] == "mlp":
            patches.append((name, set_to(run2[name])))
        else:

            def paste(act, hook, head=r[1], value=run2[name]):
                act = act.clone()
                act[:, :, head] = value[:, :, head]
                return act

            patches.append((name, paste))
    with torch.no_grad():
        return metric(model.run_with_hooks(corrupted, fwd_hooks=patches))


@pytest.mark.parametrize("freeze_mlps", [True, False])
def test_batched_equals_a_plain_loop_and_one_sender_per_pass(freeze_mlps):
    cfg = tiny_cfg(normalization="LN", positional="learned", n_layers=3, act_fn="gelu")
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    senders = ["embed", (0, 1), ("mlp", 0), (1, 0), (0, 0)]
    runs = (corrupted, model.run_with_cache(clean)[1], model.run_with_cache(corrupted)[1])
    receiver_sets = [
        [(2, 1, "k")],
        [(2, 0, "q"), (2, 0, "v"), (2, 1, "v")],
        [("mlp", 1), "output"],
        [(2, 1, "q"), ("mlp", 2), "output"],
    ]
    for receivers in receiver_sets:
        batched = pp(
            model, clean, corrupted, square_metric, senders, receivers, freeze_mlps=freeze_mlps
        )
        single = pp(
            model,
            clean,
            corrupted,
            square_metric,
            senders,
            receivers,
            freeze_mlps=freeze_mlps,
            chunk_size=1,
        )
        two = pp(
            model,
            clean,
            corrupted,
            square_metric,
            senders,
            receivers,
            freeze_mlps=freeze_mlps,
            chunk_size=2,
        )
        looped = torch.stack(
            [
                looped_path_patching(model, runs, square_metric, s, receivers, freeze_mlps)
                for s in senders
            ]
        )
        assert close(batched, looped, rel=1e-10), receivers
        assert close(single, batched, rel=1e-12) and close(two, batched, rel=1e-12)


def test_heads_grid_is_the_list_call_laid_out():
    cfg = tiny_cfg(n_layers=3)
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    receivers = [(2, 0, "k"), ("mlp", 1)]
    grid = pp(model, clean, corrupted, square_metric, "heads", receivers)
    assert grid.shape == (3, 2)
    # (2, 0, "k") reads the heads of layers 0 and 1, ("mlp", 1) those too (its own layer's)
    assert not grid[:2].isnan().any() and grid[2].isnan().all()
    listed = pp(model, clean, corrupted, square_metric, [(0, 0), (0, 1), (1, 0), (1, 1)], receivers)
    assert close(grid[:2].flatten(), listed)
    with pytest.raises(
        ValueError, match=r"receiver \(2, 0, 'k'\) does not come after sender \(2, 0\)"
    ):
        pp(model, clean, corrupted, square_metric, (2, 0), receivers)
    one = pp(model, clean, corrupted, square_metric, (0, 1), receivers)
    assert one.shape == () and close(one, listed[1])


# -------------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("attn_only", [True, False])
def test_clean_equal_to_corrupted_changes_nothing(attn_only):
    cfg = tiny_cfg(attn_only=attn_only, normalization="LN")
    model = random_model(cfg)
    x = random_input(cfg, seed=1)
    base = corrupted_value(model, x, square_metric)
    senders = ["embed", (0, 0), (0, 1)] + ([] if attn_only else [("mlp", 0)])
    for receivers in [[(1, 0, "k"), (1, 1, "q")], "output", [(1, 1, "v"), "output"]]:
        got = pp(model, x, x.clone(), square_metric, senders, receivers)
        assert close(got, torch.full_like(got, base)), receivers


def test_a_sender_that_writes_nothing_gives_the_corrupted_metric():
    cfg = tiny_cfg(normalization="LN")
    model = random_model(cfg)
    with torch.no_grad():
        model.blocks[0].attn.W_O[1].zero_()  # head 0.1 writes nothing at all
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    base = corrupted_value(model, corrupted, square_metric)
    receivers = [(1, 0, "q"), (1, 0, "k"), (1, 1, "v"), ("mlp", 0), ("mlp", 1), "output"]
    for r in receivers:
        assert close(pp(model, clean, corrupted, square_metric, (0, 1), r), base), r
    # while the other head of the layer does move the same receivers
    moved = pp(model, clean, corrupted, square_metric, (0, 0), receivers)
    assert not close(moved, base, rel=1e-6)


def test_model_weights_and_hooks_are_left_as_they_were():
    cfg = tiny_cfg()
    model = random_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)
    pp(model, clean, corrupted, square_metric, "heads", "output")
    calls = []

    def failing(y):
        calls.append(1)
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        pp(model, clean, corrupted, failing, [(0, 0), (0, 1)], [(1, 0, "k"), "output"])
    assert calls == [1]
    assert not any(hp.has_hooks for hp in model.hook_dict.values())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_users_hook_is_part_of_the_model_in_every_run():
    cfg = tiny_cfg(attn_only=True)
    model = random_model(cfg)
    clean, corrupted = random_input(cfg, seed=1), random_input(cfg, seed=2)

    def halve(act, hook):
        return act * 0.5

    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", halve)]):
        got = pp(model, clean, corrupted, square_metric, [(1, 0), (1, 1)], "output")
        act = activation_patching(
            model,
            clean,
            corrupted,
            square_metric,
            "blocks.1.attn.hook_result",
            by="head",
            progress=False,
        )
        assert len(model.hook_dict["blocks.1.hook_resid_pre"]._fwd) == 1
    assert close(got, act, rel=1e-10)


# ------------------------------------------------------------------------------ bad inputs


@pytest.fixture(scope="module")
def small():
    cfg = tiny_cfg()
    return random_model(cfg), random_input(cfg, seed=1), random_input(cfg, seed=2)


@pytest.mark.parametrize(
    "senders, receivers, match",
    [
        ((1, 0), (0, 1, "k"), r"receiver \(0, 1, 'k'\) does not come after sender \(1, 0\)"),
        ((1, 0), (1, 1, "q"), "does not come after sender"),  # the same layer's heads
        (("mlp", 0), (0, 0, "v"), "does not come after sender"),
        (("mlp", 1), ("mlp", 1), "does not come after sender"),
        ((0, 2), "output", r"head must be an int in \[-2, 1\], got 2"),
        ((2, 0), "output", r"layer must be an int in \[-2, 1\], got 2"),
        ((0, 0), (1, 5, "k"), "head must be an int"),
        ((0, 0), (1, 0, "z"), "each receiver must be one of"),
        ((0, 0), "logits", "each receiver must be one of"),
        ("pos_embed", "output", "each sender must be one of"),
        ([], "output", "senders is empty"),
        ((0, 0), [], "receivers is empty"),
        ("heads", (0, 0, "k"), "no head comes before every receiver"),
        ([(0, 0), ("embed", 1)], "output", r"layer must be an int .*in the sender \('embed', 1\)"),
    ],
)
def test_bad_senders_and_receivers_are_refused(small, senders, receivers, match):
    model, clean, corrupted = small
    with pytest.raises(ValueError, match=match):
        pp(model, clean, corrupted, last_sum, senders, receivers)


def test_mlps_of_an_attention_only_model_are_refused():
    cfg = tiny_cfg(attn_only=True)
    model = random_model(cfg)
    x = random_input(cfg)
    for senders, receivers in [(("mlp", 0), "output"), ((0, 0), ("mlp", 1))]:
        with pytest.raises(ValueError, match="attention-only, it has no MLPs"):
            pp(model, x, x, last_sum, senders, receivers)


def test_bad_runs_are_refused(small):
    model, clean, corrupted = small
    bad = corrupted.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="corrupted_x"):
        pp(model, clean, bad, last_sum, (0, 0), "output")
    with pytest.raises(ValueError, match="the same shape"):
        pp(model, clean, corrupted[:, :-1], last_sum, (0, 0), "output")
    with pytest.raises(ValueError, match="metric must return a scalar"):
        pp(model, clean, corrupted, lambda y: y[:, -1], (0, 0), "output")
    with pytest.raises(ValueError, match="chunk_size"):
        pp(model, clean, corrupted, last_sum, (0, 0), "output", chunk_size=0)
    with unchecked():
        with pytest.raises(TypeError, match="freeze_mlps must be True or False"):
            pp(model, clean, corrupted, last_sum, (0, 0), "output", freeze_mlps="yes")
        with pytest.raises(TypeError, match="metric must be callable"):
            pp(model, clean, corrupted, 3.0, (0, 0), "output")
        with pytest.raises(ValueError, match="senders must be one of"):
            pp(model, clean, corrupted, last_sum, 7, "output")
        with pytest.raises(ValueError, match="senders must be one of"):
            pp(model, clean, corrupted, last_sum, torch.tensor([0, 1]), "output")
        with pytest.raises(ValueError, match=r"layer must be an int .*got tensor\(1\)"):
            pp(model, clean, corrupted, last_sum, (0, 0), [(torch.tensor(1), 0, "k")])
    assert not any(hp.has_hooks for hp in model.hook_dict.values())


def test_the_how_to_page_example_runs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "howto_path_patching.rst").read_text()
    blocks = re.findall(r"^\.\. code-block:: python\n((?:\n|   .*\n)+)", text, flags=re.M)
    assert len(blocks) == 1
    code = "\n".join(line[3:] for line in blocks[0].splitlines())
    namespace: dict = {}
    exec(compile(code, "docs/howto_path_patching.rst", "exec"), namespace)
    assert namespace["k_path"].shape == (4,)
    assert namespace["direct"].shape == (2, 4) and not namespace["direct"].isnan().any()
    assert namespace["all_keys"].shape == ()
    assert namespace["effect"].shape == (4,)
