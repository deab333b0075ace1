"""ActivationCache: the activations of one run, and decompositions of the residual stream."""

import difflib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from einops import einsum
from jaxtyping import Float

if TYPE_CHECKING:
    from .model import HookedVectorTransformer
    from .model.components import Norm, TransformerBlock

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
_MLP = {"pre": "hook_pre", "post": "hook_post"}
_TOP = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "out": "unembed.hook_out",
    "scale": "ln_final.hook_scale",
    "normalized": "ln_final.hook_normalized",
}


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
    if "." in name or name.startswith("hook_"):
        return name
    if layer is None:
        if name in _TOP:
            return _TOP[name]
        raise KeyError(f"short name {name!r} needs a layer, e.g. ({name!r}, 0)")
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


def _head_results(model: "HookedVectorTransformer", layer: int, z: torch.Tensor) -> torch.Tensor:
    w_o = cast("TransformerBlock", model.blocks[layer]).attn.W_O.detach().to(z.device)
    return einsum(
        z, w_o, "batch pos n_heads d_head, n_heads d_head d_model -> batch pos n_heads d_model"
    )


def _mlp_post(model: "HookedVectorTransformer", layer: int, pre: torch.Tensor) -> torch.Tensor:
    return cast("TransformerBlock", model.blocks[layer]).mlp.act_fn(pre)


DERIVABLE = {
    ".attn.hook_result": (".attn.hook_z", _head_results),
    ".mlp.hook_post": (".mlp.hook_pre", _mlp_post),
}
"""Activations that ``run_with_cache(names_filter=None)`` leaves out because the cache
recomputes them on first access from another cached one: per-head results
``z_h W_O[h]`` from ``hook_z`` (``n_heads`` times the size of ``attn_out``) and the MLP's
``act_fn(hook_pre)`` (the largest activation of a block). Not storing them saves the
memory traffic that dominates caching on CPU."""


class ActivationCache(Mapping[str, torch.Tensor]):
    """The activations of one forward pass, keyed by hook name.

    Index with a full name (``cache["blocks.0.attn.hook_pattern"]``) or a short one
    (``cache["pattern", 0]``, ``cache["resid_post", -1]``, ``cache["scale", 1, "ln2"]``,
    ``cache["embed"]``). Gradients cached with ``incl_bwd`` sit under ``name + "_grad"``.
    Activations in :data:`DERIVABLE` (per-head results, the MLP's post-activation) are
    recomputed on first access when they were not cached.

    Args:
        cache_dict: hook name to tensor.
        model: the model that produced them (its weights are read by the
            decompositions).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> y, cache = model.run_with_cache(torch.randn(4, 5, 3))
        >>> cache["pattern", 0].shape  # [batch, n_heads, dest_pos, src_pos]
        torch.Size([4, 2, 5, 5])
        >>> cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
        True
        >>> cache["result", 1].shape  # recomputed from hook_z: [batch, pos, n_heads, d_model]
        torch.Size([4, 5, 2, 8])
        >>> parts, labels = cache.decompose_resid(return_labels=True)
        >>> parts.shape, labels[:3]  # [component, batch, pos, d_model]
        (torch.Size([6, 4, 5, 8]), ['embed', 'pos_embed', '0_attn_out'])
        >>> bool(torch.allclose(parts.sum(0), cache["resid_post", -1], atol=1e-5))
        True
    """

    def __init__(self, cache_dict: dict[str, torch.Tensor], model: "HookedVectorTransformer"):
        self.cache_dict = dict(cache_dict)
        self.model = model
        self.cfg = model.cfg

    # -- Mapping ----------------------------------------------------------------------
    def _key(self, key: Any) -> str:
        if isinstance(key, str):
            return act_name(key) if key in _TOP else key
        if isinstance(key, tuple) and key and isinstance(key[0], str):
            name, layer, sub = (list(key) + [None, None])[:3]
            if layer is not None:
                layer = self.model.layer_index(layer)
            return act_name(name, layer, sub)
        raise KeyError(f"cache keys are a hook name or (name, layer[, sub]), got {key!r}")

    def __getitem__(self, key: Any) -> torch.Tensor:
        full = self._key(key)
        try:
            return self.cache_dict[full]
        except KeyError:
            derived = self._derive(full)
            if derived is not None:
                return derived
            close = difflib.get_close_matches(full, list(self.cache_dict), n=5, cutoff=0.5)
            hint = f"; close matches: {close}" if close else ""
            raise KeyError(
                f"{full!r} is not in this cache ({len(self.cache_dict)} entries){hint}. "
                "Was it excluded by names_filter?"
            ) from None

    def _derive(self, full: str) -> torch.Tensor | None:
        """An activation that was not cached but follows exactly from one that was
        (see :data:`DERIVABLE`); stored once computed."""
        for suffix, (source_suffix, _) in DERIVABLE.items():
            if full.endswith(suffix):
                source = full[: -len(suffix)] + source_suffix
                if source not in self.cache_dict:
                    return None
                layer = int(full.split(".")[1])
                derive = DERIVABLE[suffix][1]
                value = derive(self.model, layer, self.cache_dict[source])
                self.cache_dict[full] = value
                return value
        return None

    def __contains__(self, key: object) -> bool:
        try:
            full = self._key(key)
        except (KeyError, ValueError):
            return False
        if full in self.cache_dict:
            return True
        return any(
            full.endswith(suffix) and full[: -len(suffix)] + source in self.cache_dict
            for suffix, (source, _) in DERIVABLE.items()
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations: {list(self.cache_dict)[:4]}...)"

    def to(self, device: str | torch.device) -> "ActivationCache":
        """A copy with every tensor moved to ``device``."""
        return ActivationCache({k: v.to(device) for k, v in self.cache_dict.items()}, self.model)

    # -- residual stream ------------------------------------------------------------
    def _n(self, layer: int | None) -> int:
        n = self.cfg.n_layers
        if layer is None:
            return n
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer <= n:
            raise ValueError(f"layer must be an int in [{-n}, {n}] or None, got {layer!r}")
        return layer % (n + 1) if layer < 0 else layer

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Any:
        """The residual stream at each layer boundary up to ``layer``.

        Returns ``[component, batch, pos, d_model]``: ``resid_pre`` of blocks
        ``0..layer-1`` (with ``resid_mid`` too if ``incl_mid``), then the stream entering
        ``layer`` — ``resid_pre`` of that block, or the final ``resid_post`` when ``layer``
        is ``None``/``n_layers``. Labels: ``"0_pre"``, ``"0_mid"``, ..., ``"final_post"``.

        Args:
            layer: the block whose input is the last entry (``None``: the final stream).
            incl_mid: include each block's ``resid_mid``.
            apply_ln: pass each entry through the linearised final norm
                (:meth:`apply_ln_to_stack`), ready to read out with ``W_U``.
            return_labels: also return the labels.
        """
        n = self._n(layer)
        parts, labels = [], []
        for ell in range(n + 1):
            if ell == self.cfg.n_layers:
                parts.append(self["resid_post", ell - 1])
                labels.append("final_post")
                break
            parts.append(self["resid_pre", ell])
            labels.append(f"{ell}_pre")
            if incl_mid and ell < n and not self.cfg.attn_only:
                parts.append(self["resid_mid", ell])
                labels.append(f"{ell}_mid")
        stack = torch.stack(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer=None)
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        incl_embeds: bool = True,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Any:
        """Split the stream entering ``layer`` into what each component wrote.

        Components: ``embed`` (``x W_E + b_E``), ``pos_embed``, then ``{l}_attn_out`` and
        ``{l}_mlp_out`` of each earlier block. They sum exactly to ``resid_pre`` of
        ``layer`` (to the final ``resid_post`` when ``layer`` is ``None``).

        Returns ``[component, batch, pos, d_model]`` (and the labels if asked).
        """
        n = self._n(layer)
        parts, labels = [], []
        if incl_embeds:
            parts.append(self["hook_embed"])
            labels.append("embed")
            if self.model.pos_embed is not None:
                parts.append(self["hook_pos_embed"])
                labels.append("pos_embed")
        for ell in range(n):
            parts.append(self["attn_out", ell])
            labels.append(f"{ell}_attn_out")
            if not self.cfg.attn_only:
                parts.append(self["mlp_out", ell])
                labels.append(f"{ell}_mlp_out")
        if not parts:
            raise ValueError("nothing to decompose: layer=0 and incl_embeds=False")
        stack = torch.stack(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer=None)
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int | None = None,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Any:
        """Each head's output ``z_h W_O[h]`` for every block before ``layer``.

        Uses ``hook_result`` if cached, else derives it from ``hook_z``. Returns
        ``[component, batch, pos, d_model]`` with labels ``"L0H0"``, ``"L0H1"``, ...; per
        layer, the heads plus ``b_O`` sum to ``attn_out``.
        """
        n = self._n(layer)
        parts, labels = [], []
        for ell in range(n):
            parts.append(self["result", ell].movedim(-2, 0))
            labels += [f"L{ell}H{h}" for h in range(self.cfg.n_heads)]
        if not parts:
            raise ValueError("layer=0: there are no heads before the first block")
        stack = torch.cat(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer=None)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        residual_stack: Float[torch.Tensor, "... batch pos d_model"],
        layer: int | None = None,
        mlp_input: bool = False,
    ) -> Float[torch.Tensor, "... batch pos d_model"]:
        """Apply a normalization layer linearised at this run's scale.

        Each component ``c`` becomes ``centre(c) / scale * w`` — ``centre`` removes the
        mean for LN/LNPre, ``w`` is applied for LN/RMS — with ``scale`` the cached
        ``hook_scale`` of the norm. Because the norm is linear once its scale is fixed,
        ``apply_ln_to_stack(decompose_resid()).sum(0) + ln.b`` equals the norm's output.

        Args:
            residual_stack: ``[..., batch, pos, d_model]`` components.
            layer: ``None`` or ``n_layers`` for ``ln_final``; else block ``layer``'s
                ``ln1`` (or ``ln2`` with ``mlp_input``).
            mlp_input: use ``ln2`` of block ``layer``.
        """
        if self.cfg.normalization is None:
            return residual_stack
        n = self._n(layer)
        if n == self.cfg.n_layers:
            # normalization is not None, so every norm is a Norm
            ln, key = cast("Norm", self.model.ln_final), "ln_final.hook_scale"
        else:
            if mlp_input and self.cfg.attn_only:
                raise ValueError("mlp_input=True but the model is attn_only: it has no ln2")
            sub = "ln2" if mlp_input else "ln1"
            ln, key = getattr(self.model.blocks[n], sub), f"blocks.{n}.{sub}.hook_scale"
        if key not in self.cache_dict:
            raise KeyError(f"apply_ln_to_stack needs {key!r} in the cache (check names_filter)")
        scale = self.cache_dict[key]
        if residual_stack.shape[-3:-1] != scale.shape[-3:-1]:
            raise ValueError(
                f"residual_stack [..., batch, pos, d_model] {tuple(residual_stack.shape)} does not "
                f"match the cached scale's batch and pos {tuple(scale.shape[:2])}"
            )
        x = residual_stack
        if ln.centre:
            x = x - x.mean(-1, keepdim=True)
        x = x / scale
        if ln.w is not None:
            x = x * ln.w.detach().to(x.device)
        return x
