"""The clean run's activations of activation and attribution patching: from a given
``clean_cache`` (checked to be made from ``clean_x``) or a run on ``clean_x``, and the
check that they are finite."""

from collections.abc import Mapping

import torch

from ..hooks.hook_point import idle
from ..model import HookedVectorTransformer


def clean_activations(
    model: HookedVectorTransformer,
    clean_x: torch.Tensor,
    names: list[str],
    clean_cache: Mapping[str, torch.Tensor] | None,
    finite: bool = False,
) -> dict[str, torch.Tensor]:
    """The clean activations at ``names``: from ``clean_cache`` (checked against
    ``clean_x``) or a run on ``clean_x``; with ``finite``, refused if one holds NaN/inf."""
    check = refuse_non_finite_acts if finite else lambda acts, source: acts
    if clean_cache is None:
        _, cache = model.run_with_cache(clean_x, names_filter=names)
        return check({name: cache[name] for name in names}, "the clean run on clean_x")
    if not isinstance(clean_cache, Mapping):
        raise TypeError(
            f"clean_cache must be an ActivationCache or a dict, got {type(clean_cache).__name__}"
        )
    acts = {}
    for name in names:
        if name not in clean_cache:
            raise ValueError(
                f"clean_cache has no activation for {name!r}; run "
                f"model.run_with_cache(clean_x) without a names_filter that excludes it"
            )
        acts[name] = clean_cache[name]
    check_cache_input(model, clean_x, clean_cache)
    return check(acts, "clean_cache")


def refuse_non_finite_acts(acts: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """``acts``, refused (``ValueError`` naming the hook point and ``source``) if one holds
    NaN or inf (but the -inf of masked keys in ``hook_attn_scores``): every cell patched
    from it would be NaN, not a measurement (as
    :func:`~vecinterp.attribution_patching` refuses the same activations)."""
    for name, act in acts.items():
        if not isinstance(act, torch.Tensor) or bool(act.isfinite().all()):
            continue
        wrong = act.isnan() | act.isposinf()
        if not name.endswith("hook_attn_scores"):  # there -inf marks a masked key
            wrong |= act.isneginf()
        if bool(wrong.any()):
            bad = int(wrong.sum())
            hint = (
                "pass the cache of model.run_with_cache(clean_x), or clean_cache=None"
                if source == "clean_cache"
                else "the inputs are finite, so the model overflows on them (check the scale "
                "of the inputs and of the weights)"
            )
            raise ValueError(
                f"{source} holds NaN or inf in {bad} entries of {name!r}: every cell patched "
                f"from it would be NaN; {hint}"
            )
    return acts


def check_cache_input(
    model: HookedVectorTransformer, clean_x: torch.Tensor, clean_cache: Mapping[str, torch.Tensor]
) -> None:
    """Refuse a ``clean_cache`` that was not made from ``clean_x``: its ``hook_embed`` (the
    input's record in a cache, ``x W_E + b_E``) must be this model's embedding of ``clean_x``.

    One small matmul, so every call can afford it. Not checked when the cache has no
    ``hook_embed`` (a ``names_filter`` left it out, or a dict built by hand, e.g. to try
    activations of one's own), when a hook edited it in that run (``edited_points``) or
    something watches it now (its hooks are part of the model here), or when its shape
    differs (the per-point shape check reports that). The tolerance, ``sqrt(eps)`` of the
    dtype times the largest entry, admits any kernel's rounding (the same computation
    gives the same bits on one device) and no other input: a batch that differs at one
    position differs there by the size of an embedding."""
    if "hook_embed" not in clean_cache:
        return
    edited: frozenset[str] = getattr(clean_cache, "edited_points", frozenset())
    if "hook_embed" in edited or not idle(model.hook_dict["hook_embed"]):
        return
    cached = clean_cache["hook_embed"]
    with torch.no_grad():
        fresh = model.embed(clean_x)
        if not isinstance(cached, torch.Tensor) or cached.shape != fresh.shape:
            return
        cached = cached.to(device=fresh.device, dtype=fresh.dtype)
        scale = float(fresh.abs().max())
        diff = float((cached - fresh).abs().max())
    if not diff <= torch.finfo(fresh.dtype).eps ** 0.5 * scale:
        raise ValueError(
            f"clean_cache was not made from clean_x: its hook_embed differs from this "
            f"model's embedding of clean_x by up to {diff:.3g} (the largest entry is "
            f"{scale:.3g}); pass the cache of model.run_with_cache(clean_x), not of "
            "corrupted_x or another batch, made with the model's current weights (or "
            "clean_cache=None to compute it)"
        )
