"""BatchTopK and JumpReLU dictionaries: values worked by hand, JumpReLU's
pseudo-derivatives against central differences, inference that does not depend on the
batch, save/load and exact resume (issue 35)."""

import math

import pytest
import torch

from vecinterp.dictionary import (
    DictionaryConfig,
    SparseAutoencoder,
    load_dictionary,
    save_dictionary,
    train_dictionary,
)
from vecinterp.dictionary.jumprelu import jumprelu, rectangle, step


class Killed(Exception):
    """Stands in for a kill after a step."""


def _identity_sae(activation, k=None, bandwidth=0.001):
    """d_in = d_sae = 3 with W_enc = W_dec = I and zero biases: pre-activations are x."""
    cfg = DictionaryConfig(
        d_in=3, d_sae=3, activation=activation, k=k, dtype="float64", bandwidth=bandwidth
    )
    sae = SparseAutoencoder(cfg, seed=0)
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(3, dtype=torch.float64))
        sae.W_dec.copy_(torch.eye(3, dtype=torch.float64))
    return sae


def _rows(n=256, d=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64).float()


def test_batchtopk_by_hand_training_and_inference():
    sae = _identity_sae("batchtopk", k=1)
    x = torch.tensor([[3.0, 2.0, 0.0], [1.0, 0.5, -1.0]], dtype=torch.float64)
    # training: the 2 * 1 largest of the whole batch (3 and 2, both in row 0)
    want = torch.tensor([[3.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.equal(sae.activate_batch(x), want)
    # inference: pre * 1{pre > threshold}, row by row
    assert torch.equal(sae.encode(x), torch.relu(x))  # untrained: threshold 0, a ReLU
    sae.threshold.fill_(1.5)
    assert torch.equal(sae.encode(x), want)
    sae.threshold.fill_(0.75)
    assert torch.equal(sae.encode(x), torch.tensor([[3.0, 2.0, 0.0], [1.0, 0.0, 0.0]]).double())


def test_batchtopk_threshold_is_the_running_mean_of_the_smallest_kept_activation():
    """One step at lr 0 (the weights stay): the threshold moves from 0 towards the
    batch's smallest kept activation by threshold_lr."""
    sae = _identity_sae("batchtopk", k=1)
    x = torch.tensor([[3.0, 2.0, 0.0], [1.0, 0.5, -1.0]], dtype=torch.float64)
    train_dictionary(
        sae, x, steps=1, batch_size=2, lr=1e-30, threshold_lr=0.25, b_dec="learn", seed=0,
        threads=1,
    )  # fmt: skip
    rows = torch.randint(2, (2,), generator=torch.Generator().manual_seed(0))
    smallest = sae.activate_batch(x[rows])
    want = 0.25 * float(smallest[smallest > 0].min())
    assert float(sae.threshold) == pytest.approx(want, rel=1e-12)


def test_batchtopk_keeps_n_times_k_and_one_row_is_topk():
    cfg = DictionaryConfig(d_in=5, d_sae=12, activation="batchtopk", k=3, dtype="float64")
    sae = SparseAutoencoder(cfg, seed=1)
    pre = torch.randn(7, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    acts = sae.activate_batch(pre.abs() + 0.1)  # all positive: exactly 7 * 3 are kept
    assert int((acts > 0).sum()) == 21
    assert float(acts[acts > 0].min()) >= float((pre.abs() + 0.1).flatten().sort().values[-21])
    topk = SparseAutoencoder(
        DictionaryConfig(d_in=5, d_sae=12, activation="topk", k=3, dtype="float64"), seed=1
    )
    for row in pre:
        assert torch.equal(sae.activate_batch(row[None]), topk.activate(row[None]))


@pytest.mark.parametrize("activation", ["batchtopk", "jumprelu"])
def test_inference_does_not_depend_on_the_batch(activation):
    k = 2 if activation == "batchtopk" else None
    cfg = DictionaryConfig(d_in=5, d_sae=12, activation=activation, k=k, dtype="float64")
    sae = SparseAutoencoder(cfg, seed=1)
    with torch.no_grad():
        if activation == "batchtopk":
            sae.threshold.fill_(0.3)
        else:
            sae.log_threshold.copy_(torch.linspace(-3, 0, 12, dtype=torch.float64))
    x = torch.randn(9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    batched = sae.encode(x)
    looped = torch.cat([sae.encode(row[None]) for row in x])
    torch.testing.assert_close(batched, looped, rtol=0, atol=1e-15)
    assert 0 < int((batched > 0).sum()) < batched.numel()  # the threshold cuts somewhere


def test_jumprelu_by_hand_values_and_pseudo_derivatives():
    """theta = (0.5, 1, 2), eps = 0.5 (half-window 0.25), z = (0.625, 0.875, 2.5): the
    first two are in their windows (|z - theta| = 0.125), the third is not (0.5)."""
    theta = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    z = torch.tensor([[0.625, 0.875, 2.5]], dtype=torch.float64, requires_grad=True)
    out = jumprelu(z, theta, 0.5)
    assert out.tolist() == [[0.625, 0.0, 2.5]]
    g = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.float64)
    out.backward(g)
    # d/dz: H(z - theta) * g; d/dtheta: -(theta / eps) * K((z - theta) / eps) * g
    assert z.grad.tolist() == [[1.0, 0.0, 4.0]]
    assert theta.grad.tolist() == [-(0.5 / 0.5) * 1.0, -(1.0 / 0.5) * 2.0, 0.0]
    theta.grad = None
    z.grad = None
    fires = step(z, theta, 0.5)
    assert fires.tolist() == [[1.0, 0.0, 1.0]]
    fires.sum().backward()
    assert theta.grad.tolist() == [-2.0, -2.0, 0.0]  # -(1 / eps) * K
    assert z.grad is None  # the step passes no gradient to z
    assert rectangle(torch.tensor([-0.5, 0.5])).tolist() == [0.0, 0.0]  # open window


def test_step_pseudo_derivative_is_its_central_difference():
    """Summed over a batch, d/dtheta of sum H(z - theta) is the central difference with
    step eps / 2 of the true step function (exactly: both count the z in the window)."""
    gen = torch.Generator().manual_seed(0)
    z = torch.rand(4096, 3, generator=gen, dtype=torch.float64)
    theta = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64, requires_grad=True)
    eps = 0.05
    step(z, theta, eps).sum().backward()
    with torch.no_grad():
        up = (z > theta + eps / 2).double().sum(0)
        down = (z > theta - eps / 2).double().sum(0)
    torch.testing.assert_close(theta.grad, (up - down) / eps, rtol=0, atol=1e-9)
    assert bool((theta.grad < 0).all())  # some z fall in every window
    # jumprelu: -(theta / eps) K in place of the difference's -(z / eps) K; z lies within
    # eps / 2 of theta there, so they differ by at most count * (1/2) per feature
    theta.grad = None
    jumprelu(z, theta, eps).sum().backward()
    with torch.no_grad():
        diff = ((z * (z > theta + eps / 2)) - (z * (z > theta - eps / 2))).sum(0) / eps
        count = (down - up).clamp_min(1)
    assert bool(((theta.grad - diff).abs() <= count * 0.5 + 1e-9).all())
    torch.testing.assert_close(theta.grad, diff, rtol=0.05, atol=0)


def test_jumprelu_l0_penalty_reaches_log_threshold_by_the_chain_rule():
    """Training's L0 term is l0_coeff * mean_row sum step(pre, exp(log_threshold)); its
    gradient in log_threshold is theta * (-1 / eps) * (rows in the window) / n (times
    l0_coeff), worked here by hand for two rows."""
    sae = _identity_sae("jumprelu", bandwidth=0.5)
    with torch.no_grad():
        sae.log_threshold.copy_(torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64).log())
    x = torch.tensor([[0.625, 0.875, 2.5], [0.3, 1.2, 1.9]], dtype=torch.float64)
    theta = sae.log_threshold.exp()
    l0 = step(sae.encode_pre(x), theta, sae.cfg.bandwidth).sum(-1).mean()
    assert float(l0.detach()) == 1.5  # (2 + 1) / 2 rows
    (grad,) = torch.autograd.grad(l0, sae.log_threshold)
    # within 0.25 of theta, by hand: 0.625, 0.3 | 0.875, 1.2 | 1.9 (not 2.5)
    in_window = torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(grad, theta.detach() * (-1 / 0.5) * in_window / 2)


@pytest.mark.parametrize("activation", ["batchtopk", "jumprelu"])
def test_save_load_round_trip(tmp_path, activation):
    k = 2 if activation == "batchtopk" else None
    cfg = DictionaryConfig(d_in=5, d_sae=8, activation=activation, k=k, bandwidth=0.01)
    sae = SparseAutoencoder(cfg, seed=0)
    train_dictionary(sae, _rows(d=5), steps=5, batch_size=16, lr=1e-2, threads=1)
    names = {"batchtopk": "threshold", "jumprelu": "log_threshold"}
    assert names[activation] in sae.state_dict()
    loaded = load_dictionary(save_dictionary(sae, tmp_path / "d"))
    assert loaded.cfg == sae.cfg
    for name, tensor in sae.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = _rows(n=7, d=5, seed=1)
    assert torch.equal(loaded.encode(x), sae.encode(x))


@pytest.mark.parametrize("activation", ["batchtopk", "jumprelu"])
def test_resume_after_a_kill_is_bit_identical(tmp_path, activation):
    k = 2 if activation == "batchtopk" else None
    cfg = DictionaryConfig(d_in=6, d_sae=24, activation=activation, k=k, bandwidth=0.1)
    kwargs = dict(
        steps=12, batch_size=16, lr=1e-2, warmup_steps=3, dead_after=2, seed=3, threads=1,
        l0_coeff=0.1, sparsity_warmup_steps=4, resample_every=4,
    )  # fmt: skip
    data = _rows()
    whole = SparseAutoencoder(cfg, seed=1)
    full = train_dictionary(whole, data, **kwargs)

    def kill_at_7(done, dictionary):
        if done == 7:
            raise Killed

    with pytest.raises(Killed):
        train_dictionary(
            SparseAutoencoder(cfg, seed=1), data, checkpoint_dir=tmp_path, checkpoint_every=5,
            callback=kill_at_7, **kwargs,
        )  # fmt: skip
    fresh = SparseAutoencoder(cfg, seed=99)
    resumed = train_dictionary(fresh, data, checkpoint_dir=tmp_path, checkpoint_every=5, **kwargs)
    assert resumed.resumed_from == 5
    for name, tensor in whole.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    for key, values in full.history.items():
        assert torch.equal(resumed.history[key], values), key
    if activation == "batchtopk":
        assert float(whole.threshold) > 0  # it was estimated, and resumed with the rest
    else:
        assert not torch.equal(
            whole.log_threshold, torch.full_like(whole.log_threshold, math.log(0.001))
        )


def test_sparsity_warmup_ramps_the_coefficient():
    """The L1 term of step s is (s + 1) / W of the full coefficient during the warm-up:
    at lr ~0 the weights do not move, so the term divided by the ramp is constant."""
    sae = SparseAutoencoder(DictionaryConfig(d_in=6, d_sae=12), seed=0)
    x = _rows(n=16)
    result = train_dictionary(
        sae, x, steps=6, batch_size=16, lr=1e-30, l1_coeff=0.5, sparsity_warmup_steps=4,
        seed=0, threads=1,
    )  # fmt: skip
    l1 = result.history["sparsity"]
    ramp = torch.tensor([0.25, 0.5, 0.75, 1.0, 1.0, 1.0], dtype=torch.float64)
    # the batches differ (drawn with replacement), so compare with each batch's own L1
    gen = torch.Generator().manual_seed(0)
    for step_index in range(6):
        rows = x[torch.randint(16, (16,), generator=gen)]
        with torch.no_grad():
            l1_sum = float(sae.encode(rows).abs().sum(-1).mean())
        want = 0.5 * float(ramp[step_index]) * l1_sum
        assert float(l1[step_index]) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"activation": "batchtopk"}, "k must be an int"),
        ({"activation": "batchtopk", "k": 9}, r"1 <= k <= d_sae \(8\)"),
        ({"activation": "jumprelu", "k": 2}, "k is for activation='topk' or 'batchtopk'"),
        ({"activation": "jumprelu", "bandwidth": 0.0}, "bandwidth must be a finite number > 0"),
        ({"activation": "jumprelu", "bandwidth": float("nan")}, "bandwidth must be"),
        ({"activation": "jumprelu", "init_threshold": 0.0}, "init_threshold must be a finite"),
        ({"activation": "jumprelu", "init_threshold": float("inf")}, "init_threshold must"),
    ],
)
def test_bad_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DictionaryConfig(d_in=4, d_sae=8, **kwargs)


def test_bad_training_settings_are_refused():
    sae = SparseAutoencoder(DictionaryConfig(d_in=6, d_sae=8, activation="batchtopk", k=2))
    with pytest.raises(ValueError, match="threshold_lr must be in"):
        train_dictionary(sae, _rows(), steps=1, threshold_lr=2.0)
    with pytest.raises(ValueError, match="sparsity_warmup_steps"):
        train_dictionary(sae, _rows(), steps=2, sparsity_warmup_steps=3)
    with pytest.raises(ValueError, match="l0_coeff must be a finite number"):
        train_dictionary(sae, _rows(), steps=2, l0_coeff=-1.0)


def test_init_threshold_sets_the_starting_thresholds():
    cfg = DictionaryConfig(d_in=4, d_sae=8, activation="jumprelu", init_threshold=0.5)
    sae = SparseAutoencoder(cfg, seed=0)
    torch.testing.assert_close(sae.log_threshold.exp(), torch.full((8,), 0.5))
    assert DictionaryConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("activation", ["relu", "jumprelu"])
def test_resampling_renews_distinct_directions_with_live_adam_moments(activation):
    """Dead features are renewed from badly reconstructed rows, one per distinct direction
    (the batch holds two directions only, so at most two of the six dead are renewed); the
    new weights' Adam second moments are the live features' mean, the first zero; a
    JumpReLU feature restarts at the live median threshold."""
    from vecinterp.dictionary.train import _resample

    cfg = DictionaryConfig(d_in=4, d_sae=8, activation=activation, dtype="float64")
    sae = SparseAutoencoder(cfg, seed=0)
    with torch.no_grad():
        sae.W_dec.copy_(torch.eye(4, dtype=torch.float64).repeat(2, 1))
        sae.W_enc.copy_(sae.W_dec.T)
        if sae.log_threshold is not None:
            sae.log_threshold.copy_(torch.linspace(-3, -1, 8, dtype=torch.float64))
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    x = _rows(n=32, d=4, seed=5).double()
    sae(x).pow(2).sum().backward()
    optimizer.step()  # every parameter has Adam moments
    x = torch.zeros(20, 4, dtype=torch.float64)
    x[:10, 2], x[10:, 3] = 1.0, -1.0  # two directions, e_2 and -e_3
    dead = torch.tensor([False, True, True, True, True, True, True, False])
    live_median = sae.log_threshold[~dead].median().item() if activation == "jumprelu" else 0
    before = {
        name: optimizer.state[param]["exp_avg_sq"].clone() for name, param in sae.named_parameters()
    }
    renewed = _resample(sae, optimizer, x, x, dead, torch.Generator().manual_seed(0))
    assert 1 <= renewed.numel() <= 2 and bool(dead[renewed].all())
    rows = sae.W_dec.detach()[renewed]  # e_2 or -e_3, up to b_dec (moved by the step)
    assert bool((rows.abs().max(-1).values > 0.99).all())
    assert set(rows.abs().argmax(-1).tolist()) <= {2, 3}
    if renewed.numel() == 2:
        assert float((rows[0] @ rows[1]).abs()) < 0.9
    live = ~dead
    for name, param in sae.named_parameters():
        if name == "b_dec":
            continue
        state = optimizer.state[param]
        axis = 1 if name == "W_enc" else 0
        got = state["exp_avg_sq"].index_select(axis, renewed)
        want = before[name].index_select(axis, live.nonzero().flatten()).mean(axis, True)
        torch.testing.assert_close(got, want.expand_as(got))
        assert bool((state["exp_avg"].index_select(axis, renewed) == 0).all())
    if activation == "jumprelu":
        assert torch.allclose(
            sae.log_threshold.detach()[renewed],
            torch.full((len(renewed),), live_median, dtype=torch.float64),
        )


def test_distinct_directions_blocked_is_the_plain_greedy_selection():
    from vecinterp.dictionary.train import RESAMPLE_DISTINCT_COSINE, _distinct

    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    dirs = centres[torch.randint(40, (700,), generator=gen)]
    dirs = dirs + 0.2 * torch.randn(700, 3, generator=gen, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    kept = [0]
    for i in range(1, 700):  # the plain greedy loop
        if float((dirs[kept] @ dirs[i]).max()) <= RESAMPLE_DISTINCT_COSINE:
            kept.append(i)
    assert 1 < len(kept) < 700
    for block in (1, 7, 256, 1000):
        assert _distinct(dirs, block=block).tolist() == kept
