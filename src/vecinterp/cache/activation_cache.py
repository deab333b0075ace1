"""ActivationCache: the activations of one run, and decompositions of the residual stream.

One file because it is one class: the mapping (short and full keys, entries recomputed
on first read) and the decompositions (accumulated, per component, per head, read through
a norm) share the key resolution and the checks of what the run assumed (weights unchanged,
points unedited), and the API page documents the methods of one class.
"""

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from jaxtyping import Float

from ..model.components.norm import statistics_dtype
from .names import _PER_BLOCK, _TOP, _norm_point, _resid_points, act_name
from .weights_record import (
    _changed_values,
    _changed_weights,
    _read_values,
    _record_weights,
    _Weights,
)

if TYPE_CHECKING:
    from ..model import HookedVectorTransformer
    from ..model.components import Norm

# TransformerLens's ActivationCache methods that users type, and what to use here
_TL_HABITS = {
    "logit_attrs": "use vi.direct_attribution(model, cache, targets), each component's "
    "read-out along target vectors [batch, pos, d_out] (vi.next_vector_targets builds "
    "them for next-vector prediction), or cache.apply_ln_to_stack(stack) @ model.W_U",
    "get_full_resid_decomposition": "use cache.decompose_resid() (embeddings, attention "
    "and MLP outputs) or cache.stack_head_results() (each head), or "
    'vi.direct_attribution(model, cache, targets, components="all")',
    "compute_head_results": "nothing to compute: each head's output is hook_result, which "
    'run_with_cache stores by default: cache["result", layer] [batch, pos, n_heads, d_model]',
}


class ActivationCache(Mapping[str, torch.Tensor]):
    """The activations of one forward pass, keyed by hook name.

    Index with a full name (``cache["blocks.0.attn.hook_pattern"]``) or a short one
    (``cache["pattern", 0]``, ``cache["resid_post", -1]``, ``cache["scale", 1, "ln2"]``,
    ``cache["embed"]``). Gradients cached with ``incl_bwd`` sit under ``name + "_grad"``.

    What indexing returns is what flowed through that hook point in that run, hook edits
    included. ``run_with_cache`` may leave out one activation that follows bit for bit
    from another: a ``relu`` MLP's ``hook_post`` (``relu(hook_pre)``, exact on any device),
    when no hook was attached there. It is computed on first access and then stored;
    ``keys()``, ``len()``, ``in`` and iteration list it all the same.

    Analyses that read the model's weights to interpret the activations
    (:meth:`apply_ln_to_stack`, and so the decompositions with ``apply_ln=True``, and
    :func:`~vecinterp.direct_attribution`) refuse with a ``ValueError`` naming the weight
    when a parameter or buffer of the model changed after the run (written in place, by
    ``load_state_dict`` or an optimizer step, or replaced, or moved by ``.to()``): the
    activations belong to the weights they ran with. The check reads each tensor's
    version counter (microseconds), and compares bit for bit a copy, taken when the run
    began, of the few small tensors these analyses read (every norm's ``w`` and ``b``,
    each ``attn.b_O``, ``unembed.W_U`` and ``b_U``), so that a write the version counter
    does not see (through ``p.data``) is refused too where it would change a number. A
    ``p.data`` write into another weight (``W_Q``, ``W_in``, ...) is not seen, and changes
    no number of these analyses: they read the cached activations of the run, not those
    weights. Indexing never refuses: entries are what flowed, whatever the weights are
    now.

    Decompositions that claim a sum refuse when a hook of the run edited a point that the
    sum assumes unedited (:meth:`decompose_resid`: a ``hook_resid_pre/mid/post`` up to the
    decomposed stream, and with ``apply_ln`` the reading norm's ``hook_normalized``); edits
    of the components themselves (``hook_embed``, ``hook_attn_out``, ``hook_result``,
    ``hook_mlp_out``, anything inside attention or the MLP) and of a norm's
    ``hook_scale`` (the cached scale is the one that divided) keep them exact.

    Args:
        cache_dict: hook name to tensor.
        model: the model that produced them (its weights are read by the
            decompositions; they are recorded now unless ``run_with_cache`` recorded
            them when the run began).
        derived: activations not in ``cache_dict`` but recomputed on first access:
            ``name -> (source name, function)``, ``function(cache_dict[source])`` being
            exactly what flowed through ``name`` on any device (``run_with_cache`` fills
            this in; see above).
        hooked_points: hook points where the run had a forward hook that its thread
            called (besides ``run_with_cache``'s own).
        edited_points: the hook points among them where a hook replaced the activation
            or wrote into it (returning ``None`` after only reading is not an edit).
            A cache built by hand has neither, so nothing is refused for hooks.

    Attributes:
        hooked_points: ``frozenset`` of names, as above.
        edited_points: ``frozenset`` of names, as above.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> y, cache = model.run_with_cache(torch.randn(4, 5, 3))
        >>> cache["pattern", 0].shape  # [batch, n_heads, dest_pos, src_pos]
        torch.Size([4, 2, 5, 5])
        >>> cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
        True
        >>> cache["result", 1].shape  # each head's z_h W_O[h]: [batch, pos, n_heads, d_model]
        torch.Size([4, 5, 2, 8])
        >>> "blocks.0.mlp.hook_post" in cache, len(cache) == len(list(cache.keys()))
        (True, True)
        >>> parts, labels = cache.decompose_resid(return_labels=True)
        >>> parts.shape, labels[:3]  # [component, batch, pos, d_model]
        (torch.Size([6, 4, 5, 8]), ['embed', 'pos_embed', '0_attn_out'])
        >>> bool(torch.allclose(parts.sum(0), cache["resid_post", -1], atol=1e-5))
        True
        >>> with torch.no_grad():
        ...     _ = model.blocks[1].ln1.w.mul_(2.0)  # the weights change after the run
        >>> cache.decompose_resid(layer=1, apply_ln=True)
        Traceback (most recent call last):
        ...
        ValueError: decompose_resid(apply_ln=True) reads the model's weights, but blocks.1.ln1.w
        changed after this cache was made (in place or replaced); re-run run_with_cache ...
    """

    def __init__(
        self,
        cache_dict: dict[str, torch.Tensor],
        model: "HookedVectorTransformer",
        *,
        derived: Mapping[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] | None = None,
        hooked_points: Iterable[str] = (),
        edited_points: Iterable[str] = (),
        _weights: _Weights | None = None,
        _values: list[torch.Tensor] | None = None,
    ):
        self.cache_dict = dict(cache_dict)
        self.model = model
        self.cfg = model.cfg
        if _weights is None:
            _weights = _record_weights(model)
            _values = _read_values(_weights)
        self._weights = _weights
        self._values = _values  # the weights the analyses read, as the run began
        self._stale: list[str] = []  # weights found changed when this cache was copied
        for arg, points in (("hooked_points", hooked_points), ("edited_points", edited_points)):
            if isinstance(points, str):
                raise TypeError(f"{arg} must be an iterable of hook names, got a str {points!r}")
            unknown = [p for p in points if p not in model.hook_dict]
            if unknown:
                raise ValueError(f"{arg}: {unknown[:3]} are not hook points of this model")
        self.hooked_points = frozenset(hooked_points)
        self.edited_points = frozenset(edited_points)
        self._pending: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {}
        for name, (source, fn) in (derived or {}).items():
            if name in self.cache_dict:
                raise ValueError(f"derived: {name!r} is also in cache_dict")
            if source not in self.cache_dict:
                raise ValueError(
                    f"derived: {name!r} is computed from {source!r}, which is not in cache_dict"
                )
            if not callable(fn):
                raise TypeError(f"derived: the function for {name!r} must be callable")
            self._pending[name] = (source, fn)

    def __getattr__(self, name: str) -> Any:
        # only reached for a name that is not an attribute: say what TransformerLens's
        # ActivationCache methods are here
        if name in _TL_HABITS:
            raise AttributeError(
                f"ActivationCache has no attribute {name!r} (TransformerLens's "
                f"ActivationCache.{name}): {_TL_HABITS[name]}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- Mapping ----------------------------------------------------------------------
    def _layer(self, layer: object) -> int:
        n = self.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(
                f"layer must be an int (0..{n - 1} or -{n}..-1), got {type(layer).__name__} "
                f"{layer!r}"
            )
        if not -n <= layer < n:
            raise ValueError(
                f"layer {layer} out of range for a {n}-layer model; use 0..{n - 1} or -{n}..-1"
            )
        return layer % n

    def _key(self, key: Any) -> str:
        if isinstance(key, str):
            if key in _TOP:
                return act_name(key)
            if key in _PER_BLOCK:
                raise KeyError(
                    f"cache[{key!r}] needs a layer index: use cache[{key!r}, 0] (layers "
                    f"0..{self.cfg.n_layers - 1}, or -1 for the last)"
                )
            return key
        if isinstance(key, tuple) and key and isinstance(key[0], str):
            if len(key) > 3:
                raise KeyError(f"cache keys are a hook name or (name, layer[, sub]), got {key!r}")
            name, layer, sub = (list(key) + [None, None])[:3]
            if sub is not None and name not in ("scale", "normalized"):
                raise KeyError(
                    f"cache[{key!r}]: the third element (sub) selects a norm, 'ln1' or 'ln2', "
                    f"and only goes with 'scale' or 'normalized', not {name!r}"
                )
            try:
                if layer is not None:
                    layer = self._layer(layer)
                return act_name(name, layer, sub)
            except (ValueError, TypeError) as err:
                raise type(err)(f"cache[{key!r}]: the layer index: {err}") from None
            except KeyError as err:
                raise KeyError(f"cache[{key!r}]: the name: {err.args[0]}") from None
        raise KeyError(f"cache keys are a hook name or (name, layer[, sub]), got {key!r}")

    def __getitem__(self, key: Any) -> torch.Tensor:
        full = self._key(key)
        if full in self.cache_dict:
            return self.cache_dict[full]
        if full in self._pending:
            return self._materialise(full)
        close = difflib.get_close_matches(full, list(self), n=5, cutoff=0.5)
        hint = f"; close matches: {close}" if close else ""
        point = full.removesuffix("_grad")
        if point not in self.model.hook_dict:
            raise KeyError(f"{full!r}: this model has no such hook point{hint}")
        why = (
            "gradients are cached by run_with_cache(..., incl_bwd=True)"
            if full.endswith("_grad")
            else "was it excluded by run_with_cache's names_filter?"
        )
        raise KeyError(f"{full!r} is not in this cache ({len(self)} entries): {why}{hint}")

    def _materialise(self, full: str) -> torch.Tensor:
        """Compute a derived activation and store it right after its source (hook order)."""
        source, fn = self._pending[full]
        with torch.no_grad():
            value = fn(self.cache_dict[source])
        names = list(self.cache_dict)
        later = names[names.index(source) + 1 :]
        moved = [(name, self.cache_dict.pop(name)) for name in later]
        self.cache_dict[full] = value
        self.cache_dict.update(moved)
        del self._pending[full]
        return value

    def __contains__(self, key: object) -> bool:
        try:
            full = self._key(key)
        except (KeyError, ValueError):
            return False
        return full in self.cache_dict or full in self._pending

    def __iter__(self) -> Iterator[str]:
        after: dict[str, list[str]] = {}
        for name, (source, _) in self._pending.items():
            after.setdefault(source, []).append(name)
        for name in list(self.cache_dict):
            yield name
            yield from after.get(name, ())

    def __len__(self) -> int:
        return len(self.cache_dict) + len(self._pending)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations: {list(self)[:4]}...)"

    def to(self, device: str | torch.device) -> "ActivationCache":
        """A copy with every tensor moved to ``device``."""
        moved = ActivationCache(
            {k: v.to(device) for k, v in self.cache_dict.items()},
            self.model,
            derived=self._pending,
            hooked_points=self.hooked_points,
            edited_points=self.edited_points,
            _weights=self._weights,
            _values=self._values,
        )
        moved._stale = list(self._stale)
        return moved

    # -- what the run assumed ----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickling) keeps what the weights check found at the
        time of copying (the copy's model holds new tensors: it is recorded afresh)."""
        state = self.__dict__.copy()
        state["_weights"] = self._changed()
        state.pop("_values")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        stale = state.pop("_weights")
        self.__dict__.update(state)
        self._stale = stale
        self._weights = _record_weights(self.model)
        self._values = _read_values(self._weights)

    def _changed(self) -> list[str]:
        """The weights that changed since the run (see the class docstring)."""
        changed = self._stale + _changed_weights(self._weights)
        if not changed and self._values is not None:
            changed = _changed_values(self._weights, self._values)
        return changed

    def _check_weights(self, what: str) -> None:
        """Refuse (``ValueError``) if the model's weights changed since the run."""
        changed = self._changed()
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise ValueError(
                f"{what} reads the model's weights, but {changed[0]}{more} changed after this "
                "cache was made (in place or replaced); re-run run_with_cache to analyse the "
                "model as it is now"
            )

    def _check_unedited(self, points: Iterable[str], what: str, hint: str) -> None:
        """Refuse (``ValueError``) if a hook of the run edited one of ``points``."""
        for point in points:
            if point in self.edited_points:
                raise ValueError(
                    f"{what} assumes {point!r} is what the model computed there, but a hook "
                    "edited it in this run (replaced the activation or wrote into it), so "
                    f"the components would not add up to what flowed; {hint}"
                )

    # -- residual stream ------------------------------------------------------------
    def _n(self, layer: int | None, mlp_input: bool = False) -> int:
        """``layer`` of the decompositions as an index in ``[0, n_layers]`` (``None`` and
        ``-1``: ``n_layers``, the final stream); with ``mlp_input``, a block index."""
        n = self.cfg.n_layers
        if layer is None:
            ell = n
        elif isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer <= n:
            raise ValueError(
                f"layer must be an int in [{-n}, {n}] or None, got {layer!r}: 0..{n - 1} is "
                f"the stream entering that block, {n} (or -1, or None) the final stream"
            )
        else:
            ell = layer % (n + 1) if layer < 0 else layer
        if mlp_input:
            if self.cfg.attn_only:
                raise ValueError("mlp_input=True but the model is attn_only: it has no MLP")
            if ell == n:
                raise ValueError(
                    f"mlp_input=True reads the input of block layer's MLP, so layer must be a "
                    f"block 0..{n - 1}, got {layer!r}"
                )
        return ell

    def _empty_stack(self) -> torch.Tensor:
        """``[0, batch, pos, d_model]``: no component (e.g. no heads before block 0)."""
        for name in ("hook_embed", "blocks.0.hook_resid_pre"):
            if name in self.cache_dict:
                return self.cache_dict[name].new_zeros((0, *self.cache_dict[name].shape))
        raise KeyError(
            "an empty stack takes its [batch, pos, d_model] shape from 'hook_embed' or "
            "'blocks.0.hook_resid_pre'; neither is in this cache (check names_filter)"
        )

    def _read(
        self, stack: torch.Tensor, apply_ln: bool, layer: int, mlp_input: bool, what: str
    ) -> Any:
        if not apply_ln:
            return stack
        return self._apply_ln(stack, layer, mlp_input, f"{what}(apply_ln=True)")

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        return_labels: bool = False,
        *,
        mlp_input: bool = False,
    ) -> Any:
        """The residual stream at each layer boundary up to ``layer``.

        Returns ``[component, batch, pos, d_model]``: ``resid_pre`` of blocks
        ``0..layer-1`` (with ``resid_mid`` too if ``incl_mid``), then the stream entering
        ``layer`` — ``resid_pre`` of that block (and its ``resid_mid`` with ``mlp_input``),
        or the final ``resid_post`` when ``layer`` is ``None``/``-1``/``n_layers``. Labels:
        ``"0_pre"``, ``"0_mid"``, ..., ``"final_post"``.

        Args:
            layer: the block whose input is the last entry (``None``: the final stream).
            incl_mid: include the ``resid_mid`` of each block before ``layer``.
            apply_ln: read every entry through the norm that reads ``layer``'s input.
                For the final stream (``layer`` ``None``/``-1``/``n_layers``) this is a
                logit lens: each entry goes through ``ln_final`` recomputed on that entry,
                its own mean and scale, ``w`` and ``b`` included (TransformerLens's
                ``recompute_ln``), so ``entry @ W_U + b_U`` is what the model would output
                if the later blocks were removed, and the last entry is exactly what the
                unembedding read. For a block's input (``layer`` ``0..n_layers-1``) the
                entries are read through block ``layer``'s ``ln1`` (``ln2`` with
                ``mlp_input``) linearised at this run's scale, as the decompositions are
                (:meth:`apply_ln_to_stack`: the cached scale of the real input, ``w``
                but not ``b``; TransformerLens's convention).
            return_labels: also return the labels.
            mlp_input: end with block ``layer``'s ``resid_mid`` (the MLP's input).

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
            >>> _, cache = model.run_with_cache(torch.randn(4, 5, 3))
            >>> cache.accumulated_resid(incl_mid=True, return_labels=True)[1]
            ['0_pre', '0_mid', '1_pre', '1_mid', 'final_post']
            >>> read = cache.accumulated_resid(layer=1, apply_ln=True)  # as block 1's ln1 reads it
            >>> ln1 = model.blocks[1].ln1
            >>> bool(torch.allclose(read[-1] + ln1.b, ln1(cache["resid_pre", 1]), atol=1e-6))
            True
            >>> lens = cache.accumulated_resid(apply_ln=True)  # each entry through ln_final
            >>> ln_final = model.ln_final
            >>> bool(torch.allclose(lens[0], ln_final(cache["resid_pre", 0]), atol=1e-6))
            True
        """
        n = self._n(layer, mlp_input)
        parts, labels = [], []
        for ell in range(n + 1):
            if ell == self.cfg.n_layers:
                parts.append(self["resid_post", ell - 1])
                labels.append("final_post")
                break
            parts.append(self["resid_pre", ell])
            labels.append(f"{ell}_pre")
            if (incl_mid and ell < n and not self.cfg.attn_only) or (mlp_input and ell == n):
                parts.append(self["resid_mid", ell])
                labels.append(f"{ell}_mid")
        stack = torch.stack(parts)
        if apply_ln and n == self.cfg.n_layers:
            stack = self._recompute_ln_final(stack, "accumulated_resid(apply_ln=True)")
        else:
            stack = self._read(stack, apply_ln, n, mlp_input, "accumulated_resid")
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        incl_embeds: bool = True,
        apply_ln: bool = False,
        return_labels: bool = False,
        *,
        mlp_input: bool = False,
    ) -> Any:
        """Split the stream entering ``layer`` into what each component wrote.

        Components: ``embed`` (``x W_E + b_E``), ``pos_embed``, then ``{l}_attn_out`` and
        ``{l}_mlp_out`` of each earlier block (TransformerLens's labels). They sum exactly
        to ``resid_pre`` of ``layer`` (to the final ``resid_post`` when ``layer`` is
        ``None``/``-1``/``n_layers``; to ``resid_mid`` of ``layer`` with ``mlp_input``,
        which adds ``{layer}_attn_out``). With ``layer=0`` and ``incl_embeds=False`` there
        is no component: the stack is empty, ``[0, batch, pos, d_model]``.

        Args:
            layer: the block whose input is decomposed (``None``: the final stream).
            incl_embeds: include ``embed`` and ``pos_embed``.
            apply_ln: read every component as ``layer`` reads it: through block
                ``layer``'s ``ln1`` (``ln2`` with ``mlp_input``), or ``ln_final`` for the
                final stream, linearised at this run's scale (:meth:`apply_ln_to_stack`),
                the final stream included: the components then sum to the norm's output
                minus its bias ``b``. (Unlike :meth:`accumulated_resid`'s logit lens, which
                recomputes ``ln_final`` on each entry, since its entries are whole streams,
                not parts of one.)
            return_labels: also return the labels.
            mlp_input: decompose block ``layer``'s ``resid_mid`` (the MLP's input).

        Returns ``[component, batch, pos, d_model]`` (and the labels if asked).

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
            >>> _, cache = model.run_with_cache(torch.randn(4, 5, 3))
            >>> parts, labels = cache.decompose_resid(layer=1, mlp_input=True, return_labels=True)
            >>> labels
            ['embed', 'pos_embed', '0_attn_out', '0_mlp_out', '1_attn_out']
            >>> bool(torch.allclose(parts.sum(0), cache["resid_mid", 1], atol=1e-6))
            True
        """
        n = self._n(layer, mlp_input)
        what = f"decompose_resid(layer={layer!r})"
        self._check_unedited(
            _resid_points(self.cfg, n, mlp_input),
            what,
            "decompose a run without that edit, or edit a component (hook_attn_out, "
            "hook_mlp_out, hook_result, ...) instead",
        )
        if apply_ln:
            self._check_unedited(
                [_norm_point(self.cfg, n, mlp_input)],
                f"{what} with apply_ln=True",
                "the norm's output is no longer the linearised sum of the components",
            )
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
        if mlp_input:
            parts.append(self["attn_out", n])
            labels.append(f"{n}_attn_out")
        stack = torch.stack(parts) if parts else self._empty_stack()
        stack = self._read(stack, apply_ln, n, mlp_input, "decompose_resid")
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int | None = None,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Any:
        """Each head's output ``z_h W_O[h]`` (``hook_result``) for every block before ``layer``.

        Returns ``[component, batch, pos, d_model]`` with labels ``"L0H0"``, ``"L0H1"``,
        ...; per layer, the heads plus ``b_O`` sum to ``attn_out``. With ``layer=0`` there
        is no head before the first block: the stack is empty, ``[0, batch, pos, d_model]``
        with no labels, as in TransformerLens.

        Args:
            layer: heads of blocks ``0..layer-1`` (``None``/``-1``/``n_layers``: all).
            apply_ln: read every head's output as ``layer`` reads it: through block
                ``layer``'s ``ln1``, or ``ln_final`` when ``layer`` is the final stream,
                linearised at this run's scale (:meth:`apply_ln_to_stack`), the final
                stream included, so that the heads' reads add up (to the norm's output
                minus ``b``, with the other components of :meth:`decompose_resid`).
            return_labels: also return the labels.

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
            >>> _, cache = model.run_with_cache(torch.randn(4, 5, 3))
            >>> heads, labels = cache.stack_head_results(return_labels=True)
            >>> heads.shape, labels
            (torch.Size([4, 4, 5, 8]), ['L0H0', 'L0H1', 'L1H0', 'L1H1'])
            >>> cache.stack_head_results(layer=0).shape
            torch.Size([0, 4, 5, 8])
        """
        n = self._n(layer)
        parts, labels = [], []
        for ell in range(n):
            parts.append(self["result", ell].movedim(-2, 0))
            labels += [f"L{ell}H{h}" for h in range(self.cfg.n_heads)]
        stack = torch.cat(parts) if parts else self._empty_stack()
        stack = self._read(stack, apply_ln, n, False, "stack_head_results")
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

        This is the stack "as layer ``layer`` reads it"; ``decompose_resid`` and
        ``stack_head_results`` call it with their own ``layer`` when ``apply_ln=True``
        (TransformerLens's convention), and so does ``accumulated_resid`` for a block's
        input; ``accumulated_resid``'s final stream is a logit lens instead, which
        recomputes ``ln_final`` on each entry. Unlike TransformerLens, ``w`` is applied,
        so the result is right for models whose norms are not folded.

        Args:
            residual_stack: ``[..., batch, pos, d_model]`` components.
            layer: ``None``, ``-1`` or ``n_layers`` for ``ln_final``; else block
                ``layer``'s ``ln1`` (or ``ln2`` with ``mlp_input``).
            mlp_input: use ``ln2`` of block ``layer`` (``layer`` must be a block).

        Raises ``ValueError`` naming the weight if the model's weights changed after the
        run (the norm's ``w`` is read; see :class:`ActivationCache`).

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
            >>> _, cache = model.run_with_cache(torch.randn(4, 5, 3))
            >>> parts = cache.decompose_resid()  # [component, batch, pos, d_model]
            >>> read = cache.apply_ln_to_stack(parts)  # as ln_final reads each component
            >>> out = model.ln_final(cache["resid_post", -1])
            >>> bool(torch.allclose(read.sum(0) + model.ln_final.b, out, atol=1e-5))
            True
        """
        return self._apply_ln(residual_stack, layer, mlp_input, "apply_ln_to_stack")

    def _recompute_ln_final(self, stack: torch.Tensor, what: str) -> torch.Tensor:
        """``ln_final`` applied to each entry of ``stack`` with that entry's own statistics
        (the norm's formula, ``w`` and ``b`` included, without firing its hooks)."""
        if self.cfg.normalization is None:
            return stack
        self._check_weights(what)
        ln = cast("Norm", self.model.ln_final)
        dtype = stack.dtype
        x = stack.to(statistics_dtype(dtype))  # float32 for half precision, as the norm
        if ln.centre:
            x = x - x.mean(-1, keepdim=True)
        x = (x / (x.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt()).to(dtype)
        if ln.w is None:
            return x
        w = ln.w.detach().to(x.device)
        return x * w if ln.b is None else torch.addcmul(ln.b.detach().to(x.device), x, w)

    def _apply_ln(
        self, residual_stack: torch.Tensor, layer: int | None, mlp_input: bool, what: str
    ) -> torch.Tensor:
        n = self._n(layer, mlp_input)
        if self.cfg.normalization is None:
            return residual_stack
        self._check_weights(what)
        if n == self.cfg.n_layers:
            # normalization is not None, so every norm is a Norm
            ln, key = cast("Norm", self.model.ln_final), "ln_final.hook_scale"
        else:
            sub = "ln2" if mlp_input else "ln1"
            ln, key = getattr(self.model.blocks[n], sub), f"blocks.{n}.{sub}.hook_scale"
        if key not in self.cache_dict:
            raise KeyError(f"apply_ln_to_stack needs {key!r} in the cache (check names_filter)")
        scale = self.cache_dict[key]
        if not isinstance(residual_stack, torch.Tensor) or residual_stack.ndim < 3:
            raise TypeError(
                f"{what}: residual_stack must be a tensor [..., batch, pos, d_model], got "
                f"{type(residual_stack).__name__}"
                + (
                    f" of shape {tuple(residual_stack.shape)}"
                    if hasattr(residual_stack, "shape")
                    else ""
                )
            )
        if residual_stack.shape[-1] != self.cfg.d_model:
            raise ValueError(
                f"{what}: residual_stack's last axis must be d_model={self.cfg.d_model}, got "
                f"shape {tuple(residual_stack.shape)}"
            )
        if not bool(torch.isfinite(residual_stack).all()):
            raise ValueError(f"{what}: residual_stack contains NaN or inf")
        if residual_stack.shape[-3:-1] != scale.shape[-3:-1]:
            raise ValueError(
                f"residual_stack [..., batch, pos, d_model] {tuple(residual_stack.shape)} does not "
                f"match the cached scale's batch and pos {tuple(scale.shape[:2])}"
            )
        dtype = residual_stack.dtype
        # the norm's precision: a half-precision model's scale is float32 (see Norm)
        x = residual_stack.to(torch.promote_types(dtype, scale.dtype))
        if ln.centre:
            x = x - x.mean(-1, keepdim=True)
        x = x / scale
        if statistics_dtype(dtype) != dtype:  # half precision: back to the stack's dtype
            x = x.to(dtype)
        if ln.w is not None:
            x = x * ln.w.detach().to(x.device)
        return x
