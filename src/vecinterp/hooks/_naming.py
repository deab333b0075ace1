"""Names of hook points: the record of a model's module tree that says whether its names
still hold (:class:`_Tree`, :func:`_scan`, :func:`_same_tree`), looking a name up
(:func:`_point`, :func:`_select_names`) and what an unknown name is told."""

import difflib
import operator
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from torch import nn

from .hook_point import HookPoint

NameFilter = str | Sequence[str] | Callable[[str], bool] | None
"""Which hooks to select: one name, a list of names, a predicate on names, or ``None``
for all of them."""

_MODULES = operator.attrgetter("_modules")


class _Tree(NamedTuple):
    """A model's module tree as its hook names were last given, kept to check cheaply
    that the tree is still so (:func:`_same_tree`) before every lookup by name.

    ``inner``: the modules that had submodules, with ``children``, each one's
    ``(key, submodule)`` pairs then; ``leaves``: those that had none (still none: a
    leaf that gains one is a change). Any edit of the tree shows in one of them, whatever
    did it: ``setattr``, ``add_module``, ``del``, ``ModuleList.insert`` / ``pop`` /
    ``append`` / ``__setitem__``, ``ModuleDict`` edits or a write into ``_modules``.
    ``points``: every hook point by name, in the order they fire. ``generation``: the value
    of ``_SHARED_GENERATION`` when no other model was found to hold one of the points.
    ``twice``: pairs of names under which one module with hook points is reachable."""

    inner: tuple[nn.Module, ...]
    children: list[list[tuple[str, nn.Module | None]]]
    leaves: tuple[nn.Module, ...]
    points: dict[str, HookPoint]
    twice: list[tuple[str, str]]
    generation: int


def _same_tree(tree: _Tree) -> bool:
    """Whether the module tree ``tree`` records is still as it was (tens of microseconds
    at most: about 80 modules for the paper's 3-layer model, one comparison each)."""
    return (
        not any(map(_MODULES, tree.leaves))
        and [list(m._modules.items()) for m in tree.inner] == tree.children
    )


def _scan(root: nn.Module) -> _Tree:
    """Walk ``root``'s module tree in ``named_modules`` order (its record, not yet checked
    against other models: ``generation`` -1)."""
    inner: list[nn.Module] = []
    children: list[list[tuple[str, nn.Module | None]]] = []
    leaves: list[nn.Module] = []
    points: dict[str, HookPoint] = {}
    seen: dict[int, str] = {}
    twice: list[tuple[str, str]] = []

    def visit(module: nn.Module, path: str) -> None:
        seen[id(module)] = path
        if isinstance(module, HookPoint):
            points[path] = module
        items = list(module._modules.items())
        if not items:
            leaves.append(module)
            return
        inner.append(module)
        children.append(items)
        for key, child in items:
            if child is None:
                continue
            sub = f"{path}.{key}" if path else key
            first = seen.get(id(child))
            if first is None:
                visit(child, sub)
            elif any(isinstance(m, HookPoint) for m in child.modules()):
                twice.append((first or "the model itself", sub))

    visit(root, "")
    return _Tree(tuple(inner), children, tuple(leaves), points, twice, -1)


def _point(hook_dict: dict[str, HookPoint], name: object) -> HookPoint:
    """``hook_dict[name]``; an unknown name is refused with what is close."""
    try:
        return hook_dict[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(_unknown_name_message(name, list(hook_dict))) from None


def _select_names(hook_dict: dict[str, HookPoint], names_filter: NameFilter) -> list[str]:
    """:meth:`HookedModule.hook_names` on a ``hook_dict`` already looked up."""
    if names_filter is None:
        return list(hook_dict)
    if isinstance(names_filter, str):
        _point(hook_dict, names_filter)
        return [names_filter]
    if callable(names_filter):
        return [name for name in hook_dict if names_filter(name)]
    if isinstance(names_filter, Sequence):
        names = list(names_filter)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"names_filter entries must be str, got {type(name).__name__}")
            _point(hook_dict, name)
        wanted = set(names)
        return [name for name in hook_dict if name in wanted]
    raise TypeError(
        "names_filter must be None, a str, a list of str or a callable, got "
        f"{type(names_filter).__name__}"
    )


_IN_BLOCK = re.compile(r"blocks\.(-?\d+)\.(.+)")


def _unknown_name_message(name: object, known: list[str]) -> str:
    """Why ``name`` is not a hook name, and what is: the blocks that exist for a block
    index out of range, the full names that end with a bare leaf (``hook_z``: every
    ``blocks.{l}.attn.hook_z``), else the names ``difflib`` finds close."""
    listed = f"(model.hook_dict lists all {len(known)} names)"
    if not isinstance(name, str):
        return f"unknown hook name {name!r}: hook names are str {listed}"
    blocks = sorted({int(m.group(1)) for m in map(_IN_BLOCK.fullmatch, known) if m})
    asked = _IN_BLOCK.fullmatch(name)
    if asked and blocks and int(asked.group(1)) not in blocks:
        rest = asked.group(2)
        pattern = f"blocks.{{l}}.{rest}"
        exists = any(f"blocks.{b}.{rest}" in known for b in blocks)
        return (
            f"unknown hook name {name!r}: this model has no block {asked.group(1)}, its "
            f"blocks are 0..{blocks[-1]}"
            + (f" ({pattern!r} for l in 0..{blocks[-1]})" if exists else "")
            + (" (use the non-negative index)" if asked.group(1).startswith("-") else "")
            + f" {listed}"
        )
    leaf = name if name.startswith("hook_") or "." in name else f"hook_{name}"
    ends = [k for k in known if k.endswith("." + leaf) or k == leaf]
    if ends:
        return f"unknown hook name {name!r}: hook names are full paths; {_options(ends)} {listed}"
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    hint = f"; did you mean one of {close}?" if close else ""
    return f"unknown hook name {name!r}{hint} {listed}"


def _options(names: list[str]) -> str:
    """``names`` as a hint: the first few, and the pattern over blocks they share."""
    matches = [_IN_BLOCK.fullmatch(n) for n in names]
    rests = {m.group(2) for m in matches if m}
    if len(rests) == 1 and all(matches):
        rest = rests.pop()
        layers = [int(m.group(1)) for m in matches if m]
        shown = names if len(names) <= 3 else [*names[:2], "...", names[-1]]
        return (
            f"did you mean 'blocks.{{l}}.{rest}' for l in {min(layers)}..{max(layers)} "
            f"({', '.join(repr(n) if n != '...' else n for n in shown)})?"
        )
    return f"did you mean one of {names[:5]}{' ...' if len(names) > 5 else ''}?"
