"""Decompositions through spliced dictionaries, defined so that nothing is counted twice.

The rule:

- A dictionary on a **component's output** (an SAE at ``blocks.L.hook_attn_out`` or
  ``hook_mlp_out``, or a transcoder replacing block ``L``'s MLP) splits that component
  into its features, its bias (and a transcoder's skip term) and its error:
  ``component = sum_i acts_i W_dec[i] + b_dec (+ x W_skip) + error``. In the residual
  decomposition (:func:`decompose_resid_features`) these parts take the component's place,
  so the stack still sums to the stream.
- A dictionary on the **residual stream itself** (``hook_resid_pre``, ``hook_resid_mid``,
  ``hook_resid_post``) is another view of the whole stream, not a component beside the
  others: it has its own decomposition (:func:`dictionary_decomposition`: features + bias
  + error = the stream there) and adds nothing to the residual decomposition.

``error`` is there only for a dictionary spliced with the error term; without it the
point carries features + bias (+ skip) alone.
"""

from typing import Any

import torch

from ..cache import ActivationCache
from .splice import SplicedPoint

FEATURES = ("each", "sum")
"""How features enter a decomposition: one entry per feature, or their sum."""


def _spliced(cache: ActivationCache, name: str) -> SplicedPoint:
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    point = cache.model.hook_point(name)
    if not isinstance(point, SplicedPoint):
        raise ValueError(
            f"no dictionary is spliced at {name!r} in the model of this cache (splice one with "
            "vecinterp.dictionary.splice)"
        )
    return point


def _entry(cache: ActivationCache, name: str) -> torch.Tensor:
    if name not in cache:
        raise ValueError(
            f"the cache has no {name!r}: run run_with_cache with names_filter=None or a filter "
            "that keeps the dictionary's hook points"
        )
    return cache[name]


def dictionary_decomposition(
    cache: ActivationCache,
    hook_name: str,
    *,
    features: str = "each",
    return_labels: bool = False,
) -> Any:
    """What flowed at ``hook_name`` (a point a dictionary is spliced at), split into the
    dictionary's parts: ``[component, batch, pos, d_model]``, summing to ``cache[hook_name]``
    (to rounding).

    Parts (labels): ``feature_0`` ... ``feature_{d_sae-1}`` (``acts_i * W_dec[i]``, from the
    cached ``hook_sae_acts_post``; one ``features`` entry with ``features="sum"``), ``bias``
    (``b_dec``), ``skip`` (a transcoder's ``x W_skip``, ``x`` its cached
    ``hook_sae_input``), ``error`` (the cached ``hook_sae_error``, with the error term).
    Memory: ``features="each"`` holds ``d_sae`` copies of the stream.

    Refused (``ValueError``) where a hook of the run edited the point itself or its
    ``hook_sae_recons``, which would break the sum; edits of the features, the input or
    the error keep it (the cache holds what flowed).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder, splice,
        ...                                   dictionary_decomposition)
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0,
        ...     dtype=torch.float64)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=16, dtype="float64"))
        >>> spliced = splice(model, {"blocks.0.hook_resid_mid": sae})
        >>> _, cache = spliced.run_with_cache(torch.randn(2, 5, 3, dtype=torch.float64))
        >>> parts, labels = dictionary_decomposition(cache, "blocks.0.hook_resid_mid",
        ...                                          return_labels=True)
        >>> parts.shape, labels[-2:]
        (torch.Size([18, 2, 5, 8]), ['bias', 'error'])
        >>> bool((parts.sum(0) - cache["resid_mid", 0]).abs().max() < 1e-12)
        True
    """
    point = _spliced(cache, hook_name)
    if features not in FEATURES:
        raise ValueError(f"features must be one of {FEATURES}, got {features!r}")
    edited = sorted({hook_name, f"{hook_name}.hook_sae_recons"} & cache.edited_points)
    if edited:
        raise ValueError(
            f"a hook of this run edited {edited}: the point no longer carries features + bias "
            "+ error; decompose a run without that edit (edit hook_sae_acts_post or "
            "hook_sae_error instead)"
        )
    d = point.dictionary
    acts = _entry(cache, f"{hook_name}.hook_sae_acts_post")
    w_dec = d.W_dec.detach().to(acts.device)
    if features == "each":
        feats = torch.einsum("...s,sd->s...d", acts, w_dec)
        labels = [f"feature_{i}" for i in range(d.cfg.d_sae)]
    else:
        feats = (acts @ w_dec).unsqueeze(0)
        labels = ["features"]
    parts = [feats, d.b_dec.detach().to(acts.device).expand(1, *acts.shape[:-1], -1)]
    labels.append("bias")
    if d.W_skip is not None:
        sae_in = _entry(cache, f"{hook_name}.hook_sae_input")
        parts.append((sae_in @ d.W_skip.detach().to(acts.device)).unsqueeze(0))
        labels.append("skip")
    if point.error_term:
        parts.append(_entry(cache, f"{hook_name}.hook_sae_error").unsqueeze(0))
        labels.append("error")
    stack = torch.cat(parts)
    return (stack, labels) if return_labels else stack


def decompose_resid_features(
    cache: ActivationCache,
    layer: int | None = None,
    *,
    incl_embeds: bool = True,
    mlp_input: bool = False,
    features: str = "each",
    return_labels: bool = False,
) -> Any:
    """:meth:`~vecinterp.ActivationCache.decompose_resid` of a spliced model's run, with
    every component that has a dictionary on its output (an SAE at ``hook_attn_out`` or
    ``hook_mlp_out``, a transcoder replacing an MLP) split into that dictionary's parts
    (:func:`dictionary_decomposition`), labelled ``"{L}_mlp_out.feature_3"``,
    ``"{L}_mlp_out.bias"``, ``"{L}_mlp_out.error"``. Dictionaries on the residual stream add
    nothing here (their own decomposition is :func:`dictionary_decomposition`). The stack
    sums to the stream ``decompose_resid`` decomposes, to rounding.

    Refused (``ValueError``) when a dictionary on the residual stream without the error
    term lies before the decomposed stream: the stream after it is its reconstruction, not
    the sum of the components.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder, splice,
        ...                                   decompose_resid_features)
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0,
        ...     dtype=torch.float64)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=4, dtype="float64"))
        >>> spliced = splice(model, {"blocks.0.hook_attn_out": sae})
        >>> _, cache = spliced.run_with_cache(torch.randn(2, 5, 3, dtype=torch.float64))
        >>> parts, labels = decompose_resid_features(cache, return_labels=True)
        >>> labels[:3]
        ['embed', 'pos_embed', '0_attn_out.feature_0']
        >>> labels[-3:]
        ['0_attn_out.bias', '0_attn_out.error', '0_mlp_out']
        >>> bool((parts.sum(0) - cache["resid_post", 0]).abs().max() < 1e-12)
        True
    """
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    stack, labels = cache.decompose_resid(
        layer, incl_embeds, return_labels=True, mlp_input=mlp_input
    )
    spliced = {
        name: point
        for name, point in cache.model.hook_dict.items()
        if isinstance(point, SplicedPoint)
    }
    upstream = set(_upstream_resid(cache, layer, mlp_input))
    for name, point in spliced.items():
        if name in upstream and not point.error_term:
            raise ValueError(
                f"{name!r} runs a dictionary without the error term: the stream after it is "
                "the dictionary's reconstruction, not the sum of the components; splice with "
                "error_term=True, or decompose that point with dictionary_decomposition"
            )
    parts: list[torch.Tensor] = []
    out_labels: list[str] = []
    for part, label in zip(stack, labels, strict=True):
        layer_str, _, kind = label.partition("_")
        name = f"blocks.{layer_str}.hook_{kind}"
        if kind in ("attn_out", "mlp_out") and name in spliced:
            sub, sub_labels = dictionary_decomposition(
                cache, name, features=features, return_labels=True
            )
            parts.extend(sub)
            out_labels += [f"{label}.{s}" for s in sub_labels]
        else:
            parts.append(part)
            out_labels.append(label)
    result = torch.stack(parts) if parts else stack
    return (result, out_labels) if return_labels else result


def _upstream_resid(cache: ActivationCache, layer: int | None, mlp_input: bool) -> list[str]:
    """The residual points up to the stream ``decompose_resid(layer, mlp_input)`` splits."""
    n_layers = cache.model.cfg.n_layers
    n = n_layers if layer is None or layer == -1 else layer
    names = []
    for ell in range(min(n + 1, n_layers)):
        names.append(f"blocks.{ell}.hook_resid_pre")
        if ell < n or mlp_input:
            names.append(f"blocks.{ell}.hook_resid_mid")
        if ell < n:
            names.append(f"blocks.{ell}.hook_resid_post")
    return names
