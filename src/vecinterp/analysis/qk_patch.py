"""The pseudoinverse QK patch: a head's QK circuit replaced by a random projection.

Unlike activation patching (:mod:`vecinterp.analysis.patching`, which re-exports
:func:`patch_qk_identity`), this edits weights, not activations: it returns a copy of the
model whose chosen heads attend by ``x P y^T`` with ``P`` an orthogonal projection of rank
``d_head``, the closest a rank-``d_head`` QK circuit can come to the identity.
"""

from collections.abc import Iterable
from typing import Any

import torch

from ..model import HookedVectorTransformer
from ..model.processing import _copy
from ..model.validation import check_bool, check_finite_number, check_seed
from ._validate import check_head, check_layer, check_model, refuse_grouped_query


def patch_qk_identity(
    model: HookedVectorTransformer,
    layer: int,
    heads: int | Iterable[int] | str,
    seed: int = 0,
    *,
    scale: float = 1.0,
    zero_biases: bool = False,
) -> HookedVectorTransformer:
    """Replace the QK circuits of some heads by a low-rank approximation of the identity.

    The pseudoinverse patch of Bhargav & Gu (2024, §4.6): a head's ``W_Q W_K^T`` is
    ``d_model x d_model`` but has rank at most ``d_head``, so it cannot be the identity;
    the closest it can be is a projection. For each patched head ``h``::

        Q ~ N(0, 1)^{d_model x d_head}      (float64, seeded)
        W_Q[h] <- scale * Q
        W_K[h] <- pinv(Q)^T                  so  W_Q W_K^T = scale * Q pinv(Q)

    ``Q pinv(Q)`` is the orthogonal projection onto the column space of ``Q``: symmetric,
    idempotent, of rank ``min(d_head, d_model)``. The paper draws "a random matrix" and
    says nothing more; any full-rank ``Q`` gives a projection and its scale cancels in
    ``Q pinv(Q)``, so the distribution only matters through the subspace it spans — a
    Gaussian ``Q`` spans a uniformly random ``d_head``-dimensional subspace. The paper
    applies no scale (``scale=1``); the model still divides scores by ``sqrt(d_head)``.
    Each head's ``Q`` comes from one generator seeded with ``seed`` that draws a ``Q``
    for every head of the layer in order, so head ``h`` gets the same ``Q`` whichever
    other heads are patched.

    Biases: the paper patches ``W_Q`` and ``W_K`` only, so ``b_Q`` and ``b_K`` are kept
    (``zero_biases=False``) and still add their terms to the scores; with
    ``zero_biases=True`` they are set to zero, so the head's score is exactly
    ``ln1(u) (scale · P) ln1(v)^T / sqrt(d_head)`` (before rotary, if any). The paper
    analysed a model with LayerNorm folded (:func:`~vecinterp.fold_layer_norm`); patch
    a folded model to match it. Every other weight is copied unchanged.

    Args:
        model: the model (not modified).
        layer: the layer (negative counts from the end).
        heads: a head index, an iterable of them, or ``"all"``.
        seed: seed of the random ``Q`` (an int).
        scale: multiplies the projection (``W_Q <- scale * Q``), a finite number; the
            paper's is 1.
        zero_biases: also set ``b_Q`` and ``b_K`` of the patched heads to zero (a bool).

    Returns:
        A new model.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.qk_patch import patch_qk_identity
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> patched = patch_qk_identity(model, layer=1, heads=[0])
        >>> P = patched.QK[1, 0].AB
        >>> bool(torch.allclose(P @ P, P, atol=1e-5)), int(torch.linalg.matrix_rank(P))
        (True, 4)
    """
    model = check_model(model)
    layer = check_layer(model, layer)
    cfg = model.cfg
    if isinstance(heads, str):
        if heads != "all":
            raise ValueError(
                f"heads must be a head index, an iterable of them or 'all', got {heads!r}"
            )
        chosen = list(range(cfg.n_heads))
    elif isinstance(heads, int) and not isinstance(heads, bool):
        chosen = [check_head(model, heads, "heads")]
    elif isinstance(heads, Iterable) and not isinstance(heads, bytes | torch.Tensor):
        items = list(heads)
        if not items:
            raise ValueError("no heads selected: heads is empty")
        chosen = sorted({check_head(model, h, f"in heads={items!r}") for h in items})
    else:
        raise TypeError(
            "heads must be a head index (an int), an iterable of them or 'all', got "
            f"{type(heads).__name__} {heads!r}"
        )
    scale = check_finite_number("scale", scale)
    check_bool("zero_biases", zero_biases)
    gen = torch.Generator().manual_seed(check_seed("seed", seed))
    qs = torch.randn(cfg.n_heads, cfg.d_model, cfg.d_head, generator=gen, dtype=torch.float64)
    refuse_grouped_query(
        model,
        "patch_qk_identity",
        "a query head's W_K is its group's key weight, shared with the other query heads of "
        "the group, so it cannot be set per query head",
    )
    new = _copy(model, cfg)
    attn: Any = new.blocks[layer].attn  # an Attention module; nn.ModuleList erases the type
    with torch.no_grad():
        for h in chosen:
            q = qs[h]
            attn.W_Q[h] = (scale * q).to(attn.W_Q)
            attn.W_K[h] = torch.linalg.pinv(q).T.to(attn.W_K)
            if zero_biases:
                attn.b_Q[h] = 0.0
                attn.b_K[h] = 0.0
    return new
