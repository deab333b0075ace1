"""Ridge regression for many probes at once, the penalty chosen by k-fold cross-validation.

Everything is computed in float64 from sufficient statistics: per fold, the Gram matrix
and sums of the activations and the cross products with the targets. A fold's training
part is "all training rows minus the fold", so the activations are multiplied once per
probe, not once per fold. Each fold's centred Gram matrix is diagonalised once
(``G = V diag(e) V^T``); every penalty then costs a diagonal rescaling, and the held-out
fold's squared error follows from the same statistics without forming its predictions::

    W(lam)  = V diag(1 / (e + lam)) V^T C
    SSE(lam) = |y|^2 - 2 tr(W^T A) + tr(W^T B W)

(``C``: centred cross products of the training part, ``A``, ``B``: those of the held-out
fold about the training part's means). Penalties are relative: ``lam = alpha tr(G) / d``,
so that one grid of ``alpha`` fits activations of any scale.
"""

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Split:
    """Which sequences train and which test, the training folds and the bootstrap."""

    train: torch.Tensor
    test: torch.Tensor
    fold: torch.Tensor
    n_folds: int
    resample: torch.Tensor
    """``[n_bootstrap, n_test]``: how often each held-out sequence is drawn in each resample."""


def make_split(n: int, test_fraction: float, n_folds: int, n_bootstrap: int, seed: int) -> Split:
    """A random split of ``n`` sequences, seeded; every fold and the test set non-empty."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    n_test = max(1, round(test_fraction * n))
    test, train = order[:n_test].sort().values, order[n_test:].sort().values
    fold = torch.randperm(len(train), generator=gen) % n_folds
    draws = torch.randint(0, n_test, (n_bootstrap, n_test), generator=gen)
    resample = torch.zeros(n_bootstrap, n_test, dtype=torch.float64)
    resample.scatter_add_(1, draws, torch.ones_like(resample))
    return Split(train, test, fold, n_folds, resample)


@dataclasses.dataclass(frozen=True)
class RidgeFit:
    """One ridge fit per cell ``P``: held-out scores and the probe (on the training split)."""

    r2: torch.Tensor  # [P]
    r2_low: torch.Tensor  # [P]
    r2_high: torch.Tensor  # [P]
    r2_per_output: torch.Tensor  # [P, k]
    alpha: torch.Tensor  # [P] relative penalty chosen
    weight: torch.Tensor  # [P, d, k]
    bias: torch.Tensor  # [P, k]


class RidgeCV:
    """The activations' statistics for cells ``[P, n, d]``, reused by every target."""

    def __init__(self, x: torch.Tensor, split: Split, alphas: torch.Tensor) -> None:
        self.split, self.alphas = split, alphas
        x = x.to(torch.float64)
        # training rows sorted by fold, so that each fold is a contiguous slice (a view)
        order = split.fold.argsort(stable=True)
        self.order = split.train[order]
        counts = torch.bincount(split.fold, minlength=split.n_folds).tolist()
        bounds = [0, *torch.tensor(counts).cumsum(0).tolist()]
        self.rows = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        train = x[:, self.order]
        self.mu0 = train.mean(1)  # [P, d]
        xc = train - self.mu0[:, None]
        self.x_train, self.x_test = xc, x[:, split.test] - self.mu0[:, None]
        grams = torch.stack([xc[:, r].mT @ xc[:, r] for r in self.rows], 1)  # [P, F, d, d]
        sums = torch.stack([xc[:, r].sum(1) for r in self.rows], 1)  # [P, F, d]
        self.n_fold = torch.tensor(counts, dtype=torch.float64)[:, None]
        self.n_train = float(len(split.train))
        m = self.n_train - self.n_fold  # [F, 1]
        gram_all, sum_all = grams.sum(1), sums.sum(1)
        self.mux = (sum_all[:, None] - sums) / m  # [P, F, d], the training part's mean
        gc = gram_all[:, None] - grams - m[..., None] * _outer(self.mux, self.mux)
        self.e, self.v = _eigh(gc)
        self.scale = _trace(gc) / x.shape[-1]  # [P, F]
        nf = self.n_fold[..., None]
        held = (
            grams
            - _outer(sums, self.mux)
            - _outer(self.mux, sums)
            + nf * _outer(self.mux, self.mux)
        )
        self.held = self.v.mT @ held @ self.v  # [P, F, d, d] in the eigenbasis
        self.sums = sums
        self.mux_all = sum_all / self.n_train  # [P, d]
        gc_all = gram_all - self.n_train * _outer(self.mux_all, self.mux_all)
        self.e_all, self.v_all = _eigh(gc_all)
        self.scale_all = _trace(gc_all) / x.shape[-1]  # [P]

    def fit(self, y: torch.Tensor, ci: float) -> RidgeFit:
        """Fit targets ``y`` ``[P or 1, n, k]`` (float64) at every cell."""
        split = self.split
        y = y.to(torch.float64)
        y_train = y[:, self.order]
        nu0 = y_train.mean(1)  # [P', k]
        yc = y_train - nu0[:, None]
        cross = torch.stack([self.x_train[:, r].mT @ yc[:, r] for r in self.rows], 1)
        tsum = torch.stack([yc[:, r].sum(1) for r in self.rows], 1)  # [P', F, k]
        ysq = torch.stack([yc[:, r].pow(2).sum(1) for r in self.rows], 1)  # [P', F, k]
        m = self.n_train - self.n_fold  # [F, 1]
        muy = (tsum.sum(1, keepdim=True) - tsum) / m  # [P', F, k]
        cross_all = cross.sum(1)  # [P, d, k]
        cc = cross_all[:, None] - cross - m[..., None] * _outer(self.mux, muy)
        z = self.v.mT @ cc  # [P, F, d, k]
        nf = self.n_fold[..., None]
        a = cross - _outer(self.sums, muy) - _outer(self.mux, tsum) + nf * _outer(self.mux, muy)
        lin = (z * (self.v.mT @ a)).sum(-1)  # [P, F, d]
        quad_m = self.held * (z @ z.mT)  # [P, F, d, d]
        yy = (ysq - 2 * muy * tsum + self.n_fold * muy.pow(2)).sum(-1)  # [P', F]
        lam = self.alphas[:, None, None] * self.scale  # [L, P, F]
        inv = _inverse(self.e[None], lam[..., None])  # [L, P, F, d]
        quad = torch.einsum("lpfi,pfij,lpfj->lpf", inv, quad_m, inv)
        sse = yy[None] - 2 * (inv * lin[None]).sum(-1) + quad  # [L, P, F]
        best = sse.sum(-1).argmin(0)  # [P]
        alpha = self.alphas[best]
        # the final probe: every training row, the chosen penalty
        muy_all = tsum.sum(1) / self.n_train  # [P', k]
        cc_all = cross_all - self.n_train * _outer(self.mux_all, muy_all)
        inv_all = _inverse(self.e_all, (alpha * self.scale_all)[:, None])  # [P, d]
        weight = self.v_all @ (inv_all[..., None] * (self.v_all.mT @ cc_all))  # [P, d, k]
        pred = (self.x_test - self.mux_all[:, None]) @ weight + (nu0 + muy_all)[:, None]
        y_test = y[:, split.test]
        return _score(
            y_test, pred, weight, nu0 + muy_all, self.mu0 + self.mux_all, alpha, split, ci
        )


def _score(
    y_test: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    mean_y: torch.Tensor,
    mean_x: torch.Tensor,
    alpha: torch.Tensor,
    split: Split,
    ci: float,
) -> RidgeFit:
    """Held-out R² (pooled over outputs and per output) and its bootstrap interval."""
    centred = y_test - y_test.mean(1, keepdim=True)  # [P', n_test, k]
    err = (y_test - pred).pow(2)  # [P, n_test, k]
    sst_k = centred.pow(2).sum(1)  # [P', k]
    r2_per_output = _r2(err.sum(1), sst_k)
    r2 = _r2(err.sum((1, 2)), sst_k.sum(-1))
    w = split.resample  # [B, n_test]
    n_test = w.shape[1]
    sse_b = err.sum(-1) @ w.T  # [P, B]
    sst_b = centred.pow(2).sum(-1) @ w.T - (w @ centred).pow(2).sum(-1) / n_test  # [P', B]
    r2_b = _r2(sse_b, sst_b)
    tail = (1 - ci) / 2
    q = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    low, high = torch.quantile(r2_b, q, dim=1)
    bias = mean_y - (mean_x[..., None] * weight).sum(1)  # pred = x @ weight + bias
    return RidgeFit(r2, low, high, r2_per_output, alpha, weight, bias)


def _r2(sse: torch.Tensor, sst: torch.Tensor) -> torch.Tensor:
    """``1 - sse / sst``, NaN where the targets have no variance (``sst == 0``)."""
    return torch.where(sst > 0, 1 - sse / sst.clamp_min(torch.finfo(sst.dtype).tiny), torch.nan)


def _outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., :, None] * b[..., None, :]


def _trace(g: torch.Tensor) -> torch.Tensor:
    return g.diagonal(dim1=-2, dim2=-1).sum(-1)


def _eigh(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    e, v = torch.linalg.eigh((g + g.mT) / 2)
    return e.clamp_min(0), v


def _inverse(e: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``1 / (e + lam)``, and 0 where both are 0 (a direction without variance)."""
    total = e + lam
    return torch.where(total > 0, 1 / total.clamp_min(torch.finfo(total.dtype).tiny), 0.0)
