"""Attention-pattern ablation (Musat 2024, §E): a hook that replaces the selected heads'
``hook_pattern`` by a uniform, identity, previous-position or given map
(:func:`pattern_ablation_hook`), and the model's outputs with such maps in place
(:func:`ablate_patterns`)."""

from collections.abc import Mapping, Sequence

import torch
from jaxtyping import Float

from ..hooks import HookFn, HookPoint
from ..model import HookedVectorTransformer
from ..model.validation import check_input
from ._ablation_common import _axis_mask, _check_choice, _index_list
from ._validate import check_head, check_layer, check_model

__all__ = ["ablate_patterns", "pattern_ablation_hook"]

PATTERN_KINDS = ("uniform", "identity", "previous")
_ROW_SUM_TOL = 1e-5  # how far a given attention map's rows may sum from 1


def _check_pattern_kind(kind: object) -> str | torch.Tensor:
    if isinstance(kind, str):
        return _check_choice(kind, PATTERN_KINDS, "pattern kind")
    if not isinstance(kind, torch.Tensor):
        raise TypeError(
            f"a pattern must be one of {PATTERN_KINDS} or a tensor [dest_pos, src_pos], "
            f"got {type(kind).__name__}"
        )
    if kind.ndim not in (2, 3) or kind.shape[-1] != kind.shape[-2]:
        raise ValueError(
            "a given attention map must have shape [dest_pos, src_pos] or "
            f"[batch, dest_pos, src_pos] with dest_pos == src_pos, got {tuple(kind.shape)}"
        )
    if not kind.is_floating_point():
        raise TypeError(f"a given attention map must be floating point, got {kind.dtype}")
    if not bool(torch.isfinite(kind).all()) or bool((kind < 0).any()):
        raise ValueError("a given attention map must be finite and non-negative")
    worst = float((kind.double().sum(-1) - 1).abs().max())
    if worst > _ROW_SUM_TOL:
        raise ValueError(
            f"each row (dest position) of a given attention map must sum to 1; "
            f"the worst is off by {worst:.3g}"
        )
    return kind


def _pattern_matrix(
    kind: str | torch.Tensor, batch: int, n_pos: int, causal: bool, like: torch.Tensor
) -> torch.Tensor:
    """``[1 or batch, dest_pos, src_pos]`` on ``like``'s dtype and device."""
    if isinstance(kind, torch.Tensor):
        if kind.shape[-1] != n_pos or (kind.ndim == 3 and kind.shape[0] != batch):
            want = f"[{n_pos}, {n_pos}] or [{batch}, {n_pos}, {n_pos}]"
            raise ValueError(f"the given attention map must be {want}, got {tuple(kind.shape)}")
        matrix = kind
    elif kind == "identity":
        matrix = torch.eye(n_pos)
    elif kind == "previous":
        matrix = torch.zeros(n_pos, n_pos)
        matrix[torch.arange(n_pos), (torch.arange(n_pos) - 1).clamp(min=0)] = 1.0
    elif causal:
        ones = torch.ones(n_pos, n_pos, dtype=torch.float64).tril()
        matrix = ones / torch.arange(1, n_pos + 1, dtype=torch.float64)[:, None]
    else:
        matrix = torch.full((n_pos, n_pos), 1.0 / n_pos, dtype=torch.float64)
    matrix = matrix.to(dtype=like.dtype, device=like.device)
    return matrix if matrix.ndim == 3 else matrix.unsqueeze(0)


def pattern_ablation_hook(
    kind: str | torch.Tensor, heads: int | Sequence[int], causal: bool = True
) -> HookFn:
    """A hook for ``blocks.l.attn.hook_pattern`` that replaces the selected heads' patterns.

    ``pattern[b, h, d, s] ← A[d, s]`` (or ``A[b, d, s]``) for each selected head, with

    - ``"uniform"``: ``A[d, s] = 1/(d+1)`` for ``s ≤ d``, else 0 (``causal``); ``1/pos``
      everywhere for a non-causal model;
    - ``"identity"``: ``A[d, s] = 1`` iff ``s = d`` (attend to self);
    - ``"previous"``: ``A[d, s] = 1`` iff ``s = d - 1``; position 0, which has no previous
      position, attends to itself;
    - a tensor ``[dest_pos, src_pos]`` or ``[batch, dest_pos, src_pos]``: any row-stochastic
      map (non-negative, each row summing to 1 within 1e-5), e.g. one-hot rows that point
      each destination at the position a head is expected to read. It is used as given:
      a map that attends to later positions makes a causal model look ahead.

    Args:
        kind: one of the above.
        heads: head indices within the hooked layer.
        causal: whether the model's attention is causal (``model.cfg.causal``); used by
            ``"uniform"``.

    Example:
        >>> import torch
        >>> from vecinterp.analysis.ablation import pattern_ablation_hook
        >>> from vecinterp.hooks import HookPoint
        >>> hook = pattern_ablation_hook("previous", heads=0)
        >>> hook(torch.zeros(1, 1, 3, 3), HookPoint())[0, 0].tolist()
        [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    given = _check_pattern_kind(kind)
    head_idx = _index_list(heads, "heads")
    if head_idx is None:
        raise ValueError("heads must name at least one head")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")

    def hook_fn(pattern: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
            raise ValueError(
                f"pattern_ablation_hook belongs on hook_pattern [batch, n_heads, dest_pos, "
                f"src_pos]; {hook.name!r} has shape {tuple(pattern.shape)}"
            )
        batch, n_heads, n_pos, _ = pattern.shape
        selected = _axis_mask(head_idx, n_heads, "heads", hook.name).nonzero().flatten()
        matrix = _pattern_matrix(given, batch, n_pos, causal, pattern)
        out = pattern.clone()
        out[:, selected.to(pattern.device)] = matrix.unsqueeze(1)
        return out

    return hook_fn


def ablate_patterns(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    patterns: Mapping[tuple[int, int], str | torch.Tensor],
) -> Float[torch.Tensor, "batch pos d_out"]:
    """The model's outputs with attention patterns replaced (Musat 2024, §E).

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        patterns: ``{(layer, head): kind}``, ``kind`` as in :func:`pattern_ablation_hook`
            (``"uniform"``, ``"identity"``, ``"previous"`` or a map ``[pos, pos]`` /
            ``[batch, pos, pos]``).

    Returns:
        Outputs ``[batch, pos, d_out]``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import ablate_patterns
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(4, 6, 3)
        >>> ablate_patterns(model, x, {(0, 1): "previous", (1, 0): torch.eye(6)}).shape
        torch.Size([4, 6, 3])
    """
    model = check_model(model)
    check_input(x, model.cfg, model.W_E)
    if not isinstance(patterns, Mapping):
        raise TypeError(f"patterns must be a dict {{(layer, head): kind}}, got {patterns!r}")
    if not patterns:
        raise ValueError("patterns is empty: give at least one {(layer, head): kind}")
    batch, n_pos, _ = x.shape
    fwd_hooks = []
    for key, kind in patterns.items():
        if not isinstance(key, tuple | list) or len(key) != 2:
            raise TypeError(f"each key of patterns must be a (layer, head) pair, got {key!r}")
        where = f"in the key {tuple(key)!r} of patterns"
        layer, head = check_layer(model, key[0], where), check_head(model, key[1], where)
        given = _check_pattern_kind(kind)
        if isinstance(given, torch.Tensor):
            _pattern_matrix(given, batch, n_pos, model.cfg.causal, x)  # shape check, early
        fwd_hooks.append(
            (
                f"blocks.{layer}.attn.hook_pattern",
                pattern_ablation_hook(given, head, causal=model.cfg.causal),
            )
        )
    with torch.no_grad():
        return model.run_with_hooks(x, fwd_hooks=fwd_hooks)
