"""Splicing dictionaries into a model: a new model in which named hook points run a sparse
autoencoder or a transcoder, exactly (with the error term) or in place of what they
replace (without it).

Where they go and what they are called (as SAELens's ``HookedSAETransformer`` names
them: the dictionary's hook points sit under the point it is spliced at):

- an SAE at ``blocks.L.hook_resid_pre``, ``hook_resid_mid``, ``hook_resid_post``,
  ``hook_attn_out`` or ``hook_mlp_out`` reads what flows there and writes its output in
  its place; its hook points are ``blocks.L.hook_resid_pre.hook_sae_input``,
  ``.hook_sae_acts_pre``, ``.hook_sae_acts_post``, ``.hook_sae_recons`` and
  ``.hook_sae_error``.
- a transcoder spliced at ``blocks.L.hook_mlp_out`` replaces block ``L``'s MLP: it reads
  its ``hook_in`` (``blocks.L.ln2.hook_normalized`` by default, or ``blocks.L.
  hook_resid_mid``; both are what the MLP's output is a function of) and writes
  ``hook_mlp_out``; its hook points are ``blocks.L.hook_mlp_out.hook_sae_*``. The MLP
  itself still runs (its output is the target of the error term).

The point itself (``blocks.L.hook_resid_pre``) stays a hook point of the model, and its
hooks (and the cache) see the dictionary's output: what the rest of the model reads (what
SAELens calls ``hook_sae_output``).

The error term (``error_term=True``): the output is ``recons + hook_sae_error(target -
clean_recons)``, where ``target`` is what flowed into the point (an SAE's input; for a
transcoder, the original MLP's output), ``recons`` the dictionary's reconstruction through
its hook points, and ``clean_recons`` the same reconstruction computed without any hook.
With no hook on the dictionary's points the two agree bit for bit, so the output is the
target up to one rounding (``r + (t - r)``): the spliced model computes what the original
did. A hook on a feature (``hook_sae_acts_post``) changes ``recons`` but not the error,
so it acts on the output, as in SAELens. Unlike SAELens's, the error term here carries
gradients (it is not computed under ``no_grad``): gradients of the spliced model with
the error term are the original's, and attribution through the features is exact.

For a transcoder, then: ``error = MLP output - transcoder output`` (both on this run's
input, the transcoder's without hooks).
"""

import copy
import threading
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
from jaxtyping import Float

from ..hooks import HookPoint
from ..model import HookedVectorTransformer
from .modules import SparseDictionary

DICTIONARY_HOOKS = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
)
"""The hook points of a dictionary, by SAELens's names."""

SAE_POINTS = (
    "hook_resid_pre",
    "hook_resid_mid",
    "hook_resid_post",
    "hook_attn_out",
    "hook_mlp_out",
)
"""The hook points of block ``L`` (``blocks.L.<name>``) an SAE may be spliced at."""


class InputTap(HookPoint):
    """A hook point that also keeps, for its thread, the last activation that left it
    (after its hooks), until a :class:`SplicedPoint` takes it: how a transcoder spliced at
    ``hook_mlp_out`` reads the MLP's input point. Otherwise a plain hook point."""

    def __init__(self) -> None:
        super().__init__()
        self._kept: dict[int, torch.Tensor] = {}
        self.tapped = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        if self.tapped:
            self._kept[threading.get_ident()] = x
        return x

    def take(self) -> torch.Tensor:
        """The activation this thread last passed through the point (removed from it)."""
        try:
            return self._kept.pop(threading.get_ident())
        except KeyError:
            raise RuntimeError(
                f"the transcoder input {self.name!r} did not fire before the transcoder's "
                "output point in this forward pass"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_kept"] = {}  # activations in flight belong to the original's forward
        return state


class SplicedPoint(InputTap):
    """A hook point that runs a dictionary: the model's point at which an SAE or a
    transcoder is spliced (made by :func:`splice`; see :mod:`.splice`).

    The dictionary's hook points are this point's children (``<name>.hook_sae_acts_post``,
    SAELens's names); the dictionary is ``.dictionary`` (its weights are the model's
    ``<name>.dictionary.W_enc``, ...), and its methods (``encode``, ``decode``) run
    through those same hook points. ``model.hook_dict`` lists this point before the
    dictionary's points (a module comes before its children), though it fires after them.

    Attributes:
        dictionary: the :class:`~vecinterp.dictionary.SparseDictionary` (a copy of the
            one given to :func:`splice`).
        error_term: whether the output adds ``hook_sae_error`` back (see :mod:`.splice`).
        source: for a transcoder, the :class:`InputTap` it reads (``None`` for an SAE).
        source_name: that point's name (``None`` for an SAE).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.dictionary import DictionaryConfig, Transcoder, splice
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> tc = Transcoder(DictionaryConfig(d_in=8, d_sae=16, transcoder=True))
        >>> point = splice(model, {"blocks.0.hook_mlp_out": tc}).blocks[0].hook_mlp_out
        >>> point.source_name, point.error_term, point.hook_sae_acts_post.name
        ('blocks.0.ln2.hook_normalized', True, 'blocks.0.hook_mlp_out.hook_sae_acts_post')
    """

    def __init__(
        self,
        dictionary: SparseDictionary,
        error_term: bool,
        source: InputTap | None = None,
        source_name: str | None = None,
    ):
        super().__init__()
        for hook in DICTIONARY_HOOKS:
            # the points move here, so that the model names them "<this point>.hook_sae_*";
            # the dictionary keeps them as plain attributes, so its methods still use them
            point = dictionary._modules.pop(hook)
            assert isinstance(point, HookPoint)
            self.add_module(hook, point)
            object.__setattr__(dictionary, hook, point)
        dictionary.__dict__.pop("_hook_record", None)
        self.dictionary = dictionary
        self.error_term = error_term
        # not a child module: the tap is the model's own point elsewhere in the tree
        object.__setattr__(self, "source", source)
        self.source_name = source_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.dictionary
        source = cast(InputTap | None, self.__dict__["source"])
        raw = d._check_input(x if source is None else source.take())
        # the dictionary's encode and decode, with the input after its hooks kept for a skip
        sae_in = d.hook_sae_input(raw)
        centred = sae_in if d.cfg.transcoder else sae_in - d.b_dec
        pre = d.hook_sae_acts_pre(centred @ d.W_enc + d.b_enc)
        out = d.decode(d.hook_sae_acts_post(d.activate(pre)), sae_in)
        if self.error_term:
            # the target (x: the SAE's input, or the MLP's output) minus the reconstruction
            # of the input as it arrived, without hooks: hooks inside then act on the output
            out = out + d.hook_sae_error(x - clean_reconstruction(d, raw))
        return super().forward(out)

    def extra_repr(self) -> str:
        kind = "transcoder" if self.dictionary.cfg.transcoder else "sae"
        src = f", reads={self.source_name!r}" if self.source_name else ""
        return f"{super().extra_repr()}, {kind}, error_term={self.error_term}{src}"


def clean_reconstruction(
    dictionary: SparseDictionary, x: Float[torch.Tensor, "... d_in"]
) -> Float[torch.Tensor, "... d_out"]:
    """The dictionary's reconstruction (prediction) of ``x`` with no hook point called:
    the same operations, in the same order, as its hooked forward pass, so with no hooks
    the two agree bit for bit (what the error term subtracts).

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
        >>> from vecinterp.dictionary.splice import clean_reconstruction
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
        >>> x = torch.randn(3, 4)
        >>> torch.equal(clean_reconstruction(sae, x), sae(x))
        True
    """
    d = dictionary
    centred = x if d.cfg.transcoder else x - d.b_dec
    recons = d.activate(centred @ d.W_enc + d.b_enc) @ d.W_dec + d.b_dec
    if d.W_skip is not None:
        recons = recons + x @ d.W_skip
    return recons


def _pairs(
    dictionaries: Mapping[str, SparseDictionary] | Iterable[tuple[str, SparseDictionary]],
) -> list[tuple[str, SparseDictionary]]:
    items = list(dictionaries.items()) if isinstance(dictionaries, Mapping) else None
    if items is None:
        if isinstance(dictionaries, str | bytes) or not isinstance(dictionaries, Iterable):
            raise TypeError(
                "dictionaries must map hook names to dictionaries ({name: dictionary}) or be "
                f"(name, dictionary) pairs, got {type(dictionaries).__name__}"
            )
        items = []
        for pair in dictionaries:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise TypeError(f"each entry must be a (hook name, dictionary) pair, got {pair!r}")
            items.append((pair[0], pair[1]))
    if not items:
        raise ValueError("dictionaries is empty: name at least one hook point")
    seen: set[str] = set()
    for name, d in items:
        if not isinstance(name, str):
            raise TypeError(f"hook names must be str, got {name!r}")
        if not isinstance(d, SparseDictionary):
            raise TypeError(
                f"the dictionary for {name!r} must be a SparseAutoencoder or Transcoder, got "
                f"{type(d).__name__}"
            )
        if name in seen:
            raise ValueError(f"two dictionaries for one hook point {name!r}: give one per point")
        seen.add(name)
    return items


def _block_and_leaf(name: str) -> tuple[int, str] | None:
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None


def _transcoder_inputs(model: HookedVectorTransformer, layer: int) -> list[str]:
    names = [f"blocks.{layer}.hook_resid_mid"]
    if model.cfg.normalization is not None:
        names.insert(0, f"blocks.{layer}.ln2.hook_normalized")
    return names


def _check(model: HookedVectorTransformer, name: str, d: SparseDictionary) -> str | None:
    """Refuse what cannot be spliced at ``name``; a transcoder's input point."""
    point = model.hook_point(name)  # an unknown name: ValueError with what is close
    if isinstance(point, SplicedPoint):
        raise ValueError(
            f"{name!r} already runs a dictionary (this model was spliced there): two "
            "dictionaries on one point are refused; splice the original model"
        )
    where = _block_and_leaf(name)
    cfg = d.cfg
    if cfg.transcoder:
        if where is None or where[1] != "hook_mlp_out":
            raise ValueError(
                f"a transcoder replaces an MLP: splice it at 'blocks.L.hook_mlp_out' (the point "
                f"it writes), got {name!r}"
            )
        if cfg.hook_out is not None and cfg.hook_out != name:
            raise ValueError(
                f"this transcoder predicts {cfg.hook_out!r} (cfg.hook_out), not {name!r}"
            )
        inputs = _transcoder_inputs(model, where[0])
        source = cfg.hook_in if cfg.hook_in is not None else inputs[0]
        if source not in inputs:
            raise ValueError(
                f"a transcoder spliced at {name!r} reads the MLP's input, one of {inputs}; "
                f"its cfg.hook_in is {cfg.hook_in!r}"
            )
    else:
        if where is None or where[1] not in SAE_POINTS:
            raise ValueError(
                f"an SAE can be spliced at blocks.L.<{'|'.join(SAE_POINTS)}>, got {name!r}"
            )
        if cfg.hook_in is not None and cfg.hook_in != name:
            raise ValueError(
                f"this SAE was trained on {cfg.hook_in!r} (cfg.hook_in), not {name!r}; build "
                "one with hook_in=None or the right name to splice it elsewhere"
            )
        source = None
    width = model.cfg.d_model
    if cfg.d_in != width or cfg.d_out != width:
        raise ValueError(
            f"the dictionary for {name!r} maps d_in={cfg.d_in} to d_out={cfg.d_out}, but the "
            f"point (and a transcoder's input) has width d_model={width}"
        )
    ref = model.W_E
    for pname, p in d.named_parameters():
        if p.dtype != ref.dtype or p.device != ref.device:
            raise ValueError(
                f"the dictionary for {name!r} has {pname} of dtype {p.dtype} on {p.device}, the "
                f"model's weights are {ref.dtype} on {ref.device}: convert one "
                "(dictionary.to(dtype=..., device=...))"
            )
    return source


def splice(
    model: HookedVectorTransformer,
    dictionaries: Mapping[str, SparseDictionary] | Iterable[tuple[str, SparseDictionary]],
    error_term: bool = True,
) -> HookedVectorTransformer:
    """A new model with ``dictionaries`` spliced at their hook points (``model`` and the
    dictionaries are left as they were: the new model holds copies).

    Args:
        model: a :class:`~vecinterp.HookedVectorTransformer` (native, imported or
            converted; grouped-query attention and gated MLPs included).
        dictionaries: ``{hook name: dictionary}`` (or ``(name, dictionary)`` pairs): an
            :class:`~vecinterp.dictionary.SparseAutoencoder` at ``blocks.L.hook_resid_pre``,
            ``hook_resid_mid``, ``hook_resid_post``, ``hook_attn_out`` or ``hook_mlp_out``;
            a :class:`~vecinterp.dictionary.Transcoder` at ``blocks.L.hook_mlp_out``,
            reading its ``cfg.hook_in`` (default ``blocks.L.ln2.hook_normalized``, or
            ``blocks.L.hook_resid_mid`` for a model without norms).
        error_term: add each dictionary's error back, so that the new model computes what
            ``model`` does (to one rounding per point) while every feature is hookable;
            ``False``: each point carries the dictionary's reconstruction instead.

    The dictionaries' hook points are ``<point>.hook_sae_input``, ``.hook_sae_acts_pre``,
    ``.hook_sae_acts_post``, ``.hook_sae_recons`` and ``.hook_sae_error``, reachable by
    ``run_with_hooks``, ``hooks()``, ``add_hook`` and ``run_with_cache``. Hooks the
    original had attached for every thread (``add_hook``) are carried over, as
    ``copy.deepcopy`` carries them. See :mod:`vecinterp.dictionary.splice` for the error
    term.

    Refused with a ``ValueError``: an unknown hook name (with what is close), a point not
    listed above, a dictionary whose width is not the point's, two dictionaries on one
    point, a point already spliced, a dictionary of another dtype or device than the
    model's; with a ``TypeError``: what is not a model or a dictionary.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder, splice
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0,
        ...     dtype=torch.float64)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=16, dtype="float64"))
        >>> spliced = splice(model, {"blocks.0.hook_resid_post": sae})
        >>> x = torch.randn(2, 5, 3, dtype=torch.float64)
        >>> y, cache = spliced.run_with_cache(x)
        >>> cache["blocks.0.hook_resid_post.hook_sae_acts_post"].shape
        torch.Size([2, 5, 16])
        >>> bool((y - model(x)).abs().max() < 1e-12)
        True
        >>> zero = lambda acts, hook: torch.zeros_like(acts)  # ablate every feature
        >>> y0 = spliced.run_with_hooks(
        ...     x, fwd_hooks=[("blocks.0.hook_resid_post.hook_sae_acts_post", zero)])
        >>> bool((y0 - y).abs().max() > 0)
        True
    """
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"model must be a HookedVectorTransformer, got {type(model).__name__}")
    if not isinstance(error_term, bool):
        raise TypeError(f"error_term must be True or False, got {error_term!r}")
    items = _pairs(dictionaries)
    sources = {name: _check(model, name, d) for name, d in items}
    new = copy.deepcopy(model)
    points = new.hook_dict
    for name, d in items:
        source = sources[name]
        if source is not None and source not in sources:  # else an SAE there is the tap
            _place(new, source, points[source], InputTap())
        spliced = SplicedPoint(unspliced_copy(d).train(False), error_term)
        placed = _place(new, name, points[name], spliced)
        assert placed is spliced
    points = new.hook_dict
    for name, source in sources.items():
        if source is None:
            continue
        tap = cast(InputTap, points[source])
        tap.tapped = True
        spliced = cast(SplicedPoint, points[name])
        object.__setattr__(spliced, "source", tap)
        spliced.source_name = source
    new.setup_hooks()
    return new


def unspliced_copy(dictionary: SparseDictionary) -> SparseDictionary:
    """A copy of ``dictionary`` that owns its hook points, ready to splice: a deep copy; or,
    for a dictionary taken out of a spliced model (:func:`spliced_dictionaries`), whose hook
    points now belong to the spliced point, a new dictionary of the same class and config
    with the same state (parameters and buffers), dtype, device and training mode.
    :func:`splice` copies every dictionary it is given this way.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder, splice,
        ...                                   spliced_dictionaries, unspliced_copy)
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> once = splice(model, {"blocks.0.hook_resid_post": SparseAutoencoder(
        ...     DictionaryConfig(d_in=8, d_sae=16))})
        >>> taken = spliced_dictionaries(once)["blocks.0.hook_resid_post"]
        >>> again = splice(model, {"blocks.0.hook_resid_post": unspliced_copy(taken)})
        >>> x = torch.randn(2, 5, 3)
        >>> torch.equal(again(x), once(x))
        True
    """
    if all(isinstance(dictionary._modules.get(h), HookPoint) for h in DICTIONARY_HOOKS):
        return copy.deepcopy(dictionary)
    param = next(dictionary.parameters())
    new = type(dictionary)(dictionary.cfg)
    new.load_state_dict(dictionary.state_dict())
    return new.to(device=param.device, dtype=param.dtype).train(dictionary.training)


def _place(model: HookedVectorTransformer, name: str, old: HookPoint, new: InputTap) -> InputTap:
    """Put ``new`` where ``old`` is, with ``old``'s hooks (every thread's) moved to it."""
    for attr in ("_fwd", "_bwd"):
        handles = list(getattr(old, attr))
        for handle in handles:
            handle.hook_point = new
        object.__setattr__(new, attr, handles)
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent), leaf, new)
    return new


def spliced_dictionaries(model: HookedVectorTransformer) -> dict[str, SparseDictionary]:
    """The dictionaries spliced into ``model`` (by :func:`splice`), by hook name, in the
    order they run.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder, splice,
        ...                                   spliced_dictionaries)
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=16))
        >>> list(spliced_dictionaries(splice(model, {"blocks.0.hook_attn_out": sae})))
        ['blocks.0.hook_attn_out']
    """
    return {
        name: point.dictionary
        for name, point in model.hook_dict.items()
        if isinstance(point, SplicedPoint)
    }
