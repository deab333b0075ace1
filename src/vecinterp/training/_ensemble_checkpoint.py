"""The checkpoints of :func:`~vecinterp.training.ensemble.train_ensemble`, and the per-member
optimizer state they save.

Layout of ``checkpoint_dir``::

    member_000/step_00000500/   member 0's vi.train checkpoint (training.checkpoint)
    member_001/step_00000500/   ...
    ensemble.json               {"format", "members": K, "step": 500}

While the ensemble runs, it holds the training lock of ``checkpoint_dir``, and
``vi.train`` in one of its ``member_*`` directories is refused (it checks that lock after
taking its own; the ensemble checks the members' after taking its own:
:func:`check_members_free`).

Each member's checkpoint is written, checksummed and read by
:mod:`vecinterp.training.checkpoint`, exactly as :func:`vecinterp.train` writes its own
(plus an ``"ensemble"`` entry in ``trainer.json``: the member's index and, once it has
diverged, why). A resume checks that index against the directory's: member directories
swapped or copied by hand are refused, not loaded into the wrong models.
``ensemble.json`` is rewritten (atomically) only once every member has
written a step, and old checkpoints are pruned only after that: a crash at any point
leaves every member with the step it names, the one a resumed ensemble continues from.
``ensemble.json`` is read as a regular file only (a FIFO or a link to a device is refused,
naming it); missing while every member holds a checkpoint, it is refused rather than the
run started again from step 0 (a crash before the first one leaves some member without a
checkpoint: that run starts afresh).

The layout does not depend on how many processes trained the ensemble: across ranks
(:mod:`._ensemble_distributed`) each rank writes and prunes its own members' directories
(:func:`write_members`, :func:`prune_members`) and rank 0 writes ``ensemble.json``
(:func:`write_marker`) once every rank has written its members, so a checkpoint resumes
on any number of ranks.
"""

import collections
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..model.atomic import atomic_write, read_regular
from ..model.transformer import HookedVectorTransformer
from ._record import read_record
from .checkpoint import (
    TRAINER_FILE,
    list_checkpoints,
    lock_holder,
    prune,
    remove_partial,
    step_dir_name,
    write_checkpoint,
)
from .data import MakeBatchSource, StreamSource, Tensors, fingerprint
from .loop import _restore
from .result import TrainHistory, TrainingDivergedError

MARKER = "ensemble.json"
FORMAT = "vecinterp-ensemble"


@dataclasses.dataclass
class AdamState:
    """The members' AdamW state: the moments stacked like the weights (``[K, ...]`` per
    parameter), and one ``torch.optim.AdamW`` per member over its model's parameters,
    which holds views of its slices when a checkpoint is written or the run returns."""

    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    optimizers: list[torch.optim.Optimizer]
    updates: list[int]  # AdamW steps each member has taken


def member_dir(checkpoint_dir: Path, member: int) -> Path:
    return checkpoint_dir / f"member_{member:03d}"


def has_checkpoints(checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` holds an ensemble's record or any member's checkpoint."""
    if (checkpoint_dir / MARKER).exists():
        return True
    return any(d.is_dir() and list_checkpoints(d) for d in checkpoint_dir.glob("member_*"))


def newest_step(checkpoint_dir: Path, k: int) -> int | None:
    """The step that every member has written (from ``ensemble.json``), or ``None`` when no
    member holds a checkpoint yet.

    ``ensemble.json`` is read as a regular file only (a FIFO would block the read, a link
    to ``/dev/zero`` fill the memory): anything else is refused, naming it. With the file
    missing while every member holds a checkpoint, the record of the step they all
    completed is lost: refused rather than started again from step 0 over their
    checkpoints (the message says how to resume or start afresh)."""
    file = checkpoint_dir / MARKER
    if not os.path.lexists(file):
        _refuse_lost_marker(checkpoint_dir, k)
        return None
    try:
        text = read_regular(file, shown=f"the ensemble record {file}")  # ValueError: not regular
    except OSError as err:
        raise ValueError(f"{file} is not a readable ensemble record: {err}") from None
    try:
        record = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{file} is not a readable ensemble record: {err}") from None
    if not (
        isinstance(record, dict)
        and record.get("format") == FORMAT
        and all(type(record.get(key)) is int and record[key] >= 1 for key in ("members", "step"))
    ):
        raise ValueError(f"{file} is not an ensemble record (format, members, step): {record}")
    if record["members"] != k:
        raise ValueError(
            f"{checkpoint_dir} holds the checkpoints of an ensemble of {record['members']} "
            f"members; this one has {k}: resume with the same models, or use another "
            "checkpoint_dir"
        )
    return int(record["step"])


def _refuse_lost_marker(checkpoint_dir: Path, k: int) -> None:
    """``ValueError`` if ``ensemble.json`` is missing but every member holds a checkpoint
    (a crash before the first ``ensemble.json`` leaves some members without one: then the
    run starts afresh, as it always did)."""
    steps = []
    for i in range(k):
        found = list_checkpoints(member_dir(checkpoint_dir, i))
        if not found:
            return
        steps.append({int(p.name.split("_")[1]) for p in found})
    common = set.intersection(*steps)
    how = (
        f"if it was lost, write it again to resume from step {max(common)}, the newest "
        f"step every member holds ({json.dumps(_marker(max(common), k))}); "
        if common
        else ""
    )
    raise ValueError(
        f"{checkpoint_dir / MARKER} is missing, but all {k} members' directories hold "
        f"checkpoints (member_000: {[step_dir_name(s) for s in sorted(steps[0])]}): "
        "resume=True will not start again from step 0 over them. The file names the step "
        f"every member completed: {how}to start afresh, move the member_* directories "
        "away or pass an empty checkpoint_dir"
    )


def _marker(step: int, members: int) -> dict[str, Any]:
    return {"format": FORMAT, "members": members, "step": step}


def fill_optimizer(state: AdamState, member: int, rate: float) -> None:
    """Put member ``member``'s AdamW state (views of its slices) into its optimizer, as
    ``torch.optim.AdamW`` would hold it after the same updates."""
    optimizer = state.optimizers[member]
    group = optimizer.param_groups[0]
    group["lr"] = rate
    optimizer.state = collections.defaultdict(dict)
    if state.updates[member] == 0:
        return
    on_device = bool(group.get("fused") or group.get("capturable"))
    for j, p in enumerate(group["params"]):
        optimizer.state[p] = {
            "step": torch.tensor(
                float(state.updates[member]), dtype=torch.float32,
                device=p.device if on_device else "cpu",
            ),
            "exp_avg": state.exp_avgs[j][member],
            "exp_avg_sq": state.exp_avg_sqs[j][member],
        }  # fmt: skip


def detach(net: HookedVectorTransformer, optimizer: torch.optim.Optimizer | None) -> None:
    """Give ``net`` (and its optimizer's state) their own storage instead of views of the
    stacks: an ordinary model."""
    with torch.no_grad():
        for t in list(net.parameters()) + list(net.buffers()):
            t.data = t.data.clone()
    if optimizer is not None:
        for per_param in optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                per_param[key] = per_param[key].clone()


def frozen_index(frozen: list[int], device: torch.device) -> torch.Tensor | None:
    """The frozen members' indices as a tensor on ``device`` for :func:`hold` and
    :func:`put_back` (``None`` if none is frozen). Made once each time the set changes, not
    at every step: on a GPU, a tensor made from a Python list is a copy that waits for the
    device."""
    return torch.tensor(frozen, device=device) if frozen else None


def hold(tensors: list[torch.Tensor], index: torch.Tensor | None) -> list[torch.Tensor]:
    """Copies of the frozen members' slices of ``tensors`` (``index``: from
    :func:`frozen_index`; see :func:`put_back`)."""
    if index is None:
        return []
    return [t.detach().index_select(0, index) for t in tensors]


def put_back(
    tensors: list[torch.Tensor], index: torch.Tensor | None, kept: list[torch.Tensor]
) -> None:
    """Restore the frozen members' slices that :func:`hold` copied."""
    if index is not None:
        for t, saved in zip(tensors, kept, strict=True):
            t.detach().index_copy_(0, index, saved)


def write_members(
    checkpoint_dir: Path,
    step: int,
    first: int,
    members: int,
    nets: list[HookedVectorTransformer],
    state: AdamState,
    sources: list[MakeBatchSource | StreamSource],
    parts: list[Tensors],
    rates: list[float],
    histories: list[TrainHistory],
    configs: list[dict[str, Any]],
    diverged: list[TrainingDivergedError | None],
    device: torch.device,
    averages: list[HookedVectorTransformer] | None,
    elapsed: float,
    threads: int | None = None,
) -> list[Path | None]:
    """Write the checkpoint of ``step`` of each member in ``nets`` (members ``first``,
    ``first + 1``, ... of an ensemble of ``members``; the lists are indexed like ``nets``)."""
    paths: list[Path | None] = []
    for j, net in enumerate(nets):
        fill_optimizer(state, j, rates[j])
        rng = {"torch_cpu": torch.get_rng_state(), **sources[j].state()}
        if device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(device)
        err = diverged[j]
        record = {
            "config": configs[j],
            "data_fingerprint": fingerprint(parts[j]),
            "elapsed": elapsed,
            "device": str(device),
            **({} if threads is None else {"threads": threads}),
            "ensemble": {
                "member": first + j,
                "members": members,
                "diverged": None if err is None else {
                    "step": err.step, "quantity": err.quantity, "value": repr(err.value),
                    "message": str(err),
                },
            },
        }  # fmt: skip
        average = averages[j] if averages is not None else None
        paths.append(
            write_checkpoint(
                member_dir(checkpoint_dir, first + j),
                step,
                net,
                state.optimizers[j],
                rng,
                histories[j].to_tensors(),
                record,
                average=average,
            )  # fmt: skip
        )
    return paths


def write_marker(checkpoint_dir: Path, step: int, members: int) -> None:
    """Name ``step`` in ``ensemble.json`` (atomically): every member has written it."""
    text = json.dumps(_marker(step, members), indent=2)
    atomic_write(checkpoint_dir / MARKER, lambda tmp: tmp.write_text(text + "\n"))


def prune_members(checkpoint_dir: Path, members: range, keep_last: int | None) -> None:
    """Keep the newest ``keep_last`` checkpoints of each of ``members`` (after
    :func:`write_marker`, so that the step it names is never pruned)."""
    for i in members:
        prune(member_dir(checkpoint_dir, i), keep_last)


def check_members_free(checkpoint_dir: Path, members: int) -> None:
    """Refuse (``ValueError`` naming the member's directory and the run there) if a live
    run holds the training lock of a member's directory. The caller holds
    ``checkpoint_dir``'s lock already, which ``vi.train`` in a member's directory checks
    after taking its own (:func:`~.checkpoint.lock_holder`): the two never run together."""
    for i in range(members):
        holder = lock_holder(member_dir(checkpoint_dir, i))
        if holder is not None:
            raise ValueError(
                f"{member_dir(checkpoint_dir, i)} is in use by another training run "
                f"({holder}): the ensemble would overwrite its checkpoints; wait for that run "
                "to end, or pass another checkpoint_dir"
            )


def remove_partial_members(checkpoint_dir: Path) -> None:
    """Delete the hidden leftovers of interrupted writes in every member's directory (only
    for the run that owns ``checkpoint_dir``)."""
    for directory in sorted(checkpoint_dir.glob("member_*")):
        if directory.is_dir():
            remove_partial(directory)


def restore(
    checkpoint_dir: Path,
    step: int,
    first: int,
    configs: list[dict[str, Any]],
    nets: list[HookedVectorTransformer],
    state: AdamState,
    sources: list[MakeBatchSource | StreamSource],
    device: torch.device,
    averages: list[HookedVectorTransformer] | None,
    histories: list[TrainHistory],
    diverged: list[TrainingDivergedError | None],
    checkpoints: list[Path | None],
) -> tuple[int, float, dict[str, Any] | None]:
    """Load the checkpoint of ``step`` of each member in ``nets`` (members ``first``,
    ``first + 1``, ...; with vi.train's own checks) into the stacks (through the members'
    aliased models and optimizers), the data sources and the RNGs; fill ``histories``,
    ``diverged`` and ``checkpoints`` (indexed like ``nets``). Returns ``(step, elapsed,
    record)``, ``record`` the first member's ``trainer.json`` (``None`` for no member)."""
    elapsed, first_record = 0.0, None
    for i, net in enumerate(nets):
        path = member_dir(checkpoint_dir, first + i) / step_dir_name(step)
        # lexists: a trainer.json that is not a regular file (a FIFO, a link to /dev/zero)
        # is refused by the read below, naming what it is, not called missing
        if not os.path.lexists(path / TRAINER_FILE):
            raise ValueError(
                f"{checkpoint_dir / MARKER} names step {step}, which every member has written, "
                f"but member {first + i}'s checkpoint {path} is missing"
            )
        _check_member(path, first + i)
        optimizer = state.optimizers[i]
        average = averages[i] if averages is not None else None
        _, histories[i], elapsed, record = _restore(
            path, configs[i], net, optimizer, sources[i], device, average
        )
        per_param = [optimizer.state.get(p, {}) for p in optimizer.param_groups[0]["params"]]
        with torch.no_grad():
            for j, saved in enumerate(per_param):
                state.exp_avgs[j][i].copy_(saved.get("exp_avg", 0.0))
                state.exp_avg_sqs[j][i].copy_(saved.get("exp_avg_sq", 0.0))
        state.updates[i] = int(per_param[0]["step"]) if per_param[0] else 0
        optimizer.state = collections.defaultdict(dict)
        entry = record.get("ensemble") or {}
        if entry.get("diverged"):
            d = entry["diverged"]
            err = TrainingDivergedError(d["step"], d["quantity"], float(d["value"]), None)
            err.args = (d["message"],)
            diverged[i] = err
        checkpoints[i] = path
        first_record = record if first_record is None else first_record
    return step, elapsed, first_record


def _check_member(path: Path, member: int) -> None:
    """Refuse member ``member``'s checkpoint ``path`` if its ``trainer.json`` says it is
    another member's, or no member's (before anything is loaded): directories swapped or
    copied by hand. Each member's record names its index (:func:`write_members`)."""
    entry = read_record(path).get("ensemble")
    index = entry.get("member") if isinstance(entry, dict) else None
    if index != member:
        said = (
            "no ensemble member's (no 'ensemble' entry)" if index is None else f"member {index}'s"
        )
        raise ValueError(
            f"{path / TRAINER_FILE} is {said}, but it lies in member {member}'s directory "
            f"{path.parent.name}: the member directories were moved, swapped or copied, and "
            f"resuming would load that state into models[{member}]; put each member_NNN "
            "directory back under its own index (its trainer.json's ensemble.member)"
        )
