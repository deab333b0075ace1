"""The claims of Mușat (2024), "Mechanism and Emergence of Stacked Attention Heads in
Multi-Layer Transformers" (arXiv:2411.12118), measured on small models trained
on the retrieval problem (:mod:`vecinterp.tasks.retrieval`), each judged by explicit
thresholds.

The paper finds:

1. with the implicit curriculum (IC: the target is ``x_1 .. x_D``) the model learns;
2. without it (non-IC: the target is ``x_D`` only) it does not (loss above 0.7);
3. the partial losses fall below 0.5 in chain order, ``x_1`` first (§7.2);
4. a few heads carry the chain, the others are idle (§8.2);
5. replacing every idle head's attention map by uniform or identity attention and every
   carrying head's by a one-hot map along its paths, all at once, keeps the loss low
   (Appendix E);
6. the circuit's heads emerge during training one by one, with the partial losses
   (average attention along the path above 0.5, §9).

Layout: :func:`train_model` (the scaled-down recipe of :class:`Settings`: :data:`FULL`
or :data:`FAST`), :func:`measure_claims` (two trained models and the IC run's checkpoints
→ :class:`ClaimsResult`), :func:`judge_claims` (numbers → :class:`Claim` rows; pure, so
the verdicts can be recomputed from a saved ``values`` dict), :func:`claims_table` and
:func:`claims_report` (Markdown), :func:`claim_figures` (matplotlib, the ``plot`` extra).
Seed sweeps (:func:`run_sweep`: an IC and a non-IC :func:`vecinterp.train_ensemble`, every
seed measured as above, :class:`SweepRow`, :func:`summarize_sweep`, :func:`sweep_table`)
turn the claims about every run, emergence order included, into measured fractions.
The circuit analysis is usable on its own: :func:`chain_aligned_maps` /
:func:`role_maps`, :func:`find_paths`, :func:`one_hot_map`, :func:`positional_maps`,
:func:`validate_circuit`, :func:`track_emergence`.

Example::

    from pathlib import Path
    import vecinterp as vi
    from vecinterp.tasks import retrieval_claims as rc

    s = rc.FAST
    ic = rc.train_model(s, ic=True, checkpoint_dir="runs/ic")
    non_ic = rc.train_model(s, ic=False)
    initial = vi.HookedVectorTransformer(rc.model_config(s), seed=0)  # step 0
    result = rc.measure_claims(ic.model, non_ic.model, s,
                               [(0, initial), *sorted(Path("runs/ic").glob("step_*"))])
    print(rc.claims_table(result))

Choices where the paper is silent
---------------------------------
- Chain-aligned attention map of head ``(l, h)``: ``M[r, s] = mean_{b, c} A[b, h,
  pos(b, c, r), pos(b, c, s)]`` over the roles ``L0 R0 L1 R1 .. Q`` of a chain (``L_i``:
  ``x_i`` in pair ``i``, ``R_i``: ``x_{i+1}`` in pair ``i``, ``Q``: the query; positions
  from :attr:`~vecinterp.tasks.retrieval.RetrievalBatch.role_positions`). A head
  *carries* the path ``r -> s`` (``s != r``) if ``M[r, s] >= THRESHOLDS["path"]``: on
  average it puts that share of its attention from every chain's ``r`` token on the same
  chain's ``s`` token.
- Hypotheses for a head's map (:data:`CANDIDATES`, simplest first; per sequence
  ``[batch, pos, pos]`` for :func:`vecinterp.ablate_patterns`): uniform (causal) or
  identity attention (idle); one-hot from each of its ``r`` tokens to the same chain's
  ``s`` token for its paths, identity rows elsewhere; or the same with *positional*
  one-hot rows elsewhere (each row on the position the head attends to most on average;
  the layout of positions is fixed, only the chains move), which for a head without paths
  is a purely positional head such as a previous-token head.
- A loss is "low" if at most ``limit = max(0.05, 1.5 x the unablated loss)`` (the paper's
  0.05, loosened for a model that is not that good). Each head gets the hypothesis with
  the lowest loss when that head alone is replaced; then all heads are replaced at once;
  then heads with one-hot maps are made idle one at a time, most dispensable first, while
  the combined loss stays at most ``max(limit, the combined loss before)`` (the paper's
  "simplest mechanism that maintains a low validation loss"). The heads left with
  one-hot maps along chain paths carry the chain.
- Removing a circuit path (its rows back to identity) from the final combined ablation
  shows whether it is needed; a path that another head duplicates is not.
- Losses are measured on one fixed validation batch of fresh sequences
  (:data:`EVAL_SEED`), the maps and emergence curves on a smaller one
  (:data:`ANALYSIS_SEED`); a path "emerges" at the first step its average attention
  exceeds 0.5, interpolated linearly between checkpoints (§9).

How :data:`FULL` scales the paper down (§7.1: ``N = 4``, ``K = 4``, ``D`` = 3 to 5, 8
heads, ``d_model`` 128, GPT-2 blocks, 1-8 layers, Adam lr 1e-3 with weight decay 0.1,
batch 512, 10k steps on 2^20 fixed sequences): ``N = 4`` and ``K = 4`` as in the paper
but ``D = 2``; 4 attention-only layers (no MLPs, as the paper's Transformer D of §9) of 4
heads, ``d_model`` 64; AdamW with weight decay 0.1 at lr 3e-3 with a cosine decay to 3e-4
(1e-3 had not learnt ``x_2`` after 600 steps; gradient clipping at 1 kept ``x_2`` from
being learnt within 1,200 steps); batch 128; 1,000 IC steps (a checkpoint every 25) and
600 non-IC steps on fresh sequences. ``D = 3`` did not train in this budget: ``x_2`` and
``x_3`` stayed at 0.75 (the loss of averaging the four chains' candidates) for 1,500
steps, the paper's slow phase before the heads emerge. :data:`FAST` trains 3-layer models
of width 32 on two chains for 300 steps: it exercises the plumbing, its numbers say
nothing about the paper's claims.
"""

from . import results as _results
from .circuit import (
    chain_aligned_maps,
    find_paths,
    one_hot_map,
    positional_maps,
    role_maps,
    validate_circuit,
)
from .figures import claim_figures, position_labels
from .judge import emergence_groups, judge_claims
from .measure import (
    crossings,
    eval_batch,
    measure_claims,
    model_config,
    track_emergence,
    train_model,
)
from .report import claims_report, claims_table
from .results import ChainPath, Claim, ClaimsResult, Settings
from .sweep import (
    SweepResult,
    SweepRow,
    emergence_order,
    run_sweep,
    summarize_sweep,
    sweep_row,
    sweep_table,
    train_sweep,
    write_sweep_csv,
)

# The constants live in .results; bound here again with their docstrings, which is where
# the API reference (autodata on this package) reads them.
HOLDS = _results.HOLDS
"""Verdict: our number meets the paper's claim (by :data:`THRESHOLDS`)."""
PARTLY = _results.PARTLY
"""Verdict: part of the claim, or a weaker form of it, holds."""
NO = _results.NO
"""Verdict: our number contradicts the claim."""
VERDICTS = _results.VERDICTS
"""The three verdicts, best first."""
THRESHOLDS = _results.THRESHOLDS
"""Every verdict is computed from these numbers (see :func:`judge_claims`)."""
CLAIMS = _results.CLAIMS
"""``number -> (claim, the paper's figure)`` for the six claims checked; ``{name}`` stands
for ``THRESHOLDS[name]``."""
CANDIDATES = _results.CANDIDATES
"""Hypotheses for a head's attention map, simplest first: idle (uniform or identity),
one-hot along its chain paths with identity rows elsewhere, or with positional one-hot
rows elsewhere."""
IDLE = _results.IDLE
"""The hypotheses of :data:`CANDIDATES` under which a head is idle."""
FIGURES = _results.FIGURES
"""The names of the figures :func:`claim_figures` makes, in order (``loss`` only with the
training histories)."""
EVAL_SEED = _results.EVAL_SEED
"""Seed of the fixed validation batch (losses and ablations)."""
ANALYSIS_SEED = _results.ANALYSIS_SEED
"""Seed of the analysis batch (attention maps and emergence curves)."""
FULL = _results.FULL
"""The paper's task scaled down to minutes on a CPU (``N = K = 4``, ``D = 2``; 4 layers of
4 heads, ``d_model`` 64; 1,000 IC and 600 non-IC steps at batch 128, lr 3e-3). Not every
seed learns in 1,000 IC steps: 10 of seeds 0-15 did (the other 6 never learned ``x_2``;
``--sweep 16`` in ``docs/tasks_retrieval.rst``), seeds 0 and 1 among them."""
FAST = _results.FAST
"""A CI-sized run (two chains, 3 layers of 2 heads, width 32, 300 steps): it exercises the
plumbing, its numbers say nothing about the paper's claims."""

__all__ = [
    "ANALYSIS_SEED",
    "CANDIDATES",
    "CLAIMS",
    "EVAL_SEED",
    "FAST",
    "FIGURES",
    "FULL",
    "HOLDS",
    "IDLE",
    "NO",
    "PARTLY",
    "THRESHOLDS",
    "VERDICTS",
    "ChainPath",
    "Claim",
    "ClaimsResult",
    "Settings",
    "SweepResult",
    "SweepRow",
    "chain_aligned_maps",
    "claim_figures",
    "claims_report",
    "claims_table",
    "crossings",
    "emergence_groups",
    "emergence_order",
    "eval_batch",
    "find_paths",
    "judge_claims",
    "measure_claims",
    "model_config",
    "one_hot_map",
    "position_labels",
    "positional_maps",
    "role_maps",
    "run_sweep",
    "summarize_sweep",
    "sweep_row",
    "sweep_table",
    "track_emergence",
    "train_model",
    "train_sweep",
    "validate_circuit",
    "write_sweep_csv",
]
