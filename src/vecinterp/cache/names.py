"""Short activation names: ``("pattern", 0)`` for ``"blocks.0.attn.hook_pattern"``.

The tables TransformerLens users know, and :func:`act_name`, which expands a short name
(with a layer and, for a block's norm, ``"ln1"``/``"ln2"``) into a full hook name. The
cache's indexing (``cache["pattern", 0]``) and the analyses that take activation names go
through it. :func:`_resid_points` and :func:`_norm_point` name the points a decomposition of
the residual stream assumes unedited.
"""

from typing import Any

_BLOCK = {
    "resid_pre": "hook_resid_pre",
    "attn_out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp_out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
_ATTN = {
    "q": "hook_q",
    "k": "hook_k",
    "v": "hook_v",
    "rot_q": "hook_rot_q",
    "rot_k": "hook_rot_k",
    "z": "hook_z",
    "attn_scores": "hook_attn_scores",
    "scores": "hook_attn_scores",
    "pattern": "hook_pattern",
    "attn": "hook_pattern",
    "result": "hook_result",
}
_MLP = {"pre": "hook_pre", "pre_linear": "hook_pre_linear", "post": "hook_post"}
_TOP = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "out": "unembed.hook_out",
    "scale": "ln_final.hook_scale",
    "normalized": "ln_final.hook_normalized",
}
_PER_BLOCK = {*_BLOCK, *_ATTN, *_MLP} - set(_TOP)


def act_name(name: str, layer: int | None = None, sub: str | None = None) -> str:
    """Expand a short activation name into a full hook name.

    ``act_name("pattern", 0)`` is ``"blocks.0.attn.hook_pattern"``;
    ``act_name("scale", 1, "ln2")`` is ``"blocks.1.ln2.hook_scale"``;
    ``act_name("embed")`` is ``"hook_embed"``; ``act_name("scale")`` is the final norm's.
    Full names pass through unchanged. Negative layers are resolved by the cache.

    Raises ``KeyError`` for an unknown short name, or a per-block name without a layer.

    Example:
        >>> from vecinterp.cache import act_name
        >>> act_name("pattern", 0), act_name("resid_post", 2), act_name("pre", 1)
        ('blocks.0.attn.hook_pattern', 'blocks.2.hook_resid_post', 'blocks.1.mlp.hook_pre')
        >>> act_name("scale", 1, "ln2"), act_name("embed"), act_name("scale")
        ('blocks.1.ln2.hook_scale', 'hook_embed', 'ln_final.hook_scale')
    """
    if not isinstance(name, str):
        raise TypeError(f"act_name: name must be a str, got {type(name).__name__} {name!r}")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
        raise TypeError(f"act_name: layer must be an int, got {type(layer).__name__} {layer!r}")
    if sub is not None and sub not in ("ln1", "ln2"):
        raise ValueError(f"act_name: sub must be 'ln1' or 'ln2' (the norm of a block), got {sub!r}")
    if "." in name or name.startswith("hook_"):
        return name
    if layer is None:
        if name in _TOP:
            return _TOP[name]
        if name in _PER_BLOCK or name in ("scale", "normalized"):
            raise KeyError(f"short name {name!r} needs a layer, e.g. ({name!r}, 0)")
        known = sorted({*_TOP, *_PER_BLOCK})
        raise KeyError(f"unknown short activation name {name!r}; known: {known}")
    if name in _BLOCK:
        return f"blocks.{layer}.{_BLOCK[name]}"
    if name in _ATTN:
        return f"blocks.{layer}.attn.{_ATTN[name]}"
    if name in _MLP:
        return f"blocks.{layer}.mlp.{_MLP[name]}"
    if name in ("scale", "normalized"):
        return f"blocks.{layer}.{sub or 'ln1'}.hook_{name}"
    known = sorted({*_BLOCK, *_ATTN, *_MLP, "scale", "normalized"})
    raise KeyError(f"unknown short activation name {name!r}; known: {known}")


def _resid_points(cfg: Any, ell: int, mlp_input: bool) -> list[str]:
    """The residual-stream hook points up to the stream entering boundary ``ell`` (block
    ``ell``'s ``resid_pre``, its ``resid_mid`` with ``mlp_input``, the final
    ``resid_post`` when ``ell == n_layers``): each is the sum of the one before and a
    component, unless a hook edited it."""
    names = []
    for block in range(min(ell + 1, cfg.n_layers)):
        names.append(f"blocks.{block}.hook_resid_pre")
        if block == ell and not mlp_input:
            break
        if not cfg.attn_only:
            names.append(f"blocks.{block}.hook_resid_mid")
        if block == ell:
            break
        names.append(f"blocks.{block}.hook_resid_post")
    return names


def _norm_point(cfg: Any, ell: int, mlp_input: bool) -> str:
    """The ``hook_normalized`` of the norm that reads the stream at boundary ``ell``."""
    if ell == cfg.n_layers:
        return "ln_final.hook_normalized"
    return f"blocks.{ell}.{'ln2' if mlp_input else 'ln1'}.hook_normalized"
