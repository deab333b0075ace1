"""Train the affine-recurrence paper's model with vecinterp's own training loop.

Recipes (``--recipe``): ``fast`` (the default, ``affine_recurrence.FAST_RECIPE``, which
trained the shipped reference model ``affine_recurrence.load_reference("fast")``;
benchmarks/train_affine.py measures its speed-up) and ``paper`` (100k steps, batch 16, AdamW
lr 1e-4, wd 0.01). ``--lr`` scales a cosine schedule's floor with the peak. ``--init``
chooses the initialisation (``VectorTransformerConfig.init``): ``gpt2`` (the default) or
``transformer_lens``, the one the paper's authors had (TransformerLens's default: every
weight matrix N(0, (0.8/sqrt(d_model))²), no shrinking of ``W_O`` and ``W_out``).
``--threads`` sets torch's intra-op threads (the paper recipe's timings are with 1).

Run: python examples/train_affine.py [--recipe paper] [--init transformer_lens] [--seed 1]
[--threads 1] [--resume]

The model goes to ``--out`` (default ``checkpoints/affine_<recipe>[_tlinit]_seed<seed>``; load
it with ``vi.load``), the resumable training checkpoints to
``checkpoints/_train_runs/<recipe>[_tlinit]_seed<seed>``.
To ship a trained model as a reference model, copy its folder to
``src/vecinterp/tasks/reference/affine_recurrence_<name>/`` with a README saying how it was
trained, and add ``<name>`` to ``affine_recurrence.REFERENCE_MODELS``.
"""

import argparse
import json
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

RECIPES = {
    # the paper's recipe (§3.2)
    "paper": ar.PAPER_RECIPE,
    # larger batches, a higher peak learning rate with warm-up, a cosine decay, clipping;
    # the recipe of the shipped checkpoint; benchmarks/train_affine.py measures it
    "fast": ar.FAST_RECIPE,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="fast")
    parser.add_argument("--steps", type=int, help="override the recipe's number of steps")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", choices=["gpt2", "transformer_lens"], default="gpt2")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", help="default: checkpoints/affine_<recipe>_seed<seed>")
    parser.add_argument(
        "--checkpoint-dir", default=None, help="default: OUT/../_train_runs/<recipe>_seed<seed>"
    )
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    init_tag = "_tlinit" if args.init == "transformer_lens" else ""
    run_name = f"{args.recipe}{init_tag}_seed{args.seed}"
    args.out = args.out or f"checkpoints/affine_{run_name}"
    recipe: dict = dict(RECIPES[args.recipe])
    if args.lr is not None and "min_lr" in recipe:
        recipe["min_lr"] *= args.lr / recipe["lr"]
    for key in ("steps", "batch_size", "lr"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    cfg = vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS, init=args.init)
    model = vi.HookedVectorTransformer(cfg, seed=args.seed)
    batch_size = recipe["batch_size"]
    eval_seed = 10_000 + args.seed
    eval_set = ar.fixed_eval_set(24, 64, seed=eval_seed)
    checkpoint_dir = Path(args.checkpoint_dir or Path(args.out).parent / "_train_runs" / run_name)

    start = time.perf_counter()
    result = vi.train(
        model,
        lambda step, gen: ar.generate(batch_size, generator=gen),
        steps=recipe["steps"],
        lr=recipe["lr"],
        weight_decay=recipe["weight_decay"],
        warmup_steps=min(recipe.get("warmup_steps", 0), recipe["steps"] // 10),
        schedule=recipe.get("schedule", "constant"),
        min_lr=recipe.get("min_lr", 0.0),
        grad_clip=recipe.get("grad_clip"),
        eval_data=eval_set,
        eval_every=args.eval_every,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        seed=args.seed,
    )
    wall = time.perf_counter() - start
    final = vi.evaluate(result.model, eval_set)
    meta = {
        "recipe": args.recipe,
        "init": args.init,
        "torch_threads": torch.get_num_threads(),
        **recipe,
        "seed": args.seed,
        "eval_mse": final,
        "eval_set": f"fixed_eval_set(24, 64, seed={eval_seed})",
        "wall_seconds_this_process": round(wall, 1),
        "torch": torch.__version__,
    }
    vi.save(result.model, args.out, metadata=meta)
    Path(args.out, "history.json").write_text(
        json.dumps(
            {
                "steps": result.history.steps,
                "train_loss": result.history.train_loss,
                "eval_steps": result.history.eval_steps,
                "eval_loss": result.history.eval_loss,
                "wall_time": result.history.wall_time,
            }
        )
    )
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
