"""Automated circuit discovery on an affine-recurrence model (:func:`discover_affine_circuit`)
and the ``--fast`` settings of the main example (:data:`FAST_MODEL_CONFIG`,
:data:`FAST_SIZES`).

The paper found its circuit by hand; ACDC (:func:`vecinterp.discover_circuit`) asks the
model which residual-stream edges it needs. The setting is the one
``benchmarks/circuit_discovery.py`` and ``docs/howto_circuit_discovery.rst`` report: clean
inputs are recurrences of length 10, corrupted inputs other recurrences (other ``c``, ``d``
and start), the metric is the MSE of the circuit's output to the model's own output at the
scored positions, and the threshold a fraction of that metric with every edge removed.
"""

import torch

from ...analysis.circuit_discovery import CircuitResult, discover_circuit
from ...loss import masked_mse
from ...model import HookedVectorTransformer
from .. import affine_recurrence as ar

FAST_MODEL_CONFIG = {
    **ar.MODEL_CONFIG_KWARGS,
    **dict(d_in=8, d_out=8, d_model=32, d_head=8, n_heads=5, d_mlp=64, n_ctx=16),
}
"""The ``--fast`` model of ``examples/affine_recurrence.py``: 3 layers (the claims are
layer-indexed), 5 heads (claim 11 patches heads 0-4), 8-dim vectors."""

FAST_SIZES = dict(
    analysis_batch=48,
    population=200,
    eval_batches=12,
    eval_batch_size=16,
    sweep_batch_size=8,
    n_random=64,
)
"""Data sizes for a quick run of :func:`~vecinterp.tasks.affine_claims.measure_claims`
(its defaults otherwise): exercises every analysis in seconds; the numbers are noisier."""


def discover_affine_circuit(
    model: HookedVectorTransformer,
    *,
    tau: float = 0.01,
    n: int = 32,
    length: int = 10,
    seed: int = 1,
    progress: bool = False,
) -> CircuitResult:
    """ACDC on an affine-recurrence model, as the docs report it.

    Clean inputs: ``ar.generate(n, length=length, seed=seed)``; corrupted inputs: ``n``
    other recurrences (``seed + 1``). Metric: ``masked_mse(circuit output, model output,
    loss_mask)``; threshold: ``tau`` times that metric for the corrupted model (every edge
    removed).

    Args:
        model: an affine-recurrence model (``d_in`` the vectors' dimension).
        tau: the threshold as a fraction of the fully corrupted metric (> 0).
        n: sequences in each of the two batches.
        length: their length (``3 <= length <= model.cfg.n_ctx``).
        seed: the clean batch's seed; the corrupted batch uses ``seed + 1``.
        progress: show :func:`~vecinterp.discover_circuit`'s progress bar.

    Returns:
        The :class:`~vecinterp.analysis.circuit_discovery.CircuitResult`
        (``plot_circuit(result)`` draws it).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import affine_claims as ac
        >>> model = vi.HookedVectorTransformer(
        ...     vi.VectorTransformerConfig(**ac.FAST_MODEL_CONFIG), seed=0)
        >>> result = ac.discover_affine_circuit(model, n=4)
        >>> result.n_edges, result.n_kept <= result.n_edges
        (370, True)
    """
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not 0 < tau < float("inf"):
        raise ValueError(f"tau must be a positive fraction, got {tau!r}")
    clean, corrupted = (
        ar.generate(
            n,
            length=length,
            dim=model.cfg.d_in,
            seed=s,
            dtype=model.W_E.dtype,
            device=model.W_E.device,
        )
        for s in (seed, seed + 1)
    )
    with torch.no_grad():
        reference = model(clean.inputs)
        scale = float(masked_mse(model(corrupted.inputs), reference, clean.loss_mask))

    def metric(y: torch.Tensor) -> torch.Tensor:
        return masked_mse(y, reference, clean.loss_mask)

    return discover_circuit(
        model,
        clean.inputs,
        corrupted.inputs,
        threshold=tau * scale,
        metric=metric,
        progress=progress,
    )
