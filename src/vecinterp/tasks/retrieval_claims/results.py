"""The claims, the thresholds that judge them, the scaled-down settings and the result
types of :mod:`vecinterp.tasks.retrieval_claims`."""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .._common import check_int
from ..retrieval import PAPER_RECIPE

HOLDS = "holds"
"""Verdict: our number meets the paper's claim (by :data:`THRESHOLDS`)."""
PARTLY = "partly"
"""Verdict: part of the claim, or a weaker form of it, holds."""
NO = "does not hold"
"""Verdict: our number contradicts the claim."""
VERDICTS = (HOLDS, PARTLY, NO)
"""The three verdicts, best first."""

EVAL_SEED = 10_000
"""Seed of the fixed validation batch (losses and ablations)."""
ANALYSIS_SEED = 20_000
"""Seed of the analysis batch (attention maps and emergence curves)."""

THRESHOLDS: dict[str, float] = dict(
    ic_holds=0.05,  # claim 1: final IC loss (the paper's "low" after ablation, App. E)
    ic_partly=0.3,
    non_ic_fails=0.7,  # claim 2: every non-IC run of the paper ends above this
    partial=0.5,  # claim 3: a partial loss has "fallen" below this (§7.2)
    path=0.5,  # claim 4: a head carries r -> s with at least this average attention
    ablation_holds=0.05,  # claim 5 and the simplification: a loss is "low" if at most
    ablation_factor=1.5,  # max(ablation_holds, ablation_factor x the unablated loss)
    ablation_partly=0.5,  # ... partly: below this share of the all-uniform loss
    emerge=0.5,  # claim 6: a path emerged once its average attention exceeds this
)
"""Every verdict is computed from these numbers (the comments give the claim)."""

CLAIMS: dict[int, tuple[str, str]] = {
    1: ("IC formulation learns", "low loss (Fig. 4; < 0.05 in App. E)"),
    2: ("non-IC formulation does not learn", "loss > {non_ic_fails} in 100 % of runs"),
    3: (
        "partial losses fall below {partial} in chain order",
        "x_1 first, then x_2, ... (100 % of runs)",
    ),
    4: (
        "a few heads carry the chain, most are idle",
        "most heads idle (§8.2); 4 of 12 carry (D = 3, App. E)",
    ),
    5: (
        "combined attention-map ablation keeps the loss low (App. E)",
        "0.031 -> 0.045 (Transformer D; procedure: < 0.05)",
    ),
    6: (
        "circuit heads emerge one by one with the partial losses (attention > {emerge})",
        "an induction head drives x_1 down, then one new head per step (§9)",
    ),
}
"""``number -> (claim, the paper's figure)`` for the six claims checked; ``{name}`` stands
for ``THRESHOLDS[name]``."""

CANDIDATES = ("uniform", "identity", "paths", "paths+positional")
"""Hypotheses for a head's attention map, simplest first: idle (uniform or identity
attention), one-hot along its chain paths with identity rows elsewhere, or with positional
one-hot rows elsewhere (see :func:`~vecinterp.tasks.retrieval_claims.validate_circuit`)."""

IDLE = ("uniform", "identity")
"""The hypotheses of :data:`CANDIDATES` under which a head is idle."""

FIGURES = ("loss", "partial_losses", "emergence", "role_attention", "carrying_heads")
"""The names of the figures :func:`~vecinterp.tasks.retrieval_claims.claim_figures` makes,
in order (``loss`` only with the training histories)."""


class ChainPath(TypedDict):
    """A head's attention path between two roles of a chain (a plain, JSON-ready dict).

    Keys: ``layer``, ``head``; ``dest`` and ``src``, indices into the roles ``L0 R0 L1 R1
    .. Q`` of :func:`vecinterp.tasks.retrieval.role_names`; ``value``, the head's mean
    attention from every chain's ``dest`` token to the same chain's ``src`` token;
    ``name``, e.g. ``"L2H1 Q->R0"``.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import ChainPath
        >>> p = ChainPath(layer=2, head=1, dest=4, src=1, value=0.93, name="L2H1 Q->R0")
        >>> p["name"], p["value"]
        ('L2H1 Q->R0', 0.93)
    """

    layer: int
    head: int
    dest: int
    src: int
    value: float
    name: str


@dataclass(frozen=True)
class Settings:
    """Sizes of the task, the models, the training and the data the analyses use.

    Attributes:
        n_chains, depth, dim: ``N``, ``D`` and ``K`` of the task.
        n_layers, n_heads, d_model: the attention-only models (``d_head = d_model /
            n_heads``).
        batch_size: sequences per training step (fresh ones every step).
        steps: implicit-curriculum (IC) training steps.
        non_ic_steps: non-IC training steps.
        lr: peak learning rate of AdamW (weight decay 0.1, the paper's), with a cosine
            decay to ``lr / 10``.
        checkpoint_every: IC checkpoint interval (the emergence curves' resolution).
        eval_size: validation sequences for the losses and the ablations.
        analysis_size: sequences for the attention maps and the emergence curves.

    Example:
        >>> import dataclasses
        >>> from vecinterp.tasks.retrieval_claims import FULL
        >>> FULL.n_chains, FULL.depth, FULL.steps
        (4, 2, 1000)
        >>> dataclasses.replace(FULL, steps=500).steps
        500
    """

    n_chains: int
    depth: int
    dim: int
    n_layers: int
    n_heads: int
    d_model: int
    batch_size: int
    steps: int
    non_ic_steps: int
    lr: float
    checkpoint_every: int
    eval_size: int
    analysis_size: int

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "lr":
                check_int(f.name, getattr(self, f.name), minimum=1)
        if isinstance(self.lr, bool) or not isinstance(self.lr, int | float) or not self.lr > 0:
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.dim % 2:
            raise ValueError(
                f"dim must be even (the positional code pairs sin and cos), got {self.dim}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")

    def summary(self) -> dict[str, str]:
        """The task, the models and the training in words (for the report).

        Example:
            >>> from vecinterp.tasks.retrieval_claims import FAST
            >>> FAST.summary()["task"]
            'N = 2 chains, D = 2 steps, K = 4 dims'
        """
        return {
            "task": f"N = {self.n_chains} chains, D = {self.depth} steps, K = {self.dim} dims",
            "model": f"{self.n_layers} attention-only layers x {self.n_heads} heads, d_model "
            f"{self.d_model} (d_head {self.d_model // self.n_heads}), LayerNorm, no "
            "positional embedding",
            "training": f"AdamW lr {self.lr:g} (cosine to {self.lr / 10:g}), weight decay "
            f"{PAPER_RECIPE['weight_decay']}, batch {self.batch_size}, {self.steps} IC / "
            f"{self.non_ic_steps} non-IC steps, checkpoint every {self.checkpoint_every}",
        }


FULL = Settings(
    n_chains=4, depth=2, dim=4, n_layers=4, n_heads=4, d_model=64, batch_size=128,
    steps=1000, non_ic_steps=600, lr=3e-3, checkpoint_every=25,
    eval_size=512, analysis_size=256,
)  # fmt: skip
"""The paper's task scaled down to minutes on a CPU (``N = K = 4``, ``D = 2``; 4 layers of
4 heads, ``d_model`` 64; 1,000 IC and 600 non-IC steps at batch 128, lr 3e-3). Not every
seed learns in 1,000 IC steps: 10 of seeds 0-15 did (the other 6 never learned ``x_2``;
``--sweep 16`` in ``docs/tasks_retrieval.rst``), seeds 0 and 1 among them."""

FAST = Settings(
    n_chains=2, depth=2, dim=4, n_layers=3, n_heads=2, d_model=32, batch_size=64,
    steps=300, non_ic_steps=60, lr=1e-2, checkpoint_every=30,
    eval_size=256, analysis_size=64,
)  # fmt: skip
"""A CI-sized run (two chains, 3 layers of 2 heads, width 32, 300 steps): it exercises the
plumbing, its numbers say nothing about the paper's claims."""


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, measured and judged: a row of the results table.

    Attributes:
        number: 1..6, as in :data:`CLAIMS`.
        claim: the claim in a few words.
        paper: the paper's figure.
        ours: what we measured, in words and numbers.
        value: the claim's headline number.
        verdict: one of :data:`VERDICTS`, from the numbers and :data:`THRESHOLDS`.

    Example:
        >>> from vecinterp.tasks.retrieval_claims import Claim
        >>> c = Claim(1, "IC formulation learns", "low loss", "final IC loss 0.0125", 0.0125,
        ...           "holds")
        >>> c.verdict, c.as_dict()["value"]
        ('holds', 0.0125)
    """

    number: int
    claim: str
    paper: str
    ours: str
    value: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict (``number, claim, paper, ours, value, verdict``)."""
        return dataclasses.asdict(self)


@dataclass
class ClaimsResult:
    """What :func:`~vecinterp.tasks.retrieval_claims.measure_claims` returns.

    Attributes:
        claims: the six :class:`Claim` rows, in order.
        values: every number the verdicts read (JSON-serialisable;
            :func:`~vecinterp.tasks.retrieval_claims.judge_claims` rebuilds ``claims``
            from it).
        info: the settings in words (:meth:`Settings.summary`).
        data: tensors and tables for the figures (not serialised): ``table`` (the
            :class:`~vecinterp.analysis.emergence.EmergenceTable`), ``role_maps``,
            ``patterns`` and ``analysis_batch``.

    Example:
        >>> import json
        >>> from vecinterp.tasks.retrieval_claims import ClaimsResult, judge_claims
        >>> def rebuild(result: ClaimsResult) -> ClaimsResult:  # from a saved values dict
        ...     values = json.loads(json.dumps(result.values))
        ...     return ClaimsResult(judge_claims(values), values, result.info)
        >>> ClaimsResult((), {}, {}).data
        {}
    """

    claims: tuple[Claim, ...]
    values: dict[str, Any]
    info: dict[str, str]
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getitem__(self, number: int) -> Claim:
        """The claim numbered ``number`` (1..6)."""
        for claim in self.claims:
            if claim.number == number:
                return claim
        raise KeyError(f"no claim {number!r}; claims: {[c.number for c in self.claims]}")
