"""The induction-head story measured on a trained 2-layer model: seven claims, each with
the numbers behind it and a verdict by explicit thresholds.

The framework paper (Elhage et al. 2021, "A Mathematical Framework for Transformer
Circuits", Transformer Circuits Thread, not on arXiv: transformer-circuits.pub/2021/framework;
its section "Two-Layer Attention-Only Transformers") says a 2-layer attention-only
model solves :mod:`vecinterp.tasks.induction` with two heads: a previous-position head in
layer 0 and an induction head in layer 1 whose keys read what the layer-0 head wrote
(K-composition). :data:`CLAIMS` splits that into seven checkable parts: the loss, the two
heads, their K-composition against random matrices and against Q and V, and two mean
ablations. :func:`measure_claims` computes the numbers with the library's API (the
detectors, :func:`~vecinterp.composition_scores` and
:func:`~vecinterp.composition_baseline`, :func:`~vecinterp.mean_ablation_hook` and
:func:`~vecinterp.ablate_heads`), :func:`judge_claims` turns them into one :class:`Claim`
row per claim with a verdict ("holds" / "partly" / "does not hold") from
:data:`THRESHOLDS`, :func:`claims_table` and :func:`claims_report` render them,
:func:`claim_figures` draws them (matplotlib, the ``plot`` extra) and :func:`save_outputs`
writes ``report.md``, ``results.json`` and the PNGs. :class:`Settings` with the presets
:data:`FULL` and :data:`FAST` holds the sizes of ``examples/induction_heads.py``.

Choices:

- Detector scores are measured on a fixed-period batch (``m``: 10 in :data:`FULL`, 5 in
  :data:`FAST`) of 256 (64) fresh sequences; the induction score of the best head is also
  reported at the shortest and longest training periods. The previous-position score
  scores rows ``1..``, the induction score rows ``m..``
  (:mod:`vecinterp.analysis.detectors`).
- "The" previous-position head is the layer-0 head with the highest previous-position
  score, "the" induction head the layer-1 head with the highest induction score; the heads
  whose scores reach ``THRESHOLDS["head_score"]`` are listed too, and the ablations use all
  of them (falling back to the best head when none reaches it), since a model may spread a
  role over several heads.
- Composition scores read the weights as given: pass the processed model
  (:func:`~vecinterp.process_weights`, LayerNorm folded into the readers); for a rotary
  model they come from the QK circuits at offset 0. The baseline draws 1,000 (300) random
  pairs; ``z = (score - mean) / std``. Random Gaussian matrices are a low bar: trained heads
  read and write a few structured subspaces, and most trained pairs score above it. So
  claim 4 "holds" only if the pair also has the highest K-composition among the layer-0
  heads writing into the induction head.
- Mean ablation replaces a head's ``hook_z`` by its per-position mean over a population of
  1,000 (200) sequences of the analysis period.
- The loss is ``MSE x dim`` on the repeated half (1 = predicting 0): on the eval set
  (every training period, in turn) for claim 1, on the analysis batch for the ablations.

Example::

    import vecinterp as vi
    from vecinterp.tasks import induction_claims as ic

    result = ic.measure_claims(vi.process_weights(trained_model))   # FULL's sizes
    print(ic.claims_table(result))
    ic.save_outputs(result, "outputs/induction_heads")
"""

from . import results as _results
from .figures import claim_figures
from .judge import head_name, judge_claims, level
from .measure import describe_model, measure_claims
from .report import claims_report, claims_table, results_payload, save_outputs
from .results import Claim, ClaimsResult, Settings

# The constants live in .results; bound here again with their docstrings, which is where
# the API reference (autodata on this package) reads them.
HOLDS = _results.HOLDS
"""Verdict: the numbers meet the claim's "holds" threshold (:data:`THRESHOLDS`)."""
PARTLY = _results.PARTLY
"""Verdict: they meet only the weaker "partly" threshold."""
NO = _results.NO
"""Verdict: they meet neither."""
VERDICTS = _results.VERDICTS
"""The three verdicts, best first."""
CLAIMS = _results.CLAIMS
"""``number -> claim``: the framework paper's induction-head story in seven checkable parts."""
THRESHOLDS = _results.THRESHOLDS
"""Every verdict is computed from these numbers (the comments in the source give the
claim). ``head_score`` also decides which heads are listed, and so ablated, as the
previous-position and induction heads."""
FIGURES = _results.FIGURES
"""The names of the figures :func:`claim_figures` makes, in order (``loss`` only with a
training history)."""
EVAL_SEED = _results.EVAL_SEED
"""Seed of the eval set (every period ``min_m .. max_m`` in turn)."""
MONITOR_SEED = _results.MONITOR_SEED
"""Seed of the small eval set watched during training (not used by the claims)."""
ANALYSIS_SEED = _results.ANALYSIS_SEED
"""Seed of the analysis batch (``+ 1`` and ``+ 2``: the shortest and longest period)."""
POPULATION_SEED = _results.POPULATION_SEED
"""Seed of the sequences whose mean activations replace the ablated heads."""
FULL = _results.FULL
"""The default experiment: :func:`vecinterp.tasks.induction.model_config`'s preset trained
with :data:`~vecinterp.tasks.induction.RECIPE`, analysed at period 10."""
FAST = _results.FAST
"""The CI experiment: 8-dim vectors, d_model 32, 2 heads per layer, periods 3..8, 400
steps, small data sets (its numbers are those of a tiny, briefly trained model)."""

__all__ = [
    "ANALYSIS_SEED",
    "CLAIMS",
    "EVAL_SEED",
    "FAST",
    "FIGURES",
    "FULL",
    "HOLDS",
    "MONITOR_SEED",
    "NO",
    "PARTLY",
    "POPULATION_SEED",
    "THRESHOLDS",
    "VERDICTS",
    "Claim",
    "ClaimsResult",
    "Settings",
    "claim_figures",
    "claims_report",
    "claims_table",
    "describe_model",
    "head_name",
    "judge_claims",
    "level",
    "measure_claims",
    "results_payload",
    "save_outputs",
]
