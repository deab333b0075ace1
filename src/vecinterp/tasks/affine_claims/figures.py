"""The figures of the paper's §4 on our model, each with the paper's value or pattern as a
reference (:func:`claim_figures`; matplotlib, the ``plot`` extra)."""

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ...analysis import fit_line
from .results import PAPER_ALPHA, ClaimsResult


def claim_figures(
    result: ClaimsResult, *, history: dict[str, Any] | None = None, lazy: bool = False
) -> dict[str, Any]:
    """The figures of the paper's §4 on our model, each showing what the paper claims.

    ``attention_alternating`` / ``attention_non_alternating`` (claims 2-4, the claim per
    layer in the row labels), ``attribution`` (claim 5, the paper's sign per layer),
    ``mlp_attribution`` (claim 12), ``ov_linearity`` (claims 6-7: our fits and the paper's
    slope 2.3 as a dashed line, in ``d_model`` and from input to output),
    ``eigenvalue_scores`` (claim 10: the scale says what −1 and +1 mean),
    ``ablation_and_patch`` (claims 9 and 11: the paper's MSE as a line),
    ``residual_vs_target`` (claim 13, with the paper's ``a_n + 2.3 a_{n-1}``) and, given a
    training ``history`` (``steps``, ``train_loss``, ``eval_steps``, ``eval_loss``),
    ``loss`` (claim 1: the paper's 1e-4 as a line). Needs matplotlib (the ``plot`` extra).

    Args:
        result: a :class:`ClaimsResult` of :func:`measure_claims` (with its ``data``).
        history: the training history, or ``None`` (no loss figure).
        lazy: return, instead of each figure, a function of no arguments that draws it,
            for :func:`vecinterp.plot.save_figures` to call in the process that writes it
            (drawing nine figures takes seconds; shared out, it takes a fraction).

    Returns:
        ``{name: Figure}`` (``{name: function}`` with ``lazy``); save each with
        ``fig.savefig(f"{name}.png")`` and close it, or pass the dict to
        :func:`vecinterp.plot.save_figures`.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt, vecinterp as vi
        >>> from vecinterp.tasks import affine_claims as ac
        >>> cfg = vi.VectorTransformerConfig(d_in=4, d_model=16, d_head=4, n_heads=5,
        ...                                  n_layers=3, d_mlp=32, n_ctx=16)
        >>> result = ac.measure_claims(vi.HookedVectorTransformer(cfg, seed=0),
        ...     analysis_batch=8, population=8, eval_batches=3, eval_batch_size=2,
        ...     sweep_batches=1, n_random=4)
        >>> figures = ac.claim_figures(result)
        >>> sorted(figures)[:3]
        ['ablation_and_patch', 'attention_alternating', 'attention_non_alternating']
        >>> plt.close("all")
    """
    import matplotlib.pyplot as plt

    from ... import plot

    if not isinstance(result, ClaimsResult) or "patterns" not in result.data:
        raise ValueError("result must be a ClaimsResult from measure_claims (with its data)")
    d, v = result.data, result.values
    patterns, batch = d["patterns"], d["batch"]
    n_layers, n_heads = patterns.shape[0], patterns.shape[2]
    rows = [f"layer {ell}" for ell in range(n_layers)]
    rows[:3] = [
        "layer 0\npaper: previous\nposition",
        "layer 1\npaper: position 1\n(outlined)",
        "layer 2\npaper: checker-\nboard if c<0",
    ]
    kinds = (("alternating", batch.alternating), ("non_alternating", ~batch.alternating))

    def attention(name: str, which: torch.Tensor) -> Any:
        idx = int(which.nonzero()[0]) if bool(which.any()) else 0
        return plot.plot_attention_grid(
            patterns[:, idx],
            row_labels=rows,
            col_labels=[f"head {h}" for h in range(n_heads)],
            title=f"attention, {name.replace('_', '-')} sequence (c = {float(batch.c[idx]):+.2f})",
            highlight_source=1,
            highlight_rows=[1],
        )

    def attribution() -> Any:
        labels, values = d["attribution"]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(labels)), 3.6), layout="constrained")
        plot.plot_attribution(
            torch.tensor(values),
            labels,
            ax=ax,
            ylabel="⟨LN(c) W_U, a_{m+1}⟩",
            title="direct attribution per head and MLP (claim 5)",
        )
        for ell, sign in enumerate(("paper: +", "paper: ~0", "paper: -")[:n_layers]):
            ax.text(
                ell * n_heads + (n_heads - 1) / 2,
                1.0,
                sign,
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=9,
                color="0.3",
            )
        return fig

    def mlp_attribution() -> Any:
        by_pos = v["mlp_by_pos"]
        fig, ax = plt.subplots(figsize=(6, 3.4), layout="constrained")
        plot.plot_attribution(
            torch.tensor(by_pos),
            [str(p) for p in range(len(by_pos))],
            ax=ax,
            ylabel="attribution",
            title="MLPs (summed) per position (claim 12)",
        )
        ax.axvspan(
            len(by_pos) - 3.5,
            len(by_pos) - 0.5,
            color="tab:green",
            alpha=0.12,
            label="paper: > 0 at the last positions",
        )
        ax.legend(loc="upper left", frameon=False)
        return fig

    def ov_linearity() -> Any:
        fig, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
        panels = (
            (d["ov_example"], "d_model: a residual vector", "paper (R² 0.83)", "x_d", "(x OV)_d"),
            (d["ov_random_example"], "d_model: a random vector", "paper (R² 0.60)", "x_d",
             "(x OV)_d"),
            (d["full_ov_example"], "input→output: W_E ΣOV W_U", "paper", "a_i",
             "(a W_E ΣOV W_U)_i"),
        )  # fmt: skip
        stats = (  # the claims' statistics, over every vector; each panel shows one vector
            f"claim 6 over all vectors: median slope {v['ov_slope']:.2f}, mean R² {v['ov_r2']:.2f}",
            f"claim 7 over all vectors: mean R² {v['ov_random_r2']:.2f}",
            f"6′/7′ over all inputs: slope {v['full_ov_slope']:.2f}, R² {v['full_ov_r2']:.2f}",
        )
        for ax, ((x, y), title, ref, xlabel, ylabel), stat in zip(axes, panels, stats, strict=True):
            ax.text(0.02, 0.02, f"one example vector;\n{stat}", transform=ax.transAxes, fontsize=7,
                    va="bottom")  # fmt: skip
            fit = fit_line(x, y)
            plot.plot_fit(
                x,
                y,
                slope=float(fit.slope),
                intercept=float(fit.intercept),
                r2=float(fit.r2),
                ax=ax,
                title=f"layer-0 OV, {title}",
                xlabel=xlabel,
                ylabel=ylabel,
                reference=(2.1, 2.5),
                reference_label=ref,
            )
            ax.legend(fontsize=8, loc="upper left")
        return fig

    def eigenvalue_scores() -> Any:
        ov, qk = d["eigen"]
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
        plot.plot_eigenvalue_scores(
            ov, circuit="OV", ax=axes[0], title="OV eigenvalue scores (paper: layer 2 < 0)"
        )
        plot.plot_eigenvalue_scores(
            qk, circuit="QK", ax=axes[1], title="QK eigenvalue scores (paper: layer 2 ~ +I)"
        )
        return fig

    def ablation_and_patch() -> Any:
        heads_mse, base = d["ablation"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
        names = [f"L1H{h}" for h in range(n_heads)]
        names += ["all L1", "all L1, len-14 means", "all L1, zeros"]
        ratios = [m / base for m in heads_mse]  # each against its own unablated MSE
        ratios += [v["ablate_joint"] / v["mse"]]
        ratios += [v[k] / base for k in ("ablate_joint_longest", "ablate_joint_zero")]
        colors = ["tab:blue"] * n_heads + ["tab:purple", "tab:gray", "tab:gray"]
        ax1.bar(names, ratios, color=colors)
        ax1.set_yscale("log")
        ax1.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax1.axhline(1.0, color="black", lw=1, label="unablated")
        ax1.axhline(2.0, color="tab:red", ls="--", lw=1, label="paper: x2 (1e-4 -> 2e-4)")
        ax1.set_title(
            f"claim 9: mean-ablating layer-1 heads\n(all L1: eval set, unablated "
            f"{v['mse']:.1e}; the others: sweep set, {base:.1e})",
            fontsize=9,
        )
        ax1.set_ylabel("MSE / unablated MSE")
        ax1.legend(fontsize=8)
        alt = v["qk_alt"]
        keys = ["seed+1", "all", "matched", "uniform"]
        labels = ["own 5 heads", "own 5: uniform (ref.)", "paper's indices 0-4",
                  "0-4, another Q", "all heads", "0-4, P scaled to |QK|_F",
                  "0-4 uniform (ref.)"]  # fmt: skip
        ratios = [v[k] / v["mse"] for k in ("qk_own_patch", "qk_own_uniform", "qk_patch")]
        ax2.bar(
            labels,
            ratios + [alt[k] / v["sweep_base"] for k in keys],
            color=["tab:blue", "tab:gray"] + ["tab:cyan"] * 4 + ["tab:gray"],
        )
        ax2.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax2.axhline(1.0, color="tab:red", ls="--", lw=1, label="paper: unchanged (x1)")
        ax2.set_title("claim 11: pseudoinverse QK patch of layer 2 (Q random, K^T = pinv Q)\n"
                      "(first three: eval set; the others: sweep set)", fontsize=9)  # fmt: skip
        ax2.set_ylabel("MSE / unpatched MSE")
        ax2.legend(fontsize=8)
        return fig

    def residual_vs_target() -> Any:
        lens = d["lens"]
        fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
        last = batch.length - 1
        for ax, (name, which) in zip(axes, kinds, strict=True):
            idx = int(which.nonzero()[0]) if bool(which.any()) else 0
            plot.plot_residual_vs_target(
                lens[idx, last],
                batch.targets[idx, last],
                ax=ax,
                title=f"claim 13, primary reading (ln_final and W_U on layer 0's resid_post):\n"
                f"{name.replace('_', '-')} (c = {float(batch.c[idx]):+.2f}), last position",
                labels=("after layer 0 through W_U", "target a_{n+1}"),
            )
            paper = batch.inputs[idx, last] + PAPER_ALPHA * batch.inputs[idx, last - 1]
            ax.plot(paper.tolist(), color="tab:green", lw=1, label="paper: a_n + 2.3 a_{n-1}")
            legend = ax.get_legend()
            if legend is not None:
                legend.remove()
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncol=3, frameon=False)
        return fig

    def loss() -> Any:
        assert history is not None
        fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
        plot.plot_loss(
            history["steps"],
            history["train_loss"],
            eval_steps=history["eval_steps"],
            eval_losses=history["eval_loss"],
            ax=ax,
            title="training loss (claim 1)",
            reference=1e-4,
            reference_label="paper",
        )
        return fig

    makers: dict[str, Callable[[], Any]] = {
        f"attention_{name}": partial(attention, name, which) for name, which in kinds
    }
    makers.update(
        attribution=attribution,
        mlp_attribution=mlp_attribution,
        ov_linearity=ov_linearity,
        eigenvalue_scores=eigenvalue_scores,
        ablation_and_patch=ablation_and_patch,
        residual_vs_target=residual_vs_target,
    )
    if history is not None and history.get("steps"):
        makers["loss"] = loss
    return makers if lazy else {name: make() for name, make in makers.items()}
