"""Data-parallel training: the ranks of a ``torchrun`` job, the split of the global batch,
and the stop of every rank when one fails. (An ensemble split across ranks uses the same
ranks, split and stop: :mod:`._ensemble_distributed`.)

:func:`vecinterp.training.train` calls :func:`join_ranks`: one process unless
``torch.distributed`` is initialised with more than one rank, or the torchrun variables
(``WORLD_SIZE`` > 1 and ``RANK``) are set, in which case ``train`` initialises the default
process group itself (``gloo`` for a CPU model, ``nccl`` for a GPU one) and destroys it when
it returns. The choices, each to keep data-parallel training equal to one process training
on the same global batch:

- Every rank draws the *global* batch ``s`` (``make_batch(s, generator)`` with the same
  generator state on every rank, or the same stream) and keeps its contiguous share of the
  rows (sizes differ by at most one). The data are thus identical to one process's by
  construction; drawing the global batch costs every rank the time one process spends on
  it. The ranks compare a fingerprint of the batch at the first step and at every
  evaluation and checkpoint step, and stop if they differ.
- The loss is the masked MSE of the global batch: each rank backpropagates the sum of its
  squared errors times ``world_size / n_used`` (``n_used``: the positions the loss uses in
  the whole batch, summed over ranks before the forward pass), so that DDP's mean over
  ranks is the gradient of ``sum / n_used`` even when the shards use unequal numbers of
  positions (a mean of per-rank means would not be).
- Gradient clipping, divergence checks and AdamW see the all-reduced gradient, which is
  the same on every rank; every rank evaluates the whole evaluation set (the same value on
  every rank, no communication; the wall time of one rank evaluating while the others
  wait). Rank 0 alone owns the checkpoint directory (its lock), writes checkpoints and
  shows the progress bar and the callback; every rank resumes from the checkpoint rank 0
  picks, which must be on a file system every rank sees.
- An exception on one rank while it draws or checks its data, evaluates, writes a
  checkpoint or runs the callback is held until the next collective check (at most one
  step later), where every rank stops: the failing rank raises its own exception (with a
  note naming it), the others :class:`RankFailedError` naming it. A rank that dies, or
  fails inside the forward or backward pass itself, stops the others when its process
  exits (``torchrun`` ends the job) or at the process group's timeout.
"""

import contextlib
import contextvars
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..loss import loss_positions, mse_at
from ..model.transformer import HookedVectorTransformer
from ..model.validation import check_device, check_input
from .data import MakeBatchSource, StreamSource, Tensors, fingerprint, to_model
from .setup import resolve_device

_ONE_PROCESS: contextvars.ContextVar[bool] = contextvars.ContextVar("one_process", default=False)
_RANK_STATES = ("torch_cpu", "cuda")


class RankFailedError(RuntimeError):
    """Raised on every other rank when one rank of a data-parallel run fails (a
    :func:`~vecinterp.training.train` under ``torchrun``, or a
    :func:`~vecinterp.training.train_ensemble` split across ranks).

    Attributes:
        rank: the (lowest) rank that failed.
        where: when (``"step 3"``, ``"start"``, ``"the end"``).
        description: the failing rank's exception, as ``"Type: message"``.

    Example:
        >>> from vecinterp.training.distributed import RankFailedError
        >>> print(RankFailedError(1, 2, "step 3", "ValueError: bad batch"))
        rank 1 of 2 failed at step 3 (ValueError: bad batch); every rank stopped
    """

    def __init__(self, rank: int, world_size: int, where: str, description: str):
        self.rank, self.where, self.description = rank, where, description
        super().__init__(
            f"rank {rank} of {world_size} failed at {where} ({description}); every rank stopped"
        )


@contextlib.contextmanager
def one_process() -> Iterator[None]:
    """Within this block :func:`~vecinterp.training.train` and
    :func:`~vecinterp.training.train_ensemble` train on this process alone, even under
    ``torchrun`` or with an initialised process group (e.g. to train a different model on
    each rank).

    Example:
        >>> from vecinterp.training.distributed import join_ranks, one_process
        >>> with one_process():
        ...     print(join_ranks("cpu").world_size)
        1
    """
    token = _ONE_PROCESS.set(True)
    try:
        yield
    finally:
        _ONE_PROCESS.reset(token)


class Solo:
    """One process: errors raise where they happen and every collective is a no-op."""

    rank = 0
    world_size = 1

    def __init__(self, device: torch.device):
        self.device = device

    @property
    def is_main(self) -> bool:
        """Whether this rank writes checkpoints and shows progress (rank 0)."""
        return self.rank == 0

    def __enter__(self) -> "Solo":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy the process group if :func:`join_ranks` created it."""

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Run a block whose exception must reach every rank (here: raise it at once)."""
        return contextlib.nullcontext()

    def sync(self, where: str) -> None:
        """Raise on every rank if one holds an exception (here: nothing to do)."""

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        return value

    def agree(self, config: dict[str, Any]) -> None:
        """``ValueError`` on every rank unless every rank was given the same ``config``."""

    def wrap(self, net: HookedVectorTransformer) -> None:
        """Wrap ``net`` in DDP for :meth:`Ranks.forward` (one process: nothing to do)."""

    def gather_rng(self, rng: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The RNG states a checkpoint saves: this rank's, and every other rank's."""
        return rng


class Ranks(Solo):
    """The ranks of a data-parallel run on the default process group (see the module)."""

    def __init__(self, device: torch.device, created: bool):
        super().__init__(device)
        self.created = created
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
        if device.type != "cuda" and backend == "nccl":
            raise ValueError(
                f"the process group's backend is nccl, which cannot reduce tensors on "
                f"{device}: train on a GPU (device=None picks cuda:LOCAL_RANK), or "
                "initialise the group with backend='gloo'"
            )
        self.comm = device if device.type == "cuda" and "nccl" in backend else torch.device("cpu")
        self.held: BaseException | None = None
        self.caller = "vecinterp.train"  # how the note on a failing rank's exception names it
        self.ddp: torch.nn.Module | None = None  # only this reference: close() frees it

    def close(self) -> None:
        # DDP's reducer holds the process group. Freed after destroy_process_group, it would
        # destroy the group holding the GIL while gloo's worker threads may need the GIL to
        # release a finished collective's tensors: a deadlock (seen under load, torch 2.13).
        # Freed here, while the group is still registered, the group outlives it.
        self.ddp = None
        if self.created and dist.is_initialized():
            dist.destroy_process_group()
        self.created = False

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        try:
            yield
        except Exception as err:  # reaches every rank at the next sync
            if self.held is None:
                self.held = err

    def sync(self, where: str, extra: list[float] | None = None) -> list[float]:  # type: ignore[override]
        """All-reduce (sum) ``extra`` with one failure flag per rank; raise on every rank
        if any rank holds an exception. Returns the summed ``extra``."""
        gate = torch.zeros(self.world_size + len(extra or []), dtype=torch.float64)
        gate[self.rank] = float(self.held is not None)
        gate[self.world_size :] = torch.tensor(extra or [], dtype=torch.float64)
        gate = gate.to(self.comm)
        dist.all_reduce(gate)
        values = gate.tolist()
        failed = [r for r in range(self.world_size) if values[r]]
        if failed:
            self._stop(failed[0], where)
        return values[self.world_size :]

    def _stop(self, first: int, where: str) -> None:
        held, self.held = self.held, None
        mine = f"{type(held).__name__}: {held}" if held is not None else None
        descriptions: list[str | None] = [None] * self.world_size
        dist.all_gather_object(descriptions, mine)
        if held is not None:
            note = getattr(held, "add_note", None)  # Python >= 3.11
            if note is not None:
                note(
                    f"{self.caller}: raised on rank {self.rank} of {self.world_size} at "
                    f"{where}; every rank stopped"
                )
            raise held
        raise RankFailedError(first, self.world_size, where, str(descriptions[first]))

    def share(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, config: dict[str, Any]) -> None:
        configs: list[Any] = [None] * self.world_size
        dist.all_gather_object(configs, config)
        differ = [
            f"rank {r}: {k}={c.get(k)!r}, rank 0: {k}={configs[0].get(k)!r}"
            for r, c in enumerate(configs)
            for k in sorted(set(c) | set(configs[0]))
            if c.get(k) != configs[0].get(k)
        ]
        if differ:
            raise ValueError(
                f"the ranks of a data-parallel run must call {self.caller} with the same "
                f"arguments (and model config), but {'; '.join(differ[:5])}"
            )

    def wrap(self, net: HookedVectorTransformer) -> None:
        # DDP broadcasts rank 0's weights; the model's buffers are constant tables
        ddp = torch.nn.parallel.DistributedDataParallel
        ids = [self.device.index] if self.device.type == "cuda" else None
        # no buffer broadcast before every forward pass (torch >= 2.13 names it anew)
        named = "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters
        no_sync: dict[str, Any] = {"forward_sync_buffers" if named else "broadcast_buffers": False}
        self.ddp = ddp(net, device_ids=ids, **no_sync)

    def gather_rng(self, rng: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mine = {k: rng[k] for k in _RANK_STATES if k in rng}
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, mine)
        out = dict(rng)
        for r in range(1, self.world_size):
            out.update({f"{k}.rank{r}": v.cpu() for k, v in every[r].items()})
        return out

    def forward(
        self,
        step: int,
        source: MakeBatchSource | StreamSource,
        net: HookedVectorTransformer,
        check: bool,
    ) -> tuple[Tensors, torch.Tensor, Callable[[], float]]:
        """Draw the global batch ``step``, forward this rank's share through DDP.

        Returns the global batch, the loss to backpropagate (this rank's squared errors
        times ``world_size / n_used``) and a function that waits for the global masked MSE.
        """
        where = source.where(step)
        parts: Tensors | None = None
        share: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        extra = [0.0] * (1 + (self.world_size if check else 0))
        if self.held is None:  # a rank that failed since the last check draws nothing
            with self.hold():
                parts = source.next(step)
                share = self._share(parts, net, where)
                extra[0] = float(share[2].sum())
                if check:
                    extra[1 + self.rank] = float(int(fingerprint(parts)[:12], 16))
        values = self.sync(f"step {step}", extra)
        assert parts is not None and share is not None
        n_used = values[0]
        if check and len(set(values[1:])) > 1:
            raise ValueError(
                f"{where}: the ranks drew different global batches (fingerprints "
                f"{[f'{v:.0f}' for v in values[1:]]} by rank): every rank must draw the same "
                "batch, so make_batch(step, generator) may depend only on step and the "
                "generator, and a stream must be the same on every rank"
            )
        if n_used == 0:
            raise ValueError(f"{where}: loss_mask selects no position")
        inputs, targets, used = share
        assert self.ddp is not None, "wrap(net) first"
        total = mse_at(self.ddp(inputs), targets, used, "sum")
        reduced = total.detach().to(self.comm, torch.float64).reshape(1)
        work = dist.all_reduce(reduced, async_op=True)
        loss = total * float(self.world_size) / n_used  # DDP averages over the ranks

        def global_loss() -> float:
            assert work is not None
            work.wait()
            return float(reduced.item()) / n_used

        return parts, loss, global_loss

    def _share(
        self, parts: Tensors, net: HookedVectorTransformer, where: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's rows of the global batch on the model's device, checked, with the
        positions the loss uses."""
        param = net.embed.W_E
        inputs, targets, mask = parts
        rows = inputs.shape[0] if inputs.dim() else 0
        if rows < self.world_size:
            raise ValueError(
                f"{where}: a global batch of {rows} sequences cannot be split across "
                f"{self.world_size} ranks; use a batch of at least {self.world_size}"
            )
        lo, hi = contiguous_share(rows, self.world_size, self.rank)
        if mask is not None and mask.dim() == 2:
            mask = mask[lo:hi]
        inputs, targets, mask = to_model((inputs[lo:hi], targets[lo:hi], mask), param.dtype,
                                         param.device)  # fmt: skip
        try:
            check_input(inputs, net.cfg, param)
        except ValueError as err:
            bad = ~torch.isfinite(inputs)
            if inputs.dim() == 3 and bool(bad.any()):
                first = bad.nonzero()[0].tolist()
                first[0] += lo
                raise ValueError(
                    f"{where}: inputs contain NaN or inf (first at index {first})"
                ) from None
            raise ValueError(f"{where}: {err}") from None
        expected = (*inputs.shape[:2], net.cfg.d_out)
        if tuple(targets.shape) != expected:
            raise ValueError(
                f"{where}: targets have shape {tuple(targets.shape)} in rows {lo}:{hi}, but "
                f"the model's outputs [batch, pos, d_out] have {expected}"
            )
        return inputs, targets, loss_positions(mask, targets.shape[:-1], targets.device)


def contiguous_share(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share ``[lo, hi)`` of ``n`` items split across
    ``world_size`` ranks: the sizes differ by at most one, the first ``n % world_size``
    ranks taking one more (the rows of a global batch; the members of an ensemble).

    Example:
        >>> from vecinterp.training.distributed import contiguous_share
        >>> [contiguous_share(5, 2, r) for r in range(2)]
        [(0, 3), (3, 5)]
        >>> [contiguous_share(7, 3, r) for r in range(3)]
        [(0, 3), (3, 5), (5, 7)]
    """
    lo = rank * (n // world_size) + min(rank, n % world_size)
    return lo, lo + n // world_size + (rank < n % world_size)


def rank_rng(saved: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """This rank's torch RNG states in a checkpoint's ``rng`` (rank 0's where the run that
    wrote it had fewer ranks)."""
    return {k: saved.get(f"{k}.rank{rank}", saved[k]) for k in _RANK_STATES if k in saved}


def join_ranks(device: str | torch.device | None) -> Solo:
    """The ranks of this run: :class:`Ranks` on the initialised default process group,
    or on one that torchrun's variables describe (initialised here, destroyed by
    :meth:`Ranks.close`); :class:`Solo` otherwise, or within :func:`one_process`.

    ``device=None`` (or ``"cuda"``) under torchrun is ``cuda:LOCAL_RANK`` where there is a
    GPU, else the CPU.
    """
    initialised = dist.is_available() and dist.is_initialized()
    env_size = os.environ.get("WORLD_SIZE", "1")
    wanted = initialised or (env_size.isdigit() and int(env_size) > 1)
    if _ONE_PROCESS.get() or not wanted:
        return Solo(resolve_device(device))
    if initialised and dist.get_world_size() == 1:
        return Solo(resolve_device(device))
    if not dist.is_available():  # pragma: no cover - torch built without distributed
        raise RuntimeError(f"WORLD_SIZE={env_size} but this torch has no torch.distributed")
    dev = _rank_device(device)
    if initialised:
        return Ranks(dev, created=False)
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise ValueError(
            f"WORLD_SIZE={env_size} asks for data-parallel training, but {', '.join(missing)} "
            "is not set: start the script with torchrun, initialise torch.distributed "
            "yourself, or unset WORLD_SIZE"
        )
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    try:
        return Ranks(dev, created=True)
    except BaseException:
        dist.destroy_process_group()
        raise


def _rank_device(device: str | torch.device | None) -> torch.device:
    if device is not None:
        dev = check_device("device", device)
        if dev.type != "cuda" or dev.index is not None:
            return resolve_device(dev)
    elif not torch.cuda.is_available():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    return torch.device("cuda", int(local) if local is not None else torch.cuda.current_device())
