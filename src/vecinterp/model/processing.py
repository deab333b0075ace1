"""Weight processing: rewrite the weights, keep the outputs.

Every function here returns a new model and leaves its input untouched. Which
transformations are exact for vector (MSE) outputs:

* :func:`fold_layer_norm` — exact. LN's ``w`` and ``b`` move into every reader of the
  normalised stream (``W_Q``, ``W_K``, ``W_V``, ``W_in``, ``W_gate``, ``W_U`` and their
  biases; under grouped-query attention the stored ``_W_K``, ``_W_V``); the
  readers are then centred, since a LayerNorm output has zero mean. LN becomes LNPre.
  For RMS only ``w`` folds and nothing is centred; RMS becomes RMSPre.
* :func:`center_writing_weights` — exact only when every reader of the residual stream
  removes the mean (LN or LNPre). Refused otherwise.
* :func:`fold_value_biases` — exact because each row of an attention pattern sums to 1,
  so ``pattern (b_V) W_O = b_V W_O``.
* ``center_unembed`` is not offered: it is exact only up to a softmax's shift invariance,
  and regression outputs have no such invariance.
"""

from collections.abc import Iterable, Mapping
from typing import cast

import torch
from einops import einsum

from .components import GatedMLP, TransformerBlock
from .config import VectorTransformerConfig
from .io import refuse_non_finite
from .transformer import HookedVectorTransformer, uninitialised_weights
from .validation import check_bool


def _check(model: object) -> HookedVectorTransformer:
    """``model`` if it is a :class:`HookedVectorTransformer` with finite weights.

    Folding moves every weight into others (``w`` of a norm into ``W_Q``, ``W_K``, ...), so
    one NaN would spread into many tensors and the result would no longer say where it
    came from: the parameter is named here instead."""
    if not isinstance(model, HookedVectorTransformer):
        hint = (
            " (a state dict: load it into a model first, model.load_state_dict(state))"
            if isinstance(model, Mapping)
            else ""
        )
        raise TypeError(
            f"model must be a HookedVectorTransformer, got {type(model).__name__}{hint}"
        )
    refuse_non_finite(
        dict(model.named_parameters()), "weight processing refuses a model with non-finite weights"
    )
    return model


def _copy(model: HookedVectorTransformer, cfg: VectorTransformerConfig) -> HookedVectorTransformer:
    """A fresh model with ``cfg`` holding copies of ``model``'s compatible weights."""
    ref = model.embed.W_E
    with uninitialised_weights():
        new = HookedVectorTransformer(cfg, seed=0, dtype=ref.dtype, device=ref.device)
    new_sd = new.state_dict()
    old_sd = model.state_dict()
    if any(k not in old_sd or old_sd[k].shape != v.shape for k, v in new_sd.items()):
        # a tensor the old model cannot fill: those start as a seed-0 model's
        new = HookedVectorTransformer(cfg, seed=0, dtype=ref.dtype, device=ref.device)
    state = {k: v.detach().clone() for k, v in old_sd.items() if k in new_sd}
    new.load_state_dict(state, strict=False)
    new.train(model.training)
    return new


def fold_layer_norm(
    model: HookedVectorTransformer, center_weights: bool = True
) -> HookedVectorTransformer:
    """Fold the normalization weights into the layers that read from them.

    LN: ``ln(x) W + b_W = n(x) (diag(w) W) + (b W + b_W)`` with ``n`` the parameter-free
    LayerNorm; then, because ``n(x)`` has zero mean, each folded ``W`` is centred over
    its ``d_model`` axis (``center_weights``) without changing any output. LN → LNPre.
    RMS: only ``w`` folds, no centring (an RMS output has no zero mean). RMS → RMSPre.
    LNPre: readers are centred. RMSPre or no normalization: an unchanged copy.

    Args:
        model: the model (not modified).
        center_weights: centre the readers' weights (LN/LNPre only).

    Returns:
        A new model with the same outputs.

    Raises:
        TypeError: ``model`` is not a :class:`~vecinterp.HookedVectorTransformer`, or
            ``center_weights`` is not a bool.
        ValueError: a weight holds NaN or inf (named), as for every function here.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> folded = vi.fold_layer_norm(model)
        >>> folded.cfg.normalization
        'LNPre'
        >>> x = torch.randn(2, 5, 3)
        >>> bool(torch.allclose(model(x), folded(x), atol=1e-5))
        True
    """
    model = _check(model)
    check_bool("center_weights", center_weights)
    cfg = model.cfg
    kind = cfg.normalization
    if kind in ("RMSPre", None):
        return _copy(model, cfg)
    new_kind = {"LN": "LNPre", "LNPre": "LNPre", "RMS": "RMSPre"}[kind]
    new = _copy(model, cfg.replace(normalization=new_kind))
    centre = center_weights and kind in ("LN", "LNPre")

    def fold(ln: torch.nn.Module, readers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        # each W is [..., d_model, d_x] and its bias [..., d_x]
        for W, b in readers:
            if getattr(ln, "b", None) is not None:
                b += einsum(cast(torch.Tensor, ln.b), W, "d_model, ... d_model d_x -> ... d_x")
            if getattr(ln, "w", None) is not None:
                W *= cast(torch.Tensor, ln.w)[:, None]
            if centre:
                W -= W.mean(dim=-2, keepdim=True)

    with torch.no_grad():
        for i, block in enumerate(cast(Iterable[TransformerBlock], model.blocks)):
            nb = cast(TransformerBlock, new.blocks[i])
            a = nb.attn
            # the stored key/value parameters (grouped-query: _W_K, ..., one per kv head)
            W_K, b_K, W_V, b_V = a.kv_parameters()
            fold(block.ln1, [(a.W_Q, a.b_Q), (W_K, b_K), (W_V, b_V)])
            if not cfg.attn_only:
                mlp = nb.mlp
                gate = [(mlp.W_gate, mlp.b_gate)] if isinstance(mlp, GatedMLP) else []
                fold(block.ln2, [*gate, (mlp.W_in, mlp.b_in)])
        fold(model.ln_final, [(new.unembed.W_U, new.unembed.b_U)])
    return new


def center_writing_weights(model: HookedVectorTransformer) -> HookedVectorTransformer:
    """Remove the mean over ``d_model`` from everything that writes to the residual stream.

    ``W_E`` and ``b_E``, ``W_pos``, each ``W_O`` and ``b_O``, each ``W_out`` and ``b_out``
    are centred. The residual stream then has zero mean at every position, which changes
    nothing downstream *only* when every reader first removes the mean. With RMS or no
    normalization that is false, and this function raises ``ValueError``.

    Returns:
        A new model with the same outputs (residual-stream activations change by their
        mean over ``d_model``).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> centred = vi.center_writing_weights(model)
        >>> bool(centred.W_E.detach().mean(-1).abs().max() < 1e-6)  # W_E [d_in, d_model]
        True
        >>> x = torch.randn(2, 5, 3)
        >>> bool(torch.allclose(model(x), centred(x), atol=1e-5))
        True
    """
    model = _check(model)
    cfg = model.cfg
    if not cfg.is_mean_removing:
        raise ValueError(
            f"center_writing_weights is exact only when every reader of the residual stream is "
            f"a mean-removing LayerNorm ('LN' or 'LNPre'); this model has "
            f"normalization={cfg.normalization!r}, so centring would change its outputs"
        )
    new = _copy(model, cfg)

    def centre(t: torch.Tensor | None) -> None:
        if t is not None:
            t -= t.mean(dim=-1, keepdim=True)

    with torch.no_grad():
        centre(new.embed.W_E)
        centre(new.embed.b_E)
        if new.pos_embed is not None:
            centre(new.pos_embed.W_pos)
        for block in cast(Iterable[TransformerBlock], new.blocks):
            centre(block.attn.W_O)
            centre(block.attn.b_O)
            if not cfg.attn_only:
                centre(block.mlp.W_out)
                centre(block.mlp.b_out)
    return new


def fold_value_biases(model: HookedVectorTransformer) -> HookedVectorTransformer:
    """Move each layer's value bias into its output bias.

    Since every attention row sums to 1, head ``h`` adds ``b_V[h] W_O[h]`` at every
    position whatever it attends to; so ``b_O ← b_O + Σ_h b_V[h] W_O[h]`` and ``b_V ← 0``
    leaves the outputs unchanged and makes ``W_V W_O`` the whole OV circuit. Under
    grouped-query attention the sum runs over every query head, each with its group's
    value bias (``b_V`` expanded), and the stored ``_b_V`` is zeroed.

    Returns:
        A new model with the same outputs (``hook_v``/``hook_z``/``hook_result`` change).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> b_V = model.blocks[0].attn.kv_parameters()[3]  # the stored value bias
        >>> with torch.no_grad():  # (b_V [n_heads, d_head]; a grouped-query model's _b_V)
        ...     _ = b_V.normal_()
        >>> folded = vi.fold_value_biases(model)
        >>> bool(folded.blocks[0].attn.b_V.eq(0).all())
        True
        >>> x = torch.randn(2, 5, 3)
        >>> bool(torch.allclose(model(x), folded(x), atol=1e-5))
        True
    """
    new = _copy(_check(model), model.cfg)
    with torch.no_grad():
        for block in cast(Iterable[TransformerBlock], new.blocks):
            a = block.attn
            # in-place +=, which returns the Parameter itself (torch's stub says Tensor)
            a.b_O += einsum(a.b_V, a.W_O, "n_heads d_head, n_heads d_head d_model -> d_model")  # type: ignore[misc]
            a.kv_parameters()[3].zero_()  # b_V as stored (grouped-query: _b_V)
    return new


def process_weights(
    model: HookedVectorTransformer,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    fold_value_biases: bool = True,
) -> HookedVectorTransformer:
    """Apply the exact weight transformations in the standard order.

    ``fold_layer_norm`` → ``center_writing_weights`` → ``fold_value_biases``. Each step
    keeps the outputs. Centring the writing weights is exact only where every norm
    removes the mean (``normalization`` ``"LN"`` or ``"LNPre"``), so on any other model
    (``"RMS"``, ``"RMSPre"`` — every Llama, Mistral or Qwen2 import — or none) it is
    skipped, whatever ``center_writing_weights`` says, as TransformerLens's
    ``process_weights`` skips it; the other steps run. (Called alone,
    :func:`center_writing_weights` refuses such a model.) The three flags must
    be bools (a string such as ``"no"`` is refused, not read as true), and a model with
    a NaN or inf weight is refused with the parameter named.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> processed = vi.process_weights(model)
        >>> x = torch.randn(2, 5, 3)
        >>> bool(torch.allclose(model(x), processed(x), atol=1e-5))
        True
    """
    model = _check(model)
    for name, flag in (
        ("fold_ln", fold_ln),
        ("center_writing_weights", center_writing_weights),
        ("fold_value_biases", fold_value_biases),
    ):
        check_bool(name, flag)
    new = model
    if fold_ln:
        new = fold_layer_norm(new)
    if center_writing_weights and model.cfg.normalization in ("LN", "LNPre"):
        new = _center_writing_weights(new)  # exact only after a mean-removing norm
    if fold_value_biases:
        new = _fold_value_biases(new)
    return new if new is not model else _copy(model, model.cfg)


_center_writing_weights = center_writing_weights
_fold_value_biases = fold_value_biases
