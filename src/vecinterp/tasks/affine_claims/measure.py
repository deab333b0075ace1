"""Measuring the claims: one forward pass per data set, every reading from it
(:func:`measure_claims`), calling the per-pass analyses of ``analyses.py`` in order."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ...model import HookedVectorTransformer
from ...model.processing import process_weights
from .. import affine_recurrence as ar
from .analyses import (
    _ablation,
    _attention,
    _attribution,
    _by_length,
    _eigen,
    _eval_run,
    _geometry,
    _lens,
    _mean,
    _mse,
    _qk_patch,
)
from .judge import judge_claims
from .results import ClaimsResult, Progress


class _Timer:
    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.timings[label] = time.perf_counter() - start
        if self.progress is not None:
            self.progress(label, self.timings[label])


def _check_model_for_claims(model: object) -> HookedVectorTransformer:
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"model must be a HookedVectorTransformer, got {type(model).__name__}")
    cfg = model.cfg
    if cfg.n_layers < 3:
        raise ValueError(
            f"model needs at least 3 layers (claims on layers 0-2), has {cfg.n_layers}"
        )
    if model.W_U.shape[1] != cfg.d_in:
        raise ValueError(
            f"model needs d_out == d_in (the next vector), got {cfg.d_in} -> {model.W_U.shape[1]}"
        )
    if cfg.n_ctx < ar.DEFAULT_MAX_LEN:
        raise ValueError(f"model needs n_ctx >= {ar.DEFAULT_MAX_LEN}, has {cfg.n_ctx}")
    if cfg.attn_only or cfg.d_mlp is None:
        raise ValueError("model needs MLPs (claim 12 attributes them)")
    return model


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def measure_claims(
    model: HookedVectorTransformer,
    *,
    analysis_batch: int = 512,
    population: int = 1000,
    eval_batches: int = 24,
    eval_batch_size: int = 64,
    sweep_batches: int = 12,
    sweep_batch_size: int = 16,
    n_random: int = 256,
    eval_seed: int = 10_000,
    analysis_seed: int = 20_000,
    population_seed: int = 30_000,
    qk_seed: int = 0,
    normalise: str = "inputs",
    progress: Progress | None = None,
) -> ClaimsResult:
    """Measure the paper's thirteen claims on ``model`` under every reading; judge them.

    The model is copied and processed (LayerNorm and value biases folded, writers
    centred; outputs unchanged) as the paper did; the one given is not modified. Each
    analysis reports its label and duration to ``progress`` when it ends.

    Args:
        model: a trained affine-recurrence model: at least 3 layers, ``d_out == d_in``,
            ``n_ctx >= 14``, MLPs. Claim 11 patches the heads of :data:`PAPER_QK_HEADS`
            that exist.
        analysis_batch: sequences of length 14 for the single-pass analyses.
        population: sequences whose per-position means replace the ablated heads (the
            paper's 1,000), stratified by length: ``population // L`` sequences of each of
            the ``L`` lengths the eval set has, each evaluated sequence ablated with the
            means of its own length (the statistics depend on the length, since every
            sequence is normalised by its own largest norm). Seeds
            ``population_seed + length``.
        eval_batches, eval_batch_size: the eval set, ``fixed_eval_set(eval_batches,
            eval_batch_size, seed=eval_seed)`` (claims 1, 9 joint, 11 primary).
        sweep_batches, sweep_batch_size: the part of the eval set the single-head
            ablations and the alternative QK patches use (the first ``sweep_batch_size``
            sequences of the first ``sweep_batches`` batches).
        n_random: random vectors for claim 7.
        eval_seed, analysis_seed, population_seed: seeds of the three data sets (none is
            one that training streams use).
        qk_seed: seed of the random ``Q`` of the pseudoinverse patch.
        normalise: how every data set is normalised
            (:data:`~vecinterp.tasks.affine_recurrence.NORMALISATIONS`): judge a model on
            data normalised the way it was trained.
        progress: ``progress(label, seconds)``, called after each analysis.

    Returns:
        A :class:`ClaimsResult`.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import affine_claims as ac
        >>> cfg = vi.VectorTransformerConfig(d_in=4, d_model=16, d_head=4, n_heads=5,
        ...                                  n_layers=3, d_mlp=32, n_ctx=16)
        >>> result = ac.measure_claims(vi.HookedVectorTransformer(cfg, seed=0),
        ...     analysis_batch=8, population=8, eval_batches=3, eval_batch_size=2,
        ...     sweep_batches=1, n_random=4)
        >>> [c.label for c in result.claims][9:11]
        ['10a', '10b']
        >>> result[6].primary.name, [r.name for r in result[6].alternatives][-1]
        ('d_model', 'output_lens')
    """
    original = _check_model_for_claims(model)
    sizes = dict(
        analysis_batch=_positive_int("analysis_batch", analysis_batch),
        population=_positive_int("population", population),
        eval_batches=_positive_int("eval_batches", eval_batches),
        eval_batch_size=_positive_int("eval_batch_size", eval_batch_size),
        sweep_batches=min(_positive_int("sweep_batches", sweep_batches), eval_batches),
        sweep_batch_size=min(_positive_int("sweep_batch_size", sweep_batch_size), eval_batch_size),
        n_random=_positive_int("n_random", n_random),
    )
    if normalise not in ar.NORMALISATIONS:
        raise ValueError(f"normalise must be one of {ar.NORMALISATIONS}, got {normalise!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable(label, seconds) or None, got {progress!r}")
    timer = _Timer(progress)
    v: dict[str, Any] = {}
    data: dict[str, Any] = {}
    with torch.no_grad():
        with timer("fold LayerNorm and value biases"):
            net = process_weights(original)
            net.eval()
        cfg = net.cfg
        kw: dict[str, Any] = dict(
            dim=cfg.d_in, dtype=net.W_E.dtype, device=net.W_E.device, normalise=normalise
        )
        v.update(n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model, d_in=cfg.d_in)
        v["normalise"] = normalise

        with timer("claim 1: eval MSE (eval set)"):
            eval_set = ar.fixed_eval_set(
                sizes["eval_batches"], sizes["eval_batch_size"], seed=eval_seed, **kw
            )
            runs = [_eval_run(net, b) for b in eval_set]
            v["mse"] = _mean([_mse(r.out, r.batch) for r in runs])
            _by_length(v, runs)

        with timer("claims 2-5, 12, 13: one pass over the analysis batch"):
            batch = ar.generate(
                sizes["analysis_batch"], length=ar.DEFAULT_MAX_LEN, seed=analysis_seed, **kw
            )
            _, cache = net.run_with_cache(batch.inputs)
            patterns = torch.stack([cache["pattern", ell] for ell in range(cfg.n_layers)])
            _attention(v, patterns, batch, runs)
            _attribution(v, data, net, cache, batch)
            _lens(v, data, net, cache, batch)
            data.update(patterns=patterns, batch=batch)

        with timer("claims 6-8: layer-0 OV geometry"):
            _geometry(v, data, net, original, cache, batch, sizes["n_random"])

        with timer("claim 10: eigenvalue scores"):
            _eigen(v, data, net, original)

        with timer(f"claim 9: mean ablation of layer 1 (population {population})"):
            lengths = sorted({r.batch.length for r in runs})
            per_length = max(1, sizes["population"] // len(lengths))
            pops = {  # stratified: each length's means from sequences of that length
                n: ar.generate(per_length, length=n, seed=population_seed + n, **kw).inputs
                for n in lengths
            }
            _ablation(v, data, net, runs, pops, sizes)

        with timer("claim 11: pseudoinverse QK patches"):
            _qk_patch(v, net, runs, sizes, qk_seed)

    v["sizes"] = sizes
    info = dict(
        config=(
            f"d_in {cfg.d_in}, d_model {cfg.d_model}, {cfg.n_layers} layers x {cfg.n_heads} "
            f"heads (d_head {cfg.d_head}), d_mlp {cfg.d_mlp}"
        ),
        sizes=sizes,
        seeds=dict(eval=eval_seed, analysis=analysis_seed, population=population_seed, qk=qk_seed),
        normalise=normalise,
    )
    return ClaimsResult(judge_claims(v), v, timer.timings, info, data)
