"""Training sparse dictionaries: a loop of its own on the library's checkpoint machinery.

Layout of ``checkpoint_dir/step_00000500/`` (the state after 500 updates)::

    dictionary/             the dictionary, by save_dictionary
    optimizer.safetensors   the Adam moments, "state.{i}.{name}"
    rng.safetensors         the run's generator, the feature-firing counters, the buffer
    history.safetensors     per-step loss, mse, sparsity term, L0 and learning rate
    trainer.json            step, the run's config, optimizer settings, data fingerprint,
                            threads, and the SHA-256 of all that

Written atomically and checksummed, under the directory lock, with the same refusals as
:func:`vecinterp.train` (see :mod:`vecinterp.training.checkpoint`).

One file although it is long: the loop, what its checkpoints write and how a resume reads
them back must change together (a field written and not read back breaks exact resume),
and a reader checks that by reading one file.
"""

import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..model.tensor_files import CHECKSUM_KEY, read_tensors, tensor_checksum
from ..threads import check_threads, use_threads
from ..training.checkpoint import (
    FORMAT,
    FORMAT_VERSION,
    TRAINER_FILE,
    flatten_optimizer,
    list_checkpoints,
    own_directory,
    prune,
    read_record,
    remove_partial,
    restore_optimizer,
    sealed,
    step_dir_name,
    unflatten_optimizer,
    write_dir_atomically,
)
from ..training.schedule import lr_at
from .activations import ActivationBuffer
from .io import load_dictionary, write_dictionary
from .jumprelu import step as step_function
from .modules import SparseDictionary

KIND = "vecinterp-dictionary-training"
_HISTORY = ("loss", "mse", "sparsity", "l0", "lr")


@dataclass
class DictionaryTrainResult:
    """What :func:`train_dictionary` returns.

    Attributes:
        dictionary: the trained dictionary (the one passed in, trained in place).
        history: per-step float64 tensors ``loss``, ``mse`` (mean squared error norm per
            row), ``sparsity`` (the L1 term, or the TopK auxiliary term), ``l0`` and ``lr``.
        steps: updates done in all (the resumed ones included).
        resumed_from: the checkpoint step the run resumed from, or ``None``.
        threads: CPU threads the run used.
        n_resampled: features resampled in this call.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder, train_dictionary
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
        >>> result = train_dictionary(sae, torch.randn(64, 4), steps=3, batch_size=8)
        >>> result.steps, result.history["loss"].shape
        (3, torch.Size([3]))
    """

    dictionary: SparseDictionary
    history: dict[str, torch.Tensor]
    steps: int
    resumed_from: int | None
    threads: int
    n_resampled: int


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_real(name: str, value: object, minimum: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):  # type: ignore[operator]
        rel = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {rel} {minimum}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


class _Data:
    """Training rows: from tensors (sampled with the run's generator) or a buffer."""

    def __init__(self, dictionary: SparseDictionary, data: object):
        cfg = dictionary.cfg
        self.buffer: ActivationBuffer | None = None
        self.tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        self.raw: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(data, ActivationBuffer):
            hook_in = cfg.hook_in or (data.hook_names[0] if len(data.hook_names) == 1 else None)
            if hook_in is None:
                raise ValueError(
                    f"the buffer holds several hook points {data.hook_names}: say which one "
                    "the dictionary reads with DictionaryConfig(hook_in=...)"
                )
            if cfg.transcoder and cfg.hook_out is None:
                raise ValueError("a transcoder trained from a buffer needs cfg.hook_out")
            names = [hook_in] + ([str(cfg.hook_out)] if cfg.transcoder else [])
            missing = [n for n in names if n not in data.hook_names]
            if missing:
                raise ValueError(
                    f"the dictionary reads {missing} but the buffer harvests "
                    f"{data.hook_names}: harvest those hook points"
                )
            self.buffer, self.names = data, names
            return
        if isinstance(data, torch.Tensor):
            if cfg.transcoder:
                raise ValueError("a transcoder trains on a pair (inputs, targets) of tensors")
            pair = (data, data)
        elif (
            isinstance(data, tuple)
            and len(data) == 2
            and all(isinstance(t, torch.Tensor) for t in data)
        ):
            pair = (data[0], data[1])
        else:
            raise TypeError(
                "data must be rows [n, d_in] (an SAE), a pair (inputs [n, d_in], targets "
                f"[n, d_out]) of tensors, or an ActivationBuffer; got {type(data).__name__}"
            )
        inputs, targets = pair
        checks = [("inputs", inputs, cfg.d_in)]
        if targets is not inputs:  # an SAE's targets are its inputs: checked once
            checks.append(("targets", targets, int(cfg.d_out or cfg.d_in)))
        for name, t, width in checks:
            if t.dim() != 2 or t.shape[1] != width or not t.is_floating_point():
                raise ValueError(
                    f"{name} must be floating-point rows [n, {width}], got {tuple(t.shape)}"
                )
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                raise ValueError(
                    f"the training {name} hold {bad} non-finite value(s) (NaN or inf): remove "
                    "those rows or fix the model that produced them"
                )
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs have {inputs.shape[0]} rows but targets {targets.shape[0]}")
        dtype = dictionary.W_dec.dtype
        inputs = inputs.to(dtype)
        self.tensors = (inputs, inputs if targets is data else targets.to(dtype))
        self.raw = pair

    @functools.cached_property
    def fingerprint(self) -> str:
        """What identifies the data (computed when a checkpoint needs it): the tensors'
        SHA-256, or the buffer's model weights and hook names."""
        if self.buffer is not None:
            weights = tensor_checksum(dict(self.buffer.model.state_dict()))
            return f"buffer:{weights}:{','.join(self.names)}"
        assert self.raw is not None
        return "tensors:" + tensor_checksum({"inputs": self.raw[0], "targets": self.raw[1]})

    def next(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self.buffer is not None:
            rows = self.buffer.next_batch(batch_size)
            x = rows[self.names[0]]
            return x, rows[self.names[-1]] if len(self.names) > 1 else x
        assert self.tensors is not None
        index = torch.randint(self.tensors[0].shape[0], (batch_size,), generator=gen)
        x = self.tensors[0][index]
        return x, x if self.tensors[1] is self.tensors[0] else self.tensors[1][index]

    def mean(self, first: torch.Tensor) -> torch.Tensor:
        """The input rows' mean: of all the tensors, or of the buffer's store after the
        first batch (``first``, the first batch itself if the store is empty)."""
        if self.tensors is not None:
            return self.tensors[0].double().mean(0).to(first.dtype)
        store = getattr(self.buffer, "rows", None)
        rows = store[self.names[0]] if store else first
        return rows.double().mean(0).to(first.dtype)

    @property
    def resumable(self) -> bool:
        return self.buffer is None or self.buffer.resumable

    def state(self) -> dict[str, torch.Tensor]:
        return {} if self.buffer is None else self.buffer.state()

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        if self.buffer is not None:
            self.buffer.restore(state)


def train_dictionary(
    dictionary: SparseDictionary,
    data: object,
    *,
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-3,
    warmup_steps: int = 0,
    schedule: str = "constant",
    l1_coeff: float = 1e-3,
    l0_coeff: float = 1e-3,
    sparsity_warmup_steps: int = 0,
    threshold_lr: float = 0.01,
    b_dec: str | None = None,
    aux_coeff: float = 1 / 32,
    aux_k: int | None = None,
    dead_after: int = 1000,
    resample_every: int | None = None,
    seed: int = 0,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
    keep_last: int | None = None,
    resume: bool = True,
    progress: bool = False,
    threads: int | str | None = "auto",
    callback: Callable[[int, SparseDictionary], None] | None = None,
) -> DictionaryTrainResult:
    """Train a :class:`SparseAutoencoder` or :class:`Transcoder` in place with Adam.

    Each step draws ``batch_size`` rows, minimises ``mean_row |target - recons|^2`` plus
    the sparsity term of the architecture, then removes from ``W_dec``'s gradient each
    row's component along itself and, after the update, rescales the rows to unit norm:

    - ReLU: ``l1_coeff * mean_row sum |acts|`` (the rows have unit norm, so this is
      Bricken et al.'s norm-weighted L1). Dead features (not active for ``dead_after``
      steps) are resampled every ``resample_every`` steps (``None``: never; not in the
      last half of the run), as Bricken et al. 2023 do: the decoder row becomes a row of
      the batch drawn with probability proportional to its squared error (an SAE's input
      minus ``b_dec``; a transcoder's error), normalised, the encoder column the same
      direction times 0.2 times the mean norm of the live columns, the bias zero.
      Unlike Bricken et al.: draws whose directions have a cosine above 0.9 with an
      earlier draw are dropped (the dead features left wait for the next resampling),
      since copies of one badly reconstructed row co-fire and die together; and Adam's
      first moments of the new weights are zeroed but their second moments set to the
      live features' mean, since from zero the first steps are several times ``lr`` and
      turn the new row away from its direction.
    - TopK and BatchTopK: the auxiliary loss of Gao et al. 2024 (arXiv 2406.04093):
      ``aux_coeff * |e - e_hat|^2 / |e - mean e|^2`` where ``e`` is the residual error and
      ``e_hat`` its reconstruction from the ``aux_k`` (default ``d_in // 2``, at least 1)
      largest pre-activations of the dead features, while any feature is dead. BatchTopK
      trains on the batch's ``n * k`` largest activations and estimates its inference
      threshold as a running mean (rate ``threshold_lr``) of the smallest activation kept
      in each batch (Bussmann et al. 2024, arXiv 2412.06410).
    - JumpReLU: ``l0_coeff * mean_row sum H(pre - theta)`` through the straight-through
      estimators of Rajamanoharan et al. 2024 (arXiv 2407.14435), with the config's
      ``bandwidth``.

    The sparsity coefficient (``l1_coeff``, ``l0_coeff``) ramps up linearly over
    ``sparsity_warmup_steps`` (Conerly et al.'s April 2024 update). Resampling
    (``resample_every``) works for every architecture, with the encoder column at the
    live columns' mean norm for all but ReLU (not 0.2 of it), so that a resampled feature
    can win a place among the ``k`` largest; a JumpReLU feature's threshold restarts at
    the live features' median (at ``cfg.init_threshold``, 0.001 by default, it fires on
    every positive pre-activation and is crushed).

    An SAE's pre-encoder bias ``b_dec`` is by default (``b_dec=None`` or ``"centre"``) set
    to the data's mean at the start of a fresh run (of all the rows; of a buffer's store)
    and held there: learned from zero, it drifts in the first steps while the rows are
    still random, and the rows settle tilted by it (on the planted test, TopK's minimum
    cosine 0.93 instead of 1.0000). ``b_dec="learn"`` trains it; a transcoder's
    ``b_dec`` (an output bias) is always learned. Any other parameter with
    ``requires_grad=False`` stays as it is.

    Recipes that recover planted features (``tests/test_dictionary_planted.py``, rows of
    norm 1-1.5, planted L0 1; all with ``resample_every=50, dead_after=50``, a linear
    decay but for TopK's cosine): ReLU + L1 ``lr=6e-2, l1_coeff=0.1, steps=2000``; TopK
    ``lr=1e-2``, 600 steps; BatchTopK ``lr=1e-2``, 800 steps; JumpReLU
    ``DictionaryConfig(bandwidth=0.1, init_threshold=0.5)``, ``lr=1e-2, l0_coeff=0.3``,
    1000 steps (a start threshold between other features' crosstalk and a feature's own
    activation; scale it, and the bandwidth, with the data).

    The learning rate warms up linearly over ``warmup_steps``, then follows ``schedule``
    (``"constant"``, ``"cosine"`` or ``"linear"`` decay to 0, see :func:`vecinterp.lr_at`).

    Args:
        dictionary: what to train (its dtype is the training dtype).
        data: rows ``[n, d_in]`` (an SAE), a pair ``(inputs, targets)`` (a transcoder),
            sampled with replacement by the run's generator; or an
            :class:`ActivationBuffer` (harvesting ``cfg.hook_in`` and, for a transcoder,
            ``cfg.hook_out``). Non-finite rows are refused.
        steps: updates in all (>= 1); batch_size, lr, warmup_steps: as named.
        seed: seeds everything random in the run (the buffer has its own seed).
        checkpoint_dir, checkpoint_every, keep_last, resume: as :func:`vecinterp.train`:
            checkpoints every ``checkpoint_every`` steps and at the end, keeps the newest
            ``keep_last``, resumes from the newest one (bit-identical to an uninterrupted
            run) if ``resume``; the directory is locked for the run. A checkpoint of
            another config or data is refused, naming what differs.
        progress: show a tqdm bar.
        threads: CPU threads (``"auto"``: :func:`vecinterp.choose_threads`, recorded in
            checkpoints and reused on resume; an int; ``None``: torch's setting).
        callback: called as ``callback(step, dictionary)`` after each update (``step``
            counts updates done).
        l1_coeff, l0_coeff, aux_coeff, aux_k, threshold_lr: as described above.
        sparsity_warmup_steps, dead_after, resample_every, b_dec: as described above.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder, train_dictionary
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8, activation="topk", k=2))
        >>> result = train_dictionary(sae, torch.randn(256, 4), steps=20, batch_size=32)
        >>> float(sae.W_dec.detach().norm(dim=1).sub(1).abs().max()) < 1e-6
        True
    """
    if not isinstance(dictionary, SparseDictionary):
        raise TypeError(
            f"dictionary must be a SparseAutoencoder or Transcoder, got {type(dictionary).__name__}"
        )
    _check_int("steps", steps, 1)
    _check_int("batch_size", batch_size, 1)
    _check_real("lr", lr, strict=True)
    _check_int("warmup_steps", warmup_steps, 0)
    if warmup_steps > steps:
        raise ValueError(f"warmup_steps ({warmup_steps}) must be <= steps ({steps})")
    if schedule not in ("constant", "cosine", "linear"):
        raise ValueError(f"schedule must be 'constant', 'cosine' or 'linear', got {schedule!r}")
    _check_real("l1_coeff", l1_coeff)
    _check_real("l0_coeff", l0_coeff)
    _check_int("sparsity_warmup_steps", sparsity_warmup_steps, 0)
    if sparsity_warmup_steps > steps:
        raise ValueError(
            f"sparsity_warmup_steps ({sparsity_warmup_steps}) must be <= steps ({steps})"
        )
    _check_real("threshold_lr", threshold_lr)
    cfg = dictionary.cfg
    if b_dec is None:
        b_dec = "learn" if cfg.transcoder else "centre"
    if b_dec not in ("centre", "learn"):
        raise ValueError(f"b_dec must be 'centre' or 'learn' (or None), got {b_dec!r}")
    if b_dec == "centre" and cfg.transcoder:
        raise ValueError(
            "b_dec='centre' is for SAEs (their pre-encoder bias); a transcoder's b_dec is an "
            "output bias: b_dec='learn'"
        )
    if threshold_lr > 1:
        raise ValueError(f"threshold_lr must be in [0, 1], got {threshold_lr!r}")
    _check_real("aux_coeff", aux_coeff)
    cfg = dictionary.cfg
    if aux_k is None:
        aux_k = max(1, cfg.d_in // 2)
    _check_int("aux_k", aux_k, 1)
    _check_int("dead_after", dead_after, 1)
    if resample_every is not None:
        _check_int("resample_every", resample_every, 1)
    _check_int("seed", seed, 0)
    if checkpoint_every is not None:
        _check_int("checkpoint_every", checkpoint_every, 1)
    if keep_last is not None:
        _check_int("keep_last", keep_last, 1)
    for name, flag in (("resume", resume), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    check_threads("threads", threads)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")
    source = _Data(dictionary, data)
    config = {
        "kind": KIND,
        "dictionary": cfg.to_dict(),
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "warmup_steps": warmup_steps,
        "schedule": schedule,
        "l1_coeff": l1_coeff,
        "l0_coeff": l0_coeff,
        "sparsity_warmup_steps": sparsity_warmup_steps,
        "threshold_lr": threshold_lr,
        "b_dec": b_dec,
        "aux_coeff": aux_coeff,
        "aux_k": aux_k,
        "dead_after": dead_after,
        "resample_every": resample_every,
        "seed": seed,
    }
    directory = None if checkpoint_dir is None else Path(checkpoint_dir)
    owner = None if directory is None else own_directory(directory)
    try:
        if directory is not None:
            remove_partial(directory)
        checkpoint = None
        if directory is not None and resume:
            found = list_checkpoints(directory)
            checkpoint = found[-1] if found else None
        if checkpoint is not None and not source.resumable:
            raise ValueError(
                f"{checkpoint} would be resumed, but the buffer reads an iterable whose "
                "position cannot be restored: build the ActivationBuffer on a make_batch "
                "callable, or pass resume=False"
            )
        record = None if checkpoint is None else read_record(checkpoint)
        if record is not None and checkpoint is not None:
            _check_resumable(record, config, source.fingerprint, checkpoint)
        count = threads
        if threads == "auto" and record is not None and "threads" in record:
            count = int(record["threads"])
        with use_threads(count) as used:
            return _run(
                dictionary, source, config, record, checkpoint, directory,
                checkpoint_every, keep_last, progress, used, callback,
            )  # fmt: skip
    finally:
        if owner is not None:
            owner.release()


def _check_resumable(
    record: dict[str, Any], config: dict[str, Any], fingerprint: str, path: Path
) -> None:
    saved = record["config"]
    if saved.get("kind") != KIND:
        raise ValueError(f"{path} is not a dictionary training checkpoint (vecinterp.train's?)")
    differ = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
    if differ:
        shown = ", ".join(f"{k}: {saved.get(k)!r} there, {config.get(k)!r} here" for k in differ)
        raise ValueError(
            f"{path} was written by a run of another config ({shown}); resume with the same "
            "settings, or pass another checkpoint_dir or resume=False"
        )
    if record["data_fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} was trained on other data (another fingerprint): resume on the same "
            "data, or pass another checkpoint_dir or resume=False"
        )


def _run(
    dictionary: SparseDictionary,
    source: _Data,
    config: dict[str, Any],
    record: dict[str, Any] | None,
    checkpoint: Path | None,
    directory: Path | None,
    checkpoint_every: int | None,
    keep_last: int | None,
    progress: bool,
    threads: int,
    callback: Callable[[int, SparseDictionary], None] | None,
) -> DictionaryTrainResult:
    cfg = dictionary.cfg
    steps, batch_size = config["steps"], config["batch_size"]
    centre = config["b_dec"] == "centre"
    b_dec_grad = dictionary.b_dec.requires_grad
    if centre:  # held at the data's mean, set below at step 0 of a fresh run
        dictionary.b_dec.requires_grad_(False)
    params = [p for p in dictionary.parameters() if p.requires_grad or p is dictionary.b_dec]
    if centre:
        params = [p for p in params if p is not dictionary.b_dec]
    optimizer = torch.optim.Adam(params, lr=config["lr"], betas=(0.9, 0.999), foreach=True)
    gen = torch.Generator().manual_seed(config["seed"])
    since_fired = torch.zeros(cfg.d_sae, dtype=torch.int64)
    # per-step history, one row a step (loss, mse, sparsity, l0, lr): one write a step
    table = torch.zeros(steps, len(_HISTORY), dtype=torch.float64)
    threshold = dictionary.threshold  # BatchTopK's inference threshold, else None
    start, elapsed = 0, 0.0
    if record is not None and checkpoint is not None:
        start, elapsed = record["step"], float(record["elapsed"])
        saved = load_dictionary(checkpoint / "dictionary")
        if saved.cfg != cfg:
            raise ValueError(f"{checkpoint}: the saved dictionary's config is {saved.cfg}")
        with torch.no_grad():
            for name, tensor in saved.state_dict().items():
                dictionary.state_dict()[name].copy_(tensor)
        file = checkpoint / "optimizer.safetensors"
        state = unflatten_optimizer(
            read_tensors(file)[0], record["optimizer"]["param_groups"], file
        )
        restore_optimizer(optimizer, state, checkpoint)
        rng = read_tensors(checkpoint / "rng.safetensors")[0]
        gen.set_state(rng["generator"])
        since_fired = rng["since_fired"].clone()
        source.restore({k: v for k, v in rng.items() if k not in ("generator", "since_fired")})
        saved_history = read_tensors(checkpoint / "history.safetensors")[0]
        for i, k in enumerate(_HISTORY):
            table[:start, i] = saved_history[k][:start]
    n_resampled = 0
    began = time.perf_counter()
    every = checkpoint_every

    def save(step: int) -> None:
        if directory is None:
            return
        opt_tensors, groups = flatten_optimizer(optimizer.state_dict())
        trainer = sealed(
            {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "step": step,
                "config": config,
                "data_fingerprint": source.fingerprint,
                "elapsed": elapsed + time.perf_counter() - began,
                "threads": threads,
                "optimizer": {"type": "Adam", "param_groups": groups},
            }
        )
        rng = {"generator": gen.get_state(), "since_fired": since_fired.clone(), **source.state()}

        def write(tmp: Path) -> None:
            write_dictionary(dictionary, tmp / "dictionary", {"step": step})
            for name, tensors in (
                ("optimizer", opt_tensors),
                ("rng", rng),
                ("history", _history(table)),
            ):
                tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
                header = {"format": FORMAT, CHECKSUM_KEY: tensor_checksum(tensors)}
                save_file(tensors, str(tmp / f"{name}.safetensors"), metadata=header)
            (tmp / TRAINER_FILE).write_text(_json(trainer))

        write_dir_atomically(directory / step_dir_name(step), write)
        prune(directory, keep_last)

    bar = tqdm(total=steps, initial=start, disable=not progress, desc="dictionary", unit="step")
    resample_every, dead_after = config["resample_every"], config["dead_after"]
    sparsity_warmup = config["sparsity_warmup_steps"]
    threshold_lr = config["threshold_lr"]
    try:
        for step in range(start, steps):
            lr = lr_at(
                step, lr=config["lr"], steps=steps, warmup_steps=config["warmup_steps"],
                schedule=config["schedule"],
            )  # fmt: skip
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, target = source.next(batch_size, gen)
            if centre and step == 0:
                with torch.no_grad():
                    dictionary.b_dec.copy_(source.mean(x))
            if (
                resample_every is not None
                and step > 0
                and step % resample_every == 0
                and step <= steps // 2
            ):
                dead = since_fired >= dead_after
                renewed = _resample(dictionary, optimizer, x, target, dead, gen)
                n_resampled += int(renewed.numel())
                since_fired[renewed] = 0
            # the sparsity coefficient's linear warm-up (Conerly et al. 2024's L1 warm-up)
            ramp = 1.0 if step >= sparsity_warmup else (step + 1) / sparsity_warmup
            loss, mse, sparsity, acts = _loss(dictionary, x, target, since_fired, config, ramp)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            dictionary.remove_parallel_gradient()
            optimizer.step()
            dictionary.normalise_decoder()
            with torch.no_grad():  # acts >= 0 for every activation
                # firings per feature as sign().sum(0): exact (acts >= 0, counts < 2^24)
                # and ~5x faster on a CPU than counting a boolean mask
                fired = acts.reshape(-1, cfg.d_sae).sign().sum(0)
                since_fired = torch.where(fired > 0, 0, since_fired + 1)
                l0 = fired.sum() / acts.shape[0]
                if threshold is not None:  # BatchTopK: the running mean of the batch's
                    kept = acts[acts > 0]  # smallest kept activation (Bussmann et al.)
                    if kept.numel():
                        threshold.lerp_(kept.min(), threshold_lr)
                row = torch.stack((loss.detach(), mse.detach(), sparsity.detach(), l0))
                table[step, :4] = row
            table[step, 4] = lr
            if not math.isfinite(table[step, 0]):
                raise ValueError(
                    f"the loss became non-finite at step {step}: lower lr (now {lr}) or "
                    "check the data's scale"
                )
            bar.update(1)
            if progress:
                bar.set_postfix(mse=f"{float(mse):.4g}", l0=f"{float(l0):.3g}")
            done = step + 1
            if directory is not None and (done == steps or (every and done % every == 0)):
                save(done)
            if callback is not None:
                callback(done, dictionary)
    finally:
        bar.close()
        dictionary.b_dec.requires_grad_(b_dec_grad)
    return DictionaryTrainResult(
        dictionary=dictionary,
        history=_history(table),
        steps=steps,
        resumed_from=start if record is not None else None,
        threads=threads,
        n_resampled=n_resampled,
    )


def _history(table: torch.Tensor) -> dict[str, torch.Tensor]:
    return {k: table[:, i].clone() for i, k in enumerate(_HISTORY)}


def _json(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=2, sort_keys=True)


def _loss(
    dictionary: SparseDictionary,
    x: torch.Tensor,
    target: torch.Tensor,
    since_fired: torch.Tensor,
    config: dict[str, Any],
    ramp: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = dictionary.cfg
    pre = dictionary.encode_pre(x)
    acts = dictionary.hook_sae_acts_post(dictionary.activate_batch(pre))
    recons = dictionary.decode(acts, x)
    error = target - recons
    mse = error.pow(2).sum(-1).mean()
    if cfg.activation == "relu":
        sparsity = (config["l1_coeff"] * ramp) * acts.abs().sum(-1).mean()
    elif cfg.activation == "jumprelu":
        assert dictionary.log_threshold is not None
        fires = step_function(pre, dictionary.log_threshold.exp(), cfg.bandwidth)
        sparsity = (config["l0_coeff"] * ramp) * fires.sum(-1).mean()
    else:
        sparsity = _aux_loss(dictionary, pre, error, since_fired, config)
    return mse + sparsity, mse, sparsity, acts.detach()


def _aux_loss(
    dictionary: SparseDictionary,
    pre: torch.Tensor,
    error: torch.Tensor,
    since_fired: torch.Tensor,
    config: dict[str, Any],
) -> torch.Tensor:
    """Gao et al.'s AuxK: the dead features' ``aux_k`` largest pre-activations reconstruct
    the residual error, normalised by its variance; zero while no feature is dead."""
    dead = since_fired >= config["dead_after"]
    n_dead = int(dead.sum())
    if n_dead == 0 or config["aux_coeff"] == 0:
        return torch.zeros((), dtype=pre.dtype)
    masked = torch.where(dead, pre, torch.full_like(pre, -math.inf))
    values, index = masked.topk(min(config["aux_k"], n_dead), dim=-1)
    aux_acts = torch.zeros_like(pre).scatter(-1, index, torch.relu(values))
    e = error.detach()
    e_hat = aux_acts @ dictionary.W_dec
    scale = (e - e.mean(0)).pow(2).sum(-1).mean().clamp_min(1e-30)
    return config["aux_coeff"] * (e - e_hat).pow(2).sum(-1).mean() / scale


@torch.no_grad()
def _resample(
    dictionary: SparseDictionary,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    target: torch.Tensor,
    dead: torch.Tensor,
    gen: torch.Generator,
) -> torch.Tensor:
    """Re-initialise dead features from the batch's worst-reconstructed rows, one feature
    per distinct direction (see :func:`_distinct`); returns the indices re-initialised
    (the other dead features wait for the next resampling)."""
    index = dead.nonzero().flatten()
    if index.numel() == 0:
        return index
    recons = dictionary.decode(dictionary.encode(x), x)
    error = target - recons
    weight = error.pow(2).sum(-1).pow(2).double()
    if float(weight.sum()) <= 0:
        return index[:0]
    rows = torch.multinomial(weight, index.numel(), replacement=True, generator=gen)
    if dictionary.cfg.transcoder:
        enc_dir, dec_dir = x[rows], error[rows]
    else:
        enc_dir = dec_dir = x[rows] - dictionary.b_dec
    enc_dir = enc_dir / enc_dir.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    dec_dir = dec_dir / dec_dir.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    keep = _distinct(dec_dir)
    enc_dir, dec_dir, index = enc_dir[keep], dec_dir[keep], index[: keep.numel()]
    alive = ~dead
    enc_norm = dictionary.W_enc[:, alive].norm(dim=0).mean() if bool(alive.any()) else 1.0
    dictionary.W_dec[index] = dec_dir
    # Bricken et al.'s 0.2 for ReLU; TopK: the live features' norm, so a resampled
    # feature can win a place among the k largest
    scale = 0.2 if dictionary.cfg.activation == "relu" else 1.0
    dictionary.W_enc[:, index] = (enc_dir * scale * enc_norm).T
    dictionary.b_enc[index] = 0
    cuts = [(dictionary.W_dec, (index,)), (dictionary.W_enc, (slice(None), index)),
            (dictionary.b_enc, (index,))]  # fmt: skip
    if dictionary.log_threshold is not None:
        # the live features' median threshold: at the initial one (0.001 by default) a
        # new feature fires on every positive pre-activation and is crushed
        log_threshold = dictionary.log_threshold
        start = (
            log_threshold[alive].median()
            if bool(alive.any())
            else math.log(dictionary.cfg.init_threshold)
        )
        log_threshold[index] = start
        cuts.append((log_threshold, (index,)))
    for param, cut in cuts:
        _reset_adam(optimizer.state.get(param, {}), param, cut, alive)
    return index


def _reset_adam(
    state: dict[str, Any], param: torch.Tensor, cut: tuple[Any, ...], alive: torch.Tensor
) -> None:
    """Restart Adam on the resampled slice ``param[cut]``: first moments zero, second
    moments the mean of the live features' (zero if none is alive).

    Zero second moments (Bricken et al.) make the first steps of a new feature several
    times ``lr`` per coordinate (``m / sqrt(v)`` with ``v`` a few steps' worth of ``g^2``
    against Adam's bias correction of the run's step count): in a few steps its decoder row
    turns away from the direction it was given, towards a correction of the live feature
    that covered it. On the planted test that left JumpReLU sharing pairs of directions.
    """
    axis = len(cut) - 1  # the feature axis: W_enc's columns, the other's rows
    for key, value in state.items():
        if not isinstance(value, torch.Tensor) or value.shape != param.shape:
            continue
        if key == "exp_avg_sq" and bool(alive.any()):
            live = value.index_select(axis, alive.nonzero().flatten()).mean(axis, keepdim=True)
            value[cut] = live
        else:
            value[cut] = 0


RESAMPLE_DISTINCT_COSINE = 0.9
"""Two resampling directions with a cosine above this count as one (:func:`_distinct`)."""


def _distinct(directions: torch.Tensor, block: int = 256) -> torch.Tensor:
    """The indices of a greedy selection of unit ``directions [n, d]``, in order, none
    with a cosine above :data:`RESAMPLE_DISTINCT_COSINE` with one kept before it
    (compared ``block`` at a time; 16384 distinct directions of width 768 take ~5 s on one
    CPU thread, once per resampling).

    Resampling draws rows with replacement, weighted by their error, so when one feature
    is badly reconstructed most draws are copies of it. Copies co-fire (BatchTopK keeps
    them all; a ReLU or JumpReLU fires them all), overshoot, shrink together and die
    together, and the feature stays shared by the live row that half-covered it: on the
    planted test BatchTopK kept 22 of 24 directions (min cosine 0.78) until one copy
    per direction was resampled (then 1.0000 on seeds 0-3).

    Example:
        >>> import torch
        >>> from vecinterp.dictionary.train import _distinct
        >>> _distinct(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.28, 0.96]]))
        tensor([0, 2])
    """
    limit = RESAMPLE_DISTINCT_COSINE
    kept: list[int] = []
    chosen = directions[:0]
    for start in range(0, directions.shape[0], block):  # blocks: matrix products, not a
        chunk = directions[start : start + block]  # matrix-vector product per direction
        ok = torch.ones(chunk.shape[0], dtype=torch.bool)
        if chosen.shape[0]:
            ok = (chunk @ chosen.T).max(dim=1).values <= limit
        gram = chunk @ chunk.T
        picked: list[int] = []
        for i in ok.nonzero().flatten().tolist():
            if not picked or float(gram[i, picked].max()) <= limit:
                picked.append(i)
        kept += [start + i for i in picked]
        chosen = torch.cat([chosen, chunk[picked]])
    return torch.tensor(kept, dtype=torch.long)
