"""Training the scaled-down models and measuring the numbers the claims are judged on
(:func:`train_model`, :func:`measure_claims`)."""

import os
from collections.abc import Sequence
from typing import Any, cast

import torch

from ...analysis import attention_patterns
from ...analysis.emergence import EmergenceTable, emergence
from ...loss import masked_mse
from ...model import HookedVectorTransformer, VectorTransformerConfig
from ...training import TrainResult, train
from .. import retrieval as R
from .circuit import chain_aligned_maps, find_paths, positional_maps, validate_circuit
from .judge import judge_claims
from .results import ANALYSIS_SEED, EVAL_SEED, THRESHOLDS, ChainPath, ClaimsResult, Settings


def model_config(settings: Settings, *, ic: bool = True) -> VectorTransformerConfig:
    """The attention-only model of ``settings`` (IC or non-IC outputs).

    Example:
        >>> from vecinterp.tasks.retrieval_claims import FAST, model_config
        >>> cfg = model_config(FAST, ic=False)
        >>> cfg.n_layers, cfg.d_out, cfg.attn_only
        (3, 4, True)
    """
    s = _check_settings(settings)
    return R.model_config(
        s.depth, s.n_layers, implicit_curriculum=ic, n_chains=s.n_chains, dim=s.dim,
        d_model=s.d_model, n_heads=s.n_heads, attn_only=True,
    )  # fmt: skip


def train_model(
    settings: Settings,
    *,
    ic: bool,
    seed: int = 0,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> TrainResult:
    """Train one attention-only model on fresh batches with the recipe of ``settings``.

    :func:`vecinterp.train` with AdamW (weight decay 0.1, the paper's), lr ``settings.lr``
    with a cosine decay to ``lr / 10``, ``settings.steps`` IC or ``settings.non_ic_steps``
    non-IC steps, a fresh batch of :func:`vecinterp.tasks.retrieval.generate` every step,
    and with ``checkpoint_dir`` a checkpoint every ``settings.checkpoint_every`` steps
    (all kept, for :func:`~vecinterp.analysis.emergence.emergence`). The model is
    initialised with ``seed``, so ``HookedVectorTransformer(model_config(settings), seed)``
    is its step 0.

    Example:
        >>> import dataclasses
        >>> from vecinterp.tasks.retrieval_claims import FAST, train_model
        >>> tiny = dataclasses.replace(FAST, steps=3)
        >>> len(train_model(tiny, ic=True).history.train_loss)
        3
    """
    s = _check_settings(settings)
    if not isinstance(ic, bool):
        raise TypeError(f"ic must be a bool, got {ic!r}")
    model = HookedVectorTransformer(model_config(s, ic=ic), seed=seed)
    kw: dict[str, Any] = dict(n_chains=s.n_chains, dim=s.dim, implicit_curriculum=ic)
    return train(
        model,
        lambda step, gen: R.generate(s.batch_size, s.depth, generator=gen, **kw),
        steps=s.steps if ic else s.non_ic_steps,
        lr=s.lr,
        weight_decay=cast(float, R.PAPER_RECIPE["weight_decay"]),  # the paper's 0.1
        schedule="cosine",
        min_lr=s.lr / 10,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=s.checkpoint_every if checkpoint_dir is not None else None,
        keep_last=None,
        seed=seed,
        device="cpu",
        progress=progress,
    )


def eval_batch(settings: Settings, size: int, seed: int, *, ic: bool = True) -> R.RetrievalBatch:
    """A fixed batch of fresh sequences of ``settings``' task (the same inputs for IC and
    non-IC with one seed).

    Example:
        >>> from vecinterp.tasks.retrieval_claims import FAST, eval_batch
        >>> eval_batch(FAST, 8, seed=0).inputs.shape
        torch.Size([8, 10, 8])
    """
    s = _check_settings(settings)
    return R.generate(
        size, s.depth, n_chains=s.n_chains, dim=s.dim, implicit_curriculum=ic, seed=seed
    )


def track_emergence(
    checkpoints: Any,
    batch: R.RetrievalBatch,
    paths: Sequence[ChainPath],
    *,
    progress: bool = False,
) -> EmergenceTable:
    """The average attention along every path and the partial losses (``x_j`` for every
    step ``j``, and their mean ``loss``) at every checkpoint of an IC run.

    Args:
        checkpoints: anything :func:`~vecinterp.analysis.emergence.emergence` takes: a
            checkpoint directory, or a list of checkpoint folders and ``(step, model)``
            pairs (``vecinterp.train`` does not save step 0: pass ``(0, initial_model)``).
        batch: an IC batch (its chains' positions route every path).
        paths: the paths to follow (:func:`find_paths`).
        progress: show a progress bar.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks.retrieval_claims import FAST, eval_batch, model_config
        >>> from vecinterp.tasks.retrieval_claims import track_emergence
        >>> model = vi.HookedVectorTransformer(model_config(FAST), seed=0)
        >>> table = track_emergence([(0, model)], eval_batch(FAST, 8, seed=0), [])
        >>> table.names
        ['x_1', 'x_2', 'loss']
    """
    if not isinstance(batch, R.RetrievalBatch):
        raise TypeError(f"batch must be a RetrievalBatch, got {type(batch).__name__}")
    pos = batch.role_positions
    specs = {
        p["name"]: (p["layer"], p["head"], pos[:, :, p["dest"]], pos[:, :, p["src"]]) for p in paths
    }

    def losses(model: HookedVectorTransformer) -> dict[str, float]:
        out = model(batch.inputs)
        named = {f"x_{j + 1}": float(v) for j, v in enumerate(R.partial_losses(out, batch))}
        named["loss"] = float(masked_mse(out, batch.targets, batch.loss_mask))
        return named

    return emergence(checkpoints, batch, specs or None, losses, progress=progress)


def crossings(
    table: EmergenceTable, names: Sequence[str], threshold: float, *, above: bool
) -> dict[str, float | None]:
    """The first (interpolated) step each quantity crosses ``threshold``; ``None`` if never.

    Example:
        >>> from vecinterp.analysis.emergence import EmergenceTable
        >>> from vecinterp.tasks.retrieval_claims import crossings
        >>> table = EmergenceTable(((0, "x_1", 1.0), (10, "x_1", 0.0), (0, "x_2", 1.0),
        ...                         (10, "x_2", 0.9)))
        >>> crossings(table, ["x_1", "x_2"], 0.5, above=False)
        {'x_1': 5.0, 'x_2': None}
    """
    return {n: table.crossing_step(n, threshold, above=above) for n in names}


def measure_claims(
    ic_model: HookedVectorTransformer,
    non_ic_model: HookedVectorTransformer,
    settings: Settings,
    checkpoints: Any,
    *,
    sweeps: int = 1,
    progress: bool = False,
) -> ClaimsResult:
    """Measure the six claims on an IC and a non-IC model trained with ``settings``.

    Losses on a fixed validation batch (``settings.eval_size`` sequences, seed
    :data:`EVAL_SEED`, the same inputs for both models); chain-aligned attention maps,
    candidate paths (:func:`find_paths` at ``THRESHOLDS["path"]``) and the emergence
    curves on an analysis batch (``settings.analysis_size``, seed :data:`ANALYSIS_SEED`);
    the circuit by :func:`validate_circuit` on the validation batch; then the curves of the
    circuit's paths and the partial losses over ``checkpoints`` (:func:`track_emergence`)
    and the steps they cross their thresholds.

    Args:
        ic_model: the trained IC model.
        non_ic_model: the trained non-IC model.
        settings: the task and training sizes both were trained with.
        checkpoints: the IC run's checkpoints, as :func:`track_emergence` takes them.
        sweeps: rounds of :func:`validate_circuit`'s step 2.
        progress: show progress bars over the checkpoints.

    Returns:
        A :class:`ClaimsResult`: the judged claims, the ``values`` they were judged on,
        the settings in words, and the maps, patterns and emergence table for the figures.

    Raises:
        ValueError: a model does not fit ``settings``' task.

    Example:
        >>> import dataclasses, vecinterp as vi
        >>> from vecinterp.tasks import retrieval_claims as rc
        >>> s = dataclasses.replace(rc.FAST, eval_size=16, analysis_size=8)
        >>> ic = vi.HookedVectorTransformer(rc.model_config(s), seed=0)
        >>> non_ic = vi.HookedVectorTransformer(rc.model_config(s, ic=False), seed=0)
        >>> result = rc.measure_claims(ic, non_ic, s, [(0, ic)])
        >>> [c.number for c in result.claims], result[1].verdict   # untrained: no
        ([1, 2, 3, 4, 5, 6], 'does not hold')
    """
    s = _check_settings(settings)
    for name, model, ic in (("ic_model", ic_model, True), ("non_ic_model", non_ic_model, False)):
        if not isinstance(model, HookedVectorTransformer):
            raise TypeError(f"{name} must be a HookedVectorTransformer, got {type(model).__name__}")
        want = model_config(s, ic=ic)
        got = model.cfg
        if (got.d_in, got.d_out, got.n_ctx) != (want.d_in, want.d_out, want.n_ctx):
            raise ValueError(
                f"{name} does not fit the task of settings (N = {s.n_chains}, D = {s.depth}, "
                f"K = {s.dim}, {'IC' if ic else 'non-IC'}): d_in, d_out, n_ctx should be "
                f"{want.d_in}, {want.d_out}, {want.n_ctx}, got {got.d_in}, {got.d_out}, "
                f"{got.n_ctx}"
            )
    model, non_ic = ic_model, non_ic_model
    val = eval_batch(s, s.eval_size, EVAL_SEED)
    val_non_ic = eval_batch(s, s.eval_size, EVAL_SEED, ic=False)
    analysis = eval_batch(s, s.analysis_size, ANALYSIS_SEED)
    with torch.no_grad():
        out = model(val.inputs)
        non_ic_out = non_ic(val_non_ic.inputs)
    patterns = attention_patterns(model, analysis.inputs)  # [layer, batch, head, pos, pos]
    maps = chain_aligned_maps(patterns, analysis)
    paths = find_paths(maps, THRESHOLDS["path"])
    validation = validate_circuit(model, val, paths, positional_maps(patterns), sweeps=sweeps)
    table = track_emergence(checkpoints, analysis, paths, progress=progress)
    values: dict[str, Any] = {
        "ic_loss": float(masked_mse(out, val.targets, val.loss_mask)),
        "partial": R.partial_losses(out, val).tolist(),
        "non_ic_loss": float(masked_mse(non_ic_out, val_non_ic.targets, val_non_ic.loss_mask)),
        "non_ic_steps": s.non_ic_steps,
        "checkpoint_every": s.checkpoint_every,
        "n_heads_total": model.cfg.n_layers * model.cfg.n_heads,
        "paths": paths,
        "validation": validation,
        "loss_crossing": crossings(
            table, [f"x_{j + 1}" for j in range(s.depth)], THRESHOLDS["partial"], above=False
        ),
        "path_crossing": crossings(
            table, [p["name"] for p in validation["kept"]], THRESHOLDS["emerge"], above=True
        ),
    }
    data = {"table": table, "role_maps": maps, "patterns": patterns, "analysis_batch": analysis}
    return ClaimsResult(judge_claims(values), values, s.summary(), data)


def _check_settings(settings: object) -> Settings:
    if not isinstance(settings, Settings):
        raise TypeError(
            "settings must be a vecinterp.tasks.retrieval_claims.Settings (FULL, FAST or "
            f"dataclasses.replace of one), got {type(settings).__name__}"
        )
    return settings
