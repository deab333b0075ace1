"""Scores of attention-head circuits: eigenvalue (copying) scores and composition scores.

Both follow Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits",
rewritten for row vectors (``resid @ W``, vecinterp's convention). All scores are computed
from the circuits' factors (:class:`~vecinterp.FactoredMatrix`): nothing of size
``d_model × d_model`` is formed or decomposed, so their cost does not grow like
``d_model³``. They run under ``torch.no_grad()`` and return detached tensors.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
from einops import einsum
from jaxtyping import Float
from tqdm.auto import tqdm

from ..factored_matrix import FactoredMatrix, linalg_dtype
from ..model import HookedVectorTransformer
from ..model.processing import fold_layer_norm
from ._validate import check_model
from .circuits import full_ov_circuit, full_qk_circuit, ov_circuit, pos_qk_circuit, qk_circuit

__all__ = [
    "CompositionBaseline",
    "composition_baseline",
    "composition_scores",
    "eigenvalue_scores",
]

_CIRCUITS: dict[str, Callable[[HookedVectorTransformer], FactoredMatrix]] = {
    "ov": ov_circuit,
    "qk": qk_circuit,
    "full_ov": full_ov_circuit,
    "full_qk": full_qk_circuit,
    "pos_qk": pos_qk_circuit,
}
_COMPOSITION_KINDS = ("Q", "K", "V")
_BASELINE_CHUNK_ENTRIES = 2**24  # random entries drawn at once by composition_baseline


def _check_kind(kind: object, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(kind, str):
        raise TypeError(f"{what}: kind must be a str, one of {allowed}, got {type(kind).__name__}")
    if kind not in allowed:
        raise ValueError(f"{what}: kind must be one of {allowed}, got {kind!r}")
    return kind


def _required(kind: object, what: str) -> object:
    """``kind``, or a ``ValueError`` when it was left out: composition has three kinds and
    none is the obvious one (TransformerLens's ``all_composition_scores(mode)`` requires it
    too), so no default silently picks one."""
    if kind is None:
        raise ValueError(
            f"{what}(model, kind=...) needs kind, one of {_COMPOSITION_KINDS}: "
            "Q-, K- or V-composition (there is no default)"
        )
    return kind


def _safe_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, and 0 where ``den == 0`` (never NaN)."""
    nonzero = den > 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), 0.0)


# ---------------------------------------------------------------------- eigenvalue scores


def eigenvalue_scores(
    circuit: FactoredMatrix | HookedVectorTransformer,
    kind: str | None = None,
    *,
    fold_ln: bool = False,
) -> Float[torch.Tensor, "*batch"]:
    """Eigenvalue ("copying") score ``Re(Σλ) / Σ|λ|`` of square circuit matrices.

    For a square matrix ``M`` with eigenvalues ``λ_1..λ_n``,
    ``score(M) = Re(Σ_i λ_i) / Σ_i |λ_i| = tr(M) / Σ_i |λ_i|``, in ``[-1, 1]`` by the
    triangle inequality. It is ``+1`` exactly when every nonzero eigenvalue is real and
    positive (``M = +I`` scores 1: the head copies what it reads), ``-1`` when all are
    real and negative (``OV = −I`` scores −1: it writes the negative of what it reads),
    and near 0 when they are spread around the circle (a 90° rotation, ``λ = ±i``,
    scores 0). The eigenvalues come from the small side of the factorisation
    (:attr:`FactoredMatrix.eigenvalues`: ``eig(BA)``, ``d_head × d_head`` per head),
    which differ from those of ``AB`` only by zeros that change neither sum.

    Two ways to call it (one function, chosen by the type of ``circuit``):

    - ``eigenvalue_scores(fm)``: the scores of any square :class:`~vecinterp.FactoredMatrix`
      with any leading dims; ``kind`` must be left ``None``.
    - ``eigenvalue_scores(model, kind=...)``: the scores of one circuit of every head of a
      model, ``kind`` required: ``"ov"`` (``W_V W_O``), ``"qk"`` (``W_Q W_K^T``),
      ``"full_ov"`` (``W_E W_V W_O W_U``, square only when ``d_in == d_out``),
      ``"full_qk"`` (``W_E W_Q W_K^T W_E^T``) or ``"pos_qk"``
      (``W_pos W_Q W_K^T W_pos^T``); see :mod:`vecinterp.analysis.circuits` for what
      these leave out (biases, normalization: fold them first with
      :func:`~vecinterp.process_weights`, or pass ``fold_ln=True``).

    Normalization: the circuits are read from the weights as they are. In a model whose
    normalization still carries its weights (``"LN"``, ``"RMS"``), or whose LNPre readers
    are not centred, the head's map on the residual stream also includes the norm's
    ``diag(w)`` and the centring, which :func:`~vecinterp.fold_layer_norm` moves into
    ``W_Q``/``W_K``/``W_V``/``W_U``. The scores then differ from those of the folded
    model, the numbers TransformerLens gives for a model loaded with ``fold_ln=True``: on
    small random models the OV scores moved by up to 0.5 (norm weights 1, biases 0: the
    centring alone) and 0.7 (random norm weights). No warning is raised (scoring an
    unfolded model is legitimate, and a warning on every such call would be noise);
    ``fold_ln=True`` scores the folded model, the same as
    ``eigenvalue_scores(vi.fold_layer_norm(model), kind)``. Neither is wrong: the raw
    circuit acts on the norm's output ``ln(x)`` (after its ``w`` and ``b``), the folded
    one on the parameter-free normalized stream; say which one you report.

    A matrix whose eigenvalues are all zero (the zero matrix, or any nilpotent one) has
    ``Σ|λ| = 0``; its score is defined as 0, not NaN. (For a nilpotent matrix the
    computed eigenvalues are rounding noise, so its score is not meaningful either way.)

    Args:
        circuit: a square FactoredMatrix ``[*batch, n, n]``, or a
            :class:`~vecinterp.HookedVectorTransformer`.
        kind: with a model, which circuit; must be ``None`` with a FactoredMatrix.
        fold_ln: with a model, score the circuits of ``vi.fold_layer_norm(model)``
            (the model itself is not modified); must be ``False`` with a FactoredMatrix.

    Returns:
        Scores ``[*batch]`` in ``[-1, 1]`` (``[n_layers, n_heads]`` for a model), real, of
        the factors' dtype (``float32`` for ``float16``/``bfloat16`` factors, whose
        eigenvalues are computed in ``float32``).

    Raises:
        ValueError: the matrix is not square (e.g. the full OV circuit when
            ``d_in != d_out``); ``kind`` unknown, missing with a model, or given with a
            FactoredMatrix; ``"pos_qk"`` on a model without ``W_pos``.
        TypeError: ``circuit`` is neither a FactoredMatrix nor a model, or ``kind`` is not
            a str.

    Example:
        >>> import torch
        >>> from vecinterp import FactoredMatrix
        >>> from vecinterp.analysis.scores import eigenvalue_scores
        >>> eye = torch.eye(4)
        >>> heads = FactoredMatrix(torch.stack([eye, eye]), torch.stack([-eye, 2 * eye]))
        >>> eigenvalue_scores(heads).tolist()  # OV = -I, then 2I
        [-1.0, 1.0]
    """
    if isinstance(circuit, HookedVectorTransformer):
        if kind is None:
            raise ValueError(
                f"eigenvalue_scores(model, kind=...) needs kind, one of {tuple(_CIRCUITS)}"
            )
        make = _CIRCUITS[_check_kind(kind, tuple(_CIRCUITS), "eigenvalue_scores")]
        fm = make(_folded(circuit, fold_ln, "eigenvalue_scores"))
        label = f"kind={kind!r} gives shape {tuple(fm.shape)}"
        if kind == "full_ov":
            label = f"the full OV circuit is d_in × d_out, shape {tuple(fm.shape)}"
    elif isinstance(circuit, FactoredMatrix):
        if kind is not None:
            raise ValueError(
                "eigenvalue_scores: kind selects a circuit of a model; with a FactoredMatrix "
                f"leave it None (got kind={kind!r})"
            )
        if fold_ln is not False:
            raise ValueError(
                "eigenvalue_scores: fold_ln folds a model's normalization; a FactoredMatrix "
                "has none, so leave it False (build the matrix from vi.fold_layer_norm(model))"
            )
        fm = circuit
        label = f"got a FactoredMatrix of shape {tuple(fm.shape)}"
    else:
        raise TypeError(
            "eigenvalue_scores expects a FactoredMatrix or a HookedVectorTransformer, got "
            f"{type(circuit).__name__}; wrap a dense square matrix M as FactoredMatrix(M, I)"
        )
    if fm.ldim != fm.rdim:
        raise ValueError(
            f"eigenvalue_scores needs square matrices, but {label} "
            f"({fm.ldim} rows != {fm.rdim} columns)"
        )
    with torch.no_grad():
        eig = fm.eigenvalues
        return _safe_ratio(eig.real.sum(-1), eig.abs().sum(-1)).to(linalg_dtype(fm.dtype))


def _folded(model: HookedVectorTransformer, fold_ln: object, what: str) -> HookedVectorTransformer:
    """``fold_layer_norm(model)`` if ``fold_ln``, else ``model``."""
    if not isinstance(fold_ln, bool):
        raise TypeError(f"{what}: fold_ln must be a bool, got {type(fold_ln).__name__}")
    return fold_layer_norm(model) if fold_ln else model


def _upcast(fm: FactoredMatrix) -> FactoredMatrix:
    """``fm`` with its factors in the dtype decompositions run in (float32 for half)."""
    dtype = linalg_dtype(fm.dtype)
    return fm if dtype == fm.dtype else FactoredMatrix(fm.A.to(dtype), fm.B.to(dtype))


# ---------------------------------------------------------------------- composition scores


def _composition_factors(
    model: HookedVectorTransformer, kind: str
) -> tuple[FactoredMatrix, FactoredMatrix]:
    """``(L, R)``, both ``[n_layers, n_heads, d_model, d_model]``, such that the score of
    earlier head ``i`` into later head ``j`` is ``‖L_i R_j‖ / (‖L_i‖ ‖R_j‖)``."""
    ov = ov_circuit(model)
    if kind == "Q":
        return ov, qk_circuit(model)
    if kind == "K":
        return ov, qk_circuit(model).T
    return ov, ov


def composition_scores(
    model: HookedVectorTransformer,
    kind: str | None = None,
    baseline: bool = False,
    *,
    fold_ln: bool = False,
) -> Float[torch.Tensor, "n_layers n_heads n_layers n_heads"]:
    """Q-, K- or V-composition scores of every earlier head into every later head.

    Entry ``[l1, h1, l2, h2]`` (with ``l1 < l2``) measures how much of what head
    ``(l1, h1)`` writes into the residual stream is read by head ``(l2, h2)``:
    ``‖L R‖_F / (‖L‖_F ‖R‖_F)`` with ``L = OV_1 = W_V W_O`` of the earlier head and

    - ``kind="Q"``: ``R = QK_2 = W_Q W_K^T`` of the later head. With row vectors the
      score of query ``r_q`` on key ``r_k`` is ``r_q QK_2 r_k^T``; if the earlier head
      writes ``y OV_1`` into the query's residual, the score gains ``y (OV_1 QK_2) r_k^T``.
    - ``kind="K"``: ``R = QK_2^T``. The earlier head writes ``y OV_1`` into the key's
      residual: ``r_q QK_2 (y OV_1)^T = r_q (QK_2 OV_1^T) y^T``, and
      ``‖QK_2 OV_1^T‖_F = ‖OV_1 QK_2^T‖_F``. (Elhage et al.'s column-vector
      ``W_QK W_OV``, transposed.)
    - ``kind="V"``: ``R = OV_2``; the later head moves ``(y OV_1) OV_2``.

    The ratio lies in ``[0, 1]`` (``‖LR‖_F ≤ ‖L‖_F ‖R‖_F``): 0 when the earlier head writes
    only into a subspace the later head does not read, 1 only when both are rank 1 and
    aligned. Random matrices score about ``1/sqrt(d_model)``, not 0: compare with
    :func:`composition_baseline`, or pass ``baseline=True`` to subtract its mean.

    Entries with ``l1 >= l2`` (a head cannot compose with itself, a head of its own layer,
    or a later one) are NaN, so that they stand out and cannot pass for "no
    composition"; use ``torch.nan_to_num`` or ``torch.nanmean``-style reductions.
    (TransformerLens's ``all_composition_scores`` puts 0 there, which a mean over the grid
    counts as pairs that do not compose.) A pair in which either matrix is zero scores 0.

    Norms are computed from the factors, as :meth:`FactoredMatrix.norm` does: with reduced
    QRs ``W_left = Q_1 R_1`` (the left factor of ``L``) and ``W_right^T = Q_2 R_2`` (the
    right factor of ``R``), ``‖L R‖_F = ‖R_1 (B_L A_R) R_2^T‖_F``, a ``d_head × d_head``
    matrix per pair, batched over all pairs of each later layer. Biases and normalization
    are not included (see :mod:`vecinterp.analysis.circuits`): on a model whose
    normalization is not folded the scores differ from the folded model's (the numbers
    TransformerLens gives for a model loaded with ``fold_ln=True``), without a warning;
    pass ``fold_ln=True`` (or call it on :func:`~vecinterp.fold_layer_norm`'s result) to
    score the folded model, as :func:`eigenvalue_scores` explains.

    Args:
        model: the transformer.
        kind: ``"Q"``, ``"K"`` or ``"V"``; required. The library's rule: an argument that
            selects which quantity is computed has no default (:func:`eigenvalue_scores`
            and :func:`composition_baseline` too), so that a call never reports K
            composition to someone who meant Q. ``None`` (left out) raises a
            ``ValueError`` listing the kinds.
        baseline: subtract the mean score of random matrices of the same shapes
            (:func:`composition_baseline` with its defaults) from every defined entry.
        fold_ln: score ``vi.fold_layer_norm(model)`` (the model is not modified).

    Returns:
        ``[n_layers, n_heads, n_layers, n_heads]``, the model's dtype (``float32`` for a
        ``float16``/``bfloat16`` model, computed in ``float32``); NaN where ``l1 >= l2``.

    Raises:
        ValueError: ``kind`` left out or not one of ``"Q"``, ``"K"``, ``"V"``.
        TypeError: ``model`` is not a model, ``kind`` not a str, ``baseline`` or
            ``fold_ln`` not a bool.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.scores import composition_scores
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> scores = composition_scores(model, kind="K")
        >>> scores.shape
        torch.Size([2, 2, 2, 2])
        >>> bool(scores[0, :, 1, :].isfinite().all()), bool(scores[1, :, 0, :].isnan().all())
        (True, True)
    """
    check_model(model)
    kind = _check_kind(
        _required(kind, "composition_scores"), _COMPOSITION_KINDS, "composition_scores"
    )
    if not isinstance(baseline, bool):
        raise TypeError(f"baseline must be a bool, got {type(baseline).__name__}")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    model = _folded(model, fold_ln, "composition_scores")
    with torch.no_grad():
        left, right = (_upcast(fm) for fm in _composition_factors(model, kind))
        left_core = torch.linalg.qr(left.A).R  # [n_layers, n_heads, r, d_head]
        right_core = torch.linalg.qr(right.B.mT).R  # [n_layers, n_heads, r, d_head]
        left_norm, right_norm = left.norm(), right.norm()
        scores = torch.full(
            (n_layers, n_heads, n_layers, n_heads), torch.nan, dtype=left.dtype, device=left.device
        )
        for later in range(1, n_layers):
            # B_L A_R for every (earlier head, later head) pair: [later, n_heads, n_heads, k, k]
            middle = einsum(
                left.B[:later],
                right.A[later],
                "l1 h1 k1 d_model, h2 d_model k2 -> l1 h1 h2 k1 k2",
            )
            core = left_core[:later, :, None] @ middle @ right_core[later].mT
            ratio = _safe_ratio(
                torch.linalg.matrix_norm(core),
                left_norm[:later, :, None] * right_norm[later],
            )
            scores[:later, :, later, :] = ratio
        if baseline:
            scores = scores - composition_baseline(model, kind).mean
    return scores


class CompositionBaseline(NamedTuple):
    """Composition scores of random matrices: their ``mean``, ``std`` and the ``samples``.

    Returned by :func:`composition_baseline`; ``samples`` is ``[n_samples]``.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.analysis.scores import composition_baseline
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=16, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> mean, std, samples = composition_baseline(model, "V", n_samples=20)
        >>> samples.shape, 0 < mean < 1, std > 0
        (torch.Size([20]), True, True)
    """

    mean: float
    std: float
    samples: Float[torch.Tensor, " n_samples"]


def composition_baseline(
    model: HookedVectorTransformer,
    kind: str | None = None,
    n_samples: int = 200,
    seed: int = 0,
    progress: bool = False,
) -> CompositionBaseline:
    """What :func:`composition_scores` gives for unrelated heads: the score of random pairs.

    Each sample draws the four factors of ``L = A_1 B_1`` and ``R = A_2 B_2`` with the
    shapes the model's heads have (``[d_model, d_head]`` and ``[d_head, d_model]``, so the
    same ranks) and i.i.d. standard Gaussian entries, and scores
    ``‖L R‖_F / (‖L‖_F ‖R‖_F)``. The score does not depend on the scale of either matrix,
    so only the shapes matter. A pair of heads in the model scoring well above
    ``mean + a few std`` composes more than chance.

    Why it is not 0: for a rotation-invariant random ``R``, ``E[R R^T] = (‖R‖² / d) I``,
    so ``E‖L R‖² ≈ ‖L‖² ‖R‖² / d_model`` and the baseline is about ``1/sqrt(d_model)``
    whatever ``d_head`` is. With the shapes above, Q, K and V composition have the same
    baseline (the same draws for the same seed); ``kind`` is checked and kept for symmetry
    with :func:`composition_scores`.

    Args:
        model: the transformer (only its shapes are used).
        kind: ``"Q"``, ``"K"`` or ``"V"``; required, as in :func:`composition_scores`.
        n_samples: number of random pairs (≥ 2, for the std).
        seed: seed of a private ``torch.Generator`` (the global RNG is left alone).
        progress: show a progress bar over chunks of samples.

    Returns:
        ``CompositionBaseline(mean, std, samples)``: floats and the ``[n_samples]`` scores,
        computed in float64 on the CPU.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.analysis.scores import composition_baseline
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=64, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> base = composition_baseline(model, "K", n_samples=100)
        >>> 0.5 < base.mean * 64**0.5 < 2.0, base.samples.shape
        (True, torch.Size([100]))
    """
    check_model(model)
    _check_kind(_required(kind, "composition_baseline"), _COMPOSITION_KINDS, "composition_baseline")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise ValueError(f"n_samples must be an int >= 2, got {n_samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    size = d_model * d_head
    gen = torch.Generator().manual_seed(seed)
    # Memory stays bounded by drawing in chunks; each sample's four factors are one
    # contiguous row of the random stream, so the chunking never changes the samples.
    chunk = max(1, min(n_samples, _BASELINE_CHUNK_ENTRIES // (4 * size)))
    parts = []
    with torch.no_grad():
        for start in tqdm(
            range(0, n_samples, chunk), desc="composition baseline", disable=not progress
        ):
            n = min(chunk, n_samples - start)
            flat = torch.randn(n, 4 * size, generator=gen, dtype=torch.float64)
            A1, B1, A2, B2 = flat.split(size, dim=1)
            left = FactoredMatrix(A1.reshape(n, d_model, d_head), B1.reshape(n, d_head, d_model))
            right = FactoredMatrix(A2.reshape(n, d_model, d_head), B2.reshape(n, d_head, d_model))
            product = left @ right
            assert isinstance(product, FactoredMatrix)
            parts.append(_safe_ratio(product.norm(), left.norm() * right.norm()))
    samples = torch.cat(parts)
    return CompositionBaseline(samples.mean().item(), samples.std().item(), samples)
