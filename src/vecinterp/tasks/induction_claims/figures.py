"""The figures of the induction claims (:func:`claim_figures`; matplotlib, the ``plot``
extra)."""

from typing import Any

import torch

from ...analysis import induction_target, previous_position_target
from .judge import head_name
from .results import ClaimsResult


def claim_figures(result: ClaimsResult, *, history: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of the claims, named as in :data:`FIGURES`.

    ``patterns`` (claims 2-3: the two heads' mean attention patterns, their target maps
    outlined), ``attention_all_heads`` (every head), ``head_scores`` (both detector scores
    as layer x head grids), ``composition`` (claims 4-5: the K-composition grid of
    layer-0 into layer-1 heads, and the pair's K, Q, V scores over a histogram of the
    random baseline) and, given a training ``history`` (``steps``, ``train_loss``,
    ``eval_steps``, ``eval_loss``), ``loss`` (claim 1, with the predict-0 level).
    Needs matplotlib (the ``plot`` extra).

    Args:
        result: a :class:`ClaimsResult` of :func:`measure_claims` (with its ``data``).
        history: the training history, or ``None`` (no loss figure).

    Returns:
        ``{name: Figure}``; save each with ``fig.savefig(f"{name}.png")`` and close it.

    Raises:
        ValueError: ``result`` has no ``data`` (e.g. one rebuilt from ``results.json``),
            or ``history`` lacks a key.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, vecinterp as vi
        >>> from vecinterp.tasks import induction, induction_claims as ic
        >>> model = vi.HookedVectorTransformer(induction.model_config(4, 5, d_model=16,
        ...     n_heads=2, d_head=4), seed=0)
        >>> result = ic.measure_claims(vi.process_weights(model), m=4, min_m=3, max_m=5,
        ...     analysis_batch=8, population=8, eval_batches=3, eval_batch_size=4,
        ...     baseline_samples=20)
        >>> list(ic.claim_figures(result))
        ['patterns', 'attention_all_heads', 'head_scores', 'composition']
        >>> plt.close("all")
    """
    import matplotlib.pyplot as plt

    from ... import plot

    if not isinstance(result, ClaimsResult) or "patterns" not in result.data:
        raise ValueError("result must be a ClaimsResult from measure_claims (with its data)")
    h, c, d = result.values["heads"], result.values["composition"], result.data
    figs: dict[str, Any] = {}
    if history is not None:
        missing = {"steps", "train_loss", "eval_steps", "eval_loss"} - set(history)
        if missing:
            raise ValueError(f"history lacks {sorted(missing)}")
        fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
        plot.plot_loss(
            history["steps"],
            history["train_loss"],
            eval_steps=history["eval_steps"],
            eval_losses=history["eval_loss"],
            ax=ax,
            title="training loss (masked MSE on the repeated half)",
        )
        ax.axhline(
            1 / result.info["dim"], color="0.4", linestyle="--", linewidth=1,
            label="predicting 0 (1/dim)",
        )  # fmt: skip
        ax.legend()
        figs["loss"] = fig

    batch = d["batch"]
    mean_patterns = d["patterns"].mean(dim=1)  # [layer, head, dest, src], over the batch
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
    for ax, head, target, label in (
        (axes[0], h["prev_head"], previous_position_target(batch.length), "previous-position"),
        (axes[1], h["induction_head"], induction_target(batch.length, batch.m), "induction"),
    ):
        plot.plot_attention(
            mean_patterns[tuple(head)],
            ax=ax,
            title=f"{head_name(head)}, {label} head (m = {batch.m}; boxes: target)",
        )
        dest, src = target.nonzero(as_tuple=True)  # outline the target cells
        ax.scatter(
            src, dest, marker="s", s=30, facecolors="none", edgecolors="tab:red", linewidths=1
        )
    figs["patterns"] = fig

    figs["attention_all_heads"] = plot.plot_attention_grid(
        mean_patterns,
        title=f"every head's attention, mean of {batch.inputs.shape[0]} sequences (m = {batch.m})",
    )

    n_heads = mean_patterns.shape[1]
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.6 * n_heads, 3.2), layout="constrained")
    plot.plot_score_grid(h["prev_scores"], ax=axes[0], title="previous-position score")
    plot.plot_score_grid(
        h["induction_scores"], ax=axes[1], title=f"induction score (m = {batch.m})"
    )
    figs["head_scores"] = fig
    figs["composition"] = _composition_figure(plt, plot, h, c, d["baseline_samples"])
    return figs


def _composition_figure(
    plt: Any, plot: Any, h: dict[str, Any], c: dict[str, Any], samples: torch.Tensor
) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    plot.plot_score_grid(
        c["k_grid"], ax=axes[0], title="K-composition: layer-0 head -> layer-1 head", fmt=".3f"
    )
    axes[0].set_xlabel("layer-1 head")
    axes[0].set_ylabel("layer-0 head")
    ax = axes[1]
    baseline = samples.tolist()
    ax.hist(baseline, bins=40, color="0.7", label="random matrices")
    styles = (("K", "tab:red", "-"), ("Q", "tab:blue", "--"), ("V", "tab:green", ":"))
    for kind, color, style in styles:
        ax.axvline(
            c["pair"][kind], color=color, linestyle=style, linewidth=2, label=f"pair: {kind}"
        )
    k_pairs = [v for row in c["k_grid"] for v in row]  # every layer-0 -> layer-1 pair
    for value in k_pairs:
        ax.axvline(value, color="tab:red", linewidth=0.8, alpha=0.5, ymax=0.12)
    values = [*baseline, *c["pair"].values(), *k_pairs]
    pad = 0.05 * (max(values) - min(values)) or 0.01
    ax.set_xlim(min(values) - pad, max(values) + pad)
    ax.set_title(f"{head_name(h['prev_head'])} -> {head_name(h['induction_head'])} vs random pairs")
    ax.set_xlabel("composition score ‖L R‖_F / (‖L‖_F ‖R‖_F)  (ticks: all K pairs)")
    ax.set_ylabel("count")
    ax.legend(fontsize=8, loc="upper center")
    return fig
