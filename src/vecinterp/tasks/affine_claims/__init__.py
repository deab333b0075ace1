"""The claims of Bhargav & Gu (2024, §4) measured on a trained affine-recurrence model,
under every reading the paper's words allow.

The paper (Samarth Bhargav and Alexander Gu, "Interpreting Affine Recurrence Learning in
GPT-style Transformers", 2024, arXiv:2410.17438) makes thirteen claims about its trained
model. Several leave the method open: which vectors, which space (``d_model``,
or the input/output space through ``W_E``/``W_U``), one head or a sum, one head ablated or
all at once, which heads, positions, sequences and thresholds. :func:`measure_claims`
computes each claim under every such reading and :func:`judge_claims` turns the numbers
into one :class:`Claim` per claim: the paper's figure, ours under the **primary** reading,
the alternative readings, and a verdict ("holds", "partly", "does not hold") computed from
the primary reading by the explicit thresholds in :data:`THRESHOLDS`.

How the primary reading is chosen: the one the paper's words name (e.g. "for each
dimension ``0 <= d < d_model``" for claim 6, "removing a particular head" for claim 9,
"heads 0, 1, 2, 3, and 4" for claim 11); where the words name nothing, the one that
matches the form of the reported figure. Each :class:`Claim` states its reason
(``basis``) and what the evidence says under the other readings (``note``), in
particular where no reading reproduces the paper's figure.

Layout: :func:`measure_claims` (model → :class:`ClaimsResult`), :func:`judge_claims`
(numbers → claims; pure, so verdicts can be recomputed from a saved ``values`` dict),
:func:`claims_table` and :func:`robustness_table` (one model, or one column per model),
:func:`claims_report` (the Markdown report) and :func:`claim_figures` (matplotlib, the
``plot`` extra). :func:`checkerboard_contrast` is the parity measure of claim 4 (per sequence too),
:func:`most_attended_earlier_position` the per-head measure of claim 3's averaged readings
and :func:`early_focus_per_sequence` its per-sequence reading; :func:`share_by_c` reports
a per-sequence reading by the recurrence's ``c`` (:data:`C_BINS`);
:func:`previous_vector_fit` fits an estimate on the previous input vector (claim 6's
output-space reading, claim 13's one-regressor slope) and :func:`identity_share` is the
scaled-identity share of a matrix (claim 7). :func:`meets_rule` and
:func:`setup_decision` apply the decision rule for claims 4, 10b and 11 to the models of
one set-up.
:func:`discover_affine_circuit` runs automated circuit discovery (ACDC) on the model, and
:data:`FAST_MODEL_CONFIG` and :data:`FAST_SIZES` are the main example's ``--fast``
settings.

Data (choices where the paper is silent): analyses that read one forward pass (attention,
attribution, geometry, logit lens) use ``analysis_batch`` sequences of the longest training
length, 14; eval MSEs use ``fixed_eval_set(24, 64, seed=10_000)`` (every length 3..14
twice, the set ``examples/train_affine.py`` reports), the mean of per-batch MSEs; single-head
ablations and the alternative QK patches use the first ``sweep_batch_size`` sequences of
each of the first ``sweep_batches`` batches of that set (every length once), each against
its own unablated MSE. Mean ablation (claim 9) replaces an activation by its mean over a
population of the evaluated length: ``population`` sequences in all, stratified over the
eval set's lengths (the per-position statistics depend on the length, because every
sequence is normalised by the largest norm among its own vectors). The model's LayerNorms
and value biases are folded first (:func:`~vecinterp.process_weights`), as the paper did
(§4.1); outputs are unchanged.
"""

from . import circuit as _circuit
from . import decision as _decision
from . import readings as _readings
from . import results as _results
from .circuit import discover_affine_circuit
from .decision import meets_rule, setup_decision
from .figures import claim_figures
from .judge import judge_claims
from .measure import measure_claims
from .patterns import (
    checkerboard_contrast,
    early_focus_per_sequence,
    most_attended_earlier_position,
)
from .readings import identity_share, previous_vector_fit, share_by_c
from .report import claims_report, claims_table, robustness_table
from .results import Claim, ClaimsResult, Reading

# The constants live in .results; bound here again with their docstrings, which is where
# the API reference (autodata on this package) reads them.
HOLDS = _results.HOLDS
"""Verdict: the primary reading meets the paper's figure (by :data:`THRESHOLDS`)."""
PARTLY = _results.PARTLY
"""Verdict: part of the claim, or a weaker form of its figure, holds."""
NO = _results.NO
"""Verdict: the primary reading contradicts the claim."""
VERDICTS = _results.VERDICTS
"""The three verdicts, best first."""
PAPER_QK_HEADS = _results.PAPER_QK_HEADS
"""The layer-2 heads whose QK circuits the paper replaced by a pseudoinverse (§4.6)."""
PAPER_ALPHA = _results.PAPER_ALPHA
"""The paper's layer-0 scale ``α`` (§4.4: slope 2.1–2.5; §4.8, Figure 17: ``a_n + 2.3 a_{n-1}``)."""
CLAIMS = _results.CLAIMS
"""``number -> (claim, the paper's figure)`` for the thirteen claims of the paper's §4.
Claim 10 is judged as two parts (:data:`CLAIM_PARTS`): ``CLAIMS[10]`` is part a."""
CLAIM_PARTS = _results.CLAIM_PARTS
"""``label -> (claim, the paper's figure)`` for the claims judged in parts: claim 10 as
10a (layer-2 OV eigenvalue scores negative) and 10b (identity-like QK in the paper's heads
0-4)."""
THRESHOLDS = _results.THRESHOLDS
"""Every verdict is computed from these numbers (the comments give the claim)."""
FAST_MODEL_CONFIG = _circuit.FAST_MODEL_CONFIG
"""The ``--fast`` model of ``examples/affine_recurrence.py`` (``VectorTransformerConfig``
keywords): 3 layers (the claims are layer-indexed), 5 heads (claim 11 patches heads 0-4),
8-dim vectors."""
FAST_SIZES = _circuit.FAST_SIZES
"""Data sizes for a quick :func:`measure_claims` (``**FAST_SIZES``): every analysis runs in
seconds; the numbers are noisier."""
C_BINS = _readings.C_BINS
"""The bins of the recurrence's ``c`` (drawn uniformly from ``(-2, 2)``) in which the
per-sequence readings of claims 3 and 4 are reported."""
EXPLAINED = _decision.EXPLAINED
"""Decision of :func:`setup_decision`: every model of the set-up meets the rule."""
SEED_DEPENDENT = _decision.SEED_DEPENDENT
"""Decision of :func:`setup_decision`: some models of the set-up meet the rule, some not."""
NOT_REPRODUCED = _decision.NOT_REPRODUCED
"""Decision of :func:`setup_decision`: no model of the set-up meets the rule."""
FIGURES = _results.FIGURES
"""The names of the figures :func:`~vecinterp.tasks.affine_claims.claim_figures` makes, in
order (``loss`` only with a training history)."""

__all__ = [
    "CLAIMS",
    "CLAIM_PARTS",
    "C_BINS",
    "EXPLAINED",
    "FAST_MODEL_CONFIG",
    "FAST_SIZES",
    "FIGURES",
    "HOLDS",
    "NO",
    "NOT_REPRODUCED",
    "PAPER_ALPHA",
    "PAPER_QK_HEADS",
    "PARTLY",
    "SEED_DEPENDENT",
    "THRESHOLDS",
    "VERDICTS",
    "Claim",
    "ClaimsResult",
    "Reading",
    "checkerboard_contrast",
    "claim_figures",
    "claims_report",
    "claims_table",
    "discover_affine_circuit",
    "early_focus_per_sequence",
    "identity_share",
    "judge_claims",
    "meets_rule",
    "measure_claims",
    "most_attended_earlier_position",
    "previous_vector_fit",
    "robustness_table",
    "setup_decision",
    "share_by_c",
]
