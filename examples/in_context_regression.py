"""In-context linear regression: the shipped model's error curve against the baselines, and
three looks at its mechanism.

The task (``vecinterp.tasks.linear_regression``; Garg et al., "What Can Transformers Learn
In-Context? A Case Study of Simple Function Classes", 2022, arXiv:2208.01066): per prompt a
fresh ``w ~ N(0, I_d)``; the model reads ``x_1, y_1, x_2, y_2, ...`` and predicts each
``y_i = w . x_i`` at ``x_i``'s position. The script

1. draws the normalised squared error against the number of in-context examples for the
   model and the baselines on the same prompts (least squares, 3-nearest neighbours,
   averaging, zero) and prints it;
2. measures where each head attends from the x positions (the queries): to earlier y
   positions (the values), to earlier x positions, or to the query itself;
3. attributes the prediction at the x positions directly to each layer (the sum of the
   components is the output minus ``b_U``);
4. mean-ablates every head alone and reports how much the error past ``d`` examples grows.

Figures and ``summary.json`` go to ``--out`` (default ``outputs/in_context_regression``).
``--checkpoint state.pt --n-head 8`` runs the same on a checkpoint of Garg et al.'s own
code, opened with ``vi.from_garg_checkpoint`` (the ``hf`` extra); its ``d`` and number of
points are read from the weights.

Run::

    python examples/in_context_regression.py
    python examples/in_context_regression.py --checkpoint path/to/state.pt --n-head 8
"""

import argparse
import json
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import linear_regression as lr


def main() -> None:
    parser = argparse.ArgumentParser(
        description="In-context linear regression (Garg et al. 2022): the shipped model's "
        "error curve against the baselines, where its heads attend, the direct attribution "
        "of its predictions and each head's ablation."
    )
    parser.add_argument("--out", default="outputs/in_context_regression")
    parser.add_argument("--prompts", type=int, default=2048, help="eval prompts (default 2048)")
    parser.add_argument(
        "--checkpoint", help="a Garg et al. state.pt / model.pt instead (needs --n-head)"
    )
    parser.add_argument(
        "--n-head",
        type=int,
        help="the number of heads of --checkpoint's model (model.n_head in its conf/*.yaml; "
        "8 in the paper): the weights do not say it, so it is required with --checkpoint",
    )
    parser.add_argument("--seed", type=int, default=20_000)
    parser.add_argument("--no-figures", action="store_true")
    args = parser.parse_args()
    if args.checkpoint and args.n_head is None:
        parser.error(
            "--checkpoint needs --n-head: the number of heads of the checkpoint's model "
            "(model.n_head in its conf/*.yaml; 8 in the paper), which its weights do not say"
        )
    if args.n_head is not None and not args.checkpoint:
        parser.error("--n-head is the number of heads of --checkpoint's model: give both")
    start = time.perf_counter()
    torch.set_num_threads(vi.choose_threads())  # the idle cores: see getting started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.checkpoint:
        model = vi.from_garg_checkpoint(args.checkpoint, n_head=args.n_head)
        print(f"opened {args.checkpoint}: {model.cfg.n_layers} layers, width {model.cfg.d_model}")
    else:
        model = lr.load_reference()
    dim, n_points = model.cfg.d_in, model.cfg.n_ctx // 2
    batch = lr.generate(args.prompts, dim=dim, n_points=n_points, seed=args.seed)
    population = lr.generate(512, dim=dim, n_points=n_points, seed=args.seed + 1)
    summary: dict = {"dim": dim, "n_points": n_points, "prompts": args.prompts}

    # 1. the error curve against the baselines
    curves = lr.error_curves(model, batch)
    print(f"\nnormalised squared error by in-context examples (d = {dim}):")
    names = ["model", "least_squares", "3-nearest_neighbours", "averaging"]
    widths = [max(len(n), 10) for n in names]  # every header whole
    print("  k  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True)))
    for k in range(n_points):
        cells = (f"{float(curves[n].mean[k]):{w}.4f}" for n, w in zip(names, widths, strict=True))
        print(f" {k:2d}  " + "  ".join(cells))
    summary["curves"] = {n: c.mean.tolist() for n, c in curves.items()}

    # 2. attention from the x positions: to y positions, to x positions, to itself
    _, cache = model.run_with_cache(batch.inputs, names_filter=lambda n: "pattern" in n)
    n_pos = 2 * n_points
    is_y = torch.arange(n_pos) % 2 == 1
    queries = ~is_y
    queries[0] = False  # position 0 can only attend to itself
    shares = {}
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer].mean(0)[:, queries]  # [head, query, key]
        self_share = torch.diagonal(cache["pattern", layer].mean(0), dim1=-2, dim2=-1)[:, queries]
        y_share = pattern[..., is_y].sum(-1).mean(-1)
        self_mean = self_share.mean(-1)
        for h in range(model.cfg.n_heads):
            shares[f"L{layer}H{h}"] = {
                "to_y": float(y_share[h]),
                "to_self": float(self_mean[h]),
                "to_earlier_x": float(1 - y_share[h] - self_mean[h]),
            }
    print("\nattention from x positions (mean share): head  to earlier y  to self  to earlier x")
    for name, s in shares.items():
        print(f"  {name:6s} {s['to_y']:12.2f} {s['to_self']:8.2f} {s['to_earlier_x']:13.2f}")
    summary["attention_from_x"] = shares

    # 3. direct attribution of the x-position predictions, by layer
    y, cache = model.run_with_cache(batch.inputs)
    targets = torch.ones_like(y)  # the output coordinate itself: sums to y - b_U
    attr = vi.direct_attribution(model, cache, targets, components="layers")
    x_pos = attr.values[:, :, 0::2]
    by_component = {
        label: float(v.abs().mean()) for label, v in zip(attr.labels, x_pos, strict=True)
    }
    print("\nmean |direct attribution| to the prediction at x positions, by component:")
    for label, v in by_component.items():
        print(f"  {label:12s} {v:8.3f}")
    summary["direct_attribution_abs"] = by_component

    # 4. each head mean-ablated alone: the error past d examples
    past_d = torch.zeros(n_pos, dtype=torch.bool)
    past_d[2 * dim :: 2] = True  # x positions with at least d examples before them

    def past_d_error(output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return ((output - t)[:, past_d, 0] ** 2).mean() / dim

    sweep, base = vi.head_ablation_sweep(
        model,
        batch.inputs,
        batch.targets,
        kind="mean",
        population=population.inputs,
        metric=past_d_error,
        progress=False,
        return_baseline=True,
    )
    print(f"\nerror past d examples: {float(base):.4f} unablated; each head mean-ablated:")
    for layer in range(model.cfg.n_layers):
        print(f"  layer {layer}: " + "  ".join(f"{float(v):7.3f}" for v in sweep[layer]))
    summary["ablation_past_d"] = {"baseline": float(base), "heads": sweep.tolist()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))

    if not args.no_figures:
        try:
            import matplotlib

            matplotlib.use("Agg")
        except ImportError:
            print("matplotlib is not installed (pip install 'vecinterp[plot]'): no figures")
        else:
            from vecinterp.plot import (
                plot_attention_grid,
                plot_attribution,
                plot_matrix,
                save_figure,
            )

            title = f"Normalised squared error vs in-context examples\n(d = {dim}; 95 % bands)"
            save_figure(lr.plot_error_curves(curves, title=title), out / "error_curve.png")
            patterns = torch.stack([cache["pattern", i].mean(0) for i in range(model.cfg.n_layers)])
            grid = plot_attention_grid(
                patterns,
                title="Mean attention pattern per head (queries: rows; x at even positions)",
            )
            save_figure(grid, out / "attention.png")
            ax = plot_attribution(
                list(by_component.values()),
                list(by_component),
                title="Mean |direct attribution|\nto the predictions at x positions",
            )
            save_figure(ax, out / "attribution.png")
            fig = plot_matrix(
                sweep - base,
                title=f"Increase of the error past d examples,\n"
                f"each head mean-ablated (unablated {float(base):.3f})",
                xlabel="head",
                ylabel="layer",
            )
            save_figure(fig, out / "ablation.png")
            print(f"\nfigures in {out}/")
    print(f"wall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
