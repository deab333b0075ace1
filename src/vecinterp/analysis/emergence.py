r"""Emergence: how attention along chosen paths and chosen losses evolve over training.

Musat (2024, §9 and Appendix D) saves a checkpoint every few steps, then measures for each
checkpoint the *average attention along each path* of a reverse-engineered circuit (a head
attending from one position to another) together with the partial losses, and reads off
when each head emerges (the first step its average attention exceeds 0.5).
:func:`emergence` does that for the checkpoints written by :func:`vecinterp.train` (or any
list of saved models) and returns an :class:`EmergenceTable`, a tidy table of
``(step, name, value)`` rows; :func:`vecinterp.plot.plot_emergence` draws it.

A path is ``(layer, head, dest, src)``. Its average attention on inputs ``x`` is

.. math::
    \bar A = \frac{1}{B\,k} \sum_{b=1}^{B} \sum_{i=1}^{k}
    A^{(\ell, h)}_b[\mathrm{dest}_{b,i}, \mathrm{src}_{b,i}]

with ``A [batch, n_heads, dest_pos, src_pos]`` the layer's attention pattern. ``dest`` and
``src`` are each

- an int: the same position in every sequence (negative counts from the end);
- an integer tensor ``[batch]`` or ``[batch, k]`` (more axes are flattened into ``k``): per
  sequence positions, e.g. where a chain's tokens sit in the retrieval task, whose layout
  changes from sequence to sequence; ``dest`` and ``src`` broadcast against each other;
- a callable ``f(data) -> int | tensor``, given the ``data`` passed to :func:`emergence`
  (e.g. ``lambda b: b.query_pos`` for a :class:`~vecinterp.tasks.retrieval.RetrievalBatch`).

This module reads the checkpoint layout of :func:`vecinterp.train`
(``checkpoint_dir/step_XXXXXXXX/model/``, the step also in the saved model's metadata)
itself, with :func:`vecinterp.load`, so that analysis does not import the training layer.

The file is long (about 500 lines) but holds one measurement, in three parts that only
make sense together: the measure at one checkpoint (:func:`path_attention`), the sweep over
a run's checkpoints that repeats it (:func:`emergence`) and the table the sweep returns
(:class:`EmergenceTable`).
"""

import csv
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from ..model import HookedVectorTransformer
from ..model.io import load, read_config
from ..model.validation import check_input
from ._validate import check_head, check_layer, check_model

__all__ = ["EmergenceTable", "emergence", "path_attention"]

Index = int | torch.Tensor | Callable[[Any], Any]
"""A position: an int, an integer tensor ``[batch]``/``[batch, k]``, or ``f(data)``."""
Path4 = Sequence[Any]
"""An attention path ``(layer, head, dest, src)``: ``layer`` and ``head`` ints, ``dest`` and
``src`` each an ``Index`` (checked by the functions, with errors naming the path)."""
Checkpoints = str | os.PathLike[str] | Sequence[Any]
"""A checkpoint directory, or a list of checkpoint paths or ``(step, model)`` pairs."""

_STEP_DIR = re.compile(r"^step_(\d+)$")


# ------------------------------------------------------------------------------ the table


@dataclasses.dataclass(frozen=True)
class EmergenceTable:
    """A tidy table of ``(step, name, value)`` rows, one per checkpoint and quantity.

    Attributes:
        rows: the rows, sorted by step, quantities in the order they were computed.

    Example:
        >>> from vecinterp.analysis.emergence import EmergenceTable
        >>> t = EmergenceTable(((0, "a", 0.1), (0, "loss", 1.0), (10, "a", 0.9),
        ...                     (10, "loss", 0.2)))
        >>> t.steps, t.names, t.column("a")
        ([0, 10], ['a', 'loss'], [0.1, 0.9])
        >>> t.crossing_step("a", 0.5)
        5.0
    """

    rows: tuple[tuple[int, str, float], ...]

    def __post_init__(self) -> None:
        rows = tuple(self.rows)
        for row in rows:
            ok = (
                isinstance(row, tuple)
                and len(row) == 3
                and isinstance(row[0], int)
                and not isinstance(row[0], bool)
                and isinstance(row[1], str)
                and isinstance(row[2], int | float)
            )
            if not ok:
                raise TypeError(
                    f"each row must be (step: int, name: str, value: float), got {row!r}"
                )
        seen = set()
        for step, name, _ in rows:
            if (step, name) in seen:
                raise ValueError(f"the table has two rows for step {step}, name {name!r}")
            seen.add((step, name))
        object.__setattr__(self, "rows", rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def steps(self) -> list[int]:
        """The distinct steps, ascending."""
        return sorted({step for step, _, _ in self.rows})

    @property
    def names(self) -> list[str]:
        """The distinct quantity names, in first-seen order."""
        return list(dict.fromkeys(name for _, name, _ in self.rows))

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one quantity, by ascending step."""
        pairs = sorted((step, value) for step, n, value in self.rows if n == name)
        if not pairs:
            raise KeyError(f"no quantity {name!r} in the table; it has {self.names}")
        return [s for s, _ in pairs], [float(v) for _, v in pairs]

    def column(self, name: str) -> list[float]:
        """The values of one quantity, by ascending step (``series(name)[1]``)."""
        return self.series(name)[1]

    def value(self, step: int, name: str) -> float:
        """The value of ``name`` at ``step``."""
        for s, n, v in self.rows:
            if s == step and n == name:
                return float(v)
        raise KeyError(f"no row for step {step}, name {name!r}")

    def crossing_step(
        self, name: str, threshold: float, *, above: bool = True, interpolate: bool = True
    ) -> float | None:
        """The first step at which ``name`` goes above (or below) ``threshold``.

        With ``interpolate`` the step is found by linear interpolation between the last
        checkpoint on the other side and the first one across, as the paper does
        (Figure 7); a quantity already across at the first checkpoint returns that step.
        ``None`` if it never crosses. "Above" means ``> threshold``, "below" ``< threshold``.
        """
        steps, values = self.series(name)
        across = [(v > threshold) if above else (v < threshold) for v in values]
        if True not in across:
            return None
        i = across.index(True)
        if i == 0 or not interpolate:
            return float(steps[i])
        s0, s1, v0, v1 = steps[i - 1], steps[i], values[i - 1], values[i]
        return float(s0 + (s1 - s0) * (threshold - v0) / (v1 - v0))

    def to_dict(self) -> dict[str, list[Any]]:
        """``{"step": [...], "name": [...], "value": [...]}``, e.g. for ``pandas.DataFrame``."""
        return {
            "step": [r[0] for r in self.rows],
            "name": [r[1] for r in self.rows],
            "value": [float(r[2]) for r in self.rows],
        }

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write ``step,name,value`` rows (with that header) to ``path``; returns it."""
        path = Path(path)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "name", "value"])
            for step, name, value in self.rows:
                writer.writerow([step, name, repr(float(value))])
        return path


# -------------------------------------------------------------------------- attention paths


def _inputs_of(data: object) -> torch.Tensor:
    inputs = getattr(data, "inputs", data)
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(
            "data must be an input tensor [batch, pos, d_in] or a batch with .inputs, "
            f"got {type(data).__name__}"
        )
    return inputs


def _resolve_index(spec: object, data: object, batch: int, n_pos: int, what: str) -> torch.Tensor:
    """``spec`` as an int64 ``[batch, k]`` tensor of positions in ``[0, n_pos)``."""
    if callable(spec) and not isinstance(spec, torch.Tensor):
        spec = spec(data)
    if isinstance(spec, int) and not isinstance(spec, bool):
        index = torch.full((batch, 1), spec, dtype=torch.int64)
    elif isinstance(spec, torch.Tensor):
        if spec.is_floating_point() or spec.is_complex() or spec.dtype == torch.bool:
            raise TypeError(f"{what} must hold integer positions, got a {spec.dtype} tensor")
        if spec.ndim == 0:
            index = spec.reshape(1, 1).expand(batch, 1)
        elif spec.shape[0] != batch:
            raise ValueError(
                f"{what} must be [batch={batch}] or [batch={batch}, k], got {tuple(spec.shape)}"
            )
        else:
            index = spec.reshape(batch, -1)
        index = index.to(torch.int64).cpu()
    else:
        raise TypeError(
            f"{what} must be an int, an integer tensor [batch] / [batch, k] or a callable "
            f"f(data) returning one, got {type(spec).__name__}"
        )
    if index.numel() == 0:
        raise ValueError(f"{what} selects no position")
    if bool((index < -n_pos).any()) or bool((index >= n_pos).any()):
        raise ValueError(
            f"{what} positions must lie in [{-n_pos}, {n_pos - 1}] for inputs of {n_pos} "
            f"positions, got values from {int(index.min())} to {int(index.max())}"
        )
    return index % n_pos


def _check_paths(
    model: HookedVectorTransformer, paths: object
) -> dict[str, tuple[int, int, Any, Any]]:
    if not isinstance(paths, Mapping):
        raise TypeError(
            f"paths must be a dict {{name: (layer, head, dest, src)}}, got {type(paths).__name__}"
        )
    if not paths:
        raise ValueError("paths is empty: give at least one {name: (layer, head, dest, src)}")
    checked = {}
    for name, path in paths.items():
        if not isinstance(name, str):
            raise TypeError(f"path names must be strings, got {name!r}")
        if not isinstance(path, tuple | list) or len(path) != 4:
            raise ValueError(f"path {name!r} must be (layer, head, dest, src), got {path!r}")
        layer, head, dest, src = path
        checked[name] = (check_layer(model, layer), check_head(model, head), dest, src)
    return checked


def path_attention(
    model: HookedVectorTransformer,
    data: Float[torch.Tensor, "batch pos d_in"] | Any,
    paths: Mapping[str, Path4],
) -> dict[str, float]:
    r"""The average attention along each path, from one forward pass (no gradients).

    .. math::
        \bar A = \frac{1}{B\,k} \sum_{b, i} A^{(\ell, h)}_b[\mathrm{dest}_{b,i},
        \mathrm{src}_{b,i}]

    Args:
        model: the model.
        data: the inputs ``[batch, pos, d_in]``, or a batch with ``.inputs`` (such as a
            :class:`~vecinterp.tasks.retrieval.RetrievalBatch`); callables in ``paths``
            receive it as given.
        paths: ``{name: (layer, head, dest, src)}``, ``dest``/``src`` as in the module
            docstring (ints, integer tensors ``[batch]``/``[batch, k]``, callables).

    Returns:
        ``{name: average attention}`` in ``[0, 1]``.

    Raises:
        TypeError, ValueError: bad model, inputs, layers, heads or positions.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.emergence import path_attention
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> path_attention(model, torch.randn(2, 5, 3), {"first row": (0, 1, 0, 0)})
        {'first row': 1.0}
    """
    model = check_model(model)
    checked = _check_paths(model, paths)
    inputs = _inputs_of(data)
    param = model.W_E
    inputs = check_input(inputs.to(device=param.device, dtype=param.dtype), model.cfg, param)
    batch, n_pos, _ = inputs.shape
    resolved = {}
    for name, (layer, head, dest, src) in checked.items():
        d = _resolve_index(dest, data, batch, n_pos, f"path {name!r}: dest")
        s = _resolve_index(src, data, batch, n_pos, f"path {name!r}: src")
        try:
            d, s = torch.broadcast_tensors(d, s)
        except RuntimeError:
            raise ValueError(
                f"path {name!r}: dest {tuple(d.shape)} and src {tuple(s.shape)} do not "
                "broadcast (both [batch, k] with the same k, or one of them k = 1)"
            ) from None
        resolved[name] = (layer, head, d, s)
    layers = sorted({layer for layer, _, _, _ in resolved.values()})
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(inputs, names_filter=names)
    finally:
        model.train(was_training)
    out = {}
    rows = torch.arange(batch)[:, None]
    for name, (layer, head, d, s) in resolved.items():
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].cpu()  # [batch, dest, src]
        out[name] = float(pattern[rows, d, s].double().mean())
    return out


# ------------------------------------------------------------------------------ checkpoints


def _step_of(path: Path) -> int:
    """The training step of a checkpoint directory or saved model."""
    model_dir = path / "model" if (path / "model").is_dir() else path
    _, metadata = read_config(model_dir)
    step = metadata.get("step") if isinstance(metadata, dict) else None
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    for candidate in (path, model_dir.parent):
        match = _STEP_DIR.match(candidate.name)
        if match:
            return int(match.group(1))
    raise ValueError(
        f"cannot tell the training step of {path}: its saved metadata has no 'step' and its "
        "name is not step_<number>; pass (step, model) pairs instead"
    )


def _checkpoint_list(checkpoints: object) -> list[tuple[int, Any]]:
    """``(step, path or model)`` pairs, sorted by step; models are loaded later, one by one."""
    if isinstance(checkpoints, str | os.PathLike):
        directory = Path(checkpoints)
        if not directory.is_dir():
            raise FileNotFoundError(f"no checkpoint directory at {directory}")
        found = sorted(
            (int(m.group(1)), child)
            for child in directory.iterdir()
            if (m := _STEP_DIR.match(child.name)) and (child / "model").is_dir()
        )
        if not found:
            if (directory / "model").is_dir() or (directory / "config.json").is_file():
                found = [(_step_of(directory), directory)]
            else:
                raise ValueError(
                    f"{directory} holds no checkpoint (step_<number>/model/ folders written "
                    "by vecinterp.train)"
                )
        items: list[tuple[int, Any]] = list(found)
    elif isinstance(checkpoints, Sequence):
        items = []
        for item in checkpoints:
            if isinstance(item, str | os.PathLike):
                items.append((_step_of(Path(item)), Path(item)))
            elif isinstance(item, tuple | list) and len(item) == 2:
                step, model = item
                if isinstance(step, bool) or not isinstance(step, int):
                    raise TypeError(f"a (step, model) pair needs an int step, got {step!r}")
                items.append(
                    (
                        step,
                        check_model(
                            model,
                            f"checkpoints[{len(items)}][1], the model of a (step, model) pair",
                        ),
                    )
                )
            else:
                raise TypeError(
                    "each checkpoint must be a path or a (step, model) pair, got "
                    f"{type(item).__name__}"
                )
        if not items:
            raise ValueError("checkpoints is empty")
    else:
        raise TypeError(
            "checkpoints must be a checkpoint directory, or a list of checkpoint paths or "
            f"(step, model) pairs, got {type(checkpoints).__name__}"
        )
    items.sort(key=lambda pair: pair[0])
    steps = [step for step, _ in items]
    if len(set(steps)) != len(steps):
        raise ValueError(f"two checkpoints have the same step: {steps}")
    return items


def _models(
    items: list[tuple[int, Any]], device: str | torch.device | None
) -> Iterator[tuple[int, HookedVectorTransformer]]:
    for step, item in items:
        if isinstance(item, HookedVectorTransformer):
            yield step, item
        else:
            model_dir = item / "model" if (item / "model").is_dir() else item
            yield step, load(model_dir, device=device)


def emergence(
    checkpoints: Checkpoints,
    data: Float[torch.Tensor, "batch pos d_in"] | Any = None,
    paths: Mapping[str, Path4] | None = None,
    losses: Callable[[HookedVectorTransformer], Mapping[str, Any]] | None = None,
    *,
    device: str | torch.device | None = "cpu",
    progress: bool = True,
) -> EmergenceTable:
    """Average attention along paths and named losses at every checkpoint of a run.

    For each checkpoint (ascending step) the model is loaded, :func:`path_attention` is
    measured on ``data`` and ``losses(model)`` is called (under ``torch.no_grad()``, model
    in eval mode); each number becomes a row ``(step, name, value)``.

    Args:
        checkpoints: a ``checkpoint_dir`` of :func:`vecinterp.train` (every
            ``step_XXXXXXXX/`` in it; train with ``keep_last=None`` to keep them all), a
            list of checkpoint folders or :func:`vecinterp.save` folders (the step comes
            from the saved metadata or a ``step_<number>`` name), or a list of
            ``(step, model)`` pairs.
        data: inputs ``[batch, pos, d_in]`` or a batch with ``.inputs``; needed with
            ``paths``.
        paths: ``{name: (layer, head, dest, src)}`` (see the module docstring).
        losses: ``fn(model) -> {name: number}``, e.g. partial losses on a validation
            batch. Its names must differ from the path names.
        device: where checkpoints are loaded (``None``: where they were saved from, i.e.
            the CPU); ``(step, model)`` pairs are used where they are.
        progress: show a tqdm bar over the checkpoints.

    Returns:
        An :class:`EmergenceTable`: per checkpoint, the paths in the given order, then the
        losses.

    Raises:
        TypeError, ValueError: bad arguments, a checkpoint whose step cannot be told, two
            checkpoints with one step, a loss that is not a finite number.
        FileNotFoundError: a missing directory.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.analysis.emergence import emergence
        >>> cfg = vi.VectorTransformerConfig(d_in=2, d_model=8, d_head=4, n_heads=2,
        ...                                  n_layers=1, n_ctx=4)
        >>> runs = [(s, vi.HookedVectorTransformer(cfg, seed=s)) for s in (0, 100)]
        >>> x = torch.randn(3, 4, 2)
        >>> table = emergence(runs, x, {"q0": (0, 0, 0, 0)},
        ...                   losses=lambda m: {"out": float(m(x).pow(2).mean())},
        ...                   progress=False)
        >>> table.names, table.steps, table.column("q0")
        (['q0', 'out'], [0, 100], [1.0, 1.0])
    """
    if paths is None and losses is None:
        raise ValueError("nothing to measure: give paths, losses or both")
    if paths is not None and data is None:
        raise ValueError("paths need data: the inputs (or a batch) to run each checkpoint on")
    if losses is not None and not callable(losses):
        raise TypeError(f"losses must be a callable fn(model) -> dict, got {type(losses).__name__}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {progress!r}")
    items = _checkpoint_list(checkpoints)
    rows: list[tuple[int, str, float]] = []
    bar = tqdm(total=len(items), desc="emergence", unit="ckpt", disable=not progress)
    try:
        for step, model in _models(items, device):
            if paths is not None:
                for name, value in path_attention(model, data, paths).items():
                    rows.append((step, name, value))
            if losses is not None:
                rows.extend((step, name, value) for name, value in _losses(model, losses, paths))
            bar.update(1)
    finally:
        bar.close()
    return EmergenceTable(tuple(rows))


def _losses(
    model: HookedVectorTransformer,
    losses: Callable[[HookedVectorTransformer], Mapping[str, Any]],
    paths: Mapping[str, Any] | None,
) -> list[tuple[str, float]]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            result = losses(model)
    finally:
        model.train(was_training)
    if not isinstance(result, Mapping):
        raise TypeError(f"losses(model) must return a dict {{name: number}}, got {result!r}")
    out = []
    for name, value in result.items():
        if not isinstance(name, str):
            raise TypeError(f"loss names must be strings, got {name!r}")
        if paths is not None and name in paths:
            raise ValueError(f"loss name {name!r} is also a path name; rename one of them")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"loss {name!r} must be a single number, got {tuple(value.shape)}")
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"loss {name!r} must be a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"loss {name!r} is not finite ({value}) at this checkpoint")
        out.append((name, float(value)))
    return out
