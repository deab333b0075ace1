"""Shared argument checks for the analysis functions: clear errors on bad layers, heads
and populations."""

from collections.abc import Iterable

import torch

from ..model import HookedVectorTransformer
from ..model.validation import check_input

HeadSpec = tuple[int, int]


def check_model(model: object, name: str = "model") -> HookedVectorTransformer:
    """``model`` if it is a :class:`HookedVectorTransformer`, else ``TypeError`` naming the
    argument ``name``."""
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"{name}: expected a HookedVectorTransformer, got {type(model).__name__}")
    return model


def check_layer(model: HookedVectorTransformer, layer: object, where: str = "") -> int:
    """A layer index in ``[-n_layers, n_layers)`` as a non-negative int.

    ``where`` names the argument the layer came from (``"a key of heads"``), so that the
    message says which argument is wrong."""
    n = model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
        context = f" ({where}; the model has {n} layers)" if where else ""
        raise ValueError(f"layer must be an int in [{-n}, {n - 1}], got {layer!r}{context}")
    return layer % n


def check_head(model: HookedVectorTransformer, head: object, where: str = "") -> int:
    """A head index in ``[-n_heads, n_heads)`` as a non-negative int (``where`` as in
    :func:`check_layer`)."""
    n = model.cfg.n_heads
    if isinstance(head, bool) or not isinstance(head, int) or not -n <= head < n:
        context = f" ({where}; the model has {n} heads per layer)" if where else ""
        raise ValueError(f"head must be an int in [{-n}, {n - 1}], got {head!r}{context}")
    return head % n


def check_heads(model: HookedVectorTransformer, heads: object) -> list[HeadSpec]:
    """Normalise a head selection to a sorted list of distinct ``(layer, head)`` pairs.

    Accepts ``"all"``, one ``(layer, head)`` pair, an iterable of pairs, or a dict
    ``{layer: [heads]}``. Errors name the argument (``heads``) and the entry that is wrong.
    """
    if isinstance(heads, str):
        if heads != "all":
            raise ValueError(f"heads must be 'all', (layer, head) pairs or a dict, got {heads!r}")
        return [(ell, h) for ell in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    checked: set[HeadSpec] = set()
    if isinstance(heads, dict):
        for ell, hs in heads.items():
            layer = check_layer(model, ell, "a key of heads")
            for h in _as_iterable(hs, f"heads[{ell!r}]"):
                checked.add((layer, check_head(model, h, f"in heads[{ell!r}]")))
        pairs: list[tuple[object, object]] = []
    elif isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(v, int) for v in heads):
        pairs = [heads]
    else:
        pairs = []
        for item in _as_iterable(heads, "heads"):
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise ValueError(f"each head must be a (layer, head) pair, got {item!r}")
            pairs.append((item[0], item[1]))
    for ell, h in pairs:
        where = f"in the (layer, head) pair {(ell, h)!r} of heads"
        checked.add((check_layer(model, ell, where), check_head(model, h, where)))
    if not checked:
        raise ValueError("no heads selected")
    return sorted(checked)


def _as_iterable(value: object, name: str) -> Iterable[object]:
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | torch.Tensor):
        return value
    if isinstance(value, torch.Tensor) and value.ndim <= 1:
        return [int(v) for v in value.reshape(-1)]
    if isinstance(value, int):
        return [value]
    raise TypeError(f"{name} must be an int or an iterable, got {type(value).__name__}")


def check_population(
    model: HookedVectorTransformer,
    population: object,
    n_pos: int | None = None,
    name: str = "population",
) -> torch.Tensor:
    """A ``[n, pos, d_in]`` tensor of inputs on the model's device and dtype, finite and
    within ``n_ctx`` positions; errors call it ``name`` (the argument it was passed as).

    ``n_pos``: if given, the population must cover at least that many positions.
    """
    if not isinstance(population, torch.Tensor):
        raise TypeError(f"{name} must be a tensor [n, pos, d_in], got {type(population).__name__}")
    cfg = model.cfg
    if population.ndim != 3 or population.shape[-1] != cfg.d_in:
        raise ValueError(
            f"{name} must have shape [n, pos, d_in={cfg.d_in}], got {tuple(population.shape)}"
        )
    if n_pos is not None and population.shape[1] < n_pos:
        raise ValueError(
            f"{name} has {population.shape[1]} positions but the inputs have {n_pos}; "
            "a per-position mean needs at least as many"
        )
    return check_input(population, cfg, model.W_E, name=name)


def refuse_grouped_query(model: HookedVectorTransformer, what: str, why: str) -> None:
    """``ValueError`` when ``model`` has grouped-query attention (``n_key_value_heads <
    n_heads``), which ``what`` does not handle, for the reason ``why``."""
    cfg = model.cfg
    if cfg.is_gqa:
        raise ValueError(
            f"{what} does not handle grouped-query attention (this model has "
            f"n_key_value_heads={cfg.n_key_value_heads} < n_heads={cfg.n_heads}): {why}"
        )
