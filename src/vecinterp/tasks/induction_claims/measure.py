"""Measuring the claims (:func:`measure_claims`): the eval loss, the detector scores of every
head, the composition of the best pair against its random baseline, two mean ablations."""

from typing import Any

import torch

from ...analysis import (
    ablate_heads,
    attention_patterns,
    composition_baseline,
    composition_scores,
    induction_score,
    mean_ablation_hook,
    mean_activations,
    previous_position_score,
)
from ...loss import masked_mse
from ...model import HookedVectorTransformer
from ...model.config import VectorTransformerConfig
from ...training import evaluate
from .. import induction
from .._common import check_int, seeded_generator
from .judge import judge_claims
from .results import ANALYSIS_SEED, EVAL_SEED, POPULATION_SEED, THRESHOLDS, ClaimsResult

_HOOK_Z = ("blocks.0.attn.hook_z", "blocks.1.attn.hook_z")


def measure_claims(
    model: HookedVectorTransformer,
    *,
    m: int = 10,
    min_m: int = induction.DEFAULT_MIN_M,
    max_m: int = induction.DEFAULT_MAX_M,
    analysis_batch: int = 256,
    population: int = 1000,
    eval_batches: int = 26,
    eval_batch_size: int = 64,
    baseline_samples: int = 1000,
    eval_seed: int = EVAL_SEED,
    analysis_seed: int = ANALYSIS_SEED,
    population_seed: int = POPULATION_SEED,
    baseline_seed: int = 0,
) -> ClaimsResult:
    """Measure the seven claims of the induction-head story on a 2-layer model; judge them.

    Pass the model processed (:func:`vecinterp.process_weights`: LayerNorm folded into
    the readers, exact) if it has LayerNorms: the composition scores read its weights as
    they are. The model is not modified. What is measured (the choices are in
    :mod:`vecinterp.tasks.induction_claims`):

    - ``rel_mse``: :func:`vecinterp.evaluate` on ``fixed_eval_set(eval_batches,
      eval_batch_size, eval_seed, min_m=min_m, max_m=max_m)`` times ``dim``, and the same
      for copying the current vector (``rel_mse_copy_current``);
    - ``heads``: previous-position and induction scores of every head on a batch of
      period ``m`` (``analysis_batch`` sequences), the best layer-0 and layer-1 head, the
      heads reaching ``THRESHOLDS["head_score"]``, and the best induction head's score at
      periods ``min_m`` and ``max_m``;
    - ``composition``: K/Q/V composition of the best pair, their z-scores against
      ``baseline_samples`` random pairs, the layer-0 x layer-1 grids, the pair's rank in
      its column of the K grid and the next best layer-0 writer;
    - ``ablation``: the best induction head's score with the previous-position heads
      mean-ablated (their ``hook_z`` replaced by its per-position mean over ``population``
      sequences of period ``m``), and ``MSE x dim`` on the analysis batch with the
      induction heads (or the previous-position heads) mean-ablated.

    Args:
        model: a 2-layer model with ``d_out == d_in`` and ``n_ctx >= 2 max(m, max_m)``.
        m: the period of the analysis batch and the ablation population (>= 2).
        min_m, max_m: the periods of the eval set (``2 <= min_m <= max_m``).
        analysis_batch: sequences in the analysis batch, and at ``min_m`` and ``max_m``.
        population: sequences whose mean activations replace an ablated head.
        eval_batches, eval_batch_size: the eval set.
        baseline_samples: random pairs of the composition baseline (>= 2).
        eval_seed, analysis_seed, population_seed: seeds of the data (the analysis
            batches at ``min_m`` and ``max_m`` use ``analysis_seed + 1`` and ``+ 2``).
        baseline_seed: seed of the random matrices of the baseline.

    Returns:
        A :class:`ClaimsResult`: the claims, ``values`` (the four groups above, plain
        numbers), ``info`` and the tensors for the figures.

    Raises:
        TypeError: ``model`` is not a :class:`~vecinterp.HookedVectorTransformer`.
        ValueError: a model of another shape, or a size or seed out of range.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import induction, induction_claims as ic
        >>> model = vi.HookedVectorTransformer(induction.model_config(4, 5, d_model=16,
        ...     n_heads=2, d_head=4), seed=0)
        >>> result = ic.measure_claims(vi.process_weights(model), m=4, min_m=3, max_m=5,
        ...     analysis_batch=8, population=8, eval_batches=3, eval_batch_size=4,
        ...     baseline_samples=20)
        >>> [c.number for c in result.claims], result[1].verdict   # an untrained model
        ([1, 2, 3, 4, 5, 6, 7], 'does not hold')
    """
    model = _check_model(model)
    for name, value in (("analysis_batch", analysis_batch), ("population", population)):
        check_int(name, value, minimum=1)
    check_int("eval_batches", eval_batches, minimum=1)
    check_int("eval_batch_size", eval_batch_size, minimum=1)
    check_int("baseline_samples", baseline_samples, minimum=2, why="a standard deviation")
    check_int("m", m, minimum=induction.MIN_M)
    for seed in (eval_seed, analysis_seed, population_seed, baseline_seed):
        seeded_generator(seed)  # refuses a bad seed now, not after minutes of work
    cfg = model.cfg
    dim = cfg.d_in
    kw: dict[str, Any] = dict(dim=dim, dtype=model.W_E.dtype, device=model.W_E.device)
    eval_set = induction.fixed_eval_set(
        eval_batches, eval_batch_size, eval_seed, min_m=min_m, max_m=max_m, **kw
    )  # checks min_m and max_m
    longest = max(m, max_m)
    if 2 * longest > cfg.n_ctx:
        raise ValueError(
            f"the longest sequence has 2 * {longest} = {2 * longest} positions, more than the "
            f"model's n_ctx = {cfg.n_ctx}"
        )
    data: dict[str, Any] = {
        "eval_set": eval_set,
        "batch": induction.generate(analysis_batch, m=m, seed=analysis_seed, **kw),
        "short": induction.generate(analysis_batch, m=min_m, seed=analysis_seed + 1, **kw),
        "long": induction.generate(analysis_batch, m=max_m, seed=analysis_seed + 2, **kw),
        "population": induction.generate(population, m=m, seed=population_seed, **kw).inputs,
    }
    with torch.no_grad():
        rel_mse = evaluate(model, eval_set) * dim
        copy = [masked_mse(b.inputs, b.targets, b.loss_mask).item() for b in eval_set]
    heads, patterns = _head_scores(model, data)
    composition, samples = _composition(model, heads, baseline_samples, baseline_seed)
    values: dict[str, Any] = {
        "rel_mse": rel_mse,
        "rel_mse_copy_current": sum(copy) / len(copy) * dim,
        "heads": heads,
        "composition": composition,
        "ablation": _ablations(model, heads, data["batch"], data["population"]),
    }
    info = {
        "config": describe_model(cfg),
        "dim": dim,
        "sizes": dict(
            m=m,
            min_m=min_m,
            max_m=max_m,
            analysis_batch=analysis_batch,
            population=population,
            eval_batches=eval_batches,
            eval_batch_size=eval_batch_size,
            baseline_samples=baseline_samples,
        ),
        "seeds": dict(
            eval=eval_seed,
            analysis=analysis_seed,
            population=population_seed,
            baseline=baseline_seed,
        ),
    }
    data.update(patterns=patterns, baseline_samples=samples)
    return ClaimsResult(judge_claims(values), values, info, data)


def describe_model(cfg: VectorTransformerConfig) -> str:
    """A one-line description of a model's shape, as the report prints it.

    Example:
        >>> from vecinterp.tasks import induction
        >>> from vecinterp.tasks.induction_claims import describe_model
        >>> describe_model(induction.model_config()).split(", ")[2:]
        ['2 layers x 4 heads (d_head 16)', 'attention only', 'rotary positions', 'n_ctx 32']
    """
    blocks = "attention only" if cfg.attn_only else f"MLPs of width {cfg.d_mlp}"
    return (
        f"d_in {cfg.d_in}, d_model {cfg.d_model}, {cfg.n_layers} layers x {cfg.n_heads} heads "
        f"(d_head {cfg.d_head}), {blocks}, {cfg.positional} positions, n_ctx {cfg.n_ctx}"
    )


def _check_model(model: object) -> HookedVectorTransformer:
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"model must be a HookedVectorTransformer, got {type(model).__name__}")
    cfg = model.cfg
    if cfg.n_layers != 2:
        raise ValueError(
            f"model must have 2 layers (the claims are about layer 0 and layer 1), has "
            f"{cfg.n_layers}"
        )
    if cfg.d_out != cfg.d_in:
        raise ValueError(
            f"model needs d_out == d_in (it predicts the next vector), got {cfg.d_in} -> "
            f"{cfg.d_out}"
        )
    return model


def _scores_at(model: HookedVectorTransformer, batch: induction.InductionBatch) -> torch.Tensor:
    return induction_score(attention_patterns(model, batch.inputs), m=batch.m)


def _head_scores(
    model: HookedVectorTransformer, data: dict[str, Any]
) -> tuple[dict[str, Any], torch.Tensor]:
    """Claims 2 and 3: detector scores of every head, the best head of each kind."""
    batch = data["batch"]
    patterns = attention_patterns(model, batch.inputs)  # [layer, batch, head, dest, src]
    prev = previous_position_score(patterns)  # [n_layers, n_heads]
    ind = induction_score(patterns, m=batch.m)
    thr = THRESHOLDS["head_score"]
    prev_head, ind_head = [0, int(prev[0].argmax())], [1, int(ind[1].argmax())]
    by_m = {
        str(data[k].m): float(_scores_at(model, data[k])[1, ind_head[1]]) for k in ("short", "long")
    }
    heads = {
        "prev_scores": prev.tolist(),
        "induction_scores": ind.tolist(),
        "prev_head": prev_head,
        "induction_head": ind_head,
        "prev_score": float(prev[0, prev_head[1]]),
        "induction_score": float(ind[1, ind_head[1]]),
        "induction_score_by_m": by_m,
        "prev_heads": [[0, h] for h in range(prev.shape[1]) if prev[0, h] >= thr],
        "induction_heads": [[1, h] for h in range(ind.shape[1]) if ind[1, h] >= thr],
    }
    return heads, patterns


def _composition(
    model: HookedVectorTransformer, heads: dict[str, Any], n_samples: int, seed: int
) -> tuple[dict[str, Any], torch.Tensor]:
    """Claims 4 and 5: K/Q/V composition of the pair against the random baseline."""
    h0, h1 = heads["prev_head"][1], heads["induction_head"][1]
    grids = {kind: composition_scores(model, kind=kind)[0, :, 1, :] for kind in ("K", "Q", "V")}
    base = composition_baseline(model, "K", n_samples=n_samples, seed=seed)
    pair = {kind: float(grid[h0, h1]) for kind, grid in grids.items()}
    k01 = grids["K"]  # [layer-0 head, layer-1 head]
    others = k01[:, h1][torch.arange(k01.shape[0]) != h0]  # other writers into the head
    composition = {
        "pair": pair,
        "z": {kind: (value - base.mean) / base.std for kind, value in pair.items()},
        "baseline_mean": base.mean,
        "baseline_std": base.std,
        "baseline_max": float(base.samples.max()),
        "k_grid": k01.tolist(),
        "q_grid": grids["Q"].tolist(),
        "v_grid": grids["V"].tolist(),
        # among the layer-0 heads, how the pair ranks as a writer into the induction head
        "rank_in_column": int((k01[:, h1] > k01[h0, h1]).sum()) + 1,
        "runner_up": float(others.max()) if others.numel() else float("nan"),
    }
    return composition, base.samples


def _ablations(
    model: HookedVectorTransformer,
    heads: dict[str, Any],
    batch: induction.InductionBatch,
    population: torch.Tensor,
) -> dict[str, Any]:
    """Claims 6 and 7: mean-ablate the previous-position heads, then the induction heads."""
    # the detected heads, or the best head when none reaches the threshold
    prev_heads = heads["prev_heads"] or [heads["prev_head"]]
    ind_heads = heads["induction_heads"] or [heads["induction_head"]]
    prev_idx, ind_idx = [h for _, h in prev_heads], [h for _, h in ind_heads]
    means = mean_activations(model, population, list(_HOOK_Z))
    hook = mean_ablation_hook(means[_HOOK_Z[0]], heads=prev_idx)
    with model.hooks(fwd_hooks=[(_HOOK_Z[0], hook)]):
        patterns = attention_patterns(model, batch.inputs)
    best = heads["induction_head"][1]
    score_after = float(induction_score(patterns, m=batch.m)[1, best])
    dim = batch.inputs.shape[-1]

    def rel_mse(out: torch.Tensor) -> float:
        return masked_mse(out, batch.targets, batch.loss_mask).item() * dim

    with torch.no_grad():
        before = rel_mse(model(batch.inputs))
        after = rel_mse(
            ablate_heads(model, batch.inputs, {1: ind_idx}, kind="mean", population=means)
        )
        after_prev = rel_mse(
            ablate_heads(model, batch.inputs, {0: prev_idx}, kind="mean", population=means)
        )
    return {
        "prev_heads": prev_heads,
        "induction_heads": ind_heads,
        "score_before": heads["induction_score"],
        "score_after": score_after,
        "rel_mse_before": before,
        "rel_mse_after": after,
        "rel_mse_after_prev": after_prev,
        "population": int(population.shape[0]),
    }
