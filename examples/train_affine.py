"""Train the affine-recurrence paper's model with vecinterp's own training loop.

Recipes (``--recipe``): ``fast`` (the default, ``affine_recurrence.FAST_RECIPE``, which
trained the shipped reference model ``affine_recurrence.load_reference("fast")``;
benchmarks/train_affine.py measures its speed-up) and ``paper`` (100k steps, batch 16, AdamW
lr 1e-4, wd 0.01). ``--lr`` scales a cosine schedule's floor with the peak. ``--init``
chooses the initialisation (``VectorTransformerConfig.init``): ``gpt2`` (the default) or
``transformer_lens``, the one the paper's authors had (TransformerLens's default: every
weight matrix N(0, (0.8/sqrt(d_model))²), no shrinking of ``W_O`` and ``W_out``).
``--init-range`` overrides the initialisation's standard deviation and ``--act-fn`` the MLP's
nonlinearity (``VectorTransformerConfig.act_fn``; the paper's model uses ``relu``).
``--setup arena`` is ARENA's "transformer from scratch" set-up, which the authors' fork most
likely started from: ``--init transformer_lens --init-range 0.02 --act-fn gelu_tanh`` (every
weight matrix N(0, 0.02²), no shrinking of ``W_O``/``W_out``, GELU with the tanh
approximation). It does not freeze ``b_U``: ARENA's ``Unembed`` keeps its bias at 0 throughout
training, which is ``--setup arena --freeze unembed.b_U``. ``--freeze NAME [NAME ...]`` keeps
the named parameters (as ``model.named_parameters()`` names them) at their initial values,
passed to ``vi.train(frozen=...)``: no gradient step, no weight decay, outside the clipped
norm. What is kept is the initial value: every bias starts at zero (``b_U`` included, under
every ``--init``), so ``--freeze unembed.b_U`` trains with ``b_U = 0``. ``--normalise all``
scales each sequence by the largest norm among all its vectors, targets included
(``affine_recurrence.NORMALISATIONS``; the tag gains ``_normall``; judge such a model with
``measure_claims(..., normalise="all")``).
``--threads`` sets torch's intra-op threads (the paper recipe's timings are with 1).

Run: python examples/train_affine.py [--recipe paper] [--init transformer_lens | --setup arena]
[--freeze unembed.b_U] [--seed 1] [--threads 1] [--resume]

The model goes to ``--out`` (default ``checkpoints/affine_<recipe><tag>_seed<seed>``; load it
with ``vi.load``), the resumable training checkpoints to
``checkpoints/_train_runs/<recipe><tag>_seed<seed>``. The tag names the set-up so that runs
never collide: none for the default, ``_tlinit`` for TransformerLens's initialisation,
``_arena`` for ARENA's set-up, and otherwise ``_<init>_r<init-range>_<act-fn>``; frozen
parameters add ``_frozen-<names>`` (each by its last part where that is unique, ``b_U`` for
``unembed.b_U``, else in full; e.g. ``paper_arena_frozen-b_U_seed0``). The metadata saved with
the model records ``frozen`` (the sorted names; empty for none).
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
from vecinterp.model.config import ACT_FNS
from vecinterp.tasks import affine_recurrence as ar

SETUPS = {
    # ARENA's "transformer from scratch" Config: init_range 0.02 for every matrix, GELU-tanh
    "arena": dict(init="transformer_lens", init_range=0.02, act_fn="gelu_tanh"),
}

RECIPES = {
    # the paper's recipe (§3.2)
    "paper": ar.PAPER_RECIPE,
    # larger batches, a higher peak learning rate with warm-up, a cosine decay, clipping;
    # the recipe of the shipped checkpoint; benchmarks/train_affine.py measures it
    "fast": ar.FAST_RECIPE,
}


def run_setup(args: argparse.Namespace) -> dict:
    """The model config's keyword arguments: the paper's model with the chosen set-up."""
    kwargs = dict(ar.MODEL_CONFIG_KWARGS, init="gpt2")
    if args.setup is not None:
        kwargs.update(SETUPS[args.setup])
    for key in ("init", "init_range", "act_fn"):
        value = getattr(args, key)
        if value is not None:
            if args.setup is not None and value != kwargs[key]:
                raise SystemExit(
                    f"--{key.replace('_', '-')} {value} contradicts --setup {args.setup}"
                )
            kwargs[key] = value
    return kwargs


def setup_tag(kwargs: dict) -> str:
    """The run name's tag for a set-up (empty for the default), so that runs never collide."""
    for name, setup in SETUPS.items():
        if all(kwargs.get(k) == v for k, v in setup.items()):
            return f"_{name}"
    default_act = ar.MODEL_CONFIG_KWARGS["act_fn"]
    if kwargs.get("init_range") is None and kwargs["act_fn"] == default_act:
        return "_tlinit" if kwargs["init"] == "transformer_lens" else ""
    init = {"transformer_lens": "tlinit", "gpt2": "gpt2"}[kwargs["init"]]
    rng = "" if kwargs.get("init_range") is None else f"_r{kwargs['init_range']:g}"
    return f"_{init}{rng}_{kwargs['act_fn']}"


def frozen_tag(names: list[str], model: vi.HookedVectorTransformer) -> str:
    """The run name's tag for frozen parameters (empty for none): ``_frozen-b_U`` for
    ``unembed.b_U``; a name whose last part other parameters share is kept whole."""
    if not names:
        return ""
    leaves = [name.rsplit(".", 1)[-1] for name, _ in model.named_parameters()]
    short = [
        name.rsplit(".", 1)[-1] if leaves.count(name.rsplit(".", 1)[-1]) == 1 else name
        for name in sorted(set(names))
    ]
    return "_frozen-" + "-".join(short)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="fast")
    parser.add_argument("--steps", type=int, help="override the recipe's number of steps")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", choices=["gpt2", "transformer_lens"], default=None)
    parser.add_argument("--init-range", type=float, help="default: the --init's own range")
    parser.add_argument("--act-fn", choices=list(ACT_FNS), default=None)
    parser.add_argument(
        "--setup",
        choices=sorted(SETUPS),
        help="a named set-up (see above); arena does not freeze b_U: "
        "--setup arena --freeze unembed.b_U is ARENA's Unembed (b_U kept at 0)",
    )
    parser.add_argument(
        "--freeze",
        nargs="+",
        metavar="NAME",
        default=[],
        help="keep these parameters (model.named_parameters() names, e.g. unembed.b_U) at "
        "their initial values (vi.train(frozen=...)); the run name gains _frozen-<names>",
    )
    parser.add_argument("--normalise", choices=ar.NORMALISATIONS, default="inputs")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", help="default: checkpoints/affine_<recipe>_seed<seed>")
    parser.add_argument(
        "--checkpoint-dir", default=None, help="default: OUT/../_train_runs/<recipe>_seed<seed>"
    )
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model_kwargs = run_setup(args)
    cfg = vi.VectorTransformerConfig(**model_kwargs)
    model = vi.HookedVectorTransformer(cfg, seed=args.seed)
    norm_tag = "" if args.normalise == "inputs" else f"_norm{args.normalise}"
    tags = f"{setup_tag(model_kwargs)}{frozen_tag(args.freeze, model)}{norm_tag}"
    run_name = f"{args.recipe}{tags}_seed{args.seed}"
    args.out = args.out or f"checkpoints/affine_{run_name}"
    recipe: dict = dict(RECIPES[args.recipe])
    if args.lr is not None and "min_lr" in recipe:
        recipe["min_lr"] *= args.lr / recipe["lr"]
    for key in ("steps", "batch_size", "lr"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    batch_size = recipe["batch_size"]
    eval_seed = 10_000 + args.seed
    eval_set = ar.fixed_eval_set(24, 64, seed=eval_seed, normalise=args.normalise)
    checkpoint_dir = Path(args.checkpoint_dir or Path(args.out).parent / "_train_runs" / run_name)

    start = time.perf_counter()
    result = vi.train(
        model,
        lambda step, gen: ar.generate(batch_size, generator=gen, normalise=args.normalise),
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
        frozen=args.freeze or None,
    )
    wall = time.perf_counter() - start
    final = vi.evaluate(result.model, eval_set)
    meta = {
        "recipe": args.recipe,
        "init": cfg.init,
        "init_range": cfg.init_range,
        "act_fn": cfg.act_fn,
        "setup": args.setup,
        "frozen": sorted(args.freeze),
        "normalise": args.normalise,
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
    return meta


if __name__ == "__main__":
    main()
