"""Ensembles across ranks: which members each rank of a ``torchrun`` job trains, the check
at the end of every step that stops every rank when one fails, the order of a checkpoint's
writes, and the gathering of every member's result onto every rank (:class:`Crew`).

:func:`~vecinterp.training.ensemble.train_ensemble` joins the ranks as
:func:`vecinterp.train` does (:func:`~vecinterp.training.distributed.join_ranks`: under
``torchrun`` or in an initialised process group of more than one rank, unless within
:func:`~vecinterp.training.distributed.one_process`). Its choices:

- **The split.** Rank ``r`` of ``W`` trains the contiguous members
  :func:`~vecinterp.training.distributed.contiguous_share` ``(K, W, r)`` gives it: shares
  differ by at most one member, the first ``K % W`` ranks taking one more (K = 5 on 2
  ranks: members 0-2 and 3-4). ``K < W`` is refused (a rank would have nothing to train).
  Each rank trains its share as one batched computation, exactly as one process trains
  the whole ensemble.
- **The same members whatever the number of ranks.** Member ``i`` starts from
  ``models[i]``, draws its data from its own source and seed, and is updated only by its
  own gradient: nothing of it depends on the rank that trains it or on the other members.
  A member's slice of the batched computation does not depend on the members stacked
  beside it, so the tests find it bit-identical on 1 and 2 CPU processes (float64,
  batches of one size; members whose batches differ in size are padded to the largest of
  the rank's share, which may change the rounding).
- **One check per step.** Every step ends with one all-reduce of a failure flag per rank
  and of each member's metrics (7 numbers per member). An exception on a rank anywhere
  in its step (its data, the batched pass, a divergence with ``on_divergence="raise"``,
  its evaluation, its checkpoint writes, rank 0's callback) is held until that check,
  where every rank stops: the failing rank raises its own exception with a note naming
  it, the others :class:`~vecinterp.training.distributed.RankFailedError`. A rank that
  dies stops the others when ``torchrun`` ends the job, or at the process group's timeout.
  The ranks thus move in lock step (one small all-reduce per step); a rank with one more
  member, or whose members all diverged, sets or follows the pace.
- **Rank 0's duties.** Rank 0 holds the checkpoint directory's lock, writes
  ``ensemble.json`` and shows the progress bar (the mean loss of every live member) and
  calls ``callback(step, metrics)`` with the metrics of all K members, which the check
  brings to it exactly (a sum of one rank's value and zeros).
- **Checkpoints.** The layout is one process's (:mod:`._ensemble_checkpoint`): each rank
  writes its own members' directories, then, once every rank has written, rank 0 names
  the step in ``ensemble.json``, then each rank prunes its own members. It does not
  depend on the number of ranks, so a checkpoint resumes on any number, and a resume
  continues member ``i`` from its own checkpoint whichever rank trains it.
- **The result.** Every rank returns all K members: after training, each member's final
  state (model, weight average, AdamW state, history, newest checkpoint, divergence) is
  broadcast from the rank that trained it, one member at a time. A script written for one
  process (``out.models[i]``, a loop over ``out.histories``) thus runs unchanged under
  ``torchrun``, and every rank may go on to analyse any member. The price is each rank
  holding the whole ensemble at the end, as one process would.
"""

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..model.transformer import HookedVectorTransformer
from . import _ensemble_checkpoint as ck
from .distributed import Ranks, Solo, contiguous_share
from .result import TrainingDivergedError, TrainResult

CALLER = "vecinterp.train_ensemble"
_SLOTS = 7  # per member in the step's check: live, window, loss, lr, grad_norm, evaluated, eval


class Crew:
    """The ranks training one ensemble of ``k`` members, and this rank's share of them.

    On one process (:class:`~vecinterp.training.distributed.Solo`) the share is every
    member and each method does what one process needs and nothing more: exceptions raise
    where they happen, and nothing is communicated.

    Attributes:
        ranks: the ranks (:func:`~vecinterp.training.distributed.join_ranks`).
        k: the number of members.
        members: the members this rank trains (a contiguous ``range``).
        split: whether the members are split across more than one rank.
    """

    def __init__(self, ranks: Solo, k: int):
        self.ranks, self.k = ranks, k
        self.split = isinstance(ranks, Ranks)
        if k < ranks.world_size:
            raise ValueError(
                f"an ensemble of {k} member{'s' if k != 1 else ''} cannot be split across "
                f"{ranks.world_size} ranks (each rank trains at least one member): start at "
                f"most {k} ranks, or train more members"
            )
        self.members = range(*contiguous_share(k, ranks.world_size, ranks.rank))
        self.owners = [r for r in range(ranks.world_size)
                       for _ in range(*contiguous_share(k, ranks.world_size, r))]  # fmt: skip
        if isinstance(ranks, Ranks):
            ranks.caller = CALLER

    @property
    def first(self) -> int:
        """The first member this rank trains."""
        return self.members.start

    @contextlib.contextmanager
    def renumbered(self) -> Iterator[None]:
        """Errors raised in the block name the members by their index in the ensemble,
        not in this rank's share (``member 1`` on the rank training members 3-4 is 4)."""
        try:
            yield
        except (ValueError, TypeError, RuntimeError) as err:
            if self.first and err.args and isinstance(err.args[0], str):
                text = re.sub(r"\bmember (\d+)", lambda m: f"member {int(m[1]) + self.first}",
                              err.args[0])  # fmt: skip
                err.args = (text, *err.args[1:])
            raise

    def check(
        self,
        step: int,
        metrics: list[dict[str, float]],
        windows: list[float | None],
    ) -> tuple[list[dict[str, float]], list[float]]:
        """End of step ``step`` on every rank: stop every rank if one holds an exception;
        else return every member's metrics (``{}`` for a frozen one) and the running mean
        losses of the live members (this rank's share in ``metrics`` and ``windows``,
        ``None`` in ``windows`` for a frozen member)."""
        live = [w for w in windows if w is not None]
        if not isinstance(self.ranks, Ranks):
            return metrics, live
        extra = [0.0] * (_SLOTS * self.k)
        for j, (m, window) in enumerate(zip(metrics, windows, strict=True)):
            if window is None or self.ranks.held is not None:  # a failed rank sends its flag
                continue
            at = _SLOTS * (self.first + j)
            extra[at : at + 5] = [1.0, window, m["loss"], m["lr"], m["grad_norm"]]
            if "eval_loss" in m:
                extra[at + 5 : at + 7] = [1.0, m["eval_loss"]]
        values = self.ranks.sync(f"step {step}", extra)
        every: list[dict[str, float]] = []
        means = []
        for i in range(self.k):
            v = values[_SLOTS * i : _SLOTS * (i + 1)]
            every.append({} if not v[0] else {"loss": v[2], "lr": v[3], "grad_norm": v[4]})
            if v[0]:
                means.append(v[1])
                if v[5]:
                    every[i]["eval_loss"] = v[6]
        return every, means

    def save(
        self,
        checkpoint_dir: Path,
        step: int,
        write: Callable[[], list[Path | None]],
        keep_last: int | None,
    ) -> list[Path | None]:
        """Write a checkpoint of ``step``: ``write()`` this rank's members, then (once every
        rank has) rank 0 names the step in ``ensemble.json``, then each rank prunes its
        own members. Returns ``write()``'s paths."""
        ranks, paths = self.ranks, []
        with ranks.hold():
            paths = write()
        ranks.sync(f"the checkpoint of step {step}")
        with ranks.hold():
            if ranks.is_main:
                ck.write_marker(checkpoint_dir, step, self.k)
        ranks.sync(f"the checkpoint of step {step}")
        with ranks.hold():  # an error here stops every rank at the next check
            ck.prune_members(checkpoint_dir, self.members, keep_last)
        return paths

    def every_divergence(
        self, diverged: list[TrainingDivergedError | None]
    ) -> list[TrainingDivergedError | None]:
        """Every member's divergence (``None`` if it trained on), from this rank's share."""
        if not isinstance(self.ranks, Ranks):
            return list(diverged)
        shares: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(shares, [_describe(e) for e in diverged])
        out = [_rebuild(d) for share in shares for d in share]
        out[self.first : self.first + len(diverged)] = diverged
        return out

    def gather(
        self,
        results: list[TrainResult],
        make_model: Callable[[], HookedVectorTransformer],
        make_optimizer: Callable[[HookedVectorTransformer], torch.optim.Optimizer],
    ) -> list[TrainResult]:
        """Every member's result on every rank, from this rank's ``results`` (its share):
        each member's final state is broadcast by the rank that trained it, one member at a
        time, and rebuilt on the others with ``make_model()`` and ``make_optimizer(net)``."""
        if not isinstance(self.ranks, Ranks):
            return list(results)
        device = self.ranks.device
        every = []
        for i in range(self.k):
            mine = i in self.members
            box: list[Any] = [_pack(results[i - self.first]) if mine else None]
            dist.broadcast_object_list(box, src=self.owners[i], device=self.ranks.comm)
            if mine:
                every.append(results[i - self.first])
                continue
            state = box[0]
            raw = make_model()
            raw.load_state_dict(state["raw"])
            optimizer = make_optimizer(raw)
            optimizer.load_state_dict(state["optimizer"])
            model = raw
            if state["model"] is not None:
                model = make_model()
                model.load_state_dict(state["model"])
            every.append(TrainResult(model, state["history"], optimizer, device,
                                     state["checkpoint"], raw_model=raw))  # fmt: skip
        return every


def _cpu(tree: Any) -> Any:
    """``tree`` (dicts, lists, tensors) with every tensor on the CPU, to be pickled."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {key: _cpu(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_cpu(value) for value in tree)
    return tree


def _pack(result: TrainResult) -> dict[str, Any]:
    """What another rank needs to rebuild ``result``: state dicts on the CPU."""
    assert result.raw_model is not None
    return {
        "raw": _cpu(result.raw_model.state_dict()),
        "model": None if result.model is result.raw_model else _cpu(result.model.state_dict()),
        "optimizer": _cpu(result.optimizer.state_dict()),
        "history": result.history,
        "checkpoint": result.checkpoint,
    }


def _describe(err: TrainingDivergedError | None) -> dict[str, Any] | None:
    if err is None:
        return None
    return {"step": err.step, "quantity": err.quantity, "value": err.value,
            "checkpoint": err.checkpoint, "cause": err.cause, "args": err.args}  # fmt: skip


def _rebuild(described: dict[str, Any] | None) -> TrainingDivergedError | None:
    if described is None:
        return None
    d = described
    err = TrainingDivergedError(d["step"], d["quantity"], d["value"], d["checkpoint"], d["cause"])
    err.args = d["args"]
    return err
