"""Running a TransformerLens 3 ``HookedTransformer`` on vector inputs instead of tokens.

TransformerLens (TL) is an optional extra: ``pip install "vecinterp[transformer-lens]"``.
It is imported inside the functions, never when :mod:`vecinterp` is imported. Models are
converted by :mod:`vecinterp.interop.transformer_lens`, which re-exports these functions.

``HookedTransformer`` embeds token indices (``W_E[tokens]``). For a vector input
``x [batch, pos, d_vocab]`` the embedding is ``x @ W_E``, which equals ``W_E[tokens]``
when ``x`` is one-hot, and the model is run from the residual stream:
``resid = x @ W_E + W_pos[:pos]`` (no ``W_pos`` term with rotary positions, which TL
applies inside attention, from the positions of the residual stream it is given), then
``tl_model(resid, start_at_layer=0)``. TL's ``start_at_layer=0`` skips exactly the token
embedding and the positional embedding, so ``hook_embed`` and ``hook_pos_embed`` never
fire that way; :func:`tl_forward_vectors` and :func:`tl_run_with_cache_vectors` run them
on ``x @ W_E`` and ``W_pos`` so that they do.
"""

from typing import Any

import torch
from jaxtyping import Float
from torch import nn

from ._tl import _check_tl_model, _transformer_lens

__all__ = ["tl_forward_vectors", "tl_run_with_cache_vectors"]


def _vector_residual(tl_model: Any, x: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(resid, shortformer_pos_embed)`` for vector inputs, computed as TL's own
    ``input_to_embed`` would for one-hot tokens, with ``hook_embed`` and
    ``hook_pos_embed`` firing."""
    c = tl_model.cfg
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected x as a torch.Tensor [batch, pos, d_vocab], got {type(x)}")
    W_E = tl_model.embed.W_E
    if x.ndim != 3 or x.shape[-1] != c.d_vocab:
        raise ValueError(
            f"expected x of shape [batch, pos, d_vocab={c.d_vocab}], got {tuple(x.shape)}"
        )
    if not 0 < x.shape[1] <= c.n_ctx or x.shape[0] == 0:
        raise ValueError(
            f"x must have at least one batch item and 1..n_ctx={c.n_ctx} positions, "
            f"got shape {tuple(x.shape)}"
        )
    if x.dtype != W_E.dtype:
        raise TypeError(f"x has dtype {x.dtype} but the TransformerLens model is {W_E.dtype}")
    if x.device != W_E.device:
        raise ValueError(f"x is on {x.device} but the TransformerLens model is on {W_E.device}")
    embed = x @ W_E
    if c.post_embedding_ln:
        embed = tl_model.embed.ln(embed)
    embed = tl_model.hook_embed(embed)
    # TL's positional embeddings read only the shape of the tokens
    tokens = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
    return tl_model.get_residual(embed, 0, tokens=tokens, return_shortformer_pos_embed=True)


def tl_forward_vectors(
    tl_model: nn.Module, x: Float[torch.Tensor, "batch pos d_in"], **forward_kwargs: Any
) -> Any:
    """Run a TransformerLens ``HookedTransformer`` on vectors instead of token indices.

    ``embed = x @ W_E`` (``hook_embed``), ``resid = embed + W_pos[:pos]``
    (``hook_pos_embed``; no positional term for rotary models, which rotate queries and
    keys inside attention), then ``tl_model(resid, start_at_layer=0, **forward_kwargs)``.
    For one-hot ``x`` this is exactly ``tl_model(tokens)``. The embedding and positional
    terms go through TL's own ``hook_embed`` and ``get_residual``, so hooks added with
    ``tl_model.hooks(...)`` on ``hook_embed`` and ``hook_pos_embed`` fire, as they do for
    tokens. Gradients flow (use it in a training step).

    Args:
        tl_model: a ``transformer_lens.HookedTransformer``.
        x: input vectors ``[batch, pos, d_vocab]`` (``d_in`` of the vecinterp model) in the
            TL model's dtype, on its device, with at most ``n_ctx`` positions.
        **forward_kwargs: passed to ``HookedTransformer.forward`` (e.g. ``stop_at_layer``);
            ``return_type="loss"`` needs tokens and does not apply to vectors.

    Returns:
        What ``HookedTransformer.forward`` returns: by default the outputs
        ``[batch, pos, d_vocab_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.interop.transformer_lens import (
        ...     tl_forward_vectors, to_transformer_lens)
        >>> tl_model = to_transformer_lens(vi.HookedVectorTransformer(
        ...     vi.VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2,
        ...                                n_layers=1, n_ctx=6), seed=0))
        >>> tokens = torch.tensor([[0, 2, 1]])
        >>> x = torch.nn.functional.one_hot(tokens, 3).float()
        >>> torch.allclose(tl_forward_vectors(tl_model, x), tl_model(tokens))
        True
    """
    tl = _transformer_lens()
    hooked: Any = _check_tl_model(tl, tl_model)
    if "start_at_layer" in forward_kwargs or "shortformer_pos_embed" in forward_kwargs:
        raise ValueError(
            "tl_forward_vectors sets start_at_layer=0 and shortformer_pos_embed itself; "
            "call tl_model(resid, start_at_layer=...) directly to start later"
        )
    resid, shortformer_pos_embed = _vector_residual(hooked, x)
    return hooked(
        resid, start_at_layer=0, shortformer_pos_embed=shortformer_pos_embed, **forward_kwargs
    )


def tl_run_with_cache_vectors(
    tl_model: nn.Module,
    x: Float[torch.Tensor, "batch pos d_in"],
    names_filter: Any = None,
    **forward_kwargs: Any,
) -> tuple[Any, Any]:
    """``run_with_cache`` of a TransformerLens ``HookedTransformer`` on vectors.

    The same as ``tl_model.run_with_cache(tokens)`` with :func:`tl_forward_vectors` as the
    forward pass, so ``hook_embed`` and ``hook_pos_embed`` are cached too (TL's own
    ``run_with_cache(resid, start_at_layer=0)`` would skip them).

    Args:
        tl_model: a ``transformer_lens.HookedTransformer``.
        x: input vectors ``[batch, pos, d_vocab]``.
        names_filter: TL's names filter (``None``: every hook point, a name, a list of
            names or a predicate).
        **forward_kwargs: passed to :func:`tl_forward_vectors`.

    Returns:
        ``(output, cache)`` with ``cache`` a ``transformer_lens.ActivationCache``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.interop.transformer_lens import (
        ...     tl_run_with_cache_vectors, to_transformer_lens)
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=6), seed=0)
        >>> x = torch.randn(2, 4, 3)
        >>> out, cache = tl_run_with_cache_vectors(to_transformer_lens(model), x)
        >>> torch.allclose(cache["hook_embed"], x @ model.W_E)
        True
    """
    tl = _transformer_lens()
    hooked: Any = _check_tl_model(tl, tl_model)
    cache, fwd_hooks, _ = hooked.get_caching_hooks(names_filter)
    with hooked.hooks(fwd_hooks=fwd_hooks):
        out = tl_forward_vectors(hooked, x, **forward_kwargs)
    return out, tl.ActivationCache(cache, hooked, has_batch_dim=True)
