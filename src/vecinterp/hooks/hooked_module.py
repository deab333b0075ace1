"""Hook management for a module tree that contains :class:`HookPoint` s."""

import contextlib
import difflib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from .hook_point import HookFn, HookHandle, HookPoint, _add_all, _remove_all

_tree_version = 0
"""Bumped whenever PyTorch registers a submodule anywhere (an assignment such as
``block.attn = other``, ``add_module``, a ``ModuleList`` item set or appended), so that a
:class:`HookedModule` sees that its record of hook points may be out of date."""


def _tree_changed(module: nn.Module, name: str, submodule: nn.Module | None) -> None:
    global _tree_version
    _tree_version += 1


_TREE_WATCH = register_module_module_registration_hook(_tree_changed)

NameFilter = str | Sequence[str] | Callable[[str], bool] | None
"""Which hooks to select: one name, a list of names, a predicate on names, or ``None``
for all of them."""

HookSpec = tuple[str | Callable[[str], bool], HookFn]
"""``(name_or_predicate, fn)``: attach ``fn`` to one hook point or to every hook point
whose name the predicate accepts."""


class HookedModule(nn.Module):
    """Base class: names every :class:`HookPoint` below it and manages their hooks.

    Subclasses call :meth:`setup_hooks` at the end of ``__init__``.
    :class:`~vecinterp.HookedVectorTransformer` is one.

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
        """Record every hook point by its module path; call once after building.

        The record is rebuilt by itself after a submodule is assigned or added anywhere
        below (``model.blocks[0].attn = other.blocks[0].attn``), so that a hook attached
        by name reaches the point that runs, not one of a module no longer in the model.
        """
        found = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                found[name] = module
        self.__dict__["_hook_dict"] = found
        self.__dict__["_hook_tree"] = _tree_version

    @property
    def hook_dict(self) -> dict[str, HookPoint]:
        """Every hook point by its module path (``"blocks.0.attn.hook_pattern"``), in the
        order they fire. Rebuilt when a submodule has been assigned or added since (see
        :meth:`setup_hooks`); deleting one with ``del`` is not noticed."""
        state = self.__dict__
        if "_hook_dict" not in state or state["_hook_tree"] != _tree_version:
            self.setup_hooks()
        return state["_hook_dict"]

    # -- looking hook points up -------------------------------------------------------
    def hook_point(self, name: str) -> HookPoint:
        """The hook point called ``name``; an unknown name lists the close matches."""
        try:
            return self.hook_dict[name]
        except (KeyError, TypeError):
            raise ValueError(_unknown_name_message(name, list(self.hook_dict))) from None

    def hook_names(self, names_filter: NameFilter = None) -> list[str]:
        """The names ``names_filter`` selects, in the order they fire.

        Args:
            names_filter: ``None`` (all), a name, a list of names, or a predicate.
        """
        if names_filter is None:
            return list(self.hook_dict)
        if isinstance(names_filter, str):
            self.hook_point(names_filter)
            return [names_filter]
        if callable(names_filter):
            return [name for name in self.hook_dict if names_filter(name)]
        if isinstance(names_filter, Sequence):
            names = list(names_filter)
            for name in names:
                if not isinstance(name, str):
                    raise TypeError(f"names_filter entries must be str, got {type(name).__name__}")
                self.hook_point(name)
            wanted = set(names)
            return [name for name in self.hook_dict if name in wanted]
        raise TypeError(
            "names_filter must be None, a str, a list of str or a callable, got "
            f"{type(names_filter).__name__}"
        )

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
        """
        _check_flag("is_permanent", is_permanent)
        return self._attach(name, fn, dir, is_permanent, owner=None)

    def _attach(
        self,
        name: str | Callable[[str], bool],
        fn: HookFn,
        dir: str,
        is_permanent: bool,
        owner: threading.Thread | None,
    ) -> list[HookHandle]:
        names = self.hook_names(name) if callable(name) else [self.hook_point(name).name]
        return _add_all([self.hook_dict[n] for n in names], fn, dir, is_permanent, owner)

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
            for direction, specs in (("fwd", fwd_hooks), ("bwd", bwd_hooks)):
                for spec in specs:
                    if not isinstance(spec, tuple | list) or len(spec) != 2:
                        raise TypeError(
                            f"each {direction} hook must be a (name_or_filter, fn) pair, "
                            f"got {spec!r}"
                        )
                    handles += self._attach(spec[0], spec[1], direction, False, owner)
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


def _unknown_name_message(name: object, known: list[str]) -> str:
    close = difflib.get_close_matches(str(name), known, n=5, cutoff=0.5)
    if not close and isinstance(name, str):
        tail = name.rsplit(".", 1)[-1]
        close = [k for k in known if k.endswith(tail)][:5]
    hint = f"; did you mean one of {close}?" if close else ""
    return f"unknown hook name {name!r}{hint} (model.hook_dict lists all {len(known)} names)"
