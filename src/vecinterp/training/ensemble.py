"""Ensembles: K models of one config trained in one process as one batched computation
(:func:`train_ensemble`, :class:`EnsembleResult`), or split across the ranks of a
``torchrun`` job, each rank training its share as one batched computation.

The batched arithmetic is in :mod:`vecinterp.training._stacked`; the members' checkpoints
are :func:`vecinterp.train`'s, one directory per member (:mod:`._ensemble_checkpoint`); the
split across ranks is in :mod:`._ensemble_distributed`. One file over 450 lines: the
training loop of an ensemble, whose steps share the state set up before it.
"""

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..model.transformer import HookedVectorTransformer
from ..model.validation import check_bool
from . import _ensemble_checkpoint as ck
from ._ensemble_distributed import Crew
from ._ensemble_setup import check_forward, check_models, member_data, per_member
from ._pending import MemberSteps, all_diverged, member_error
from ._speed import RunThreads, StepPace, warn_slow
from ._stacked import adamw_step, alias, losses_and_grads, stack_batches, stack_weights
from .checkpoint import own_directory, remove_partial
from .compiled import compiled_stacked_forward
from .data import to_model
from .distributed import join_ranks
from .loop import Data, _adamw, _update_average
from .result import TrainHistory, TrainingDivergedError, TrainResult
from .schedule import check_int, check_schedule, lr_at
from .setup import check_args, check_ema, check_threads, check_trainable, make_eval, make_source

ON_DIVERGENCE = ("freeze", "raise")


@dataclasses.dataclass
class EnsembleResult:
    """What :func:`train_ensemble` returns: one :class:`~vecinterp.TrainResult` per member.

    It is a sequence of those results (``len``, indexing, iteration), member ``i`` at
    index ``i``.

    Attributes:
        results: member ``i``'s :class:`~vecinterp.TrainResult`: an ordinary trained
            :class:`~vecinterp.HookedVectorTransformer` (sharing no storage with the
            others), its :class:`~vecinterp.TrainHistory`, a ``torch.optim.AdamW`` holding
            its optimizer state, and its newest checkpoint.
        diverged: ``None`` for a member that trained to the end; for one frozen by
            ``on_divergence="freeze"``, the :class:`~vecinterp.TrainingDivergedError` that
            stopped it (its step, the quantity and value). Its model is its state before
            that step and its history ends there.
        device: where the ensemble was trained (across ranks: this rank's device, where
            it holds every member's result).

    Example:
        >>> import torch, vecinterp as vi
        >>> cfg = vi.VectorTransformerConfig(d_in=2, d_model=8, d_head=4, n_heads=2,
        ...                                  n_layers=1, n_ctx=4)
        >>> models = [vi.HookedVectorTransformer(cfg, seed=s) for s in range(3)]
        >>> def make_batch(step, gen):
        ...     x = torch.randn(8, 4, 2, generator=gen)
        ...     return x, -x
        >>> out = vi.train_ensemble(models, make_batch, steps=5, lr=1e-2, seed=[0, 1, 2],
        ...                         progress=False, device="cpu")
        >>> len(out), [len(h.train_loss) for h in out.histories], out.diverged
        (3, [5, 5, 5], [None, None, None])
        >>> out.models[2] is out[2].model
        True
    """

    results: list[TrainResult]
    diverged: list[TrainingDivergedError | None]
    device: torch.device

    @property
    def models(self) -> list[HookedVectorTransformer]:
        """The trained models, member ``i`` at index ``i``."""
        return [r.model for r in self.results]

    @property
    def histories(self) -> list[TrainHistory]:
        """The members' loss histories."""
        return [r.history for r in self.results]

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, member: int) -> TrainResult:
        return self.results[member]

    def __iter__(self) -> Iterator[TrainResult]:
        return iter(self.results)


def train_ensemble(
    models: Sequence[HookedVectorTransformer],
    data: Data | Sequence[Data],
    *,
    steps: int,
    lr: float | Sequence[float],
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    warmup_steps: int = 0,
    schedule: str = "constant",
    min_lr: float = 0.0,
    grad_clip: float | None = None,
    ema_decay: float | None = None,
    ema_start: int = 0,
    eval_data: Any = None,
    eval_every: int | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
    keep_last: int | None = 2,
    resume: bool = False,
    seed: int | Sequence[int] = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    log_every: int = 50,
    callback: Callable[[int, list[dict[str, float]]], Any] | None = None,
    on_divergence: str = "freeze",
    sync_every: int = 50,
    threads: int | str | None = "auto",
    compile: bool = False,
    frozen: object = None,
) -> EnsembleResult:
    """Train K models of one config at once, as one batched computation: K times
    :func:`vecinterp.train`.

    Member ``i`` is trained exactly as ``vi.train(models[i], data_i, lr=lr_i,
    seed=seed_i, ...)`` with the other arguments shared: the same masked MSE, schedule,
    AdamW (its own moments, its own learning rate, decoupled weight decay), gradient
    clipping to its *own* total norm, weight average, evaluation, history and
    checkpoints. The K forward and backward passes run as one computation on weights
    stacked on a leading member axis (batched matrix products, the heads' queries, keys
    and values in one product) and the K AdamW steps as one call of torch's fused AdamW
    kernel (one per distinct learning rate); each member's result equals ``vi.train``'s
    up to rounding (the batched products sum in another order; the tests hold the weights
    to 1e-10 in float64 after 20 steps). The batched forward pass has no hook
    points: models with hooks attached are refused, as ``vi.train`` refuses them, rather
    than trained without the intervention the hooks make (the returned models have hook
    points of their own); so are models with NaN/inf weights, naming the member.

    Speed: the point is an accelerator, which one small model leaves mostly idle and on
    which K members are as many kernel launches as one (not yet measured). On a CPU, busy
    with one model's matrix products already, the ensemble took about the time of K
    sequential runs in 3-update runs (0.8-1.1x their throughput) and 1.1-1.4x faster in
    30-update runs of the retrieval models (``benchmarks/ensemble.py``).

    On the first step the batched forward is checked against member 0's own forward.

    Host syncs, as in :func:`vecinterp.train`: each step's losses, gradient norms, numbers
    of scored positions and input checks stay on the device and are read in one transfer
    every ``sync_every`` steps, so that on a GPU the host queues the next steps while the
    device computes. They are also read before every evaluation, checkpoint and
    ``callback`` call (so with a callback, every step), at every ``log_every`` steps while
    the bar is shown, and after the last step; the first step reads the device a few times
    more (its input check, the forward check). Each member's first bad value is named as
    a read after every step would name it. With ``on_divergence="freeze"`` a member found
    diverged at a read has been updated by the steps since its bad one; it is put back to
    its state before that step by replaying them from a copy of the members' weights,
    AdamW moments and weight average taken at the start of each window of steps between
    two reads (one more copy of that state in memory, refreshed once a window; the replay
    runs only when a member diverged). The weights, histories and checkpoints do not depend
    on ``sync_every`` (bit for bit, in the tests); ``wall_time`` is the host's clock when a
    step was queued. Under ``torchrun`` every step is read: the ranks' check at the end of
    each step exchanges every member's loss, so a window without reads would need another
    exchange across the ranks.

    Across ranks: under ``torchrun --nproc_per_node N`` (or with ``torch.distributed``
    initialised with N > 1 ranks), every rank runs this same call and trains a contiguous
    share of the members, as one batched computation: rank ``r`` trains members
    ``r * (K // N) + min(r, K % N)`` onwards, ``K // N`` of them plus one on the first
    ``K % N`` ranks (K = 5 on 2 ranks: members 0-2 and 3-4; ``K < N`` is refused). Member
    ``i`` is the same model whatever the number of ranks: the same initial weights, seed,
    data and updates (the tests find it bit-identical on 1 and 2 CPU processes). Every rank
    returns all K members (each member's final state is broadcast by the rank that trained
    it): a script written for one process runs unchanged, e.g. a sweep of hundreds of
    models over many GPUs with one command, and any rank can go on to analyse any member;
    the price is every rank holding the whole ensemble at the end, as one process would.
    Rank 0 holds the checkpoint directory's lock, shows the progress bar and calls
    ``callback`` with all K members' metrics; each rank writes its own members'
    checkpoints, in the layout of one process, so a run resumes on any number of ranks. An
    error on any rank stops every rank at the end of that step, the others raising
    :class:`~vecinterp.training.distributed.RankFailedError` naming it. Inside
    :func:`~vecinterp.training.distributed.one_process` the ensemble trains on this process
    alone. See :mod:`vecinterp.training._ensemble_distributed` and
    :doc:`/howto_ensembles`.

    Arguments are :func:`vecinterp.train`'s, with these differences:

    - ``models``: K >= 1 models sharing one config and dtype (e.g.
      ``[vi.HookedVectorTransformer(cfg, seed=s) for s in range(K)]``); they are copied,
      not modified.
    - ``data``: one ``make_batch(step, generator)``, which every member calls with its own
      generator (seeded with its ``seed``); or a list of K data, one per member (each a
      ``make_batch`` or an iterable of batches). One iterable cannot feed several members:
      one iterable for all, or the same iterable object twice in the list
      (``[stream] * K``), is refused.
      At each step the members' batches are stacked, the smaller ones padded with
      unscored zeros (exact for a causal model; a non-causal one needs equal lengths).
    - ``lr``: one peak learning rate, or a sequence of K (``min_lr`` must not exceed any).
    - ``seed``: one seed for every member's data generator (the members then see the same
      batches and differ by their initial weights), or a sequence of K.
    - ``eval_data``: one evaluation set for every member.
    - ``callback(step, metrics)``: ``metrics`` is a list of K dicts, vi.train's for each
      member (empty for a frozen member); across ranks, on rank 0 alone, with every
      member's.
    - ``on_divergence``: when a member's loss or gradient norm turns NaN/inf (found before
      its update), ``"freeze"`` stops that member at its last good state (recorded in
      :attr:`EnsembleResult.diverged`; its checkpoints keep that state) and trains the
      others on; ``"raise"`` stops the ensemble with :class:`TrainingDivergedError`, as
      ``vi.train`` does. Whatever the setting, the error is raised, naming the member,
      when every member has diverged, when the data are to blame (NaN/inf targets) and for
      a non-finite evaluation loss (found after an update, so no good state is left).
    - ``sync_every``: read the members' values on the host at least every this many steps
      (>= 1; see "Host syncs" above). ``1`` reads each step before its update. Under
      ``torchrun``, every step is read.
    - ``compile``: compile the K members' batched forward pass (and with it its
      backward) with ``torch.compile``; the masked losses, clipping and AdamW stay as
      they are. Members equal the eager ensemble's to rounding (tested); the checks and
      checkpoints are those of the eager ensemble. See :doc:`/howto_compile`.
    - ``frozen``: not supported by the ensemble (its batched AdamW updates every stacked
      parameter); anything but ``None`` raises ``NotImplementedError``. Train the members
      one by one with ``vi.train(..., frozen=...)``.

    Checkpoints: ``checkpoint_dir/member_003/step_00000500/`` is member 3's
    :func:`vecinterp.train` checkpoint after 500 updates (its config, optimizer state,
    RNG states, history; SHA-256 checksums), loadable with :func:`vecinterp.load` and
    resumable alone by ``vi.train``; ``checkpoint_dir/ensemble.json`` names the newest
    step that every member has written, the one ``resume=True`` continues from, ending
    bit-identical to an uninterrupted run on the same device. The ensemble holds
    ``checkpoint_dir``'s lock from start to end, as ``vi.train`` does; ``vi.train`` in
    ``checkpoint_dir/member_003`` is refused while the ensemble runs (however the directory
    is named: ``"."`` from inside it, or a symbolic link), and the ensemble while a run
    holds a member's directory. A resume refuses member directories whose
    ``trainer.json`` names another member (swapped or copied by hand), an
    ``ensemble.json`` that is not a regular file, and a missing ``ensemble.json`` while
    every member holds checkpoints (the message says how to resume or start afresh).

    Returns:
        An :class:`EnsembleResult`: K :class:`~vecinterp.TrainResult` (ordinary models).

    Raises:
        ValueError, TypeError: for bad arguments (naming them), members of different
            configs or dtypes, a batch that cannot be stacked (naming the member), and
            vi.train's errors.
        FileExistsError: checkpoints exist and ``resume=False``.
        TrainingDivergedError: see ``on_divergence``.
        RankFailedError: across ranks, on every rank but the one that failed.
        NotImplementedError: ``frozen`` other than ``None``.

    Example:
        >>> import torch, vecinterp as vi
        >>> cfg = vi.VectorTransformerConfig(d_in=2, d_model=8, d_head=4, n_heads=2,
        ...                                  n_layers=1, n_ctx=4)
        >>> models = [vi.HookedVectorTransformer(cfg, seed=s) for s in range(4)]
        >>> def make_batch(step, gen):
        ...     x = torch.randn(8, 4, 2, generator=gen)
        ...     return x, -x
        >>> out = vi.train_ensemble(models, make_batch, steps=30, lr=[1e-2, 1e-2, 3e-3, 3e-3],
        ...                         seed=range(4), progress=False, device="cpu")
        >>> [h.train_loss[-1] < h.train_loss[0] for h in out.histories]
        [True, True, True, True]
        >>> alone = vi.train(models[2], make_batch, steps=30, lr=3e-3, seed=2, progress=False,
        ...                  device="cpu")
        >>> bool(torch.allclose(alone.model.W_E, out.models[2].W_E, atol=1e-5))
        True
    """
    if frozen is not None:
        raise NotImplementedError(
            f"train_ensemble does not support frozen= (got {frozen!r}): its batched AdamW "
            "step updates every parameter of every member. Train the members one by one "
            "with vi.train(..., frozen=...), which does"
        )
    members = check_models(models)
    check_trainable({f"models[{i}]": member for i, member in enumerate(members)})
    check_threads(threads)
    check_bool("compile", compile)
    run = compiled_stacked_forward() if compile else None
    k = len(members)
    lrs, seeds = per_member("lr", lr, k), per_member("seed", seed, k)
    for lr_i, seed_i in zip(lrs, seeds, strict=True):
        check_args(members[0], steps, lr_i, weight_decay, betas, eps, grad_clip, eval_data,
                   eval_every, checkpoint_dir, checkpoint_every, keep_last, resume, seed_i,
                   progress, log_every, callback)  # fmt: skip
        check_schedule(lr=lr_i, steps=steps, warmup_steps=warmup_steps, schedule=schedule,
                       min_lr=min_lr)  # fmt: skip
    check_ema(ema_decay, ema_start, steps)
    check_int("sync_every", sync_every, minimum=1)
    if on_divergence not in ON_DIVERGENCE:
        raise ValueError(f"on_divergence must be one of {ON_DIVERGENCE}, got {on_divergence!r}")
    sources = [make_source(d, s) for d, s in zip(member_data(data, k), seeds, strict=True)]
    run_eval = make_eval(eval_data)
    cfg, dtype = members[0].cfg, next(members[0].parameters()).dtype
    configs = [
        {
            "model": cfg.to_dict(), "dtype": str(dtype), "lr": lrs[i],
            "weight_decay": weight_decay, "betas": list(betas), "eps": eps,
            "warmup_steps": warmup_steps, "schedule": schedule, "min_lr": min_lr,
            "grad_clip": grad_clip, "data": sources[i].kind, "steps": steps,
            **({"ema_decay": ema_decay, "ema_start": ema_start} if ema_decay is not None else {}),
            "seed": seeds[i] if sources[i].kind == "make_batch" else None,
        }
        for i in range(k)
    ]  # fmt: skip
    # one process unless under torchrun: then each rank trains its share (_ensemble_distributed)
    with RunThreads(threads) as run_threads, join_ranks(device) as ranks:
        crew = Crew(ranks, k)
        ranks.agree(_agreed(configs, on_divergence=on_divergence, eval=run_eval is not None,
                            eval_every=eval_every, checkpoint_every=checkpoint_every,
                            keep_last=keep_last, resume=resume, checkpoint_dir=None
                            if checkpoint_dir is None else os.fspath(checkpoint_dir)))  # fmt: skip
        dev, own, first = ranks.device, crew.members, crew.first
        n = len(own)
        sources = [sources[i] for i in own]
        stacked = stack_weights([members[i] for i in own], dev)
        nets = [HookedVectorTransformer(cfg, seed=0, dtype=dtype, device=dev) for _ in own]
        for j, net in enumerate(nets):
            alias(net, stacked, j)
            net.train()
        names = [name for name, _ in nets[0].named_parameters()]
        leaves = [stacked[name] for name in names]

        def make_optimizer(net: HookedVectorTransformer, rate: float) -> torch.optim.Optimizer:
            return _adamw(list(net.parameters()), lr=rate, betas=(betas[0], betas[1]), eps=eps,
                          weight_decay=weight_decay)  # fmt: skip

        state = ck.AdamState(
            [torch.zeros_like(t).detach() for t in leaves],
            [torch.zeros_like(t).detach() for t in leaves],
            [make_optimizer(net, lrs[i]) for net, i in zip(nets, own, strict=True)],
            [0] * n,
        )
        averages: list[HookedVectorTransformer] | None = None
        averaged: list[torch.Tensor] = []
        if ema_decay is not None:
            avg_stacked = {name: t.detach().clone() for name, t in stacked.items()}
            averages = [HookedVectorTransformer(cfg, seed=0, dtype=dtype, device=dev) for _ in own]
            for j, avg in enumerate(averages):
                alias(avg, avg_stacked, j)
                avg.eval()
            averaged = [avg_stacked[name] for name in names]
        # from here on, lists of n are this rank's members: member first + j at index j
        histories = [TrainHistory() for _ in own]
        diverged: list[TrainingDivergedError | None] = [None] * n
        checkpoints: list[Path | None] = [None] * n
        start, elapsed = 0, 0.0
        resumed: dict[str, Any] | None = None  # member 0's record of the step resumed from
        ckdir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        owner = None  # rank 0 holds the directory's lock from start to end
        try:
            if ckdir is not None:
                newest = None
                with ranks.hold():  # an error here stops every rank at the sync below
                    if ranks.is_main:
                        owner = own_directory(ckdir)
                        # vi.train in a member's directory would delete its staged steps
                        ck.check_members_free(ckdir, k)
                        if owner.held:  # hidden leftovers of killed runs: no live run owns them
                            remove_partial(ckdir)
                            ck.remove_partial_members(ckdir)
                        if not resume and ck.has_checkpoints(ckdir):
                            raise FileExistsError(
                                f"{ckdir} already holds the checkpoints of an ensemble; pass "
                                "resume=True to continue that run, or use an empty "
                                "checkpoint_dir"
                            )
                        newest = ck.newest_step(ckdir, k) if resume else None
                ranks.sync("start")
                newest = ranks.share(newest)  # every rank resumes from the step rank 0 read
                if newest is not None:
                    with ranks.hold():
                        start, elapsed, resumed = ck.restore(
                            ckdir, newest, first, [configs[i] for i in own], nets, state,
                            sources, dev, averages, histories, diverged, checkpoints,
                        )  # fmt: skip
                    ranks.sync(f"the resume from step {newest}")
            # the run's CPU threads, once: those the resumed run recorded, else the rule's
            run_threads.settle(resumed, "the ensemble's checkpoint")
        except BaseException:
            if owner is not None:
                owner.release()
            raise

        def active() -> list[int]:
            return [j for j in range(n) if diverged[j] is None]

        def evaluate_at(done: int, metrics: list[dict[str, float]]) -> None:
            assert run_eval is not None
            for j in active():
                value = run_eval(nets[j] if averages is None else averages[j])
                if not math.isfinite(value):
                    raise member_error(
                        first + j, TrainingDivergedError(done, "eval loss", value, checkpoints[j])
                    )
                histories[j].eval_steps.append(done)
                histories[j].eval_loss.append(value)
                metrics[j]["eval_loss"] = value

        def check_first(j: int, inputs: torch.Tensor, out: torch.Tensor) -> None:
            with crew.renumbered():
                check_forward(nets[j], inputs, out, j)

        def due(done: int, every: int | None) -> bool:
            return done == steps or bool(every and done % every == 0)

        # what a frozen member keeps; the groups that one update changes
        held = leaves + state.exp_avgs + state.exp_avg_sqs + averaged
        live = (leaves, state.exp_avgs, state.exp_avg_sqs, averaged)

        def advance(tensors: tuple[list[torch.Tensor], ...], grads: list[torch.Tensor],
                    done: int, rates: list[float]) -> None:  # fmt: skip
            """Update ``done`` (AdamW, then the weight average) of ``tensors`` (as ``live``)."""
            params, exp_avgs, exp_avg_sqs, averages_ = tensors
            adamw_step(params, grads, exp_avgs, exp_avg_sqs, step=done, lrs=rates,
                       weight_decay=weight_decay, betas=(betas[0], betas[1]), eps=eps)  # fmt: skip
            if ema_decay is not None:
                _update_average(averages_, params, ema_decay, done > ema_start)

        def recover(late: dict[int, int], snapshot: list[torch.Tensor]) -> None:
            """Give each member of ``late`` (member: its first bad step, before this read
            step) its state before that step: the window's steps replayed from
            ``snapshot`` (``held`` before the window's first update) up to it. A member's
            slice does not depend on the others', so the replay is its own computation."""
            m = len(leaves)
            copy = [t.requires_grad_(i < m) for i, t in enumerate(snapshot)]
            tensors = (copy[:m], copy[m : 2 * m], copy[2 * m : 3 * m], copy[3 * m :])
            for s in pending.steps:
                with torch.no_grad():
                    for j in [j for j, bad in late.items() if bad == s.step]:
                        for t, c in zip(held, copy, strict=True):
                            t.detach()[j].copy_(c.detach()[j])
                if s.step == max(late.values()):
                    return
                inputs, targets, mask, _ = stack_batches(cfg, s.batches, s.where)
                p = {**stacked, **dict(zip(names, tensors[0], strict=True))}
                _, grads, _ = losses_and_grads(cfg, p, tensors[0], inputs, targets, mask,
                                               grad_clip, run=run)  # fmt: skip
                advance(tensors, grads, s.step + 1, s.rates)

        shown = progress and ranks.is_main
        bar = tqdm(total=steps, initial=start, disable=not shown, desc=f"train x{k}", unit="step")
        # each step's values stay on the device until read (one transfer) every `sync` steps
        # and wherever the host needs them; across ranks, every step's are (Crew.check)
        sync = 1 if crew.split else sync_every
        pending = MemberSteps(first, on_divergence, stop=not crew.split)
        frozen = ck.frozen_index([j for j in range(n) if diverged[j] is not None], dev)
        snapshot: list[torch.Tensor] | None = None  # held before the window's first update
        pace = StepPace(warn=warn_slow if ranks.is_main else None, device=dev, offset=start)
        t0 = time.perf_counter() - elapsed
        try:
            if start == 0 and run_eval is not None:
                with ranks.hold():
                    evaluate_at(0, [{} for _ in own])
                ranks.sync("the evaluation before training")
            for step in range(start, steps):
                pace.begin()
                done = step + 1
                metrics: list[dict[str, float]] = [{} for _ in own]
                windows: list[float | None] = [None] * n  # running mean losses, live members
                evaluating = run_eval is not None and due(done, eval_every)
                saving = ckdir is not None and due(done, checkpoint_every)
                refresh = done % log_every == 0 or done == steps
                read = (
                    len(pending) + 1 >= sync or evaluating or saving or done == steps
                    or callback is not None or (shown and refresh)
                )  # fmt: skip
                with ranks.hold():  # an error stops every rank at the check below
                    if not read and not pending and on_divergence == "freeze" and len(active()) > 1:
                        # a member found diverged at this window's read returns to its
                        # state before its bad step, replayed from here
                        snapshot = [t.detach().clone() for t in held]
                    try:
                        parts = [s.next(step) for s in sources]
                        where = [s.where(step) for s in sources]
                        batches = [to_model(p, dtype, dev) for p in parts]
                        with crew.renumbered():
                            inputs, targets, mask, finite = stack_batches(cfg, batches, where)
                        rates = [lr_at(step, lr=lrs[i], steps=steps, warmup_steps=warmup_steps,
                                       schedule=schedule, min_lr=min_lr) for i in own]  # fmt: skip
                        check = None
                        if step == start and active():  # the first step reads the device
                            pending.check_inputs(finite, batches, where)
                            check = functools.partial(check_first, active()[0], inputs)
                        losses, grads, norms = losses_and_grads(
                            cfg,
                            stacked,
                            leaves,
                            inputs,
                            targets,
                            mask,
                            grad_clip,
                            check,
                            run,
                        )
                        values = [losses.detach(), norms, mask.sum((1, 2)), finite]
                        pending.add(step, rates, torch.stack([v.to(losses.dtype) for v in values]),
                                    batches, where)  # fmt: skip
                    except Exception:  # an earlier step of the window may have failed first
                        pending.check_before(diverged, checkpoints)
                        raise
                    if read:  # before this step's update
                        newly = pending.check(diverged, checkpoints)
                        late = {j: bad for j, bad in newly.items() if bad < step}
                        if late:
                            assert snapshot is not None
                            recover(late, snapshot)
                        if newly:
                            frozen = ck.frozen_index(
                                [j for j in range(n) if diverged[j] is not None], dev
                            )
                        snapshot = None
                    if active():  # else the check below stops the ensemble if no member is left
                        kept = ck.hold(held, frozen)
                        advance(live, grads, done, rates)
                        ck.put_back(held, frozen, kept)
                    wall = time.perf_counter() - t0
                    pending.finished(wall)
                    pace.end(read)  # evaluations and checkpoints below are not timed
                    if read:
                        metrics = pending.commit(histories, state.updates)
                        if evaluating:
                            evaluate_at(done, metrics)
                        for j in active():
                            window = histories[j].train_loss[-log_every:]
                            windows[j] = sum(window) / len(window) if refresh else 0.0
                if not read:
                    bar.update(1)
                    continue
                every, means = crew.check(step, metrics, windows)  # every member's, every rank
                if not means:  # every member of the ensemble has diverged
                    raise all_diverged(crew.every_divergence(diverged))
                if saving:
                    assert ckdir is not None
                    write = functools.partial(
                        ck.write_members, ckdir, done, first, k, nets, state, sources, parts,
                        rates, histories, [configs[i] for i in own], diverged, dev, averages,
                        wall, run_threads.count,
                    )  # fmt: skip
                    checkpoints = crew.save(ckdir, done, write, keep_last)
                with ranks.hold():  # rank 0's errors here stop every rank at the next check
                    bar.update(1)
                    if refresh:
                        bar.set_postfix(_postfix(means, k), refresh=False)
                    if callback is not None and ranks.is_main:
                        callback(step, every)
            ranks.sync("the end")
        finally:
            bar.close()
            if owner is not None:
                owner.release()
        rates = [lr_at(steps - 1, lr=lrs[i], steps=steps, warmup_steps=warmup_steps,
                       schedule=schedule, min_lr=min_lr) for i in own]  # fmt: skip
        results = []
        for j, net in enumerate(nets):
            ck.fill_optimizer(state, j, rates[j])
            ck.detach(net, state.optimizers[j])
            if averages is not None:
                ck.detach(averages[j], None)
                averages[j].train()
            model = net if averages is None else averages[j]
            results.append(TrainResult(model, histories[j], state.optimizers[j], dev,
                                       checkpoints[j], raw_model=net))  # fmt: skip
        every_diverged = crew.every_divergence(diverged)
        results = crew.gather(
            results,
            lambda: HookedVectorTransformer(cfg, seed=0, dtype=dtype, device=dev),
            lambda net: make_optimizer(net, lrs[0]),  # its state (and lr) are then loaded
        )
    return EnsembleResult(results, every_diverged, dev)


def _agreed(configs: list[dict[str, Any]], **others: Any) -> dict[str, Any]:
    """What every rank must have been given alike: the members' configs (one value where
    all members share it, else the list of K) and ``others``."""
    out: dict[str, Any] = {"members": len(configs)}
    for key in configs[0]:
        values = [c[key] for c in configs]
        out[key] = values[0] if all(v == values[0] for v in values) else values
    return {**out, **others}


def _postfix(means: list[float], k: int) -> dict:
    """The bar's postfix: the live members' mean running loss, how many diverged."""
    out = {"loss": f"{sum(means) / len(means):.3e}"}
    if len(means) < k:
        out["diverged"] = str(k - len(means))
    return out
