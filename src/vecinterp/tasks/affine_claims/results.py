"""The claims, the thresholds that judge them, and the result types of
:mod:`vecinterp.tasks.affine_claims`."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HOLDS = "holds"
"""Verdict: the primary reading meets the paper's figure (by :data:`THRESHOLDS`)."""
PARTLY = "partly"
"""Verdict: part of the claim, or a weaker form of its figure, holds."""
NO = "does not hold"
"""Verdict: the primary reading contradicts the claim."""
VERDICTS = (HOLDS, PARTLY, NO)
"""The three verdicts, best first."""

PAPER_QK_HEADS = (0, 1, 2, 3, 4)
"""The layer-2 heads whose QK circuits the paper replaced by a pseudoinverse (§4.6)."""

PAPER_ALPHA = 2.3
"""The paper's layer-0 scale ``α`` (§4.4: slope 2.1–2.5; §4.8, Figure 17: ``a_n + 2.3 a_{n-1}``)."""

CLAIMS: dict[int, tuple[str, str]] = {
    1: ("final eval MSE", "1e-4"),
    2: ("layer 0: all heads but one attend to the previous position", "7 of 8 heads"),
    3: ("layer 1: most heads attend to the second vector", "most heads (one sequence)"),
    4: ("layer 2: checkerboard patterns for c<0, not otherwise", "pattern (one sequence)"),
    5: ("direct attribution: layer 0 +, layer 1 ~0, layer 2 -", "+, 0, -"),
    6: ("layer-0 OV on residual vectors: per-dim linear fit", "R² 0.83, slope 2.1-2.5, b~0"),
    7: ("same fit on random vectors", "R² ~0.60 (< residual)"),
    8: ("share of layer-0 OV output outside W_E's row space", "84.15 %"),
    9: ("mean-ablating layer-1 heads (population 1,000)", "MSE 1e-4 -> 2e-4"),
    10: ("layer-2 OV ~ -I: OV eigenvalue scores negative", "OV scores < 0"),
    11: ("pseudoinverse QK patch of the 5 identity-like layer-2 heads", "MSE unchanged"),
    12: ("MLP direct attribution positive at the last positions", "positive"),
    13: ("residual after layer 0 through W_U ~ crude estimate of the target", "plot"),
}
"""``number -> (claim, the paper's figure)`` for the thirteen claims of the paper's §4.
Claim 10 is judged as two parts (:data:`CLAIM_PARTS`): ``CLAIMS[10]`` is part a."""

CLAIM_PARTS: dict[str, tuple[str, str]] = {
    "10a": CLAIMS[10],
    "10b": ("layer-2 QK ~ +I: identity-like QK heads", "5 of 8 heads (0-4)"),
}
"""``label -> (claim, the paper's figure)`` for the claims judged in parts: §4.6 says
both that layer 2's OV circuits are close to −I (Figure 15's negative eigenvalue scores,
part a) and that its QK circuits "strongly resemble a positive identity", naming heads
0-4 for the patch (part b). Head indices mean nothing across models (any permutation of
a layer's heads is the same model), so part b counts identity-like heads wherever they
are, and claim 11 patches each model's own most identity-like heads."""

THRESHOLDS: dict[str, Any] = dict(
    eval_mse_holds=2e-4,  # claim 1: within 2x of the paper's 1e-4
    eval_mse_partly=1e-3,
    head_score=0.5,  # claims 2, 3: a head "attends to X" if this share of its attention is on X
    head_score_partly=0.25,  # claim 3 "partly": most heads above this (uniform ~0.17)
    focus_seq_holds=0.5,  # claim 3 per sequence: share of |c| > 1 sequences in which most
    focus_seq_partly=0.25,  # heads put > head_score of their attention on one early vector
    checker_seq_holds=0.5,  # claim 4 per sequence: share of c < -1 sequences whose contrast
    checker_seq_other=0.1,  # > checker_alt, with at most this share of c > 1 sequences
    checker_seq_partly=0.25,
    checker_alt=0.2,  # claim 4: contrast on alternating sequences at least this ...
    checker_gap=0.2,  # ... and this much above the non-alternating contrast
    checker_gap_partly=0.05,
    near_zero=0.2,  # claim 5: |layer 1| <= this times max(|layer 0|, |layer 2|)
    r2_holds=0.7,  # claim 6
    r2_partly=0.4,
    slope_range=(1.5, 3.0),  # claim 6: median slope inside, paper 2.1-2.5
    intercept_max=0.1,
    r2_random_tol=0.15,  # claim 7: |R² - 0.60| within this, and below the residual R² ...
    r2_gap=0.05,  # ... by at least this much
    outside_tol=0.10,  # claim 8: within 10 points of 84.15 %
    outside_partly=0.5,
    ablation_holds=3.0,  # claim 9: MSE ratio ablated/unablated (paper: 2)
    ablation_partly=10.0,  # claim 9 "partly": within 10x (the layer matters, but not much)
    qk_identity=0.5,  # claim 10b: a QK eigenvalue score above this is identity-like
    qk_heads_holds=5 / 8,  # claim 10b: the share of layer-2 heads identity-like (paper 5/8)
    qk_heads_partly=5 / 16,
    patch_holds=1.5,  # claim 11: MSE ratio after/before (paper: 1)
    patch_partly=3.0,
    uniform_matters=2.0,  # claim 11's reference: uniform attention in those heads costs this
    lens_holds=0.7,  # claim 13: correlation with the target
    lens_partly=0.3,
)
"""Every verdict is computed from these numbers (the comments give the claim)."""

FIGURES = (
    "attention_alternating",
    "attention_non_alternating",
    "attribution",
    "mlp_attribution",
    "ov_linearity",
    "eigenvalue_scores",
    "ablation_and_patch",
    "residual_vs_target",
    "loss",
)
"""The names of the figures :func:`~vecinterp.tasks.affine_claims.claim_figures` makes, in
order (``loss`` only with a training history)."""

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class Reading:
    """One reading of a claim's method and what it gives on the model.

    Attributes:
        name: a short identifier, e.g. ``"full_ov"``.
        label: what is measured, in words, e.g. ``"full OV W_E·ΣOV·W_U, input→output"``.
        text: the figure, formatted, e.g. ``"R² 1.00, slope 0.39"``.
        value: the reading's headline number (what a verdict or a plot would use).
        key: shown as its own row of :func:`robustness_table` (the alternatives that
            change the conclusion).

    Example:
        >>> from vecinterp.tasks.affine_claims import Reading
        >>> r = Reading("joint", "all 8 heads at once", "x101", 101.2)
        >>> f"{r.label}: {r.text}"
        'all 8 heads at once: x101'
    """

    name: str
    label: str
    text: str
    value: float
    key: bool = False


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, measured: the primary reading, the others, the verdict.

    Attributes:
        number: 1..13, as in :data:`CLAIMS`.
        part: ``""``, or ``"a"``/``"b"`` for a claim judged in parts (claim 10:
            :data:`CLAIM_PARTS`); :attr:`label` is the two together.
        claim: the claim in a few words.
        paper: the paper's figure.
        primary: the reading the verdict rests on.
        alternatives: the other readings the paper's words allow (and baselines).
        verdict: one of :data:`VERDICTS`, from ``primary`` and :data:`THRESHOLDS`.
        headline: the primary figure in a few characters (for :func:`robustness_table`).
        basis: why the primary reading is the primary one (the paper's words).
        note: what the evidence says under all readings.

    Example:
        >>> from vecinterp.tasks.affine_claims import Claim, Reading
        >>> c = Claim(1, "final eval MSE", "1e-4", Reading("eval", "eval set", "9.2e-05", 9.2e-5),
        ...           (), "holds", "9.2e-05", "the training distribution", "")
        >>> c.number, c.verdict, c.primary.text
        (1, 'holds', '9.2e-05')
    """

    number: int
    claim: str
    paper: str
    primary: Reading
    alternatives: tuple[Reading, ...]
    verdict: str
    headline: str
    basis: str
    note: str
    part: str = ""

    @property
    def label(self) -> str:
        """``number`` and ``part`` as tables print them: ``"6"``, ``"10a"``."""
        return f"{self.number}{self.part}"


@dataclass
class ClaimsResult:
    """What :func:`measure_claims` returns.

    Attributes:
        claims: the :class:`Claim` objects, in order (1..13, claim 10 as 10a and 10b).
        values: every number measured (JSON-serialisable; :func:`judge_claims` rebuilds
            ``claims`` from it).
        timings: seconds per analysis, in the order they ran.
        info: the model's shape and the data sizes used.
        data: tensors for :func:`claim_figures` (not serialised).

    Example:
        >>> from vecinterp.tasks.affine_claims import ClaimsResult, judge_claims
        >>> import json
        >>> def rebuild(result: ClaimsResult) -> ClaimsResult:  # from a saved values dict
        ...     values = json.loads(json.dumps(result.values))
        ...     return ClaimsResult(judge_claims(values), values, {}, result.info)
        >>> ClaimsResult((), {}, {}, {}).data
        {}
    """

    claims: tuple[Claim, ...]
    values: dict[str, Any]
    timings: dict[str, float]
    info: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getitem__(self, number: int | str) -> "Claim":
        """The claim numbered ``number`` (1..13), or labelled ``number`` (``"10a"``); a
        number judged in parts (10) raises ``KeyError`` naming its labels."""
        found = [c for c in self.claims if c.label == str(number)]
        if not found and isinstance(number, int) and not isinstance(number, bool):
            found = [c for c in self.claims if c.number == number]
        if len(found) == 1:
            return found[0]
        labels = [c.label for c in self.claims]
        if found:
            raise KeyError(
                f"claim {number!r} is judged in parts: use one of {[c.label for c in found]}"
            )
        raise KeyError(f"no claim {number!r}; claims: {labels}")
