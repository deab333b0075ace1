"""Shared argument checks for the analysis functions: clear errors on bad layers, heads
and populations."""

from collections.abc import Iterable

import torch

from ..model import HookedVectorTransformer

HeadSpec = tuple[int, int]


def check_model(model: object) -> HookedVectorTransformer:
    """``model`` if it is a :class:`HookedVectorTransformer`, else ``TypeError``."""
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"expected a HookedVectorTransformer, got {type(model).__name__}")
    return model


def check_layer(model: HookedVectorTransformer, layer: object) -> int:
    """A layer index in ``[-n_layers, n_layers)`` as a non-negative int."""
    return model.layer_index(layer)  # type: ignore[arg-type]


def check_head(model: HookedVectorTransformer, head: object) -> int:
    """A head index in ``[-n_heads, n_heads)`` as a non-negative int."""
    n = model.cfg.n_heads
    if isinstance(head, bool) or not isinstance(head, int) or not -n <= head < n:
        raise ValueError(f"head must be an int in [{-n}, {n - 1}], got {head!r}")
    return head % n


def check_heads(model: HookedVectorTransformer, heads: object) -> list[HeadSpec]:
    """Normalise a head selection to a sorted list of distinct ``(layer, head)`` pairs.

    Accepts ``"all"``, one ``(layer, head)`` pair, an iterable of pairs, or a dict
    ``{layer: [heads]}``.
    """
    if isinstance(heads, str):
        if heads != "all":
            raise ValueError(f"heads must be 'all', (layer, head) pairs or a dict, got {heads!r}")
        return [(ell, h) for ell in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    if isinstance(heads, dict):
        pairs: list[tuple[object, object]] = [
            (ell, h) for ell, hs in heads.items() for h in _as_iterable(hs, "heads[layer]")
        ]
    elif isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(v, int) for v in heads):
        pairs = [heads]
    else:
        pairs = []
        for item in _as_iterable(heads, "heads"):
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise ValueError(f"each head must be a (layer, head) pair, got {item!r}")
            pairs.append((item[0], item[1]))
    if not pairs:
        raise ValueError("no heads selected")
    return sorted({(check_layer(model, ell), check_head(model, h)) for ell, h in pairs})


def _as_iterable(value: object, name: str) -> Iterable[object]:
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | torch.Tensor):
        return value
    if isinstance(value, torch.Tensor) and value.ndim <= 1:
        return [int(v) for v in value.reshape(-1)]
    if isinstance(value, int):
        return [value]
    raise TypeError(f"{name} must be an int or an iterable, got {type(value).__name__}")


def check_population(
    model: HookedVectorTransformer, population: object, n_pos: int | None = None
) -> torch.Tensor:
    """A ``[n, pos, d_in]`` tensor of inputs on the model's device and dtype.

    ``n_pos``: if given, the population must cover at least that many positions.
    """
    if not isinstance(population, torch.Tensor):
        raise TypeError(
            f"population must be a tensor [n, pos, d_in], got {type(population).__name__}"
        )
    cfg = model.cfg
    if population.ndim != 3 or population.shape[-1] != cfg.d_in:
        raise ValueError(
            f"population must have shape [n, pos, d_in={cfg.d_in}], got {tuple(population.shape)}"
        )
    if n_pos is not None and population.shape[1] < n_pos:
        raise ValueError(
            f"population has {population.shape[1]} positions but the inputs have {n_pos}; "
            "a per-position mean needs at least as many"
        )
    return population
