"""In-context linear regression (Garg et al., 2022): data, baselines, error curves and a
shipped reference model.

Shivam Garg, Dimitris Tsipras, Percy Liang, Gregory Valiant, "What Can Transformers Learn
In-Context? A Case Study of Simple Function Classes", NeurIPS 2022, arXiv:2208.01066.

Per prompt, ``w ~ N(0, I_d)`` and ``k`` points ``x_i ~ N(0, I_d)`` with ``y_i = w . x_i``
(optionally with noise, or a sparse ``w``), interleaved as ``x_1, y_1, x_2, y_2, ...``
with ``y_i`` in the first coordinate of a ``d``-vector (:func:`generate`); the model
predicts ``y_i`` at ``x_i``'s position. The baselines (:func:`least_squares`,
:func:`ridge`, :func:`nearest_neighbours`, :func:`averaging`, :func:`zero`) are exact and
batched over prompts and prefixes; :func:`error_curves` compares a model with them, and
:func:`load_reference` loads the shipped model (the paper's GPT-2 layout, scaled down:
see :data:`MODEL_CONFIG_KWARGS`).
"""

from .baselines import BASELINES, averaging, least_squares, nearest_neighbours, ridge, zero
from .data import (
    DEFAULT_DIM,
    DEFAULT_POINTS,
    MODEL_CONFIG_KWARGS,
    RECIPE,
    RegressionBatch,
    batches,
    generate,
)
from .evaluation import (
    REFERENCE_MODEL,
    ErrorCurve,
    error_curve,
    error_curves,
    load_reference,
    plot_error_curves,
    reference_path,
    x_predictions,
)

__all__ = [
    "BASELINES",
    "DEFAULT_DIM",
    "DEFAULT_POINTS",
    "MODEL_CONFIG_KWARGS",
    "RECIPE",
    "REFERENCE_MODEL",
    "ErrorCurve",
    "RegressionBatch",
    "averaging",
    "batches",
    "error_curve",
    "error_curves",
    "generate",
    "least_squares",
    "load_reference",
    "nearest_neighbours",
    "plot_error_curves",
    "reference_path",
    "ridge",
    "x_predictions",
    "zero",
]
