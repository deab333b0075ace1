"""Ablating components and reading the outputs: attention heads (:func:`ablate_heads`, a
head's slice of ``hook_z`` or ``hook_result``) and whole activations whose axis 1 is
``pos``, at every position or some (:func:`ablate`: MLPs, attention layers, the residual
stream). The replacement kinds are defined in :mod:`vecinterp.analysis.ablation`."""

from collections.abc import Iterable, Sequence

import torch
from jaxtyping import Float

from ..cache import act_name
from ..model import HookedVectorTransformer
from ..model.validation import check_input
from ._ablation_common import _HEAD_HOOKS, KINDS, Population, _check_choice, default_kind
from ._validate import check_heads, check_layer, check_model
from .ablation_hooks import _ablation_hook, _replacements

__all__ = ["ablate", "ablate_heads"]


def ablate_heads(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    heads: object,
    kind: str | None = None,
    population: Population | None = None,
    hook: str = "z",
    resample_source: torch.Tensor | None = None,
    seed: int = 0,
    positions: int | Sequence[int] | None = None,
) -> Float[torch.Tensor, "batch pos d_out"]:
    """The model's outputs with attention heads ablated.

    Head ``h`` of layer ``l`` is replaced in ``blocks.l.attn.hook_z`` (its mixed values
    ``z[:, :, h]``, before ``W_O``; the default) or ``blocks.l.attn.hook_result`` (its
    output ``z_h W_O[h]``); the layer then writes ``Σ_h z_h W_O[h] + b_O`` as usual. So
    zero-ablating every head of a layer leaves ``attn_out = b_O``.

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        heads: ``"all"``, ``(layer, head)``, a list of pairs, or ``{layer: [heads]}``.
        kind: ``"zero"``, ``"mean"`` or ``"resample"`` (see :mod:`vecinterp.analysis.ablation`).
            Left out: ``"zero"``, with a ``FutureWarning`` (:func:`head_ablation_sweep`
            defaults to ``"mean"``; ``kind`` will be required in a later release).
        population: for ``"mean"``: inputs ``[n, pos_pop ≥ pos, d_in]``, or the dict of
            :func:`mean_activations` (to compute the means once); for ``"resample"``
            without ``resample_source``: inputs to draw the ``batch`` sources from.
            Ignored by ``"zero"``.
        hook: ``"z"`` or ``"result"``.
        resample_source: for ``"resample"``: inputs of ``x``'s shape.
        seed: seeds the draw from the population for ``"resample"``.
        positions: ablate only at these positions (default all).

    Returns:
        Outputs ``[batch, pos, d_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import ablate_heads
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x, pop = torch.randn(4, 6, 3), torch.randn(50, 6, 3)
        >>> ablate_heads(model, x, {1: [0, 1]}, kind="mean", population=pop).shape
        torch.Size([4, 6, 3])
    """
    model = check_model(model)
    pairs = check_heads(model, heads)
    kind = _check_choice(default_kind("ablate_heads", "zero") if kind is None else kind, KINDS,
                         "kind")  # fmt: skip
    hook = _check_choice(hook, _HEAD_HOOKS, "hook")
    check_input(x, model.cfg, model.W_E)
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    names = {layer: f"blocks.{layer}.attn.hook_{hook}" for layer in by_layer}
    with torch.no_grad():
        repl = _replacements(
            model, x, kind, list(names.values()), population, resample_source, seed
        )
        fwd_hooks = [
            (names[layer], _ablation_hook(kind, repl[names[layer]], hs, positions))
            for layer, hs in by_layer.items()
        ]
        return model.run_with_hooks(x, fwd_hooks=fwd_hooks)


def _component_names(model: HookedVectorTransformer, components: object) -> list[str]:
    single = isinstance(components, str) or (
        isinstance(components, tuple) and len(components) == 2 and isinstance(components[1], int)
    )
    if single:
        items: list[object] = [components]
    elif isinstance(components, Iterable) and not isinstance(components, bytes | torch.Tensor):
        items = list(components)
    else:
        raise TypeError(
            "components must be a hook name, a (short name, layer) pair or a list of them, "
            f"got {type(components).__name__}"
        )
    if not items:
        raise ValueError("components is empty: name at least one activation")
    names = []
    for item in items:
        if isinstance(item, str):
            name = act_name(item) if item in ("embed", "pos_embed") else item
        elif isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str):
            name = act_name(item[0], check_layer(model, item[1], f"in {tuple(item)!r}"))
        else:
            raise TypeError(
                f"each component must be a hook name or a (short name, layer) pair such as "
                f"('mlp_out', 1), got {item!r}"
            )
        model.hook_point(name)  # unknown names fail here, listing close matches
        if name.endswith(("hook_pattern", "hook_attn_scores")):
            raise ValueError(
                f"{name!r} is [batch, n_heads, dest_pos, src_pos], not [batch, pos, ...]; "
                "ablate attention patterns with ablate_patterns"
            )
        names.append(name)
    return list(dict.fromkeys(names))


def ablate(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    components: object,
    kind: str = "zero",
    population: Population | None = None,
    positions: int | Sequence[int] | None = None,
    resample_source: torch.Tensor | None = None,
    seed: int = 0,
) -> Float[torch.Tensor, "batch pos d_out"]:
    """The model's outputs with whole activations ablated (at every position or some).

    ``components`` names activations whose axis 1 is ``pos``: MLP ``l`` is
    ``("mlp_out", l)``, the attention layer ``("attn_out", l)``, a whole layer both; the
    residual stream ``("resid_pre", l)`` etc.; full hook names work too
    (``"blocks.1.hook_mlp_out"``). Each is replaced as ``kind`` says (see
    :mod:`vecinterp.analysis.ablation`) at ``positions`` (default all). For heads use
    :func:`ablate_heads`, for attention patterns :func:`ablate_patterns`.

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        components: a hook name, a ``(short name, layer)`` pair, or a list of them.
        kind: ``"zero"``, ``"mean"`` or ``"resample"``.
        population: as in :func:`ablate_heads`.
        positions: positions to ablate (default all).
        resample_source: as in :func:`ablate_heads`.
        seed: as in :func:`ablate_heads`.

    Returns:
        Outputs ``[batch, pos, d_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import ablate
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(4, 6, 3)
        >>> y = ablate(model, x, [("attn_out", 1), ("mlp_out", 1)])  # all of layer 1
        >>> torch.equal(y, model.unembed(model.ln_final(model(x, stop_at_layer=1))))
        True
    """
    model = check_model(model)
    kind = _check_choice(kind, KINDS, "kind")
    names = _component_names(model, components)
    check_input(x, model.cfg, model.W_E)
    with torch.no_grad():
        repl = _replacements(model, x, kind, names, population, resample_source, seed)
        fwd_hooks = [(name, _ablation_hook(kind, repl[name], None, positions)) for name in names]
        return model.run_with_hooks(x, fwd_hooks=fwd_hooks)
