"""The training loop: masked MSE, AdamW, schedule, clipping, eval, checkpoints, resume.

One file: :func:`train` is one function whose parts share the run's state (the network,
the optimizer, the checkpoint directory's lock, the steps not yet read), and its small
helpers beside it are also what the ensemble trainer imports."""

import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..model.config import VectorTransformerConfig, same_config
from ..model.transformer import HookedVectorTransformer
from ..model.validation import check_bool
from ._pending import PendingSteps
from ._speed import RunThreads, StepPace, warn_slow
from .checkpoint import (
    latest_checkpoint,
    own_directory,
    prune,
    read_checkpoint,
    remove_partial,
    restore_optimizer,
    step_dir_name,
    write_checkpoint,
)
from .compiled import compiled_step_loss
from .data import MakeBatchSource, StreamSource, Tensors, fingerprint, step_loss, to_model
from .distributed import Ranks, join_ranks, rank_rng
from .result import TrainHistory, TrainingDivergedError, TrainResult
from .schedule import check_int, check_schedule, lr_at
from .setup import (
    Frozen,
    check_args,
    check_ema,
    check_threads,
    check_trainable,
    make_eval,
    make_source,
    resolve_frozen,
)

Data = Iterable[Any] | Callable[[int, torch.Generator], Any]
"""Training data: an iterable of batches, or ``make_batch(step, generator) -> batch``."""


def train(
    model: HookedVectorTransformer,
    data: Data,
    *,
    steps: int,
    lr: float,
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
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    log_every: int = 50,
    callback: Callable[[int, dict[str, float]], Any] | None = None,
    sync_every: int = 50,
    threads: int | str | None = "auto",
    compile: bool = False,
    frozen: Frozen = None,
) -> TrainResult:
    r"""Train ``model`` on ``data`` with the masked MSE and AdamW; checkpoint and resume.

    Update ``s`` (``s = 0 .. steps - 1``) reads batch ``s``, computes
    :math:`\mathcal{L}_s = \mathrm{MSE}_{\text{mask}}(f_\theta(x_s), t_s)`, clips the
    gradient to total norm ``grad_clip`` (if given) and takes an AdamW step with learning
    rate :func:`~vecinterp.training.schedule.lr_at` ``(s)`` (linear warm-up, then constant
    or a cosine or linear decay). Training runs on a copy: ``model`` itself is left
    unchanged. The copy is rebuilt from ``model``'s config and weights, so it would carry
    none of ``model``'s hooks: a model with hooks attached (vecinterp hooks, permanent or
    not, and this thread's ``hooks()`` contexts; PyTorch module hooks) is refused rather
    than trained without the intervention they make, and so is one with NaN/inf weights.

    With ``ema_decay`` :math:`\beta`, the returned model is an exponential moving average of
    the weights: :math:`\bar\theta_t = \theta_t` for :math:`t \le` ``ema_start`` updates,
    then :math:`\bar\theta_t = \beta \bar\theta_{t-1} + (1 - \beta) \theta_t`. The
    average is what is evaluated and returned (``result.model``; the last iterate is
    ``result.raw_model``) and what checkpoints save beside the iterate. Averaging removes
    much of the noise that a high learning rate leaves in the last iterate: on the affine
    recurrences, ``ema_decay=0.998`` gave a 1.5-2x lower eval MSE than the last iterate
    while the rate was between 8e-4 and 4e-4; at the end of a decay to zero the two agree.

    Data, in two forms:

    - ``make_batch(step, generator) -> batch``: batch ``s`` depends only on ``s`` and a CPU
      ``torch.Generator`` seeded with ``seed`` whose state checkpoints save. The exact and
      cheap form to resume, e.g. ``lambda s, g: affine_recurrence.generate(16, generator=g)``.
    - an iterable of batches, e.g. ``affine_recurrence.batches(16, seed=0)``; batch ``s``
      is its ``s``-th item. To resume, pass the same stream re-created from its start: the
      batches already trained on are drawn again and skipped (their cost is paid again),
      and the last one is checked against a fingerprint saved in the checkpoint.

    A batch is an object with ``.inputs [batch, pos, d_in]``, ``.targets [batch, pos,
    d_out]`` and ``.loss_mask [batch, pos]`` (bool, or None for all positions), or a tuple
    ``(inputs, targets[, loss_mask])``; floats are cast to the model's dtype and device.

    Checkpoints (``checkpoint_dir/step_00000500/``: the state after 500 updates) hold the
    model (:func:`vecinterp.save`), AdamW's state, the RNG states (torch's global CPU
    generator, the data generator, CUDA's if used), the history and the config, as
    safetensors + JSON (no pickle), written into a temporary directory and renamed into
    place; every safetensors file carries a SHA-256 of its tensors and ``trainer.json`` one
    of its contents, verified on resume (a resume also refuses optimizer settings in
    ``trainer.json`` that differ from the run's own). One is written every
    ``checkpoint_every`` updates and after the last; the newest ``keep_last`` are kept.
    The run owns ``checkpoint_dir`` from start to end by an OS lock (``flock`` on
    ``.vecinterp-train.lock`` there; released however the run ends, even by
    ``kill -9``): a second run on the same directory is refused before it touches a file.
    ``resume=True`` continues from the newest (or starts afresh if there is none) and ends
    bit-identical to an uninterrupted run on the same device. A NaN/inf loss or gradient
    raises :class:`TrainingDivergedError` naming the step; no checkpoint holds that step's
    update or any later one, so the newest holds the last good state. When the batch's
    targets are to blame (NaN or inf at a position the loss uses), the error names the
    batch and the first bad index. NaN/inf inputs are refused naming the batch
    (``make_batch(3, ...)`` or ``batch 3 of data``; ``batch 0 of eval_data`` for the
    evaluation set).

    Host syncs: each step's loss, gradient norm and input check stay on the device and are
    read all at once every ``sync_every`` steps, so that on a GPU the host can queue the
    next steps while the device computes (a read waits for everything queued before it).
    They are also read before every evaluation, checkpoint and ``callback`` call (so with a
    callback, every step), at every ``log_every`` steps while the bar is shown, and after
    the last step. The first bad step of the ones read is named as a read after every step
    would name it; the device may have run up to ``sync_every - 1`` more steps by then,
    whose updates are dropped with the run. The history, the weights and the checkpoints
    do not depend on ``sync_every``; ``wall_time`` is the host's clock when a step was
    queued (on a GPU, exact at each read). On a CPU a read costs nothing but itself.

    Threads: on a CPU whose cores other processes keep busy, torch's default of one thread
    per core can make every step many times slower (a small model trained ~15x slower than
    with one thread, on 2 cores with one busy). So by default (``threads="auto"``) the run
    chooses its count once, before its first step, by :func:`~vecinterp.choose_threads`
    (the idle cores, at least 1, at most torch's current setting), records it in every
    checkpoint (``trainer.json``'s ``"threads"``) and, resumed, uses the recorded count
    again, so that a resume on a differently loaded machine (or in a process with another
    ``torch.set_num_threads``) computes exactly as the run it continues; a checkpoint
    written before the count was recorded resumes with the rule's count. torch's setting
    is restored when the run returns or fails. ``threads=N`` uses N threads (resumed too:
    a count other than the recorded one may round differently); ``threads=None`` leaves
    torch's setting alone. When the steps become more than 10x slower than the first
    steps, for 50 steps or more and 10 s or more, a :class:`~vecinterp.SlowTrainingWarning`
    says so (once).

    Frozen parameters: ``frozen`` names parameters (as ``model.named_parameters()`` names
    them, e.g. ``"unembed.b_U"``) or gives predicates ``name -> bool`` that choose them,
    and the run keeps them at their values in ``model``, bit for bit: they take no
    gradient, are left out of AdamW (so weight decay does not shrink them either), out of
    the norm that ``grad_clip`` clips (the norm is that of the trained parameters'
    gradients alone, as in a plain loop whose optimizer and ``clip_grad_norm_`` are given
    only the trained parameters) and out of the weight average (which holds them at their
    values too). It is the value ``model`` holds that is kept: a freshly initialised
    model's biases are zeros (``HookedVectorTransformer.init_weights``), so
    ``frozen=["unembed.b_U"]`` on one is ARENA's ``Unembed``, whose ``b_U`` stays 0.
    ``model`` itself is never changed (its ``requires_grad`` flags are not read: freeze
    with ``frozen``), and the returned models' parameters all take gradients again, as
    any model's do; ``result.optimizer`` holds the trained parameters only. Checkpoints
    record the sorted names (``trainer.json``'s ``config["frozen"]``) and a resume with
    another set is refused. Under ``torchrun`` and with ``compile=True`` alike;
    :func:`~vecinterp.train_ensemble` refuses it.

    Data-parallel: under ``torchrun --nproc_per_node N`` (or with ``torch.distributed``
    initialised) every rank runs this same call. Each draws the global batch and trains on
    its share of the rows with ``DistributedDataParallel``; the model equals one process's
    on the same global batch up to rounding. Rank 0 alone writes checkpoints and shows the
    bar and ``callback``; an error on any rank stops every rank, naming it. See
    :mod:`vecinterp.training.distributed` and :doc:`/howto_distributed`.

    Args:
        model: the model to train (copied; not modified).
        data: ``make_batch(step, generator)`` or an iterable of batches (see above).
        steps: number of updates (>= 1).
        lr: peak learning rate (> 0).
        weight_decay: AdamW's decoupled weight decay (>= 0), on every parameter that is
            trained (none of ``frozen``).
        betas, eps: AdamW's moment decay rates (each in [0, 1)) and epsilon (> 0).
        warmup_steps: linear warm-up length, ``0 .. steps``.
        schedule: ``"constant"``, ``"cosine"`` or ``"linear"`` (the last two decay to
            ``min_lr`` at ``steps``).
        min_lr: the decay's floor, ``0 .. lr``.
        grad_clip: clip the total gradient norm (of the trained parameters) to this (> 0);
            ``None``: no clipping.
        ema_decay: keep an exponential moving average of the weights with this decay
            (in (0, 1), e.g. 0.998: a horizon of about 500 updates) and return it;
            ``None``: no average.
        ema_start: the average starts after this many updates (``0 .. steps - 1``; needs
            ``ema_decay``); before, it equals the weights.
        eval_data: a batch, a list of batches (mean of per-batch MSEs, see
            :func:`~vecinterp.training.data.evaluate`) or ``fn(model) -> float``;
            evaluated before training, every ``eval_every`` updates and at the end.
        eval_every: evaluation interval in updates (needs ``eval_data``).
        checkpoint_dir: where checkpoints go; ``None``: none are written.
        checkpoint_every: checkpoint interval in updates (needs ``checkpoint_dir``).
        keep_last: how many checkpoints to keep (>= 1); ``None`` keeps all.
        resume: continue from the newest checkpoint in ``checkpoint_dir``. The config
            (model, dtype, optimizer, schedule, seed, data form; ``steps`` too unless the
            schedule is constant) must match. With ``resume=False`` an existing checkpoint
            is an error rather than overwritten.
        seed: seeds the data generator of ``make_batch``.
        device: ``None``: :func:`default_device` (``cuda:LOCAL_RANK`` under torchrun).
        progress: show a tqdm bar with the running loss.
        log_every: refresh the bar's running loss (mean of the last ``log_every`` losses)
            every this many updates.
        callback: ``callback(step, metrics)`` after each update (on rank 0 alone), with
            ``metrics`` holding ``loss``, ``lr``, ``grad_norm`` and, after an evaluation,
            ``eval_loss``. It must not draw from torch's global RNG if resumed runs are to
            stay bit-identical.
        sync_every: read the steps' losses and gradient norms on the host (and check them)
            at least every this many steps (>= 1; see "Host syncs" above). ``1`` checks
            each step before the next starts. The batches of the steps not yet read are
            kept until then (to name a bad one's first NaN). Under ``torchrun`` every step
            is read (the ranks agree on each step's loss).
        compile: compute each step's forward pass, masked MSE and backward pass as one
            ``torch.compile`` d graph (inductor; the first step compiles it, tens of
            seconds on a CPU). The same checks (NaN/inf inputs named by batch,
            divergence), checkpoints and bit-identical resume on the same machine; the
            losses equal eager training's to rounding, not to the bit. Clipping and
            AdamW stay eager (already fused kernels). Not under ``torchrun`` (refused).
            See :doc:`/howto_compile`.
        threads: the CPU threads torch uses for the run (``torch.set_num_threads``, the
            previous count restored when the run ends): ``"auto"`` (default) the idle
            cores, or the count recorded by the checkpoint resumed from; an int >= 1 that
            count; ``None`` torch's setting as it is. See "Threads".
        frozen: parameters kept at their values in ``model`` (see "Frozen parameters"):
            a name as ``model.named_parameters()`` gives it (``"unembed.b_U"``), a
            predicate ``name -> bool`` (``lambda name: name.endswith(".b_K")``), or a list
            of names and predicates (their union). ``None`` (default) or ``[]``: every
            parameter is trained. Unknown names (the error lists close matches and the
            model's names), a name given twice, entries that are neither strings nor
            callables, a predicate that raises, returns a non-bool or selects nothing, and
            freezing every parameter are refused naming ``frozen``.

    Returns:
        A :class:`~vecinterp.training.result.TrainResult` with the trained model (the
        average if ``ema_decay``), the last iterate, the
        :class:`~vecinterp.training.result.TrainHistory` and the optimizer.

    Raises:
        ValueError, TypeError: for bad arguments, a model with hooks attached or NaN/inf
            weights, a checkpoint of another config or a corrupted one (naming the file;
            ``trainer.json`` is checksummed too, and its optimizer settings must equal the
            run's), data that run out, or a ``checkpoint_dir`` that another run holds
            (naming its pid, host and start time).
        FileExistsError: checkpoints exist and ``resume=False``.
        TrainingDivergedError: a ``FloatingPointError`` for a non-finite loss or gradient
            norm.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.training.loop import train
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> def make_batch(step, gen):
        ...     x = torch.randn(8, 4, 2, generator=gen)
        ...     return x, -x
        >>> result = train(model, make_batch, steps=30, lr=1e-2, progress=False, device="cpu")
        >>> result.history.train_loss[-1] < result.history.train_loss[0]
        True

        Keep the output bias at its initial zeros (ARENA's ``Unembed``):

        >>> fixed = train(model, make_batch, steps=30, lr=1e-2, progress=False, device="cpu",
        ...               frozen=["unembed.b_U"])
        >>> bool(torch.equal(fixed.model.b_U, model.b_U)), model.b_U.abs().max().item()
        (True, 0.0)
    """
    check_args(model, steps, lr, weight_decay, betas, eps, grad_clip, eval_data, eval_every,
               checkpoint_dir, checkpoint_every, keep_last, resume, seed, progress, log_every,
               callback)  # fmt: skip
    check_schedule(lr=lr, steps=steps, warmup_steps=warmup_steps, schedule=schedule, min_lr=min_lr)
    check_ema(ema_decay, ema_start, steps)
    check_int("sync_every", sync_every, minimum=1)
    check_threads(threads)
    check_bool("compile", compile)
    check_trainable({"model": model})
    frozen_names = resolve_frozen(model, frozen)
    compute_loss = compiled_step_loss() if compile else step_loss
    source = make_source(data, seed)
    run_eval = make_eval(eval_data)
    # one process unless under torchrun (see distributed)
    with RunThreads(threads) as run_threads, join_ranks(device) as ranks:
        dev = ranks.device
        dtype = next(model.parameters()).dtype
        config = {
            "model": model.cfg.to_dict(), "dtype": str(dtype), "lr": lr,
            "weight_decay": weight_decay, "betas": list(betas), "eps": eps,
            "warmup_steps": warmup_steps, "schedule": schedule, "min_lr": min_lr,
            "grad_clip": grad_clip, "data": source.kind, "steps": steps,
            **({"ema_decay": ema_decay, "ema_start": ema_start} if ema_decay is not None else {}),
            **({"frozen": frozen_names} if frozen_names else {}),
            "seed": seed if source.kind == "make_batch" else None,
        }  # fmt: skip
        ranks.agree(config)  # every rank was given the same arguments
        if compile and isinstance(ranks, Ranks):
            raise ValueError(
                "compile=True is not supported under torchrun (DistributedDataParallel) "
                "yet: train with compile=False there"
            )
        net = HookedVectorTransformer(model.cfg, seed=0, dtype=dtype, device=dev)
        net.load_state_dict(model.state_dict())
        net.train()
        # frozen parameters take no gradient (before DDP, whose reducer skips them) and stay
        # out of the optimizer (no weight decay), the clipped norm and the weight average
        held = [p for name, p in net.named_parameters() if name in frozen_names]
        for p in held:
            p.requires_grad_(False)
        params = [p for p in net.parameters() if p.requires_grad]
        ranks.wrap(net)  # in DDP across ranks (rank 0's weights are broadcast)
        optimizer = _adamw(params, lr=lr, betas=(betas[0], betas[1]), eps=eps,
                           weight_decay=weight_decay)  # fmt: skip
        average = None
        if ema_decay is not None:
            average = HookedVectorTransformer(model.cfg, seed=0, dtype=dtype, device=dev)
            average.load_state_dict(net.state_dict())
            average.eval()
        history, start, elapsed, checkpoint = TrainHistory(), 0, 0.0, None
        resumed: dict[str, Any] | None = None  # the record of the checkpoint resumed from
        ckdir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        # the run owns its checkpoint directory (an OS lock, taken by rank 0) until it returns
        # or dies: a second run on it is refused before it touches any file there
        owner = None
        try:
            if ckdir is not None:
                with ranks.hold():  # an error here stops every rank at the sync below
                    if ranks.is_main:
                        owner = own_directory(ckdir)
                        if owner.held:  # hidden leftovers of killed runs: no live run owns them
                            remove_partial(ckdir)
                        checkpoint = latest_checkpoint(ckdir)
                        if checkpoint is not None and not resume:
                            raise FileExistsError(
                                f"{ckdir} already holds checkpoints (newest: {checkpoint.name}); "
                                "pass resume=True to continue that run, or use an empty "
                                "checkpoint_dir"
                            )
                ranks.sync("start")
                checkpoint = ranks.share(checkpoint)  # every rank resumes from rank 0's pick
                if checkpoint is not None:
                    with ranks.hold():
                        start, history, elapsed, resumed = _restore(
                            checkpoint, config, net, optimizer, source, dev, average, ranks.rank
                        )
                    ranks.sync(f"the resume from {checkpoint}")
            # the run's CPU threads, once: those the resumed run recorded, else the rule's
            run_threads.settle(resumed, checkpoint)
        except BaseException:
            if owner is not None:
                owner.release()
            raise

        def rng_states() -> dict[str, torch.Tensor]:
            rng = {"torch_cpu": torch.get_rng_state(), **source.state()}
            if dev.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(dev)
            return ranks.gather_rng(rng)  # with every other rank's states, if any

        def save(done: int, last: Tensors, rng: dict[str, torch.Tensor]) -> Path:
            assert ckdir is not None
            if not ranks.is_main:  # rank 0 alone writes
                return ckdir / step_dir_name(done)
            record = {
                "config": config,
                "data_fingerprint": fingerprint(last),
                "elapsed": history.wall_time[-1],
                "device": str(dev),
                "world_size": ranks.world_size,
                "threads": run_threads.count,
            }
            path = write_checkpoint(
                ckdir, done, net, optimizer, rng, history.to_tensors(), record, average=average
            )
            prune(ckdir, keep_last)
            return path

        def evaluate_at(done: int) -> float:
            assert run_eval is not None
            value = run_eval(net if average is None else average)
            if not math.isfinite(value):
                raise TrainingDivergedError(done, "eval loss", value, checkpoint)
            history.eval_steps.append(done)
            history.eval_loss.append(value)
            return value

        def due(done: int, every: int | None) -> bool:
            return done == steps or bool(every and done % every == 0)

        # the weight average's tensors and the weights they follow, paired once for the loop
        averaged: list[torch.Tensor] = []
        followed: list[torch.Tensor] = list(params)
        if average is not None:
            averaged = [p for name, p in average.named_parameters() if name not in frozen_names]
        shown = progress and ranks.is_main
        bar = tqdm(total=steps, initial=start, disable=not shown, desc="train", unit="step")
        # each step's loss, gradient norm and input check stay on the device until read
        # (one transfer) every sync_every steps and wherever the host needs them
        pending = PendingSteps(source.where, dtype, dev)
        pace = StepPace(warn=warn_slow if ranks.is_main else None, device=dev, offset=start)
        t0 = time.perf_counter() - elapsed
        try:
            if start == 0 and run_eval is not None:
                with ranks.hold():
                    evaluate_at(0)
                ranks.sync("the evaluation before training")
            for step in range(start, steps):
                pace.begin()
                rate = lr_at(step, lr=lr, steps=steps, warmup_steps=warmup_steps,
                             schedule=schedule, min_lr=min_lr)  # fmt: skip
                for group in optimizer.param_groups:
                    group["lr"] = rate
                optimizer.zero_grad(set_to_none=True)
                done = step + 1
                evaluating = run_eval is not None and due(done, eval_every)
                saving = ckdir is not None and due(done, checkpoint_every)
                try:
                    if isinstance(ranks, Ranks):  # this rank's share of the global batch
                        check = step == start or evaluating or saving
                        parts, loss, global_loss = ranks.forward(step, source, net, check)
                        loss.backward()
                        norm_value = float(_grad_norm(params, grad_clip))
                        values = [global_loss(), norm_value, 1.0]  # read already
                        pending.add(step, rate, torch.tensor(values, dtype=torch.float64), parts)
                        read = True
                    else:
                        parts = source.next(step)
                        batch = to_model(parts, dtype, dev)
                        loss, finite = compute_loss(net, batch, source.where(step))
                        loss.backward()
                        norm = _grad_norm(params, grad_clip).to(loss.dtype)
                        loss = loss.detach()
                        pending.add(
                            step, rate, torch.stack([loss, norm, finite.to(loss.dtype)]), batch
                        )
                        read = (
                            len(pending) >= sync_every or evaluating or saving or done == steps
                            or callback is not None or (shown and done % log_every == 0)
                        )  # fmt: skip
                except Exception:  # an earlier step of the window may have failed first
                    pending.check_before(checkpoint)
                    raise
                if read:  # before this update; and before any checkpoint of the steps read
                    pending.check(checkpoint)
                optimizer.step()
                if ema_decay is not None:
                    _update_average(averaged, followed, ema_decay, done > ema_start)
                pending.finished(time.perf_counter() - t0)
                pace.end(read)  # evaluations and checkpoints below are not timed
                if not read:
                    with ranks.hold():
                        bar.update(1)
                    continue
                metrics = pending.commit(history)[-1][1]
                if evaluating:
                    with ranks.hold():
                        metrics["eval_loss"] = evaluate_at(done)
                if evaluating or saving:
                    ranks.sync(f"step {step}")
                if saving:
                    rng = rng_states()
                    with ranks.hold():
                        checkpoint = save(done, parts, rng)
                with ranks.hold():  # rank 0's errors here stop every rank at the next sync
                    bar.update(1)
                    if shown and (done % log_every == 0 or done == steps):
                        window = history.train_loss[-log_every:]
                        postfix = {"loss": f"{sum(window) / len(window):.3e}"}
                        if history.eval_loss:
                            postfix["eval"] = f"{history.eval_loss[-1]:.3e}"
                        bar.set_postfix(postfix, refresh=False)
                    if callback is not None and ranks.is_main:
                        callback(step, metrics)
            ranks.sync("the end")
        finally:
            bar.close()
            if owner is not None:
                owner.release()
    for p in held:  # the returned model is like any other: every parameter takes gradients
        p.requires_grad_(True)
    if average is None:
        return TrainResult(net, history, optimizer, dev, checkpoint, raw_model=net)
    average.train()
    return TrainResult(average, history, optimizer, dev, checkpoint, raw_model=net)


@torch.no_grad()
def _update_average(
    averaged: list[torch.Tensor],
    params: list[torch.Tensor],
    decay: float,
    averaging: bool,
) -> None:
    """One step of the weight average: ``avg <- decay * avg + (1 - decay) * param`` once
    ``averaging``, a copy of the weights before."""
    if averaging:
        torch._foreach_lerp_(averaged, params, 1.0 - decay)
    else:
        torch._foreach_copy_(averaged, params)


def _grad_norm(params: list[torch.nn.Parameter], grad_clip: float | None) -> torch.Tensor:
    """Total L2 norm of the gradients before clipping; clips them if ``grad_clip``."""
    if grad_clip is not None:
        return torch.nn.utils.clip_grad_norm_(params, grad_clip)
    grads = [p.grad for p in params if p.grad is not None]
    # what clip_grad_norm_ computes: one fused norm per device and dtype where torch has a
    # fused kernel (CUDA: 2 kernels, not one per parameter); elsewhere, and before torch
    # 2.6, the norm of the per-tensor norms, which is the same arithmetic on a CPU
    total = getattr(torch.nn.utils, "get_total_norm", None)
    if total is not None:
        return total(grads, 2.0)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _restore(
    path: Path,
    config: dict[str, Any],
    net: HookedVectorTransformer,
    optimizer: torch.optim.Optimizer,
    source: MakeBatchSource | StreamSource,
    dev: torch.device,
    average: HookedVectorTransformer | None,
    rank: int = 0,
) -> tuple[int, TrainHistory, float, dict[str, Any]]:
    """Load a checkpoint into ``net``, ``optimizer``, ``source``, the RNGs (``rank``'s)
    and the weight average; returns its step, history, elapsed time and (verified) record."""
    saved = read_checkpoint(path)
    record = saved["record"]
    before = record["config"]
    ignore = {"steps"} if config["schedule"] == before.get("schedule") == "constant" else set()
    if same_config(before.get("model"), VectorTransformerConfig.from_dict(config["model"])):
        ignore.add("model")
    differ = sorted(
        k for k in set(config) | set(before) if k not in ignore and config.get(k) != before.get(k)
    )
    if differ:
        shown: dict[str, Any] = {"frozen": []}  # how an absent setting reads: none frozen
        details = "; ".join(
            f"{k}: checkpoint {before.get(k, shown.get(k))!r}, now {config.get(k, shown.get(k))!r}"
            for k in differ
        )
        raise ValueError(
            f"cannot resume from {path}: it was trained with a different config ({details})"
        )
    step = record["step"]
    if step > config["steps"]:
        raise ValueError(
            f"cannot resume from {path}: it is at step {step} > steps={config['steps']}"
        )
    net.load_state_dict(saved["model"].state_dict())
    if average is not None:
        if saved["average"] is None:
            raise ValueError(f"cannot resume from {path}: it holds no weight average")
        average.load_state_dict(saved["average"].state_dict())
    restore_optimizer(optimizer, saved["optimizer"], path)
    source.restore(step, saved["rng"], record["data_fingerprint"])
    rng = rank_rng(saved["rng"], rank)
    torch.set_rng_state(rng["torch_cpu"])
    if dev.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], dev)
    return step, TrainHistory.from_tensors(saved["history"]), float(record["elapsed"]), record


def _adamw(params: list[torch.nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW over ``params`` with the fused kernel where torch has one for the device (CPU
    since torch 2.4, CUDA): one pass over the parameters instead of a dozen small ops per
    tensor, ~4x faster steps on the affine paper's model on CPU. Same update rule,
    deterministic, and the same state-dict layout, so checkpoints resume across either
    implementation."""
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # no fused kernel for this device/dtype/torch
        return torch.optim.AdamW(params, **kwargs)
