"""The batched head-ablation sweep (:func:`head_ablation_sweep`): a metric with each head
ablated alone, several heads sharing one forward pass on a tiled batch, and how heads are
packed into passes (``_pack_heads``) and how many share one (``_default_chunk_size``)."""

import math
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Bool, Float
from tqdm.auto import tqdm

from ..hooks import HookFn, HookPoint
from ..loss import loss_positions, masked_mse
from ..model import HookedVectorTransformer
from ..model.validation import check_finite, check_input
from ..threads import check_threads, use_threads
from ._ablation_common import (
    _HEAD_HOOKS,
    _PASS_ELEMENTS,
    _PASS_ELEMENTS_ACCELERATOR,
    KINDS,
    Population,
    _check_choice,
    _widest,
    default_kind,
)
from ._validate import check_heads, check_model
from .ablation_hooks import _fit_replacement, _replacements

__all__ = ["head_ablation_sweep"]

# default sweep chunk: as every batched pass (see _ablation_common)
_SWEEP_ELEMENTS = _PASS_ELEMENTS
_SWEEP_ELEMENTS_ACCELERATOR = _PASS_ELEMENTS_ACCELERATOR

Metric = Callable[[torch.Tensor, torch.Tensor], Any]
"""``metric(output [batch, pos, d_out], targets [batch, pos, d_out]) -> scalar``."""


def _sweep_hook(mask: torch.Tensor, repl: torch.Tensor) -> HookFn:
    """Replace head ``h`` in copy ``c`` where ``mask[c, h]``; activations are the batch
    tiled ``k = mask.shape[0]`` times, ``[k * batch, pos, n_heads, d]``."""

    def hook_fn(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        tiled = act.reshape(mask.shape[0], -1, *act.shape[1:])
        return torch.where(mask[:, None, None, :, None], repl, tiled).reshape(act.shape)

    return hook_fn


def _scalar(value: object) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric must return a scalar, got a tensor of shape {value.shape}")
        return float(value.item())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"metric must return a scalar tensor or a float, got {type(value).__name__}")


def head_ablation_sweep(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    targets: Float[torch.Tensor, "batch pos d_out"],
    kind: str | None = None,
    population: Population | None = None,
    metric: Metric | None = None,
    loss_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None,
    heads: object = "all",
    chunk_size: int | None = None,
    progress: bool = True,
    hook: str = "z",
    resample_source: torch.Tensor | None = None,
    seed: int = 0,
    return_baseline: bool = False,
    threads: int | str | None = None,
) -> (
    Float[torch.Tensor, "n_layers n_heads"]
    | tuple[Float[torch.Tensor, "n_layers n_heads"], Float[torch.Tensor, ""]]
):
    """A metric with each head ablated alone, ``score[l, h] = metric(y^{-(l,h)}, targets)``,
    computed in batched passes.

    ``y^{-(l,h)}`` is ``ablate_heads(model, x, (l, h), kind, ...)``. Instead of one forward
    pass per head, ``k ≤ chunk_size`` heads share a pass: the batch is tiled ``k`` times
    (copy ``c`` ablates head ``(l_c, h_c)``) and each ablated layer's hook on ``hook_z``
    replaces head ``h_c``'s slice in copy ``c`` only (a per-copy mask ``[k, n_heads]`` per
    layer). Heads are packed in (layer, head) order, the heads of one layer kept in one
    pass when they fit. A pass starts at the first layer it ablates, from the residual
    stream of one unablated pass (which also gives the baseline), since every copy is the
    same before it. The result equals the loop over :func:`ablate_heads` up to rounding:
    each copy's arithmetic is the same, but a matrix product over ``k·batch`` rows may
    round differently in the last bit than one over ``batch`` rows (in float64 the two
    agree to about 1e-15, usually exactly).

    Cost: a head of layer ``l`` costs ``n_layers - l`` layers of the batch (from its
    pass's first layer), not ``n_layers``; the rest of the gain is from larger batches,
    which helps most where a forward pass is dominated by per-call costs (accelerators,
    small models) and little where matrix products dominate (large models on a CPU).

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        targets: ``[batch, pos, d_out]``.
        kind: ``"zero"``, ``"mean"`` or ``"resample"``. Left out: ``"mean"``, with a
            ``FutureWarning`` (:func:`ablate_heads` defaults to ``"zero"``; ``kind`` will
            be required in a later release).
        population: as in :func:`ablate_heads` (needed for ``"mean"``).
        metric: ``metric(output, targets) -> scalar`` with ``output`` one copy's outputs
            ``[batch, pos, d_out]`` and ``targets`` as given; it returns a one-element
            tensor or a float. Default: ``masked_mse(output, targets, loss_mask)``.
        loss_mask: ``[batch, pos]`` or ``[pos]`` for the default metric only.
        heads: which heads to sweep (as in :func:`ablate_heads`); others score NaN.
        chunk_size: copies per pass (≥ 1; the number of heads or more: one pass).
            Default: as many as keep the widest activation of a pass (e.g. the
            MLP's ``[k·batch, pos, d_mlp]``) at about 2^22 numbers on CPU (16 MiB in
            float32: larger passes fall out of cache and run slower per row) or 2^27 on an
            accelerator; at least 1, at most the number of heads swept.
        progress: show a progress bar over the passes.
        hook: ``"z"`` or ``"result"``, as in :func:`ablate_heads`.
        resample_source: as in :func:`ablate_heads`.
        seed: as in :func:`ablate_heads`.
        return_baseline: also return the metric of the unablated model.
        threads: CPU threads for the call (``torch.set_num_threads``, torch's setting
            restored when it returns): an int >= 1, ``"auto"`` (the idle cores, at most
            torch's setting: :func:`~vecinterp.choose_threads`), or ``None`` (default:
            torch's setting as it is).

    Returns:
        ``scores [n_layers, n_heads]`` in the model's dtype, or ``(scores, baseline)``
        with ``return_baseline``; ``baseline`` is a 0-dim tensor.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.ablation import head_ablation_sweep
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x, t, pop = torch.randn(4, 6, 3), torch.randn(4, 6, 3), torch.randn(50, 6, 3)
        >>> scores, base = head_ablation_sweep(model, x, t, "mean", population=pop,
        ...                                    progress=False, return_baseline=True)
        >>> scores.shape, base.shape
        (torch.Size([2, 2]), torch.Size([]))
    """
    check_threads("threads", threads)
    with use_threads(threads):
        model = check_model(model)
        pairs = check_heads(model, heads)
        kind = _check_choice(
            default_kind("head_ablation_sweep", "mean") if kind is None else kind, KINDS, "kind"
        )
        hook = _check_choice(hook, _HEAD_HOOKS, "hook")
        check_input(x, model.cfg, model.W_E)
        batch, n_pos, _ = x.shape
        d_out = model.W_U.shape[1]
        if not isinstance(targets, torch.Tensor) or targets.shape != (batch, n_pos, d_out):
            got = (
                tuple(targets.shape)
                if isinstance(targets, torch.Tensor)
                else type(targets).__name__
            )
            raise ValueError(
                f"targets must be [batch, pos, d_out]={(batch, n_pos, d_out)}, got {got}"
            )
        if metric is None:
            # the positions the loss uses must have finite targets (as in direct_attribution;
            # masked-out ones may hold NaN, as masked_mse allows)
            used = loss_positions(loss_mask, (batch, n_pos), x.device)
            check_finite("targets", targets, where=used)

            def metric(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                return masked_mse(output, target, loss_mask)

        elif loss_mask is not None:
            raise ValueError(
                "loss_mask is used by the default metric only; apply it in your metric"
            )
        elif not callable(metric):
            raise TypeError(f"metric must be callable, got {type(metric).__name__}")
        if chunk_size is None:
            chunk_size = _default_chunk_size(model, batch, n_pos, hook, x.device, len(pairs))
        elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

        by_layer: dict[int, list[int]] = {}
        for layer, head in pairs:
            by_layer.setdefault(layer, []).append(head)
        names = {layer: f"blocks.{layer}.attn.hook_{hook}" for layer in by_layer}
        cfg = model.cfg
        scores = torch.full((cfg.n_layers, cfg.n_heads), float("nan"), dtype=model.W_E.dtype)
        with torch.no_grad():
            values = _replacements(
                model, x, kind, list(names.values()), population, resample_source, seed
            )
            width = cfg.d_model if hook == "result" else cfg.d_head
            act_shape = (batch, n_pos, cfg.n_heads, width)
            repl = {
                layer: _fit_replacement(kind, values[name], act_shape, x, name)
                for layer, name in names.items()
            }
            chunks = _pack_heads(by_layer, chunk_size)
            starts = sorted({chunk[0][0] for chunk in chunks})
            resid_names = {layer: f"blocks.{layer}.hook_resid_pre" for layer in starts}
            clean, cache = model.run_with_cache(x, names_filter=list(resid_names.values()))
            baseline = _scalar(metric(clean, targets))
            if not math.isfinite(baseline):
                raise ValueError(
                    f"the metric of the unablated model is {baseline}, so every score would be "
                    "meaningless; check that targets (and what your metric reads) are finite and "
                    "that the model's weights are"
                )
            for chunk in tqdm(chunks, desc="head ablation sweep", disable=not progress):
                k, start = len(chunk), chunk[0][0]
                masks: dict[int, torch.Tensor] = {}
                for c, (layer, head) in enumerate(chunk):
                    if layer not in masks:
                        masks[layer] = torch.zeros(k, cfg.n_heads, dtype=torch.bool)
                    masks[layer][c, head] = True
                fwd_hooks = [
                    (names[layer], _sweep_hook(mask.to(x.device), repl[layer]))
                    for layer, mask in masks.items()
                ]
                resid = cache[resid_names[start]].repeat(k, 1, 1)
                with model.hooks(fwd_hooks=fwd_hooks):
                    out = model(resid, start_at_layer=start)
                out = out.reshape(k, batch, n_pos, d_out)
                for c, (layer, head) in enumerate(chunk):
                    scores[layer, head] = _scalar(metric(out[c], targets))
        scores = scores.to(x.device)
        if return_baseline:
            return scores, torch.tensor(baseline, dtype=scores.dtype, device=x.device)
        return scores


def _pack_heads(by_layer: dict[int, list[int]], chunk_size: int) -> list[list[tuple[int, int]]]:
    """Chunks of at most ``chunk_size`` heads in (layer, head) order; a layer's heads join
    the current chunk only if all fit (else they start a new one, split if too many)."""
    chunks: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    for layer, heads in by_layer.items():
        pending = [(layer, head) for head in heads]
        if current and len(current) + len(pending) > chunk_size:
            chunks.append(current)
            current = []
        while len(current) + len(pending) > chunk_size:
            chunks.append(pending[:chunk_size])
            pending = pending[chunk_size:]
        current += pending
    return [*chunks, current] if current else chunks


def _default_chunk_size(
    model: HookedVectorTransformer,
    batch: int,
    n_pos: int,
    hook: str,
    device: torch.device,
    n_heads: int,
) -> int:
    width = _widest(model.cfg, model.W_U.shape[1], n_pos, hook)
    budget = _SWEEP_ELEMENTS.get(device.type, _SWEEP_ELEMENTS_ACCELERATOR)
    return max(1, min(n_heads, budget // (batch * n_pos * width)))
