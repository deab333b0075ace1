"""Plots of analysis results: attention patterns, circuit matrices, score grids, attributions,
linear fits, loss curves (matplotlib; the optional ``plot`` extra).

Every function takes plain results (torch tensors, numpy arrays or, for 1-D inputs, lists),
draws on the ``ax`` it is given or on a new figure, and returns the ``Axes`` (or ``Figure``)
so the caller can restyle or save it. None calls ``plt.show()`` or changes ``rcParams``.
Shapes are checked up front with a ``ValueError`` that names the expected axes. Inputs are
annotated as plain array types rather than jaxtyping shapes on purpose: the functions accept
several ranks and report a wrong one as a ``ValueError`` of their own.

Figures that state a claim: :func:`plot_fit`, :func:`plot_attribution` and :func:`plot_loss`
draw a ``reference`` (the value a paper reports) beside the data, :func:`plot_attention_grid`
outlines a source position (``highlight_source``), :func:`add_note` writes a sentence into
an axes, and :func:`plot_eigenvalue_scores` labels the ends of its colour scale with what
they mean (−1 negates, +1 copies).

Speed and legibility: tick marks are set through fixed locators (no tick objects are built
until a draw needs them), :func:`plot_attention_grid` places its panels itself instead of
running a layout engine over dozens of axes, and :func:`save_figure` writes and closes a
figure. Text is sized in points, so it is legible from 100 dpi (the default of
:func:`save_figure`; 8-pt text is then 11 px tall): for a smaller image, shrink the figure,
not the dpi.

Nothing in vecinterp imports this package at import time (only functions that draw, when
called), so vecinterp works without matplotlib.

One module per family of figures, every name re-exported here: ``attention``
(:func:`plot_attention`, :func:`plot_attention_grid`), ``matrices`` (:func:`plot_matrix`,
:func:`plot_score_grid`, :func:`plot_eigenvalue_scores`), ``attribution`` (attributions and
fits: :func:`plot_attribution`, :func:`plot_fit`, :func:`plot_residual_vs_target`),
``curves`` (:func:`plot_loss`, :func:`plot_emergence`), ``circuit`` (:func:`plot_circuit`,
the graph of a discovered circuit), ``features`` (a sparse dictionary's features:
:func:`plot_feature_density`, :func:`plot_decoder_similarity`,
:func:`plot_feature_activation`) and ``figures`` (:func:`add_note`,
:func:`save_figure`, :func:`save_figures`); ``_common`` holds the matplotlib import guard
and the helpers they share.
"""

from typing import SupportsFloat

# _common comes first: its guard names the plot extra when matplotlib is missing. ``X as X``
# re-exports the public names of the one-module version that are not in __all__.
from ._common import ArrayLike as ArrayLike
from ._common import Scalar as Scalar
from ._common import _require_matplotlib
from .attention import plot_attention, plot_attention_grid
from .attribution import plot_attribution, plot_fit, plot_residual_vs_target
from .circuit import plot_circuit
from .curves import LossHistory as LossHistory
from .curves import plot_emergence, plot_loss
from .features import plot_decoder_similarity, plot_feature_activation, plot_feature_density
from .figures import add_note, save_figure, save_figures
from .matrices import EIGENVALUE_SCALE_LABELS as _SCALE_LABELS
from .matrices import plot_eigenvalue_scores, plot_matrix, plot_score_grid

__all__ = [
    "add_note",
    "plot_attention",
    "plot_attention_grid",
    "plot_attribution",
    "plot_circuit",
    "plot_decoder_similarity",
    "plot_eigenvalue_scores",
    "plot_emergence",
    "plot_feature_activation",
    "plot_feature_density",
    "plot_fit",
    "plot_loss",
    "plot_matrix",
    "plot_residual_vs_target",
    "plot_score_grid",
    "save_figure",
    "save_figures",
]

EIGENVALUE_SCALE_LABELS: dict[str, dict[SupportsFloat, str]] = _SCALE_LABELS  # the same dict
"""What the ends of an eigenvalue-score scale mean, per circuit: the colour-bar labels of
:func:`plot_eigenvalue_scores`. An OV circuit ``W_V W_O = −I`` scores exactly −1 (the head
writes the negative of what it reads), ``+I`` scores +1 (it copies); a QK circuit
``W_Q W_K^T = ±I`` makes a query attend most to keys in the same (+1) or the opposite (−1)
direction."""

# importlib.reload(vecinterp.plot) re-runs this file only, with the submodules still loaded:
# check matplotlib again, so that a reload without it fails as a first import does.
_require_matplotlib()

# The functions keep the module they had before the package was split, vecinterp.plot: their
# public, documented name (as numpy's set_module does). doctest then finds their examples
# here, in this package, as before (and once, not again in the submodule that defines them).
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
