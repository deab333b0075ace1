"""The model's error curve against the baselines, and the shipped reference model.

The curve is Garg et al.'s "normalised squared error vs number of in-context examples":
for each prompt position ``i`` (``i`` earlier pairs seen), the squared error of the
prediction of ``y_{i+1}`` divided by ``dim`` (the variance of ``y`` for ``x, w ~ N(0,
I)``), averaged over prompts, with a 95 % normal interval (1.96 standard errors over
prompts).
"""

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from .._shipped import load_folder, shipped_folder
from .baselines import BASELINES, ridge
from .data import RegressionBatch

if TYPE_CHECKING:
    from ...model.transformer import HookedVectorTransformer

REFERENCE_MODEL = "linear_regression_small"
"""The folder of the shipped reference model (``vecinterp/tasks/reference/``): the
:data:`MODEL_CONFIG_KWARGS` model trained with :data:`RECIPE`, seed 0, 25,000 steps (27 min
on one CPU core); its curve is in the task's docs page."""


@dataclasses.dataclass(frozen=True, eq=False)
class ErrorCurve:
    """Normalised squared error per number of in-context examples.

    Attributes:
        mean: ``[k]``, entry ``i``: the mean over prompts of ``(pred - y_{i+1})^2 / dim``,
            the prediction made after ``i`` examples.
        sem: ``[k]``, its standard error over prompts.
    """

    mean: Float[torch.Tensor, " k"]
    sem: Float[torch.Tensor, " k"]

    @property
    def low(self) -> Float[torch.Tensor, " k"]:
        """The lower end of the 95 % normal interval, ``mean - 1.96 sem``."""
        return self.mean - 1.96 * self.sem

    @property
    def high(self) -> Float[torch.Tensor, " k"]:
        """The upper end of the 95 % normal interval, ``mean + 1.96 sem``."""
        return self.mean + 1.96 * self.sem


def x_predictions(
    model: "HookedVectorTransformer", batch: object
) -> Float[torch.Tensor, "batch k"]:
    """The model's predictions of ``y_1`` to ``y_k`` of ``batch`` (a :class:`RegressionBatch`),
    read at the ``x`` positions (output coordinate 0), in float64, without gradients."""
    if not isinstance(batch, RegressionBatch):
        raise TypeError(f"batch must be a RegressionBatch, got {type(batch).__name__}")
    with torch.no_grad():
        out = model(batch.inputs.to(model.W_E.dtype))
    return out[:, 0::2, 0].double()


def error_curve(predictions: object, batch: object) -> ErrorCurve:
    """The normalised squared error of ``predictions [batch, k]`` of ``batch.ys`` (a
    :class:`RegressionBatch`) per position (see the module docstring).

    Example:
        >>> import torch
        >>> from vecinterp.tasks import linear_regression as lr
        >>> batch = lr.generate(4, dim=2, n_points=3, seed=0)
        >>> curve = lr.error_curve(batch.ys.double() + 1.0, batch)   # off by 1 everywhere
        >>> curve.mean.tolist(), curve.sem.tolist()                  # 1 / dim, no spread
        ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0])
    """
    if not isinstance(batch, RegressionBatch):
        raise TypeError(f"batch must be a RegressionBatch, got {type(batch).__name__}")
    if not isinstance(predictions, torch.Tensor) or predictions.shape != batch.ys.shape:
        raise ValueError(
            f"predictions must be a tensor [batch, k] = {list(batch.ys.shape)}, got "
            + (
                str(list(predictions.shape))
                if isinstance(predictions, torch.Tensor)
                else type(predictions).__name__
            )
        )
    err = (predictions.double() - batch.ys.double()).pow(2) / batch.dim
    n = err.shape[0]
    sem = err.std(0) / n**0.5 if n > 1 else torch.full_like(err[0], float("nan"))
    return ErrorCurve(mean=err.mean(0), sem=sem)


def error_curves(
    model: "HookedVectorTransformer | None",
    batch: RegressionBatch,
    *,
    ridge_alpha: float | None = None,
) -> dict[str, ErrorCurve]:
    """The error curves of ``model`` (key ``"model"``, left out when ``model`` is None) and
    of every baseline of :data:`BASELINES` (and ridge with ``ridge_alpha``, key
    ``"ridge"``) on the same prompts.

    Example:
        >>> from vecinterp.tasks import linear_regression as lr
        >>> batch = lr.generate(256, seed=1)
        >>> curves = lr.error_curves(lr.load_reference(), batch)
        >>> sorted(curves)
        ['3-nearest_neighbours', 'averaging', 'least_squares', 'model', 'zero']
        >>> float(curves["least_squares"].mean[-1]) < 1e-10    # exact past dim points
        True
        >>> float(curves["model"].mean[-1]) < 0.05
        True
    """
    from ...model.transformer import HookedVectorTransformer

    if model is not None and not isinstance(model, HookedVectorTransformer):
        hint = (
            ": pass one model (error_curves(models[0], batch)), one call per model"
            if isinstance(model, (list, tuple))
            else ""
        )
        raise TypeError(
            f"model must be a HookedVectorTransformer or None, got {type(model).__name__}{hint}"
        )
    curves: dict[str, ErrorCurve] = {}
    if model is not None:
        curves["model"] = error_curve(x_predictions(model, batch), batch)
    for name, baseline in BASELINES.items():
        curves[name] = error_curve(baseline(batch.xs, batch.ys), batch)
    if ridge_alpha is not None:
        curves["ridge"] = error_curve(ridge(batch.xs, batch.ys, ridge_alpha), batch)
    return curves


def plot_error_curves(curves: Mapping[str, ErrorCurve], *, title: str | None = None) -> Any:
    """A matplotlib figure of the curves (mean and 95 % band against the number of
    in-context examples), on a log scale; matplotlib is imported here (the ``plot``
    extra)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for name, curve in curves.items():
        k = torch.arange(len(curve.mean))
        style = dict(lw=2.5, color="black") if name == "model" else dict(lw=1.2)
        ax.plot(k, curve.mean.clamp(min=1e-6), label=name, **style)
        ax.fill_between(k, curve.low.clamp(min=1e-6), curve.high.clamp(min=1e-6), alpha=0.15)
    ax.set_yscale("log")
    ax.set_xlabel("in-context examples seen before the query")
    ax.set_ylabel("squared error / dim")
    ax.set_title(title or "Normalised squared error vs in-context examples (95 % bands)")
    ax.legend(fontsize=8)
    return fig


def reference_path() -> Path:
    """The folder of the shipped reference model inside the installed package (what
    :func:`vecinterp.save` writes; ``vi.load`` reads it).

    Example:
        >>> from vecinterp.tasks import linear_regression as lr
        >>> lr.reference_path().name
        'linear_regression_small'
    """
    return shipped_folder(
        REFERENCE_MODEL, REFERENCE_MODEL, "train one with examples/train_regression.py"
    )


def load_reference(
    *, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> "HookedVectorTransformer":
    """The shipped reference model: ``VectorTransformerConfig(**MODEL_CONFIG_KWARGS)``
    trained with :data:`RECIPE` (seed 0, 25,000 steps of fresh prompts). It follows least
    squares below ``dim`` examples and stays within 0.11 of it (normalised squared error)
    past ``dim``, 0.025 from 8 examples on (see the task's docs page for the curve).

    Args:
        device: where to put the weights (default: the CPU).
        dtype: a floating dtype to cast the weights to (default: as saved, float32).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import linear_regression as lr
        >>> model = lr.load_reference()
        >>> model.cfg == vi.VectorTransformerConfig(**lr.MODEL_CONFIG_KWARGS)
        True
    """
    return load_folder(reference_path(), device, dtype)
