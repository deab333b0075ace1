"""Train the in-context linear-regression model of Garg et al. (2022), scaled for a CPU.

The model is ``linear_regression.MODEL_CONFIG_KWARGS`` (4 layers, width 64, d = 5,
k = 11 points), the recipe ``linear_regression.RECIPE``; fresh noiseless prompts every step.
``--threads`` sets torch's intra-op threads (the reference model's timing is with 1).
Killed runs resume from the last training checkpoint when started again with the same
arguments.

Run: python examples/train_regression.py [--steps N] [--seed 0] [--threads 1] [--out DIR]

The model goes to ``--out`` (default ``checkpoints/regression_seed<seed>``; load it with
``vi.load``), the training checkpoints to ``OUT/../_train_runs/<OUT's name>``. The shipped
reference model (``linear_regression.load_reference()``) is this script's output with the
default arguments, its ``config.json`` and ``model.safetensors`` copied to
``src/vecinterp/tasks/reference/linear_regression_small/``.
"""

import argparse
import json
import time
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.tasks import linear_regression as lr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="override the recipe's number of steps")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", help="default: checkpoints/regression_seed<seed>")
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=1000)
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.out = args.out or f"checkpoints/regression_seed{args.seed}"
    recipe = dict(lr.RECIPE)
    if args.lr is not None:
        recipe["min_lr"] *= args.lr / recipe["lr"]
    for key in ("steps", "batch_size", "lr"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    cfg = vi.VectorTransformerConfig(**lr.MODEL_CONFIG_KWARGS)
    model = vi.HookedVectorTransformer(cfg, seed=args.seed)
    batch_size = recipe["batch_size"]
    eval_seed = 10_000 + args.seed
    eval_set = lr.generate(1024, seed=eval_seed)

    start = time.perf_counter()
    result = vi.train(
        model,
        lambda step, gen: lr.generate(batch_size, generator=gen),
        steps=recipe["steps"],
        lr=recipe["lr"],
        weight_decay=recipe["weight_decay"],
        warmup_steps=min(recipe["warmup_steps"], recipe["steps"] // 10),
        schedule=recipe["schedule"],
        min_lr=recipe["min_lr"],
        grad_clip=recipe["grad_clip"],
        eval_data=eval_set,
        eval_every=args.eval_every,
        checkpoint_dir=Path(args.out).parent / "_train_runs" / Path(args.out).name,
        checkpoint_every=args.checkpoint_every,
        resume=True,
        seed=args.seed,
    )
    wall = time.perf_counter() - start
    final = vi.evaluate(result.model, eval_set)
    meta = {
        "torch_threads": torch.get_num_threads(),
        **recipe,
        "seed": args.seed,
        "eval_mse": final,
        "eval_set": f"linear_regression.generate(1024, seed={eval_seed})",
        "wall_seconds_this_process": round(wall, 1),
        "train_seconds_all_processes": round(result.history.wall_time[-1], 1)
        if result.history.wall_time
        else None,
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
