"""The claims, the thresholds that judge them, the experiment settings and the result types
of :mod:`vecinterp.tasks.induction_claims`."""

import math
from dataclasses import dataclass, field
from typing import Any

from ...model.config import VectorTransformerConfig
from .. import induction
from .._common import check_int

HOLDS = "holds"
"""Verdict: the numbers meet the claim's "holds" threshold (:data:`THRESHOLDS`)."""
PARTLY = "partly"
"""Verdict: they meet only the weaker "partly" threshold."""
NO = "does not hold"
"""Verdict: they meet neither."""
VERDICTS = (HOLDS, PARTLY, NO)
"""The three verdicts, best first."""

CLAIMS: dict[int, str] = {
    1: "the model predicts the repeated half (eval MSE x dim; predicting 0 scores 1)",
    2: "layer 0 has a previous-position head",
    3: "layer 1 has an induction head (attends to the vector after the previous occurrence)",
    4: "their K-composition stands out from random matrices",
    5: "K-composition, not Q or V, connects the pair",
    6: "the induction head needs the previous-position head(s): mean-ablate them",
    7: "the prediction needs the induction head(s): mean-ablate them",
}
"""``number -> claim``: the framework paper's induction-head story in seven checkable parts."""

THRESHOLDS: dict[str, float] = dict(
    rel_mse_holds=0.05,  # claim 1: MSE x dim on the repeated half (predicting 0 scores 1)
    rel_mse_partly=0.5,
    head_score=0.5,  # claims 2, 3: a head "is" a previous-position / induction head
    head_score_partly=0.3,
    z_holds=5.0,  # claim 4: K-composition of the pair, std above the random baseline (and
    # "holds" also needs the pair to be the top layer-0 writer into the induction head)
    z_partly=2.0,
    ablated_score_holds=0.5,  # claim 6: induction score after / before ablating layer 0
    ablated_score_partly=0.8,
    ablated_mse_holds=0.5,  # claim 7: MSE x dim after ablating the induction heads ...
    ablated_mse_partly=0.2,
    ablated_mse_rise_holds=10.0,  # ... and at least this many times the unablated one (a
    ablated_mse_rise_partly=3.0,  # model that never learnt has a high loss either way)
)
"""Every verdict is computed from these numbers (the comments give the claim).
``head_score`` also decides which heads are listed, and so ablated, as the
previous-position and induction heads."""

FIGURES = ("loss", "patterns", "attention_all_heads", "head_scores", "composition")
"""The names of the figures :func:`~vecinterp.tasks.induction_claims.claim_figures` makes,
in order (``loss`` only with a training history)."""

EVAL_SEED = 10_000
"""Seed of the eval set (every period ``min_m .. max_m`` in turn)."""
MONITOR_SEED = 10_001
"""Seed of the small eval set watched during training (not used by the claims)."""
ANALYSIS_SEED = 20_000
"""Seed of the analysis batch (``+ 1`` and ``+ 2``: the shortest and longest period)."""
POPULATION_SEED = 30_000
"""Seed of the sequences whose mean activations replace the ablated heads."""


@dataclass(frozen=True)
class Settings:
    """Model, training and analysis sizes of one run of the induction experiment.

    Attributes:
        dim: vector dimension (``d_in = d_out``).
        min_m, max_m: the periods drawn during training (and covered by the eval set).
        d_model, n_heads, d_head: the model's widths (2 layers, attention only).
        steps, batch_size, lr, warmup_steps: training (the rest is
            :data:`vecinterp.tasks.induction.RECIPE`'s).
        analysis_m: the fixed period of the analysis batch.
        analysis_batch: sequences in the analysis batch (and at the shortest and longest
            period).
        population: sequences whose mean ``hook_z`` replaces an ablated head.
        eval_batches, eval_batch_size: the eval set.
        baseline_samples: random matrix pairs of the composition baseline.

    Example:
        >>> from vecinterp.tasks.induction_claims import FAST
        >>> FAST.model_config().d_model, FAST.recipe(steps=50)["warmup_steps"]
        (32, 20)
        >>> FAST.measure_kwargs()["m"]
        5
    """

    dim: int
    min_m: int
    max_m: int
    d_model: int
    n_heads: int
    d_head: int
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    analysis_m: int
    analysis_batch: int
    population: int
    eval_batches: int
    eval_batch_size: int
    baseline_samples: int

    def __post_init__(self) -> None:
        for name in ("dim", "d_model", "n_heads", "d_head", "steps", "batch_size"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("analysis_batch", "population", "eval_batches", "eval_batch_size"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("baseline_samples", self.baseline_samples, minimum=2)
        check_int("warmup_steps", self.warmup_steps, minimum=0)
        check_int("min_m", self.min_m, minimum=induction.MIN_M)
        check_int("max_m", self.max_m, minimum=self.min_m, why=f"min_m is {self.min_m}")
        check_int("analysis_m", self.analysis_m, minimum=induction.MIN_M)
        if self.analysis_m > self.max_m:
            raise ValueError(f"analysis_m must be <= max_m = {self.max_m}, got {self.analysis_m}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")

    def model_config(self) -> VectorTransformerConfig:
        """The 2-layer attention-only model, :func:`vecinterp.tasks.induction.model_config`."""
        return induction.model_config(
            self.dim, self.max_m, d_model=self.d_model, n_heads=self.n_heads, d_head=self.d_head
        )

    def recipe(
        self, *, steps: int | None = None, lr: float | None = None, batch_size: int | None = None
    ) -> dict[str, Any]:
        """:data:`~vecinterp.tasks.induction.RECIPE` with these sizes (or the ones given).

        ``batch_size`` is for :func:`~vecinterp.tasks.induction.generate`, the rest keyword
        arguments of :func:`vecinterp.train`. The warm-up is cut to ``steps``; the final
        learning rate keeps the recipe's ratio to the peak.
        """
        r = induction.RECIPE
        steps = steps or self.steps
        lr = lr or self.lr
        return dict(
            r,
            steps=steps,
            batch_size=batch_size or self.batch_size,
            lr=lr,
            warmup_steps=min(self.warmup_steps, steps),
            min_lr=lr * r["min_lr"] / r["lr"],
        )

    def measure_kwargs(self) -> dict[str, int]:
        """The data sizes as keyword arguments of
        :func:`~vecinterp.tasks.induction_claims.measure_claims`."""
        return dict(
            m=self.analysis_m,
            min_m=self.min_m,
            max_m=self.max_m,
            analysis_batch=self.analysis_batch,
            population=self.population,
            eval_batches=self.eval_batches,
            eval_batch_size=self.eval_batch_size,
            baseline_samples=self.baseline_samples,
        )


_R = induction.RECIPE
FULL = Settings(
    dim=induction.DEFAULT_DIM,
    min_m=induction.DEFAULT_MIN_M,
    max_m=induction.DEFAULT_MAX_M,
    d_model=64,
    n_heads=4,
    d_head=16,
    steps=_R["steps"],
    batch_size=_R["batch_size"],
    lr=_R["lr"],
    warmup_steps=_R["warmup_steps"],
    analysis_m=10,
    analysis_batch=256,
    population=1000,
    eval_batches=26,  # every period 4..16 twice
    eval_batch_size=64,
    baseline_samples=1000,
)
FAST = Settings(
    dim=8,
    min_m=3,
    max_m=8,
    d_model=32,
    n_heads=2,
    d_head=8,
    steps=400,
    batch_size=32,
    lr=5e-3,
    warmup_steps=20,
    analysis_m=5,
    analysis_batch=64,
    population=200,
    eval_batches=12,
    eval_batch_size=32,
    baseline_samples=300,
)


@dataclass(frozen=True)
class Claim:
    """One row of the results table.

    Attributes:
        number: 1..7, as in :data:`CLAIMS`.
        claim: the claim in words.
        ours: what we measured, formatted.
        value: the number the verdict rests on.
        verdict: one of :data:`VERDICTS`, from ``value`` (and the row's other numbers) by
            :data:`THRESHOLDS`.

    Example:
        >>> from vecinterp.tasks.induction_claims import Claim
        >>> c = Claim(2, "layer 0 has a previous-position head", "L0H1: score 0.865", 0.865,
        ...           "holds")
        >>> c.number, c.verdict
        (2, 'holds')
    """

    number: int
    claim: str
    ours: str
    value: float
    verdict: str


@dataclass
class ClaimsResult:
    """What :func:`~vecinterp.tasks.induction_claims.measure_claims` returns.

    Attributes:
        claims: the seven :class:`Claim` rows, in order.
        values: every number measured (JSON-serialisable, heads as ``[layer, head]``
            lists and the periods of ``induction_score_by_m`` as strings, so that a JSON
            round trip gives back an equal dict;
            :func:`~vecinterp.tasks.induction_claims.judge_claims` rebuilds ``claims``
            from it).
        info: the model's shape (``config``, ``dim``) and the data sizes and seeds used.
        data: tensors for the figures (``patterns``, ``batch``, ``population``,
            ``baseline_samples``; not serialised).

    Example:
        >>> import json
        >>> from vecinterp.tasks.induction_claims import ClaimsResult, judge_claims
        >>> def rebuild(result: ClaimsResult) -> ClaimsResult:  # from a saved values dict
        ...     values = json.loads(json.dumps(result.values))
        ...     return ClaimsResult(judge_claims(values), values, result.info)
        >>> ClaimsResult((), {}, {}).data
        {}
    """

    claims: tuple[Claim, ...]
    values: dict[str, Any]
    info: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getitem__(self, number: int) -> Claim:
        """The claim numbered ``number`` (1..7)."""
        for claim in self.claims:
            if claim.number == number:
                return claim
        raise KeyError(f"no claim {number!r}; claims: {[c.number for c in self.claims]}")
