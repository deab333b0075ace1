"""Activations to train dictionaries on: harvested from a model at named hook points and
positions, through a shuffled buffer of bounded size.

:func:`harvest_activations` runs the model on each batch of ``data`` (a ``make_batch(step,
generator)`` callable, as :func:`vecinterp.train` takes, or an iterable of batches) with
hooks that keep what flows at the named points, and stops the forward after the last
block it needs (``stop_at_layer``). :class:`ActivationBuffer` keeps at most ``capacity``
rows, mixes new rows with old ones and hands out shuffled batches; its state (rows,
position, generators) goes into a training checkpoint, so a run resumes exactly.
"""

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from ..hooks import HookPoint
from ..model.transformer import HookedVectorTransformer

Positions = int | Sequence[int] | slice | None
"""Which positions to keep: ``None`` (all), an index, a list of indices or a slice."""

_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_BEFORE_BLOCKS = ("hook_embed", "hook_pos_embed")


def stop_layer(model: HookedVectorTransformer, hook_names: Sequence[str]) -> int | None:
    """The ``stop_at_layer`` that runs every block the hook points need and no more
    (``None``: the whole forward, for points after the blocks).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.dictionary.activations import stop_layer
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, n_ctx=5), seed=0)
        >>> stop_layer(model, ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"])
        2
    """
    stop = 0
    for name in hook_names:
        match = _BLOCK.match(name)
        if match:
            stop = max(stop, int(match.group(1)) + 1)
        elif name not in _BEFORE_BLOCKS:
            return None
    return stop


def check_hook_names(model: HookedVectorTransformer, hook_names: object) -> list[str]:
    """``hook_names`` as a list after checking each names a hook point of ``model``
    (``ValueError`` saying what is close for one that does not)."""
    if isinstance(hook_names, str):
        hook_names = [hook_names]
    if not isinstance(hook_names, Sequence) or not hook_names:
        raise ValueError(f"hook_names must be a non-empty list of hook names, got {hook_names!r}")
    names = list(hook_names)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"hook_names entries must be str, got {type(name).__name__}")
        model.hook_point(name)  # ValueError naming what is close
    if len(set(names)) != len(names):
        raise ValueError(f"hook_names lists a name twice: {names}")
    return names


def batch_inputs(batch: object, where: str) -> torch.Tensor:
    """The model inputs of a batch: a tensor, a tuple ``(inputs, ...)`` or an object with
    ``.inputs`` (such as a task's batch)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if hasattr(batch, "inputs"):
        inputs = batch.inputs
    elif isinstance(batch, tuple | list) and batch:
        inputs = batch[0]
    else:
        raise TypeError(
            f"{where} must be an inputs tensor, a tuple (inputs, ...) or an object with "
            f".inputs, got {type(batch).__name__}"
        )
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"{where}: inputs must be a torch.Tensor, got {type(inputs).__name__}")
    return inputs


class BatchSource:
    """Batches from ``make_batch(step, generator)`` (seeded, its state saveable) or from an
    iterable (read once, in order; its position cannot be saved)."""

    def __init__(self, data: object, seed: int):
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.make_batch: Callable[[int, torch.Generator], Any] | None = None
        self.iterator: Iterator[Any] | None = None
        if callable(data) and not isinstance(data, torch.Tensor):
            self.make_batch = data
        elif isinstance(data, Iterable) and not isinstance(data, torch.Tensor | str):
            self.iterator = iter(data)
        else:
            raise TypeError(
                "data must be a make_batch(step, generator) callable or an iterable of "
                f"batches, got {type(data).__name__}"
            )

    @property
    def resumable(self) -> bool:
        """Whether :meth:`state` captures the position (only for ``make_batch``)."""
        return self.make_batch is not None

    def next(self) -> Any | None:
        """The next batch, or ``None`` once an iterable is exhausted."""
        if self.make_batch is not None:
            batch = self.make_batch(self.step, self.generator)
        else:
            assert self.iterator is not None
            batch = next(self.iterator, None)
        self.step += 1
        return batch

    def where(self) -> str:
        """How errors name the batch last read."""
        step = self.step - 1
        return f"make_batch({step}, ...)" if self.make_batch is not None else f"batch {step}"

    def state(self) -> dict[str, torch.Tensor]:
        return {
            "source_step": torch.tensor(self.step),
            "source_generator": self.generator.get_state(),
        }

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.step = int(state["source_step"])
        self.generator.set_state(state["source_generator"])


def _select(act: torch.Tensor, positions: Positions, name: str) -> torch.Tensor:
    """``[batch, pos, ...]`` (or ``[batch, d]``) -> rows ``[batch * n_pos, prod(...)]`` at
    ``positions``: the axes after the position are flattened (``hook_z``'s heads too)."""
    if act.dim() < 3:
        if positions is not None:
            raise ValueError(f"positions were given but {name} has no position axis")
        return act
    if positions is not None:
        index = [positions] if isinstance(positions, int) else positions
        act = act[:, index] if isinstance(index, slice) else act[:, list(index)]
    return act.reshape(act.shape[0] * act.shape[1], -1)


def harvest_batch(
    model: HookedVectorTransformer,
    hook_names: list[str],
    inputs: torch.Tensor,
    positions: Positions = None,
    where: str = "batch",
) -> dict[str, torch.Tensor]:
    """The activations at ``hook_names`` for one batch of ``inputs``, as rows ``[n, d]``
    (detached), from a forward that stops after the last block it needs. ``ValueError``
    naming the hook point and the batch if any is not finite."""
    kept: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: HookPoint) -> None:
        kept[str(hook.name)] = act.detach()

    with torch.no_grad():
        model.run_with_hooks(
            inputs,
            fwd_hooks=[(name, keep) for name in hook_names],
            stop_at_layer=stop_layer(model, hook_names),
        )
    rows = {}
    for name in hook_names:
        act = _select(kept[name], positions, name)
        if not bool(torch.isfinite(act).all()):
            raise ValueError(
                f"the activations at {name!r} for {where} hold "
                f"{int((~torch.isfinite(act)).sum())} non-finite value(s) (NaN or inf): a "
                "dictionary cannot be trained on them; check the model's weights and inputs"
            )
        rows[name] = act
    return rows


def harvest_activations(
    model: HookedVectorTransformer,
    hook_names: str | Sequence[str],
    data: object,
    *,
    positions: Positions = None,
    seed: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Run ``model`` on each batch of ``data`` and yield its activations at ``hook_names``
    as rows: ``{name: [batch * n_positions, d]}`` per batch, detached (the axes after the
    position are flattened into ``d``: ``hook_z``'s ``n_heads * d_head``).

    Args:
        model: any :class:`~vecinterp.HookedVectorTransformer` (native, imported or
            converted).
        hook_names: hook point name(s); an unknown name is refused (``ValueError`` saying
            what is close).
        data: ``make_batch(step, generator) -> batch`` (endless; ``generator`` seeded with
            ``seed``) or an iterable of batches; a batch is an inputs tensor, a tuple
            ``(inputs, ...)`` or an object with ``.inputs`` (a task's batch).
        positions: which positions to keep (``None``: all).
        seed: the seed of ``make_batch``'s generator.

    The forward stops after the last block the names need (``stop_at_layer``). Non-finite
    activations are refused (``ValueError`` naming the point and batch).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import harvest_activations
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> batches = [torch.randn(4, 5, 3) for _ in range(2)]
        >>> rows = next(harvest_activations(model, "blocks.0.hook_resid_post", batches,
        ...                                 positions=-1))
        >>> rows["blocks.0.hook_resid_post"].shape
        torch.Size([4, 8])
    """
    names = check_hook_names(model, hook_names)
    source = BatchSource(data, seed)
    while True:
        batch = source.next()
        if batch is None:
            return
        inputs = batch_inputs(batch, source.where())
        yield harvest_batch(model, names, inputs, positions, source.where())


class ActivationBuffer:
    """A shuffled buffer of harvested activations, at most ``capacity`` rows, refilled from
    the model as it drains: no need to hold the dataset.

    Refilling keeps the rows not yet handed out, tops the buffer up with new ones and
    shuffles the lot (a seeded generator), so each batch mixes rows of many model
    batches. :meth:`next_batch` returns ``{name: [batch_size, d]}``; rows at one index
    come from the same model position (an input and its target, for a transcoder).

    Args:
        model: the model to harvest from; hook_names, data, positions, seed: as
            :func:`harvest_activations` (``seed`` also seeds the shuffling).
        capacity: rows held at most (>= 1); a refill happens when fewer than half are
            left unread.
        dtype: the dtype of the rows handed out (default: as harvested).

    A buffer over a ``make_batch`` callable can save and restore its state
    (:meth:`state`, :meth:`restore`), which training checkpoints use; one over an
    iterable cannot (``resumable`` is ``False``).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import ActivationBuffer
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
        >>> make_batch = lambda step, gen: torch.randn(4, 5, 3, generator=gen)
        >>> buffer = ActivationBuffer(model, ["blocks.0.hook_resid_post"], make_batch,
        ...                           capacity=64)
        >>> buffer.next_batch(16)["blocks.0.hook_resid_post"].shape
        torch.Size([16, 8])
    """

    def __init__(
        self,
        model: HookedVectorTransformer,
        hook_names: str | Sequence[str],
        data: object,
        *,
        capacity: int = 65536,
        positions: Positions = None,
        seed: int = 0,
        dtype: torch.dtype | None = None,
    ):
        if not isinstance(model, HookedVectorTransformer):
            raise TypeError(f"model must be a HookedVectorTransformer, got {type(model).__name__}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.model = model
        self.hook_names = check_hook_names(model, hook_names)
        self.capacity = capacity
        self.positions = positions
        self.dtype = dtype
        self.source = BatchSource(data, seed)
        self.shuffle = torch.Generator().manual_seed(seed + 1)
        self.rows: dict[str, torch.Tensor] | None = None  # the unread rows, shuffled
        self.read = 0
        self.pending: dict[str, torch.Tensor] | None = None  # harvested, not yet mixed in
        self.exhausted = False

    @property
    def resumable(self) -> bool:
        """Whether :meth:`state` captures everything (a ``make_batch`` source)."""
        return self.source.resumable

    @property
    def unread(self) -> int:
        """Rows in the buffer not yet handed out."""
        return 0 if self.rows is None else next(iter(self.rows.values())).shape[0] - self.read

    def _harvest(self) -> dict[str, torch.Tensor] | None:
        batch = self.source.next()
        if batch is None:
            return None
        inputs = batch_inputs(batch, self.source.where())
        rows = harvest_batch(
            self.model, self.hook_names, inputs, self.positions, self.source.where()
        )
        if self.dtype is not None:
            rows = {k: v.to(self.dtype) for k, v in rows.items()}
        return rows

    def _refill(self) -> None:
        parts: list[dict[str, torch.Tensor]] = []
        if self.rows is not None and self.unread:
            parts.append({k: v[self.read :] for k, v in self.rows.items()})
        held = self.unread
        if self.pending is not None:
            parts.append(self.pending)
            held += next(iter(self.pending.values())).shape[0]
            self.pending = None
        while held < self.capacity and not self.exhausted:
            rows = self._harvest()
            if rows is None:
                self.exhausted = True
                break
            parts.append(rows)
            held += next(iter(rows.values())).shape[0]
        if not parts:
            self.rows, self.read = None, 0
            return
        joined = {k: torch.cat([p[k] for p in parts]) for k in self.hook_names}
        if held > self.capacity:  # the overflow waits for the next refill
            self.pending = {k: v[self.capacity :] for k, v in joined.items()}
            joined = {k: v[: self.capacity] for k, v in joined.items()}
        n = next(iter(joined.values())).shape[0]
        order = torch.randperm(n, generator=self.shuffle)
        self.rows = {k: v[order] for k, v in joined.items()}
        self.read = 0

    def next_batch(self, batch_size: int) -> dict[str, torch.Tensor]:
        """The next ``batch_size`` shuffled rows per hook point; ``ValueError`` once an
        iterable source cannot supply them."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if batch_size > self.capacity:
            raise ValueError(
                f"batch_size {batch_size} is larger than the buffer's capacity {self.capacity}"
            )
        if self.unread < max(batch_size, self.capacity // 2) and not (
            self.exhausted and self.pending is None
        ):
            self._refill()
        if self.unread < batch_size:
            raise ValueError(
                f"the data ran out: {self.unread} row(s) left in the buffer, {batch_size} "
                "asked for; give more batches or a make_batch callable"
            )
        assert self.rows is not None
        batch = {k: v[self.read : self.read + batch_size] for k, v in self.rows.items()}
        self.read += batch_size
        return batch

    def state(self) -> dict[str, torch.Tensor]:
        """The buffer's state as tensors (for a checkpoint): its unread and pending rows,
        the shuffling and source generators, the source's step."""
        if not self.resumable:
            raise ValueError(
                "this buffer reads an iterable, whose position cannot be saved: build it "
                "on a make_batch(step, generator) callable to checkpoint and resume"
            )
        state = {
            "buffer_shuffle": self.shuffle.get_state(),
            "buffer_exhausted": torch.tensor(self.exhausted),
            **self.source.state(),
        }
        for i, name in enumerate(self.hook_names):
            if self.rows is not None:
                state[f"buffer_rows.{i}"] = self.rows[name][self.read :].contiguous()
            if self.pending is not None:
                state[f"buffer_pending.{i}"] = self.pending[name].contiguous()
        return state

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        """Put back a :meth:`state` (``ValueError`` if a piece is missing)."""
        needed = ["buffer_shuffle", "buffer_exhausted", "source_step", "source_generator"]
        missing = [k for k in needed if k not in state]
        if missing:
            raise ValueError(f"the buffer state lacks {missing}")
        self.shuffle.set_state(state["buffer_shuffle"])
        self.exhausted = bool(state["buffer_exhausted"])
        self.source.restore(state)
        names = self.hook_names
        has_rows = f"buffer_rows.{0}" in state
        self.rows = (
            {n: state[f"buffer_rows.{i}"] for i, n in enumerate(names)} if has_rows else None
        )
        self.read = 0
        has_pending = f"buffer_pending.{0}" in state
        self.pending = (
            {n: state[f"buffer_pending.{i}"] for i, n in enumerate(names)} if has_pending else None
        )
