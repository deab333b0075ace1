"""A 2-layer model with a HAND-PLANTED variable, for the probe and alignment-search tests.

Residual stream, before a random rotation ``R`` (``d_model = 8``)::

    e0 e1 e2: the input x (d_in = 3)   e3: flag of position 0   e4: V   e5: constant 1

- ``W_E`` writes ``x`` into ``e0..e2``; ``W_pos`` writes ``e5`` at every position and
  ``e3`` at position 0 only.
- Layer 0's one head attends to position 0 from every position (query ``BIG e5``, key
  ``e3``: a score of ``BIG / sqrt(d_head)`` for position 0 and 0 elsewhere, so the other
  weights are ``exp(-BIG / sqrt(2))``, below float64's smallest number) and copies
  ``x[0, 0]`` (``e0`` at position 0) into ``e4``. So the variable ``v = x[:, 0, 0]`` is in
  ``resid_pre`` of layer 0 at position 0 only (along ``e0``), and from ``resid_mid`` of
  layer 0 on at every position, along ``e4``.
- Layer 1 writes nothing (zero ``W_O``, zero biases).
- ``W_U`` reads ``e4``: the output is ``v`` at every position (``d_out = 1``).

Every matrix that writes the residual stream is multiplied by ``R`` on the right and every
one that reads it by ``R^T`` on the left, so the planted direction of ``V`` is ``R[4]``
(not a coordinate axis), and the model computes the same function.
"""

import torch

import vecinterp as vi

BIG = 1000.0
N_CTX = 6


def rotation(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=gen, dtype=torch.float64))
    return q


def planted_model(seed: int = 0) -> tuple[vi.HookedVectorTransformer, torch.Tensor]:
    """The model and the planted direction of ``V`` in the residual stream, ``[8]``."""
    cfg = vi.VectorTransformerConfig(
        d_in=3,
        d_out=1,
        d_model=8,
        d_head=2,
        n_heads=1,
        n_layers=2,
        n_ctx=N_CTX,
        attn_only=True,
        normalization=None,
        positional="learned",
    )
    model = vi.HookedVectorTransformer(cfg, seed=seed, dtype=torch.float64)
    r = rotation(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[:, :3] = torch.eye(3, dtype=torch.float64)
        model.pos_embed.W_pos[:, 5] = 1.0
        model.pos_embed.W_pos[0, 3] = 1.0
        attn = model.blocks[0].attn
        attn.W_Q[0][5, 0] = BIG
        attn.W_K[0][3, 0] = 1.0
        attn.W_V[0][0, 0] = 1.0
        attn.W_O[0][0, 4] = 1.0
        model.unembed.W_U[4, 0] = 1.0
        model.embed.W_E.copy_(model.embed.W_E @ r)
        model.pos_embed.W_pos.copy_(model.pos_embed.W_pos @ r)
        for w in (attn.W_Q, attn.W_K, attn.W_V):
            w.copy_(r.T @ w)
        attn.W_O.copy_(attn.W_O @ r)
        model.unembed.W_U.copy_(r.T @ model.unembed.W_U)
    return model, r[4]


def sin_principal_angles(basis: torch.Tensor, planted: torch.Tensor) -> torch.Tensor:
    """The sines of the principal angles between ``span(basis)`` and ``span(planted)``
    (both ``[d, k]``, orthonormalised here): the singular values of the part of the
    planted basis outside the found subspace; accurate near 0, unlike ``arccos``."""
    q = torch.linalg.qr(basis.to(torch.float64)).Q
    u = torch.linalg.qr(planted.to(torch.float64).reshape(q.shape[0], -1)).Q
    return torch.linalg.svdvals(u - q @ (q.T @ u))
