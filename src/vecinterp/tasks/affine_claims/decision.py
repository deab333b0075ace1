"""The decision rule for claims 4, 10b and 11 on the models of one set-up: does the set-up
explain them (:func:`setup_decision`)? Stated before the models of the set-up were measured,
with the thresholds of :data:`~vecinterp.tasks.affine_claims.THRESHOLDS`."""

import math
from collections.abc import Sequence
from typing import Any

from .results import THRESHOLDS

EXPLAINED = "explained by the set-up"
"""The decision when every model of the set-up meets the rule."""
SEED_DEPENDENT = "seed-dependent"
"""The decision when some models of the set-up meet the rule and some do not."""
NOT_REPRODUCED = "not reproduced under this set-up"
"""The decision when no model of the set-up meets the rule."""


def meets_rule(values: dict[str, Any]) -> dict[str, bool]:
    """Whether one model meets each part of the decision rule, and all of them.

    (a) checkerboards: a per-sequence layer-2 contrast above ``checker_alt`` on at least
    ``checker_seq_holds`` of the ``c < -1`` sequences and at most ``checker_seq_other`` of
    the ``c > 1`` ones (claim 4 "holds"); (b) identity-like QK: at least ``qk_heads_holds``
    of the layer-2 heads with a QK score above ``qk_identity`` (claim 10b "holds"); (c) the
    patch: the pseudoinverse patch of the model's own most identity-like heads at most
    ``patch_holds`` times the unpatched MSE while uniform attention on the same heads costs
    at least ``uniform_matters`` times it.

    Args:
        values: a :attr:`~vecinterp.tasks.affine_claims.ClaimsResult.values` dict.

    Returns:
        ``{"checkerboards": bool, "identity_qk": bool, "patch": bool, "all": bool}``.

    Example:
        >>> from vecinterp.tasks.affine_claims import meets_rule
        >>> meets_rule(dict(checker_seq_strong=[0.6, 0.05], qk_scores=[[], [], [0.9] * 5 +
        ...     [0.1] * 3], mse=1.0, qk_own_patch=1.2, qk_own_uniform=2.5))
        {'checkerboards': True, 'identity_qk': True, 'patch': True, 'all': True}
    """
    t = THRESHOLDS
    try:
        alternating, growing = values["checker_seq_strong"]
        qk = values["qk_scores"][2]
        patch = values["qk_own_patch"] / values["mse"]
        uniform = values["qk_own_uniform"] / values["mse"]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(
            f"values must be a ClaimsResult.values dict of this version ({exc!r})"
        ) from exc
    parts = {
        "checkerboards": alternating >= t["checker_seq_holds"]
        and growing <= t["checker_seq_other"],
        "identity_qk": sum(x > t["qk_identity"] for x in qk)
        >= math.ceil(t["qk_heads_holds"] * len(qk)),
        "patch": patch <= t["patch_holds"] and uniform >= t["uniform_matters"],
    }
    return {**parts, "all": all(parts.values())}


def setup_decision(models: Sequence[dict[str, Any]]) -> str:
    """The decision for one set-up from its models (one ``values`` dict per seed):
    :data:`EXPLAINED` if every model meets the whole rule (:func:`meets_rule`),
    :data:`SEED_DEPENDENT` if some do, :data:`NOT_REPRODUCED` if none does.

    Args:
        models: the ``values`` dicts of the set-up's models, at least one.

    Returns:
        One of the three decisions.

    Example:
        >>> from vecinterp.tasks.affine_claims import setup_decision
        >>> good = dict(checker_seq_strong=[0.6, 0.05], qk_scores=[[], [], [0.9] * 8],
        ...             mse=1.0, qk_own_patch=1.2, qk_own_uniform=2.5)
        >>> setup_decision([good, dict(good, qk_own_patch=4.0)])
        'seed-dependent'
    """
    models = list(models)
    if not models:
        raise ValueError("models must hold at least one values dict")
    met = [meets_rule(v)["all"] for v in models]
    return EXPLAINED if all(met) else SEED_DEPENDENT if any(met) else NOT_REPRODUCED
