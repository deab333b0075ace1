"""Hook management for a module tree that contains :class:`HookPoint` s."""

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn

from ._naming import NameFilter, _point, _same_tree, _scan, _select_names, _Tree
from .hook_point import HookFn, HookHandle, HookPoint, _add_all, _remove_all

HookSpec = tuple[str | Callable[[str], bool], HookFn]
"""``(name_or_predicate, fn)``: attach ``fn`` to one hook point or to every hook point
whose name the predicate accepts."""

# Which models named each hook point (a point shared by reference between two models is
# held by both): weak on both sides, so neither a point nor a model is kept alive.
_HOLDERS: "weakref.WeakKeyDictionary[HookPoint, weakref.WeakSet[HookedModule]]"
_HOLDERS = weakref.WeakKeyDictionary()
# Bumped when two models are found to hold one hook point: every model then checks its
# points again at its next lookup, so that both refuse, not only the one that looked.
_SHARED_GENERATION = 0
# Serialises the (rare) rebuilds and the holders' sets; lookups of an unchanged tree
# never take it.
_TREE_LOCK = threading.RLock()


class HookedModule(nn.Module):
    """Base class: names every :class:`HookPoint` below it and manages their hooks.

    Subclasses call :meth:`setup_hooks` at the end of ``__init__``.
    :class:`~vecinterp.HookedVectorTransformer` is one.

    Names follow the live module tree: every lookup by name (``hook_dict``,
    ``run_with_hooks``, ``hooks()``, ``add_hook``, ``run_with_cache``) first checks that
    no submodule was assigned, added, deleted, inserted, popped or reordered anywhere
    below since the names were given, whatever method did it, and names the points
    afresh if one was. A hook point must have one name, so a lookup refuses
    (``ValueError`` naming both names) while one hook point is reachable under two: a
    module placed twice in one model (``model.blocks[1].attn = model.blocks[0].attn``) or
    shared by reference with another model (``A.blocks[0].attn = B.blocks[1].attn``: A
    refuses, and B too from A's first lookup on, until one of them no longer holds it;
    before that, B's names are B's and right for B). Give the model its own copy
    (``copy.deepcopy(module)``) instead. A plain forward never looks names up.

    Hooks and threads: hooks added by :meth:`hooks`, :meth:`run_with_hooks` (and the
    model's ``run_with_cache``) are *scoped*: only the thread that added them sees them,
    so several threads may run hooked or caching forward passes on one model at once,
    each seeing its own hooks only. Hooks added by :meth:`add_hook` are *global*: every
    thread's forward passes call them. ``copy.deepcopy(model)`` carries the global hooks
    (the same functions, called with the copy's hook points) and no scoped ones.

    Example:
        >>> import torch
        >>> from vecinterp.hooks import HookedModule, HookPoint
        >>> class Doubler(HookedModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.hook_in = HookPoint()
        ...         self.setup_hooks()
        ...     def forward(self, x):
        ...         return 2 * self.hook_in(x)
        >>> model = Doubler()
        >>> list(model.hook_dict)
        ['hook_in']
        >>> model.run_with_hooks(torch.ones(2), fwd_hooks=[("hook_in", lambda x, hook: x + 1)])
        tensor([4., 4.])
    """

    def setup_hooks(self) -> None:
        """Name every hook point by its module path now (``point.name``).

        Optional after ``__init__``: every lookup by name checks the module tree first and
        names the points again when it changed (see the class docstring). Raises
        ``ValueError`` if a hook point is reachable under two names.
        """
        self.__dict__.pop("_hook_record", None)
        self._name_points()

    @property
    def hook_dict(self) -> dict[str, HookPoint]:
        """Every hook point by its module path (``"blocks.0.attn.hook_pattern"``), in the
        order they fire, as the module tree is now (checked on each access; see the class
        docstring). ``ValueError`` if a hook point is reachable under two names.

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
            >>> first = model.blocks.pop(0)  # swap the two layers
            >>> model.blocks.insert(1, first)
            >>> model.hook_dict["blocks.1.attn.hook_z"] is first.attn.hook_z
            True
            >>> first.attn.hook_z.name
            'blocks.1.attn.hook_z'
        """
        tree = self.__dict__.get("_hook_record")
        if tree is not None and tree.generation == _SHARED_GENERATION and _same_tree(tree):
            return tree.points
        return self._name_points()

    def _name_points(self) -> dict[str, HookPoint]:
        """Check that every hook point has one name, give it, and keep the record."""
        global _SHARED_GENERATION
        with _TREE_LOCK:
            tree = self._tree()
            if tree.twice:
                first, second = tree.twice[0]
                raise ValueError(
                    f"one module with hook points is reachable in this model both as "
                    f"{first!r} and as {second!r} (placed twice by reference), so its hook "
                    "points would have two names and a hook or cache entry by one name would "
                    "also act at the other; give the second place its own copy "
                    "(copy.deepcopy(module))"
                )
            clash = self._held_elsewhere(tree)
            if clash is not None:
                name, other, other_name = clash
                _SHARED_GENERATION += 1  # the other model refuses too at its next lookup
                raise ValueError(
                    f"hook point {name!r} of this {type(self).__name__} is also "
                    f"{other_name!r} of another {type(other).__name__} that holds the same "
                    "module (shared by reference, e.g. A.blocks[0].attn = B.blocks[1].attn): "
                    "a hook point has one name, so hooks and cache entries by name would act "
                    "on the wrong layer; give this model its own copy (copy.deepcopy(module)) "
                    "or take the module out of the other model"
                )
            for name, point in tree.points.items():
                point.name = name
            self.__dict__["_hook_record"] = tree._replace(generation=_SHARED_GENERATION)
            return tree.points

    def _tree(self) -> _Tree:
        """The record of the module tree as it is now: walked again if it changed, with
        this model noted as a holder of each point it holds. Call under ``_TREE_LOCK``."""
        old = self.__dict__.get("_hook_record")
        if old is not None and _same_tree(old):
            return old
        tree = _scan(self)
        for point in tree.points.values():
            _HOLDERS.setdefault(point, weakref.WeakSet()).add(self)
        if old is not None:
            kept = set(tree.points.values())
            for point in old.points.values():
                holders = _HOLDERS.get(point)
                if point not in kept and holders is not None:
                    holders.discard(self)
        self.__dict__["_hook_record"] = tree  # generation -1: checked at the next lookup
        return tree

    def _held_elsewhere(self, tree: _Tree) -> tuple[str, "HookedModule", str] | None:
        """A hook point of ``tree`` that another live model holds too, as ``(its name
        here, that model, its name there)``; ``None`` if there is none."""
        for name, point in tree.points.items():
            holders = _HOLDERS.get(point)
            if holders is None or len(holders) < 2:
                continue
            for other in list(holders):
                if other is self:
                    continue
                for other_name, held in other._tree().points.items():
                    if held is point:
                        return name, other, other_name
        return None

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickling) names its own hook points at its first
        lookup: the record of the original's tree is not carried."""
        state = super().__getstate__()
        state.pop("_hook_record", None)
        return state

    # -- looking hook points up -------------------------------------------------------
    def hook_point(self, name: str) -> HookPoint:
        """The hook point called ``name``; an unknown name says what is close (the
        blocks that exist for ``blocks.5.attn.hook_z``, the full names for ``hook_z``)."""
        return _point(self.hook_dict, name)

    def hook_names(self, names_filter: NameFilter = None) -> list[str]:
        """The names ``names_filter`` selects, in the order they fire.

        Args:
            names_filter: ``None`` (all), a name, a list of names, or a predicate.
        """
        return _select_names(self.hook_dict, names_filter)

    # -- adding and removing --------------------------------------------------------
    def add_hook(
        self,
        name: str | Callable[[str], bool],
        fn: HookFn,
        dir: str = "fwd",
        is_permanent: bool = False,
    ) -> list[HookHandle]:
        """Attach ``fn`` to the hook point ``name`` (or every one a predicate accepts).

        Returns the handles; ``handle.remove()`` detaches one. Hooks added here stay
        until removed or :meth:`reset_hooks`; permanent ones survive ``reset_hooks()``.
        They are global: forward passes in every thread call them (use :meth:`hooks`
        for hooks that only the calling thread sees). ``is_permanent`` must be a bool.
        A hook belongs to the point, not to the name: it moves with its module if the
        module is moved elsewhere in the tree.
        """
        _check_flag("is_permanent", is_permanent)
        return self._attach(name, fn, dir, is_permanent, None, self.hook_dict)

    def _attach(
        self,
        name: str | Callable[[str], bool],
        fn: HookFn,
        dir: str,
        is_permanent: bool,
        owner: threading.Thread | None,
        hook_dict: dict[str, HookPoint],
    ) -> list[HookHandle]:
        if callable(name):
            points = [point for n, point in hook_dict.items() if name(n)]
        else:
            points = [_point(hook_dict, name)]
        return _add_all(points, fn, dir, is_permanent, owner)

    def reset_hooks(self, including_permanent: bool = False) -> None:
        """Remove every hook (permanent ones too if ``including_permanent``).

        The hooks of a ``hooks()`` context open in another running thread stay until that
        context exits: that thread is not disturbed, and the caller never saw them.
        ``including_permanent`` must be a bool (``"no"`` is refused, not read as true).
        """
        _check_flag("including_permanent", including_permanent)
        for hp in self.hook_dict.values():
            hp.remove_hooks("both", including_permanent=including_permanent)

    @contextlib.contextmanager
    def hooks(
        self,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
    ) -> Iterator["HookedModule"]:
        """Attach hooks for the duration of a ``with`` block, for the calling thread only.

        Contexts nest; each removes exactly the hooks it added when it exits, also when
        the block raises. Backward hooks attach to the tensors made inside the block,
        so a ``backward()`` called after the block still reaches them. Forward passes
        run by other threads meanwhile do not see these hooks (hooks added with
        :meth:`add_hook` are seen by all), and a ``copy.deepcopy`` of the model taken
        inside the block does not carry them.

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
            >>> zero = lambda act, hook: torch.zeros_like(act)
            >>> with model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", zero)]):
            ...     y = model(torch.randn(2, 5, 3))
        """
        handles: list[HookHandle] = []
        owner = threading.current_thread()
        try:
            if fwd_hooks or bwd_hooks:
                hook_dict = self.hook_dict  # the tree is checked once per context
            for direction, specs in (("fwd", fwd_hooks), ("bwd", bwd_hooks)):
                for spec in specs:
                    if not isinstance(spec, tuple | list) or len(spec) != 2:
                        raise TypeError(
                            f"each {direction} hook must be a (name_or_filter, fn) pair, "
                            f"got {spec!r}"
                        )
                    handles += self._attach(spec[0], spec[1], direction, False, owner, hook_dict)
            yield self
        finally:
            _remove_all(handles)

    def run_with_hooks(
        self,
        *args: Any,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
        **kwargs: Any,
    ) -> Any:
        """Call the model with hooks attached for this call (and this thread) only.

        ``bwd_hooks`` fire when the caller later back-propagates through the output.
        """
        with self.hooks(fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks):
            return self(*args, **kwargs)


def _check_flag(name: str, value: object) -> None:
    # the hooks layer sits below the model's validators (model.validation.check_bool)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
