"""fit_probes: the closed-form cross-validated ridge against a brute-force one, a planted
variable decoded where it is written and not where it is absent, and the controls."""

import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg
from planted_variable import planted_model
from vecinterp.analysis._ridge import RidgeCV, make_split

N = 600


@pytest.fixture(scope="module")
def planted():
    model, direction = planted_model()
    x = torch.randn(N, 6, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    targets = {"v": x[:, 0, 0], "x": x}
    probes = vi.fit_probes(model, x, targets, ["resid_pre", "resid_post"], progress=False)
    return model, direction, x, probes


def _brute_ridge(x, y, lam):
    """Ridge with an intercept: centre on the rows' means, solve the normal equations."""
    mx, my = x.mean(0), y.mean(0)
    xc = x - mx
    w = torch.linalg.solve(xc.T @ xc + lam * torch.eye(x.shape[1], dtype=x.dtype), xc.T @ (y - my))
    return w, my - mx @ w


def test_ridge_matches_brute_force_cross_validation():
    gen = torch.Generator().manual_seed(0)
    P, n, d, k = 3, 90, 5, 2
    x = torch.randn(P, n, d, generator=gen, dtype=torch.float64) * torch.tensor([1, 3, 0.1, 2, 1.0])
    x = x + 4.0  # far from the origin: the centring matters
    y = x[..., :2] @ torch.tensor([[1.0, -2.0], [0.5, 1.0]], dtype=torch.float64)
    y = y + torch.randn(P, n, k, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 3.0])
    alphas = torch.tensor([1e-3, 1e-1, 1.0, 10.0, 100.0], dtype=torch.float64)
    split = make_split(n, 0.25, 4, 50, seed=3)
    fit = RidgeCV(x, split, alphas).fit(y, ci=0.9)
    train, test = split.train, split.test
    for p in range(P):
        xt, yt = x[p, train], y[p, train]
        xc = xt - xt.mean(0)
        scale = torch.trace(xc.T @ xc) / d
        cv = []
        for alpha in alphas:
            sse = 0.0
            for f in range(split.n_folds):
                tr, va = split.fold != f, split.fold == f
                part = xt[tr] - xt[tr].mean(0)
                lam = alpha * torch.trace(part.T @ part) / d
                w, b = _brute_ridge(xt[tr], yt[tr], lam)
                sse += float((yt[va] - xt[va] @ w - b).pow(2).sum())
            cv.append(sse)
        best = int(torch.tensor(cv).argmin())
        assert fit.alpha[p] == alphas[best]
        w, b = _brute_ridge(xt, yt, alphas[best] * scale)
        torch.testing.assert_close(fit.weight[p], w, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(fit.bias[p], b, rtol=1e-10, atol=1e-12)
        pred = x[p, test] @ w + b
        resid = (y[p, test] - pred).pow(2)
        sst = (y[p, test] - y[p, test].mean(0)).pow(2)
        torch.testing.assert_close(fit.r2[p], 1 - resid.sum() / sst.sum(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(fit.r2_per_output[p], 1 - resid.sum(0) / sst.sum(0))
        # the bootstrap: each resample's R² computed by repeating the held-out rows
        r2_b = []
        for counts in split.resample:
            rows = torch.repeat_interleave(torch.arange(len(test)), counts.long())
            yy, pp = y[p, test][rows], pred[rows]
            r2_b.append(1 - (yy - pp).pow(2).sum() / (yy - yy.mean(0)).pow(2).sum())
        low, high = torch.quantile(
            torch.stack(r2_b), torch.tensor([0.05, 0.95], dtype=torch.float64)
        )
        torch.testing.assert_close(fit.r2_low[p], low, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(fit.r2_high[p], high, rtol=1e-10, atol=1e-12)


def test_planted_variable_decoded_where_written_and_not_where_absent(planted):
    _, _, _, probes = planted
    v = probes["v"]
    assert v.hook_names == (
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_pre",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
    )
    # resid_pre of layer 0: v = x[0, 0] is there at position 0 only
    assert v.r2[0, 0] > 1 - 1e-9
    assert (v.r2[0, 1:] < 0.03).all() and (v.r2_low[0, 1:] < 0).all()
    # layer 0's head copies it to every position: decodable everywhere after it
    assert (v.r2[1:] > 1 - 1e-9).all()
    assert (v.r2_low <= v.r2).all() and (v.r2 <= v.r2_high).all()
    # the per-position target x (3 outputs) is the input itself: everywhere
    assert probes["x"].r2_per_output.shape == (4, 6, 3)
    assert (probes["x"].r2_per_output > 1 - 1e-9).all()


def test_probe_weight_reads_the_planted_direction(planted):
    _, direction, x, probes = planted
    v = probes["v"]
    w = v.weight[2, 3, :, 0]  # resid_post of layer 0, position 3
    cos = (w @ direction) / w.norm()
    assert abs(float(cos)) > 1 - 1e-9
    _, cache = planted[0].run_with_cache(x[:5])
    pred = cache["blocks.0.hook_resid_post"][:, 3] @ v.weight[2, 3] + v.bias[2, 3]
    torch.testing.assert_close(pred[:, 0], x[:5, 0, 0], rtol=1e-6, atol=1e-6)


def test_controls_behave_as_controls(planted):
    _, _, _, probes = planted
    v = probes["v"]
    # shuffled targets are not decodable anywhere
    assert (v.shuffled_r2 < 0.03).all()
    # the random model has v at position 0 of the embedding too (any embedding is linear)
    assert abs(float(v.selectivity[0, 0])) < 1e-9
    # the input itself: every random network keeps it at layer 0, selectivity ~ 0
    x_probe = probes["x"]
    assert (x_probe.selectivity[0].abs() < 1e-9).all()
    # after the planted head: the trained copy is selective at the last positions
    assert (v.selectivity[2, 3:] > 0.5).all()


def test_random_model_selectivity_is_zero():
    cfg = tiny_cfg(d_out=3)
    model = random_model(cfg, seed=3)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(500, 5, 3, generator=gen, dtype=torch.float64)
    noise = torch.randn(500, 2, generator=gen, dtype=torch.float64)
    probes = vi.fit_probes(
        model, x, {"noise": noise, "x": x}, "resid_pre", control_seed=7, progress=False
    )
    # a target unrelated to the input: R², control R² and shuffled R² all about 0
    for field in ("r2", "control_r2", "shuffled_r2"):
        assert (getattr(probes["noise"], field).abs() < 0.05).all(), field
    assert (probes["noise"].selectivity.abs() < 0.05).all()
    # the input: decodable in both random models at layer 0, so no selectivity
    assert (probes["x"].selectivity[0].abs() < 1e-9).all()


def test_batched_positions_equal_one_position_at_a_time(planted):
    model, _, x, probes = planted
    alone = vi.fit_probes(
        model,
        x,
        {"v": x[:, 0, 0]},
        "blocks.0.hook_resid_pre",
        positions=[2],
        controls=(),
        progress=False,
    )["v"]
    torch.testing.assert_close(alone.r2[0, 0], probes["v"].r2[0, 2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(alone.weight[0, 0], probes["v"].weight[0, 2], rtol=1e-9, atol=1e-12)
    assert alone.control_r2.isnan().all() and alone.shuffled_r2.isnan().all()


def test_per_position_nan_marks_undefined_cells(planted):
    model, _, x, _ = planted
    prev = torch.full_like(x, torch.nan)
    prev[:, 1:] = x[:, :-1]
    probes = vi.fit_probes(
        model, x, {"prev": prev}, "blocks.0.hook_resid_post", controls=(), progress=False
    )["prev"]
    assert probes.r2[0, 0].isnan() and probes.weight[0, 0].isnan().all()
    assert not probes.r2[0, 1:].isnan().any()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(targets={"v": torch.randn(7)}), ValueError, "targets\\['v'\\] must be"),
        (dict(targets={"v": torch.full((N,), torch.nan)}), ValueError, "must be finite"),
        (dict(targets=[1.0]), TypeError, "targets"),
        (dict(hook_names="z"), ValueError, "not laid out"),
        (dict(hook_names="nonsense"), ValueError, "unknown hook name"),
        (dict(positions=[9]), ValueError, "positions"),
        (dict(controls=("random",)), ValueError, "controls"),
        (dict(alphas=(0.0,)), ValueError, "alphas"),
        (dict(n_folds=1), ValueError, "n_folds"),
        (dict(test_fraction=1.5), ValueError, "test_fraction"),
        (dict(ci=1.5), ValueError, "ci"),
    ],
)
def test_bad_arguments(planted, kwargs, error, match):
    model, _, x, _ = planted
    args = dict(targets={"v": x[:, 0, 0]}, hook_names="resid_pre")
    args.update(kwargs)
    with pytest.raises(error, match=match):
        vi.fit_probes(model, x, args.pop("targets"), args.pop("hook_names"), progress=False, **args)


def test_too_few_sequences(planted):
    model, _, x, _ = planted
    with pytest.raises(ValueError, match="sequences"):
        vi.fit_probes(model, x[:8], x[:8, 0, 0], "resid_pre", progress=False)
