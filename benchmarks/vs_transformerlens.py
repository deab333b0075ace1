"""vecinterp against TransformerLens 3 on the same model and weights, with a plain PyTorch
model of the same math as the floor.

Configuration: the affine-recurrence paper's model
(``vecinterp.tasks.affine_recurrence.MODEL_CONFIG_KWARGS``: d_in 40, d_model 128, d_head 64,
8 heads, 3 layers, d_mlp 3072, LayerNorm, learned positions), random weights (seed 0),
fp32, length 14, batch 16 and 256. TransformerLens gets the same weights through
``vecinterp.interop.to_transformer_lens``; the plain model is
``vecinterp.testing.PlainTransformer`` (fused ``F.linear``, ``F.layer_norm``,
``scaled_dot_product_attention``, no hooks).

TransformerLens embeds token indices, so it is fed vectors by the documented recipe,
inside every timed call: ``resid = x @ W_E + W_pos[:pos]``, then
``tl_model(resid, start_at_layer=0)`` (its ``run_with_cache``/``run_with_hooks`` likewise).

Operations (each checked to give the same numbers on all sides):

- forward: ``model(x)`` / ``tl_model(resid, start_at_layer=0)`` / ``plain(x)``.
- run_with_cache: each library's default (vecinterp leaves out the per-head results and
  the MLP post-activations, which it recomputes on access; TransformerLens caches every
  hook that fires). Floor: the plain forward.
- train step: AdamW step on the MSE to random targets (zero_grad, forward, backward, step).
- mean-ablation sweep over all 24 heads: ``vi.head_ablation_sweep`` (batched passes)
  vs a loop of 24 ``run_with_hooks`` replacing one head's ``hook_z`` by its per-position
  mean; the means (over 1,000 random sequences) are computed once, outside the timing.
  Floor: 24 plain forward passes (the loop without any hook cost).
- activation patching of ``resid_pre`` over layers x positions (3 x 14 cells):
  ``vi.activation_patching`` (batched) vs a loop of 42 ``run_with_hooks`` pasting one
  position of the clean ``resid_pre`` (what TransformerLens's
  ``get_act_patch_resid_pre`` does; that function itself cannot take vector inputs: it
  reads the number of positions from the input's last axis and embeds the input as
  tokens). Both include the clean run. Floor: 43 plain forward passes.

Timing: the implementations alternate round by round, so that machine noise hits them
alike; each time is the best round, and ratios of the medians are given in brackets. The
fast operations run ``--rounds`` rounds at batch 16 (fewer, at least 3, at larger
batches), the analyses ``--heavy-rounds`` (their first round, which also checks that both
sides give the same numbers, counts: no separate warm-up). The analyses' plain floors are
3 plain forward passes timed in each of their rounds and scaled to 24 or 43 passes.
Default run: about 3 minutes of one core (1 thread).

Run: python benchmarks/vs_transformerlens.py [--rounds N] [--heavy-rounds M] [--threads T]
[--cpu-time] [--batches 16 256] (needs ``pip install "vecinterp[transformer-lens]"``).
"""

import argparse
import copy
import platform
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version

import torch

import vecinterp as vi
from vecinterp.analysis.ablation import head_ablation_sweep, mean_activations
from vecinterp.analysis.patching import activation_patching
from vecinterp.interop.transformer_lens import to_transformer_lens
from vecinterp.tasks.affine_recurrence import MODEL_CONFIG_KWARGS
from vecinterp.testing import PlainTransformer

N_POS = 14
POPULATION = 1000
CLOCK = time.perf_counter


def timed(fn: Callable[[], object], reps: int) -> float:
    start = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - start) / reps


def interleaved(calls: dict[str, Callable[[], object]], rounds: int, reps: int) -> dict:
    """Best and median seconds per call of each implementation, interleaved by round."""
    for fn in calls.values():  # warm-up
        timed(fn, 1)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(timed(fn, reps))
    return {k: (min(v), statistics.median(v)) for k, v in times.items()}


class Sides:
    """The three models with the same weights, and the inputs of one batch size."""

    def __init__(self, batch: int, means: dict[str, torch.Tensor]):
        cfg = vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)
        self.cfg = cfg
        self.model = vi.HookedVectorTransformer(cfg, seed=0).eval()
        self.tl = to_transformer_lens(self.model).eval()
        self.plain = PlainTransformer(cfg, self.model.state_dict()).eval()
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(batch, N_POS, cfg.d_in, generator=gen)
        self.corrupted = torch.randn(batch, N_POS, cfg.d_in, generator=gen)
        self.targets = torch.randn(batch, N_POS, cfg.d_out, generator=gen)
        self.means = means

    def resid(self, x: torch.Tensor) -> torch.Tensor:
        """TransformerLens's input for vectors: ``x @ W_E + W_pos[:pos]``."""
        return x @ self.tl.W_E + self.tl.W_pos[: x.shape[1]]

    def tl_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tl(self.resid(x), start_at_layer=0)

    # -- the mean-ablation sweep ----------------------------------------------------
    def ours_sweep(self) -> torch.Tensor:
        return head_ablation_sweep(
            self.model, self.x, self.targets, kind="mean", population=self.means, progress=False
        )

    def tl_sweep(self) -> torch.Tensor:
        cfg = self.cfg
        scores = torch.empty(cfg.n_layers, cfg.n_heads)
        for layer in range(cfg.n_layers):
            name = f"blocks.{layer}.attn.hook_z"
            mean = self.means[name][:N_POS]  # [pos, n_heads, d_head]
            for head in range(cfg.n_heads):

                def ablate(z, hook, head=head, mean=mean):
                    z[:, :, head] = mean[:, head]
                    return z

                out = self.tl.run_with_hooks(
                    self.resid(self.x), start_at_layer=0, fwd_hooks=[(name, ablate)]
                )
                scores[layer, head] = vi.masked_mse(out, self.targets)
        return scores

    # -- activation patching over layers x positions --------------------------------
    def metric(self, y: torch.Tensor) -> torch.Tensor:
        return vi.masked_mse(y, self.targets)

    def ours_patching(self) -> torch.Tensor:
        return activation_patching(
            self.model, self.x, self.corrupted, self.metric, "resid_pre", progress=False
        )

    def tl_patching(self) -> torch.Tensor:
        cfg = self.cfg
        _, clean = self.tl.run_with_cache(
            self.resid(self.x),
            start_at_layer=0,
            names_filter=lambda n: n.endswith("hook_resid_pre"),
        )
        result = torch.empty(cfg.n_layers, N_POS)
        for layer in range(cfg.n_layers):
            name = f"blocks.{layer}.hook_resid_pre"
            for pos in range(N_POS):

                def patch(act, hook, pos=pos, name=name):
                    act[:, pos] = clean[name][:, pos]
                    return act

                # a fresh residual stream per run (the hook edits it in place, as
                # TransformerLens's patch setters do; tokens would be embedded afresh too)
                out = self.tl.run_with_hooks(
                    self.resid(self.corrupted), start_at_layer=0, fwd_hooks=[(name, patch)]
                )
                result[layer, pos] = self.metric(out)
        return result

    # -- a training step ------------------------------------------------------------
    def train_steps(self) -> dict[str, Callable[[], object]]:
        """One AdamW step per call on each side, each on its own copy of the weights (the
        models of the other operations stay untouched: Adam's updates would make the
        copies drift apart at the 1e-4 level)."""
        x, t = self.x, self.targets
        model = copy.deepcopy(self.model)
        tl_model = to_transformer_lens(self.model)
        plain = PlainTransformer(self.cfg, self.model.state_dict())
        sides = {
            "plain": (plain, plain),
            "vecinterp": (model, model),
            "TransformerLens": (
                tl_model,
                lambda x: tl_model(
                    x @ tl_model.W_E + tl_model.W_pos[: x.shape[1]], start_at_layer=0
                ),
            ),
        }
        steps = {}
        for name, (module, forward) in sides.items():
            opt = torch.optim.AdamW(module.parameters(), lr=1e-4, weight_decay=0.01)

            def step(opt=opt, forward=forward):
                opt.zero_grad(set_to_none=True)
                loss = vi.masked_mse(forward(x), t)
                loss.backward()
                opt.step()
                return loss.detach()

            steps[name] = step
        return steps

    def check(self) -> None:
        """The forward and a training step give the same numbers on every side (the
        analyses are compared in their first timed round)."""
        with torch.inference_mode():
            y = self.model(self.x)
            assert torch.allclose(self.plain(self.x), y, atol=1e-5), "plain disagrees"
            assert torch.allclose(self.tl_forward(self.x), y, atol=1e-5), "TL disagrees"
        losses = [float(step()) for step in self.train_steps().values()]
        assert max(losses) - min(losses) < 1e-5 * max(losses), losses


def heavy(sides: Sides, ours: Callable, theirs: Callable, passes: int, rounds: int) -> dict:
    """Best and median seconds of an analysis on both sides, interleaved by round; the
    first round (no separate warm-up: these take seconds) also checks that both give the
    same numbers. The plain floor is ``passes`` plain forward passes, timed as 3 passes in
    the same rounds (the whole loop would double the run time) and scaled."""
    times: dict[str, list[float]] = {"plain": [], "vecinterp": [], "TransformerLens": []}
    for i in range(rounds):
        start = CLOCK()
        ours_result = ours()
        times["vecinterp"].append(CLOCK() - start)
        start = CLOCK()
        theirs_result = theirs()
        times["TransformerLens"].append(CLOCK() - start)
        if i == 0:
            diff = (ours_result - theirs_result).abs().max()
            assert torch.allclose(ours_result, theirs_result, rtol=1e-4, atol=1e-6), diff
        times["plain"].append(timed(lambda: sides.plain(sides.x), 3) * passes)
    return {k: (min(v), statistics.median(v)) for k, v in times.items()}


def measure(batch: int, means: dict[str, torch.Tensor], rounds: int, heavy_rounds: int):
    sides = Sides(batch, means)
    sides.check()
    reps = max(1, 160 // batch)
    rounds = max(3, rounds * 16 // batch)  # fewer rounds of the long calls at batch 256
    rows = {}
    with torch.inference_mode():
        rows["forward"] = interleaved(
            {
                "plain": lambda: sides.plain(sides.x),
                "vecinterp": lambda: sides.model(sides.x),
                "TransformerLens": lambda: sides.tl_forward(sides.x),
            },
            rounds,
            reps,
        )
        rows["run_with_cache"] = interleaved(
            {
                "plain": lambda: sides.plain(sides.x),
                "vecinterp": lambda: sides.model.run_with_cache(sides.x),
                "TransformerLens": lambda: sides.tl.run_with_cache(
                    sides.resid(sides.x), start_at_layer=0
                ),
            },
            rounds,
            reps,
        )
    rows["train step"] = interleaved(sides.train_steps(), rounds, reps)
    cfg = sides.cfg
    with torch.inference_mode():
        rows[f"mean-ablation sweep ({cfg.n_layers * cfg.n_heads} heads)"] = heavy(
            sides, sides.ours_sweep, sides.tl_sweep, cfg.n_layers * cfg.n_heads, heavy_rounds
        )
        rows[f"patching resid_pre ({cfg.n_layers} x {N_POS})"] = heavy(
            sides, sides.ours_patching, sides.tl_patching, cfg.n_layers * N_POS + 1, heavy_rounds
        )
    return rows


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description="vecinterp vs TransformerLens")
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="rounds of the fast operations at batch 16 (scaled down for larger batches)",
    )
    parser.add_argument(
        "--heavy-rounds", type=int, default=2, help="rounds of the sweep and the patching (>= 1)"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process CPU clock (steadier on a busy machine; use with --threads 1)",
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, TransformerLens {version('transformer-lens')}, "
        f"{torch.get_num_threads()} threads, {platform.machine()}, "
        f"rounds {args.rounds} (sweep/patching {args.heavy_rounds}), "
        f"{'process CPU' if args.cpu_time else 'wall'} clock"
    )
    cfg = vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)
    model = vi.HookedVectorTransformer(cfg, seed=0).eval()
    pop = torch.randn(POPULATION, N_POS, cfg.d_in, generator=torch.Generator().manual_seed(0))
    means = mean_activations(model, pop, lambda name: name.endswith("attn.hook_z"))
    header = (
        "| batch | operation | plain | vecinterp | TransformerLens | vecinterp / TL "
        "| vecinterp / plain | TL / plain |\n|---|---|---|---|---|---|---|---|"
    )
    print(header)
    for batch in args.batches:
        rows = measure(batch, means, args.rounds, args.heavy_rounds)
        for op, r in rows.items():
            (p, pm), (o, om), (t, tm) = r["plain"], r["vecinterp"], r["TransformerLens"]
            print(
                f"| {batch} | {op} | {fmt_time(p)} | {fmt_time(o)} | {fmt_time(t)} "
                f"| {o / t:.2f}x ({om / tm:.2f}x) | {o / p:.2f}x ({om / pm:.2f}x) "
                f"| {t / p:.2f}x ({tm / pm:.2f}x) |",
                flush=True,
            )
    print("best-of-rounds times; ratios of the best (of the medians in brackets)")


if __name__ == "__main__":
    main()
