"""Ablation: replace activations of heads, MLPs, layers or positions, or attention patterns,
and see what the outputs do.

Three kinds of replacement ``r`` for an activation ``a`` of input ``x`` (shape
``[batch, pos, ...]``):

- ``"zero"``: ``r = 0``.
- ``"mean"``: ``r[b, p] = (1/N) Σ_n a(population_n)[p]``, the mean over a population of
  ``N`` input sequences, **per position** ``p`` (position 3 gets the mean of position 3;
  positions are never pooled). An input with fewer positions than the population uses
  the first ``pos`` positions of the mean; for a causal model that is exactly the mean a
  population cut to ``pos`` positions would give, for a non-causal one the population's
  later positions also shaped it. An input with more positions than the population is
  an error.
- ``"resample"``: ``r[b, p] = a(x'_b)[p]``, the activation of another input ``x'`` of the
  same shape as ``x``: ``resample_source`` if given, else ``batch`` sequences drawn from
  the population without replacement (the first ``batch`` items of a random
  permutation seeded by ``seed``, cut to ``pos`` positions).

What can be ablated: heads (a head's slice of ``attn.hook_z``, the default, or of
``attn.hook_result``: :func:`ablate_heads`); any activation whose axis 1 is ``pos``, at
every position or only at some (an MLP: ``("mlp_out", layer)``; a whole layer:
``[("attn_out", layer), ("mlp_out", layer)]``; the residual stream at positions 2 and 3:
``("resid_pre", layer)`` with ``positions=[2, 3]``: :func:`ablate`); attention patterns
(uniform, identity, previous-position or a given map, as in Musat (2024), the retrieval
paper: :func:`ablate_patterns`). The hook factories (:func:`zero_ablation_hook`,
:func:`mean_ablation_hook`, :func:`resample_ablation_hook`, :func:`pattern_ablation_hook`)
return hooks for ``model.hooks(...)`` / ``run_with_hooks`` to combine with other
interventions.

:func:`head_ablation_sweep` ablates every head alone and returns a metric per head, in
batched passes (see its docstring). Every function leaves the model as it found it
(no weight edited, no hook left, also when something raises) and runs under
``torch.no_grad()``.

The code lives in four modules, all re-exported here (this module is the public path):
:mod:`.ablation_hooks` (the hook factories, :func:`mean_activations` and the replacements),
:mod:`.component_ablation` (:func:`ablate_heads`, :func:`ablate`), :mod:`.pattern_ablation`
(:func:`pattern_ablation_hook`, :func:`ablate_patterns`) and :mod:`.ablation_sweep`
(:func:`head_ablation_sweep`); their shared private helpers are in ``_ablation_common``.
"""

# Private names too: they were importable from this module before the split and stay so.
from ._ablation_common import (  # noqa: F401
    _HEAD_HOOKS,
    KINDS,
    Population,
    _axis_mask,
    _check_choice,
    _index_list,
)
from .ablation_hooks import (  # noqa: F401
    _ablation_hook,
    _fit_replacement,
    _replacements,
    _selection_mask,
    mean_ablation_hook,
    mean_activations,
    resample_ablation_hook,
    zero_ablation_hook,
)
from .ablation_sweep import (  # noqa: F401
    _SWEEP_ELEMENTS,
    _SWEEP_ELEMENTS_ACCELERATOR,
    Metric,
    _default_chunk_size,
    _pack_heads,
    _scalar,
    _sweep_hook,
    head_ablation_sweep,
)
from .component_ablation import _component_names, ablate, ablate_heads  # noqa: F401
from .pattern_ablation import (  # noqa: F401
    _ROW_SUM_TOL,
    PATTERN_KINDS,
    _check_pattern_kind,
    _pattern_matrix,
    ablate_patterns,
    pattern_ablation_hook,
)

__all__ = [
    "ablate",
    "ablate_heads",
    "ablate_patterns",
    "head_ablation_sweep",
    "mean_ablation_hook",
    "mean_activations",
    "pattern_ablation_hook",
    "resample_ablation_hook",
    "zero_ablation_hook",
]
