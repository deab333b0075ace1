"""The figures of the claims: training losses, partial losses and path attention over
training, every head's chain-aligned map and the circuit's heads on one sequence
(:func:`claim_figures`; matplotlib, the ``plot`` extra)."""

import math
from typing import Any

from ..retrieval import RetrievalBatch, role_names
from .results import THRESHOLDS, ClaimsResult


def position_labels(batch: RetrievalBatch, index: int = 0) -> list[str]:
    """``"a:L0"``-style labels of sequence ``index``'s positions: chain letter, role.

    Example:
        >>> from vecinterp.tasks import retrieval
        >>> from vecinterp.tasks.retrieval_claims import position_labels
        >>> position_labels(retrieval.generate(1, 1, n_chains=2, seed=0))
        ['b:L0', 'b:R0', 'a:L0', 'a:R0', 'a:Q', 'b:Q']
    """
    if not isinstance(batch, RetrievalBatch):
        raise TypeError(f"batch must be a RetrievalBatch, got {type(batch).__name__}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(batch.inputs):
        raise ValueError(f"index must be a sequence of the batch (0..{len(batch.inputs) - 1})")
    labels = [""] * batch.n_pos
    roles = role_names(batch.depth)
    for chain in range(batch.n_chains):
        for role, pos in enumerate(batch.role_positions[index, chain].tolist()):
            labels[pos] = f"{chr(ord('a') + chain)}:{roles[role]}"
    return labels


def claim_figures(
    result: ClaimsResult, *, ic_history: Any = None, non_ic_history: Any = None
) -> dict[str, Any]:
    """The figures of the claims, as matplotlib figures named as in :data:`FIGURES`.

    ``loss`` (claims 1, 2: the IC and non-IC training losses; only given both histories),
    ``partial_losses`` (claim 3: the partial validation losses over the checkpoints, with
    the threshold), ``emergence`` (claim 6: the average attention along the circuit's
    paths), ``role_attention`` (claim 4: every head's chain-aligned map) and
    ``carrying_heads`` (claims 4, 5: the circuit's heads on one sequence). Needs
    matplotlib (the ``plot`` extra).

    Args:
        result: a :class:`ClaimsResult` of ``measure_claims`` (with its ``data``).
        ic_history, non_ic_history: the runs' :class:`~vecinterp.TrainHistory`, or
            ``None`` (no ``loss`` figure).

    Returns:
        ``{name: Figure}``; save each with ``fig.savefig(f"{name}.png")`` and close it.

    Example:
        >>> import dataclasses, matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, vecinterp as vi
        >>> from vecinterp.tasks import retrieval_claims as rc
        >>> s = dataclasses.replace(rc.FAST, eval_size=16, analysis_size=8)
        >>> ic = vi.HookedVectorTransformer(rc.model_config(s), seed=0)
        >>> non_ic = vi.HookedVectorTransformer(rc.model_config(s, ic=False), seed=0)
        >>> figures = rc.claim_figures(rc.measure_claims(ic, non_ic, s, [(0, ic)]))
        >>> list(figures)
        ['partial_losses', 'emergence', 'role_attention', 'carrying_heads']
        >>> plt.close("all")
    """
    import matplotlib.pyplot as plt

    from vecinterp import plot

    if not isinstance(result, ClaimsResult) or "table" not in result.data:
        raise ValueError("result must be a ClaimsResult from measure_claims (with its data)")
    d, v = result.data, result.values
    table, depth = d["table"], len(v["partial"])
    figs: dict[str, Any] = {}

    if ic_history is not None and non_ic_history is not None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
        for ax, history, label in zip(
            axes, (ic_history, non_ic_history), ("IC", "non-IC"), strict=True
        ):
            plot.plot_loss(history, ax=ax, title=f"{label} training loss", log=True)
        figs["loss"] = fig

    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    plot.plot_emergence(
        table, [f"x_{j + 1}" for j in range(depth)] + ["loss"], ax=ax, log=True,
        threshold=THRESHOLDS["partial"], title="partial validation losses (IC)", ylabel="MSE",
    )  # fmt: skip
    figs["partial_losses"] = fig

    path_names = [p["name"] for p in v["validation"]["kept"]]
    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    if path_names:
        plot.plot_emergence(
            table, path_names, ax=ax, threshold=THRESHOLDS["emerge"],
            title="average attention along the circuit's paths", ylabel="attention",
        )  # fmt: skip
    else:
        ax.set_title("no carrying path found")
    figs["emergence"] = fig

    maps = d["role_maps"]
    n_layers, n_heads = maps.shape[:2]
    labels = role_names(depth)
    fig, axes = plt.subplots(
        n_layers, n_heads, figsize=(2.3 * n_heads, 2.2 * n_layers), layout="constrained",
        squeeze=False,
    )  # fmt: skip
    for layer in range(n_layers):
        for head in range(n_heads):
            plot.plot_attention(
                maps[layer, head], ax=axes[layer, head], labels=labels, colorbar=False,
                title=f"L{layer}H{head}",
            )  # fmt: skip
    fig.suptitle("chain-aligned attention (mean over sequences and chains)")
    figs["role_attention"] = fig

    validation = v["validation"]
    kinds = {h: "carrying" for h in validation["carrying"]}
    kinds |= {h: "positional" for h in validation["positional"]}
    shown = sorted(kinds) or ["L0H0"]
    pos_labels = position_labels(d["analysis_batch"], 0)
    ncols = min(4, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 4.2 * nrows), layout="constrained", squeeze=False
    )
    for ax in axes.flat[len(shown) :]:
        ax.set_axis_off()
    for ax, name in zip(axes.flat, shown, strict=False):
        layer, head = (int(value) for value in name[1:].split("H"))
        plot.plot_attention(
            d["patterns"][layer, 0, head], ax=ax, labels=pos_labels, colorbar=False,
            title=f"{name} ({kinds.get(name, 'no circuit head found')})",
        )  # fmt: skip
    fig.suptitle("the circuit's heads on one sequence (positions: chain a..d, role)")
    figs["carrying_heads"] = fig
    return figs
