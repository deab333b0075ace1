"""The OV and QK circuits of every attention head, as factored matrices.

Row vectors, right multiplication (``resid @ W``), as everywhere in vecinterp. For head
``h`` of layer ``l``:

==================  ==========================================  =========================
circuit             matrix                                      shape
==================  ==========================================  =========================
OV                  ``W_V W_O``                                 ``d_model × d_model``
QK                  ``W_Q W_K^T``                               ``d_model × d_model``
full OV             ``W_E W_V W_O W_U``                         ``d_in × d_out``
full QK             ``W_E W_Q W_K^T W_E^T``                     ``d_in × d_in``
positional QK       ``W_pos W_Q W_K^T W_pos^T``                 ``n_ctx × n_ctx``
==================  ==========================================  =========================

A residual vector ``r`` read by the head moves ``r OV`` into the residual stream (what
the head writes if it attends to ``r``); the attention score of query residual ``r_q``
on key residual ``r_k`` is ``r_q QK r_k^T / sqrt(d_head)``. The full circuits follow the
direct path from input vector to output vector (``x W_E`` in, ``W_U`` out), so for a
layer ``l > 0`` they ignore everything earlier layers add to the residual stream.

Every circuit is a :class:`~vecinterp.FactoredMatrix` of rank at most ``d_head`` (never
formed densely: ask for ``.AB`` if you need it), stacked over ``[n_layers, n_heads]``
(or ``[n_heads]`` for one ``layer``), built from detached weights: no gradient flows.

**What is left out.** The circuits are the linear parts of the head, and omit:

- the query/key/value biases ``b_Q``, ``b_K``, ``b_V`` and the output bias ``b_O``.
  ``b_V`` can be made exact: :func:`~vecinterp.fold_value_biases` (or
  :func:`~vecinterp.process_weights`) moves it into ``b_O`` (each attention row sums to
  1), after which ``W_V W_O`` is the head's entire contribution apart from that layer-wide
  constant. ``b_Q``/``b_K`` add terms linear in ``r_q`` or ``r_k`` (and a constant) to
  the scores, which no single bilinear matrix holds; they are simply not included.
- the normalization layers. With LayerNorm, fold their weights and biases into the
  readers first with :func:`~vecinterp.process_weights` (``fold_ln=True``); the remaining
  division by the input-dependent scale cannot be folded into any weight.
- the embedding bias ``b_E``. The full circuits offer ``include_embed_bias=True``, which
  appends ``b_E`` as an extra last row of ``W_E`` (as if each input vector carried an
  extra coordinate that is always 1), so the ``d_in + 1``-th row/column is the bias's
  contribution. The positional embedding is excluded from the full circuits; it has its
  own :func:`pos_qk_circuit`.
- the ``1/sqrt(d_head)`` score scale and, for ``positional="rotary"``, the rotation of
  queries and keys (the QK circuits are then those of position offset 0).

A weight that holds NaN or inf is refused with a ``ValueError`` naming it (e.g.
``blocks.1.attn.W_V``): the forward pass does not scan the weights, so this is where a
diverged model is caught.
"""

import torch

from ..factored_matrix import FactoredMatrix
from ..model import HookedVectorTransformer
from ._validate import check_layer, check_model

__all__ = [
    "full_ov_circuit",
    "full_qk_circuit",
    "ov_circuit",
    "pos_qk_circuit",
    "qk_circuit",
]


def _finite(name: str, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` detached, or a ``ValueError`` naming the parameter if it is not finite.

    ``name`` is the parameter's name in the model (``"blocks.0.attn.W_V"``); for a stack of
    every layer's weights (``"blocks.*.attn.W_V"``) the first bad layer is named."""
    weight = weight.detach()
    if bool(torch.isfinite(weight).all()):
        return weight
    if "*" in name:
        bad = (~torch.isfinite(weight)).flatten(1).any(1)
        name = name.replace("*", str(int(bad.nonzero()[0])))
    raise ValueError(
        f"the model's weight {name} contains NaN or inf, so no circuit of it means anything "
        "(a diverged training run, or an edit gone wrong?)"
    )


def _head_weights(model: HookedVectorTransformer, name: str, layer: int | None) -> torch.Tensor:
    """``W_{Q,K,V,O}`` detached, ``[n_layers, n_heads, ...]`` or one layer's ``[n_heads, ...]``;
    a non-finite weight is refused, naming it."""
    if layer is None:
        return _finite(f"blocks.*.attn.{name}", getattr(model, name))
    ell = check_layer(model, layer)
    return _finite(f"blocks.{ell}.attn.{name}", getattr(model.blocks[ell].attn, name))


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _embedding(model: HookedVectorTransformer, include_embed_bias: object) -> torch.Tensor:
    """``W_E [d_in, d_model]``, or ``[W_E; b_E]`` ``[d_in + 1, d_model]`` with the bias."""
    W_E = _finite("embed.W_E", model.W_E)
    if not _check_bool("include_embed_bias", include_embed_bias):
        return W_E
    b_E = model.embed.b_E
    if b_E is None:
        raise ValueError(
            "include_embed_bias=True but the model has no embedding bias "
            "(cfg.embed_bias=False); leave include_embed_bias=False"
        )
    return torch.cat([W_E, _finite("embed.b_E", b_E)[None, :]], dim=0)


def ov_circuit(model: HookedVectorTransformer, layer: int | None = None) -> FactoredMatrix:
    """Every head's OV circuit ``W_V W_O``.

    ``OV[l, h] = W_V[l, h] @ W_O[l, h]``: head ``h`` of layer ``l`` attending to residual
    vector ``r`` writes ``r OV[l, h]`` (up to biases and normalization; see the module
    docstring). The same matrix as ``model.OV``, with detached factors.

    Args:
        model: the transformer.
        layer: one layer (negative counts from the end), or ``None`` for all.

    Returns:
        FactoredMatrix ``[n_layers, n_heads, d_model, d_model]`` (``A = W_V``, ``B = W_O``),
        or ``[n_heads, d_model, d_model]`` for one layer.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.analysis.circuits import ov_circuit
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> tuple(ov_circuit(model).shape), tuple(ov_circuit(model, layer=-1).shape)
        ((2, 2, 8, 8), (2, 8, 8))
    """
    check_model(model)
    return FactoredMatrix(_head_weights(model, "W_V", layer), _head_weights(model, "W_O", layer))


def qk_circuit(model: HookedVectorTransformer, layer: int | None = None) -> FactoredMatrix:
    """Every head's QK circuit ``W_Q W_K^T``.

    ``QK[l, h] = W_Q[l, h] @ W_K[l, h]^T``: the attention score of a query residual
    ``r_q`` on a key residual ``r_k`` is ``r_q QK[l, h] r_k^T / sqrt(d_head)`` (up to biases,
    normalization and rotary rotation). The same matrix as ``model.QK``, detached.

    Args:
        model: the transformer.
        layer: one layer (negative counts from the end), or ``None`` for all.

    Returns:
        FactoredMatrix ``[n_layers, n_heads, d_model, d_model]`` (``A = W_Q``,
        ``B = W_K^T``), or ``[n_heads, d_model, d_model]`` for one layer.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.analysis.circuits import qk_circuit
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> qk = qk_circuit(model, layer=0)
        >>> tuple(qk.shape), qk.mdim
        ((2, 8, 8), 4)
    """
    check_model(model)
    W_K = _head_weights(model, "W_K", layer)
    return FactoredMatrix(_head_weights(model, "W_Q", layer), W_K.transpose(-1, -2))


def full_ov_circuit(
    model: HookedVectorTransformer,
    layer: int | None = None,
    *,
    include_embed_bias: bool = False,
) -> FactoredMatrix:
    """Every head's full OV circuit ``W_E W_V W_O W_U``, from input to output vectors.

    ``x FullOV[l, h]`` is what head ``h`` of layer ``l`` adds to the output when it
    attends to a position whose input vector is ``x``, along the direct path (embedding →
    head → unembedding; normalization, biases and other layers left out, see the module
    docstring). Kept factored as ``(W_E W_V) (W_O W_U)``, through ``d_head``.

    Args:
        model: the transformer.
        layer: one layer (negative counts from the end), or ``None`` for all.
        include_embed_bias: append ``b_E`` as an extra last row of ``W_E``, so that row
            ``d_in`` is what the embedding bias contributes. ``ValueError`` if the model
            has no ``b_E``.

    Returns:
        FactoredMatrix ``[n_layers, n_heads, d_in, d_out]`` (``[n_heads, d_in, d_out]`` for
        one layer; ``d_in + 1`` rows with the bias). Square only when ``d_in == d_out``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.circuits import full_ov_circuit
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_out=5, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> full = full_ov_circuit(model)
        >>> tuple(full.shape), full.mdim
        ((2, 2, 3, 5), 4)
        >>> dense = model.W_E @ model.W_V @ model.W_O @ model.W_U
        >>> bool(torch.allclose(full.AB, dense))
        True
    """
    check_model(model)
    W_E = _embedding(model, include_embed_bias)
    W_U = _finite("unembed.W_U", model.W_U)
    return FactoredMatrix(
        W_E @ _head_weights(model, "W_V", layer), _head_weights(model, "W_O", layer) @ W_U
    )


def full_qk_circuit(
    model: HookedVectorTransformer,
    layer: int | None = None,
    *,
    include_embed_bias: bool = False,
) -> FactoredMatrix:
    """Every head's full QK circuit ``W_E W_Q W_K^T W_E^T``, between input vectors.

    ``x_q FullQK[l, h] x_k^T / sqrt(d_head)`` is the attention score of a query position
    with input ``x_q`` on a key position with input ``x_k``, along the direct path
    (positional embedding, biases, normalization and earlier layers left out). Kept
    factored as ``(W_E W_Q) (W_E W_K)^T``, through ``d_head``.

    Args:
        model: the transformer.
        layer: one layer (negative counts from the end), or ``None`` for all.
        include_embed_bias: append ``b_E`` as an extra last row of ``W_E`` (on both the
            query and the key side). ``ValueError`` if the model has no ``b_E``.

    Returns:
        FactoredMatrix ``[n_layers, n_heads, d_in, d_in]`` (``[n_heads, d_in, d_in]`` for
        one layer; ``d_in + 1`` with the bias).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.circuits import full_qk_circuit
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> full = full_qk_circuit(model, layer=1)
        >>> W_E, attn = model.W_E, model.blocks[1].attn
        >>> dense = W_E @ attn.W_Q @ attn.W_K.transpose(-1, -2) @ W_E.T
        >>> tuple(full.shape), bool(torch.allclose(full.AB, dense))
        ((2, 3, 3), True)
    """
    check_model(model)
    W_E = _embedding(model, include_embed_bias)
    W_K = _head_weights(model, "W_K", layer)
    return FactoredMatrix(W_E @ _head_weights(model, "W_Q", layer), (W_E @ W_K).transpose(-1, -2))


def pos_qk_circuit(model: HookedVectorTransformer, layer: int | None = None) -> FactoredMatrix:
    """Every head's positional QK circuit ``W_pos W_Q W_K^T W_pos^T``.

    Entry ``[..., i, j]`` is the part of the attention score of query position ``i`` on key
    position ``j`` (times ``sqrt(d_head)``) that comes from the positional embeddings
    alone, along the direct path. (The causal mask, when on, hides ``j > i``; this matrix
    does not apply it.)

    Args:
        model: a transformer with an additive positional embedding ``W_pos``
            (``positional="learned"`` or ``"sinusoidal"``).
        layer: one layer (negative counts from the end), or ``None`` for all.

    Returns:
        FactoredMatrix ``[n_layers, n_heads, n_ctx, n_ctx]`` (``[n_heads, n_ctx, n_ctx]``
        for one layer), factored as ``(W_pos W_Q) (W_pos W_K)^T``.

    Raises:
        ValueError: the model has no ``W_pos`` (``positional="rotary"`` or ``"none"``).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.analysis.circuits import pos_qk_circuit
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> tuple(pos_qk_circuit(model).shape)
        (2, 2, 5, 5)
    """
    check_model(model)
    if model.pos_embed is None:
        raise ValueError(
            "pos_qk_circuit needs an additive positional embedding W_pos "
            "(positional='learned' or 'sinusoidal'), but this model has "
            f"positional={model.cfg.positional!r}"
        )
    W_pos = _finite("pos_embed.W_pos", model.pos_embed.W_pos)
    W_K = _head_weights(model, "W_K", layer)
    return FactoredMatrix(
        W_pos @ _head_weights(model, "W_Q", layer), (W_pos @ W_K).transpose(-1, -2)
    )
