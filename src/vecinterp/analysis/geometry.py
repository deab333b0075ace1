"""Residual-stream geometry (Bhargav & Gu 2024, §4.4 and §4.6): how linearly a layer's OV
circuits act on residual vectors, how much of a vector lies outside the embedding's row
space, and the residual stream after any layer read out through ``ln_final`` and ``W_U``
(the "logit lens" for vector outputs)."""

from dataclasses import dataclass
from typing import cast

import torch
from jaxtyping import Float
from torch import nn

from ..cache import ActivationCache
from ..model import HookedVectorTransformer
from ..model.components import Norm, TransformerBlock
from ..model.components.norm import statistics_dtype
from ..model.contract import contract
from ..model.validation import check_finite
from ._validate import check_layer, check_model

_UNEMBED = "batch pos d_model, d_model d_out -> batch pos d_out"


@dataclass(frozen=True)
class LinearFit:
    """Least-squares lines ``y ≈ slope · x + intercept``, one per leading index.

    Attributes:
        slope: ``[*fit]``.
        intercept: ``[*fit]``.
        r2: ``[*fit]`` coefficient of determination, the squared correlation of ``x`` and
            ``y`` (NaN where ``y`` is constant).
        n_points: points per fit.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.geometry import fit_line
        >>> fit = fit_line(torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]),
        ...                torch.tensor([[1.0, 3.0, 5.0], [0.0, -1.0, -2.0]]))
        >>> fit.slope, fit.intercept, fit.r2, fit.n_points
        (tensor([ 2., -1.]), tensor([1., 0.]), tensor([1., 1.]), 3)
    """

    slope: Float[torch.Tensor, "*fit"]
    intercept: Float[torch.Tensor, "*fit"]
    r2: Float[torch.Tensor, "*fit"]
    n_points: int


@dataclass(frozen=True)
class OVLinearity:
    """Result of :func:`ov_linearity`.

    Attributes:
        layer: the block.
        summed: the fit for the layer's summed OV circuit ``Σ_h W_V[h] W_O[h]``: scalars,
            or ``[*vec]`` (one per vector) with ``per_vector=True``.
        heads: the fit for each head's OV circuit: ``[n_heads]`` (``[*vec, n_heads]`` with
            ``per_vector=True``), or ``None`` with ``per_head=False``.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.analysis.geometry import ov_linearity
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> result = ov_linearity(model, 0, n_random=10, per_vector=True)
        >>> result.layer, result.summed.slope.shape, result.heads.slope.shape
        (0, torch.Size([10]), torch.Size([10, 2]))
    """

    layer: int
    summed: LinearFit
    heads: LinearFit | None


def fit_line(x: Float[torch.Tensor, "*#fit n"], y: Float[torch.Tensor, "*#fit n"]) -> LinearFit:
    """Ordinary least-squares line through the points ``(x_i, y_i)`` along the last axis.

    .. math::
        \\text{slope} = \\frac{S_{xy}}{S_{xx}}, \\quad
        \\text{intercept} = \\bar y - \\text{slope}\\,\\bar x, \\quad
        R^2 = \\frac{S_{xy}^2}{S_{xx} S_{yy}}

    with ``S_xy = Σ_i (x_i − x̄)(y_i − ȳ)``. Leading axes broadcast and give one fit each.

    Args:
        x: ``[*fit, n]`` abscissae (at least 2 distinct values per fit).
        y: ``[*fit, n]`` ordinates.

    Both must be finite floating-point tensors (``TypeError`` for a list or an integer
    tensor: convert with ``torch.as_tensor(x, dtype=torch.float64)``; ``ValueError``
    naming the first NaN/inf, which would make every number of its fit NaN).

    Example:
        >>> import torch
        >>> from vecinterp.analysis.geometry import fit_line
        >>> x = torch.tensor([0.0, 1.0, 2.0, 3.0])
        >>> fit = fit_line(x, 2 * x + 1)
        >>> fit.slope.item(), fit.intercept.item(), fit.r2.item()
        (2.0, 1.0, 1.0)
    """
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name} must be a floating-point tensor [*fit, n], got {type(t).__name__}; "
                f"use torch.as_tensor({name}, dtype=torch.float64)"
            )
        if not t.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor, got {t.dtype}; use {name}.double()"
            )
        check_finite(name, t)
    if x.shape[-1] != y.shape[-1] or x.shape[-1] < 2:
        raise ValueError(
            f"x and y need the same number (>= 2) of points on their last axis, "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    x, y = torch.broadcast_tensors(x, y)
    dx = x - x.mean(-1, keepdim=True)
    dy = y - y.mean(-1, keepdim=True)
    sxx, syy, sxy = (dx * dx).sum(-1), (dy * dy).sum(-1), (dx * dy).sum(-1)
    if bool((sxx == 0).any()):
        raise ValueError("x is constant in some fit: a line through it is undefined")
    slope = sxy / sxx
    intercept = y.mean(-1) - slope * x.mean(-1)
    r2 = sxy * sxy / (sxx * syy)
    return LinearFit(slope, intercept, r2, x.shape[-1])


def ov_linearity(
    model: HookedVectorTransformer,
    layer: int,
    vectors: Float[torch.Tensor, "*vec d_model"] | None = None,
    *,
    n_random: int = 100,
    seed: int = 0,
    per_head: bool = True,
    per_vector: bool = False,
    apply_ln: bool = False,
) -> OVLinearity:
    """How well a layer's OV circuits act as a per-dimension scaling ``x ↦ α x``.

    Paper §4.4: for residual vectors ``x`` read by block ``layer``'s attention, plot the
    pairs ``(x_d, (x OV)_d)`` for every dimension ``0 <= d < d_model`` and fit a line; a
    slope ``α`` with intercept ~0 and ``R²`` near 1 means ``OV`` copies (scaled by ``α``).
    Here the pairs of all vectors and dimensions are pooled into one fit (or, with
    ``per_vector``, fitted per vector over its ``d_model`` dimensions, as the paper reports
    per-vector slopes and an average ``R²``), for each head's ``OV_h = W_V[h] W_O[h]`` and
    for the layer's sum ``Σ_h OV_h`` (the paper's Figure 9).

    What is regressed: ``x`` is multiplied by ``OV`` exactly as given, as in the paper's
    ``(x_d, (OV x)_d)``, so pass what the heads read: the normalised input of the layer
    (``cache["normalized", layer, "ln1"]``, which is what ``W_V`` reads in a model whose
    norms were folded with :func:`~vecinterp.process_weights`, as the paper's was).
    ``OV`` excludes the value and output biases (constant writes, not part of the map;
    fold them first with :func:`~vecinterp.fold_value_biases` if they matter to you).
    With ``apply_ln=True`` the vectors are raw residual vectors (e.g. ``resid_pre``) and
    each is first normalised by the layer's ``ln1`` (computed on that vector; its bias
    ``b`` left out like the value bias): the pairs become ``(x_d, (ln1(x) OV)_d)``, the
    layer's write compared with the stream it is added to.

    Args:
        model: the model.
        layer: the block whose heads are fitted (negative counts from the end).
        vectors: ``[*vec, d_model]`` residual vectors (any leading axes), or ``None`` for
            ``n_random`` random vectors with i.i.d. standard normal entries ``N(0, 1)``,
            drawn in float64 from ``torch.Generator().manual_seed(seed)`` on the CPU and
            cast to the model's dtype and device (paper: "a random, non-residual stream
            vector", Figure 10).
        n_random: how many random vectors when ``vectors`` is ``None``.
        seed: their seed.
        per_head: also fit each head (else ``heads`` is ``None``).
        per_vector: one fit per vector instead of one pooled fit.
        apply_ln: normalise the vectors with ``ln1`` before the OV circuit (see above).

    Returns:
        An :class:`OVLinearity`.

    Example:
        >>> import torch
        >>> from vecinterp import HookedVectorTransformer, VectorTransformerConfig
        >>> from vecinterp.analysis.geometry import ov_linearity
        >>> cfg = VectorTransformerConfig(d_in=3, d_model=4, d_head=4, n_heads=2, n_layers=1,
        ...                               n_ctx=4, attn_only=True)
        >>> model = HookedVectorTransformer(cfg, dtype=torch.float64)
        >>> attn = model.blocks[0].attn
        >>> with torch.no_grad():  # head 0 copies with OV = 2 I, head 1 writes nothing
        ...     _ = attn.kv_parameters()[2].copy_(torch.eye(4).expand(2, 4, 4))  # W_V
        ...     _ = attn.W_O.copy_(torch.stack([2 * torch.eye(4), torch.zeros(4, 4)]))
        >>> fit = ov_linearity(model, 0)  # 100 random Gaussian vectors
        >>> round(fit.summed.slope.item(), 12), round(fit.summed.r2.item(), 12)
        (2.0, 1.0)
        >>> [round(s, 12) for s in fit.heads.slope.tolist()]
        [2.0, 0.0]
    """
    model = check_model(model)
    ell = check_layer(model, layer)
    block = cast(TransformerBlock, model.blocks[ell])
    W_V, W_O = block.attn.W_V.detach(), block.attn.W_O.detach()
    if vectors is None:
        if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 1:
            raise ValueError(f"n_random must be a positive int, got {n_random!r}")
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n_random, model.cfg.d_model, generator=gen, dtype=torch.float64)
        x = x.to(dtype=W_V.dtype, device=W_V.device)
    else:
        x = _check_vectors(vectors, model.cfg.d_model, W_V, "vectors")
    with torch.no_grad():
        read = _norm(block.ln1, x, with_bias=False) if apply_ln else x
        writes = contract(
            "vec n_heads d_head, n_heads d_head d_model -> vec n_heads d_model",
            contract(
                "vec d_model, n_heads d_model d_head -> vec n_heads d_head",
                read.reshape(-1, x.shape[-1]),
                W_V,
            ),
            W_O,
        )
        flat = x.reshape(-1, x.shape[-1])
        if per_vector:
            lead = x.shape[:-1]
            summed = _reshape(fit_line(flat, writes.sum(1)), lead)
            heads = (
                _reshape(fit_line(flat[:, None], writes), (*lead, W_V.shape[0]))
                if per_head
                else None
            )
        else:
            summed = fit_line(flat.reshape(-1), writes.sum(1).reshape(-1))
            heads = (
                fit_line(flat.reshape(1, -1), writes.movedim(1, 0).reshape(W_V.shape[0], -1))
                if per_head
                else None
            )
    return OVLinearity(ell, summed, heads)


def fraction_outside_embedding(
    vectors: Float[torch.Tensor, "*vec d_model"],
    model: HookedVectorTransformer,
    *,
    squared: bool = False,
    rtol: float | None = None,
) -> Float[torch.Tensor, "*vec"]:
    """The share of each vector's norm outside the row space of ``W_E``.

    Paper §4.4 (its 84.15% for ``OV x`` in layer 0): with ``W_E = U Σ V^T`` and ``V_r``
    the right singular vectors of the singular values above the rank tolerance (rows of
    ``V^T`` spanning the embedding space, a subspace of ``d_model``),

    .. math:: f(v) = \\frac{\\lVert v - v V_r V_r^T \\rVert}{\\lVert v \\rVert}

    — a ratio of norms, as in the paper; ``squared=True`` gives the ratio of squared
    norms (the share of ``‖v‖²``), which is additive: inside and outside shares sum to 1.
    A zero vector (e.g. the write of a head whose OV circuit is zero) lies in every
    subspace, so nothing of it is outside: its fraction is defined as 0 rather than the
    0/0 = NaN of the formula, which would turn any mean over the result into NaN (as
    ``torch.nn.functional.cosine_similarity`` gives 0 for a zero vector). Its inside and
    outside shares then sum to 0, not 1; to leave such vectors out of an average, drop
    them first (``vectors[vectors.norm(dim=-1) > 0]``). The ratio is scale-free and is
    computed on each vector divided by its largest entry, so a tiny or huge vector (whose
    norm would underflow to 0 or overflow to inf) gets its direction's fraction.

    Args:
        vectors: ``[*vec, d_model]`` vectors (any leading axes), e.g. ``x @ OV``.
        model: the model whose ``W_E [d_in, d_model]`` defines the embedding space.
        squared: return the squared ratio.
        rtol: singular values below ``rtol · σ_max`` count as zero; default
            ``max(d_in, d_model) · eps(dtype)`` (numpy's ``matrix_rank`` rule).

    Returns:
        ``[*vec]`` fractions in ``[0, 1]``.

    Example:
        >>> import torch
        >>> from vecinterp import HookedVectorTransformer, VectorTransformerConfig
        >>> from vecinterp.analysis.geometry import fraction_outside_embedding
        >>> model = HookedVectorTransformer(VectorTransformerConfig(
        ...     d_in=1, d_model=2, d_head=2, n_heads=1, n_layers=1, n_ctx=2))
        >>> with torch.no_grad():
        ...     _ = model.embed.W_E.copy_(torch.tensor([[3.0, 0.0]]))  # embedding space: e_0
        >>> fraction_outside_embedding(torch.tensor([[5.0, 0.0], [0.0, 1.0], [3.0, 4.0]]), model)
        tensor([0.0000, 1.0000, 0.8000])
    """
    model = check_model(model)
    W_E = model.W_E.detach()
    v = _check_vectors(vectors, model.cfg.d_model, W_E, "vectors")
    if rtol is None:
        rtol = max(W_E.shape) * torch.finfo(W_E.dtype).eps
    elif not isinstance(rtol, float | int) or isinstance(rtol, bool) or not 0 <= rtol < 1:
        raise ValueError(f"rtol must be a number in [0, 1), got {rtol!r}")
    with torch.no_grad():
        _, sing, Vh = torch.linalg.svd(W_E, full_matrices=False)
        basis = Vh[sing > rtol * sing.max()] if bool(sing.max() > 0) else Vh[:0]
        # the ratio does not depend on v's scale: divide by the largest entry first, so
        # that norms of very small or very large vectors neither underflow to 0 (0/0) nor
        # overflow to inf (inf/inf)
        peak = v.abs().amax(dim=-1, keepdim=True)
        nonzero = peak > 0
        u = v / torch.where(nonzero, peak, torch.ones_like(peak))
        outside = u - (u @ basis.T) @ basis
        # a zero vector: 0, not 0/0 (see above)
        ratio = torch.where(
            nonzero[..., 0], outside.norm(dim=-1) / u.norm(dim=-1), torch.zeros_like(peak[..., 0])
        )
    return ratio.square() if squared else ratio


def logit_lens(
    model: HookedVectorTransformer,
    cache: ActivationCache,
    layer: int | None = None,
    *,
    linearised: bool = False,
) -> Float[torch.Tensor, "batch pos d_out"] | Float[torch.Tensor, "component batch pos d_out"]:
    """The residual stream after a block, read out as if it were the final one.

    ``lens_l = LN_final(resid_post_l) W_U + b_U`` (paper §4.6, Figure 14: "project the
    residual stream vectors into the unembedding space directly after the zeroth layer").
    By default ``LN_final`` is recomputed on that residual — its own mean and scale, the
    model's ``w`` and ``b`` — so the result is what the model would output if the later
    blocks were removed, and after the last block it equals the model's output bit for
    bit (the model's own ``ln_final`` and ``unembed`` modules compute it, so hooks attached
    to them fire). With ``linearised=True`` the final norm uses the scale cached for the
    real final residual instead (:meth:`~vecinterp.ActivationCache.apply_ln_to_stack`,
    plus ``b``): a linear readout, the one
    :func:`~vecinterp.analysis.attribution.direct_attribution` uses, under which the lens
    of a sum of components is the sum of their lenses (up to the biases ``b`` and ``b_U``).

    Args:
        model: the model that produced ``cache``.
        cache: activations with ``hook_resid_post`` of the block (for ``layer=None``:
            ``hook_resid_pre`` of every block and the last ``hook_resid_post``), and with
            ``linearised``, ``ln_final.hook_scale``.
        layer: the block after which to read (negative counts from the end); ``None``
            reads every boundary: the embeddings (before block 0), then after each block.
        linearised: use the cached final-norm scale instead of recomputing it.

    Returns:
        ``[batch, pos, d_out]`` for one layer, or ``[n_layers + 1, batch, pos, d_out]``
        (entry ``0``: before block 0; entry ``l + 1``: after block ``l``).

    Example:
        >>> import torch
        >>> from vecinterp import HookedVectorTransformer, VectorTransformerConfig
        >>> from vecinterp.analysis.geometry import logit_lens
        >>> cfg = VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2,
        ...                               n_ctx=6)
        >>> model = HookedVectorTransformer(cfg, seed=0)
        >>> y, cache = model.run_with_cache(torch.randn(4, 6, 3))
        >>> lens = logit_lens(model, cache)
        >>> lens.shape, torch.equal(lens[-1], y), torch.equal(logit_lens(model, cache, 0), lens[1])
        (torch.Size([3, 4, 6, 3]), True, True)
    """
    model = check_model(model)
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    if cache.model is not model:
        raise ValueError("cache was not produced by this model (cache.model is not model)")
    with torch.no_grad():
        if layer is None:
            resids = list(cache.accumulated_resid(None))
        else:
            resids = [cache["resid_post", check_layer(model, layer)]]
        outs = [_readout(model, cache, r, linearised) for r in resids]
    return outs[0] if layer is not None else torch.stack(outs)


# -- internals ------------------------------------------------------------------------------
def _readout(
    model: HookedVectorTransformer, cache: ActivationCache, resid: torch.Tensor, linearised: bool
) -> torch.Tensor:
    if not linearised:
        # the model's own modules, so the last layer reproduces its output bit for bit
        return model.unembed(model.ln_final(resid))
    normed = cache.apply_ln_to_stack(resid, layer=None)
    b = getattr(model.ln_final, "b", None)
    if b is not None:
        normed = normed + b.detach()
    unembed = model.unembed
    return contract(_UNEMBED, normed, unembed.W_U.detach(), unembed.b_U.detach())


def _norm(ln: Norm | nn.Module, x: torch.Tensor, with_bias: bool) -> torch.Tensor:
    """``ln(x)`` by the formula of :class:`~vecinterp.model.components.Norm`, without
    firing its hooks; optionally without ``b``."""
    if not isinstance(ln, Norm):  # normalization=None: nn.Identity
        return x
    dtype = x.dtype
    x = x.to(statistics_dtype(dtype))  # Norm's precision: float32 for half-precision models
    if ln.centre:
        x = x - x.mean(-1, keepdim=True)
    x = (x / (x.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt()).to(dtype)
    w, b = ln.w, ln.b if with_bias else None
    if w is None:
        return x
    return x * w.detach() if b is None else torch.addcmul(b.detach(), x, w.detach())


def _check_vectors(v: object, d_model: int, ref: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a tensor [..., d_model], got {type(v).__name__}")
    if v.ndim < 1 or v.shape[-1] != d_model or v.numel() == 0:
        raise ValueError(
            f"{name} must be a non-empty tensor [..., d_model={d_model}], got {tuple(v.shape)}"
        )
    if v.dtype != ref.dtype:
        raise TypeError(
            f"{name} has dtype {v.dtype} but the model's weights are {ref.dtype}; "
            f"use {name}.to({ref.dtype})"
        )
    if v.device != ref.device:
        raise ValueError(f"{name} is on {v.device} but the model is on {ref.device}")
    if not bool(torch.isfinite(v).all()):
        raise ValueError(f"{name} contain NaN or inf")
    return v


def _reshape(fit: LinearFit, shape: tuple[int, ...]) -> LinearFit:
    return LinearFit(
        fit.slope.reshape(shape), fit.intercept.reshape(shape), fit.r2.reshape(shape), fit.n_points
    )
