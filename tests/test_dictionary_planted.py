"""Planted features (a toy model of superposition, Elhage et al. 2022, arXiv 2209.10652):
a dictionary trained on a model's activations finds the directions put there (issue 35).

``N_FEATURES`` = 24 unit directions in ``D`` = 8 dimensions: the standard basis plus four
rows of a Hadamard matrix (coherence 1/sqrt(8)), rotated at random, and their negatives (so
the data's centre is 0). They are built into a model's weights: its input is the sparse
coefficient vector (one feature per position, the planted L0 = 1, magnitude uniform in
[1, 1.5]) and its embedding ``W_E`` holds the directions, so ``hook_embed`` is the sparse
sum, harvested through an :class:`~vecinterp.dictionary.ActivationBuffer`.

Every planted direction must be matched by a decoder row with cosine >= 0.99 (the minimum
over the planted features) and the FVU be <= 0.01.

The SAE's pre-encoder bias ``b_dec`` is held at the data's centre (0): trained from 0, it
drifts to ~0.4 in the first steps, while the rows are still random, and TopK training
settles with every row tilted by it (minimum cosine ~0.94, FVU ~1e-3 at the same budget).
"""

import torch

import vecinterp as vi
from vecinterp.dictionary import (
    ActivationBuffer,
    DictionaryConfig,
    SparseAutoencoder,
    evaluate_dictionary,
    train_dictionary,
)

D, N_EXTRA, N_POS = 8, 4, 4
N_FEATURES = 2 * (D + N_EXTRA)
MIN_COSINE, MAX_FVU = 0.99, 0.01


def _hadamard(d: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d**0.5


def planted_directions(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rotation, _ = torch.linalg.qr(torch.randn(D, D, generator=gen))
    frame = torch.cat([torch.eye(D), _hadamard(D)[:N_EXTRA]]) @ rotation
    return torch.cat([frame, -frame])


def make_batch(step: int, gen: torch.Generator, rows: int = 64) -> torch.Tensor:
    """Coefficients ``[rows, N_POS, N_FEATURES]``: one feature per position."""
    which = torch.randint(N_FEATURES, (rows, N_POS, 1), generator=gen)
    size = 1 + 0.5 * torch.rand(rows, N_POS, 1, generator=gen)
    return torch.zeros(rows, N_POS, N_FEATURES).scatter(-1, which, size)


def planted_model(directions: torch.Tensor) -> vi.HookedVectorTransformer:
    cfg = vi.VectorTransformerConfig(
        d_in=N_FEATURES, d_model=D, d_head=4, n_heads=1, n_layers=1, n_ctx=N_POS,
        positional="none", normalization=None,
    )  # fmt: skip
    model = vi.HookedVectorTransformer(cfg, seed=0)
    with torch.no_grad():
        model.embed.W_E.copy_(directions)
    return model


def min_cosine(planted: torch.Tensor, rows: torch.Tensor) -> float:
    """The worst planted direction's best cosine with a decoder row."""
    return float((planted @ rows.T).max(dim=1).values.min())


def test_topk_sae_recovers_planted_directions():
    directions = planted_directions()
    model = planted_model(directions)
    buffer = ActivationBuffer(model, ["hook_embed"], make_batch, capacity=4096, seed=1)
    x = torch.cat([buffer.next_batch(256)["hook_embed"] for _ in range(48)])
    assert 1 - 1e-5 <= float(x.norm(dim=1).min()) and float(x.norm(dim=1).max()) <= 1.5 + 1e-5
    cfg = DictionaryConfig(d_in=D, d_sae=2 * N_FEATURES, activation="topk", k=1)
    sae = SparseAutoencoder(cfg, seed=0)
    sae.b_dec.requires_grad_(False)  # held at the data's centre, 0 (see the docstring)
    train_dictionary(
        sae, x, steps=600, batch_size=256, lr=1e-2, warmup_steps=20, schedule="cosine",
        dead_after=50, resample_every=50, seed=0, threads=1,
    )  # fmt: skip
    stats = evaluate_dictionary(sae, x)
    cosine = min_cosine(directions, sae.W_dec.detach())
    # measured: min cosine 1.0000, FVU 1.5e-07, L0 1.000
    assert cosine >= MIN_COSINE
    assert stats.fvu <= MAX_FVU
    assert stats.l0 == 1.0
