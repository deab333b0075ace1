"""A named place in the forward pass where an activation can be read or edited."""

import threading
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules import module as _module

HookFn = Callable[..., Any]
"""A hook is called as ``fn(activation, hook=hook_point)``. A forward hook may return a
tensor of the same shape, dtype and device to replace the activation; returning ``None``
keeps it. A backward hook receives the gradient of the activation and may return a
replacement (a tensor, or a one-element tuple ``(grad,)`` as TransformerLens allows)."""

# Adding and removing hooks replaces a hook point's lists instead of editing them in
# place (copy on write), so a forward running in another thread iterates over a list that
# never changes under it. This lock serialises the writers; readers never take it. The
# lists are plain attributes, set with `object.__setattr__`: `nn.Module.__setattr__` would
# only look them up among the parameters, buffers and submodules first (a few
# microseconds, twice per hook that a `hooks()` context or `run_with_cache` adds).
_EDIT_LOCK = threading.Lock()
_set = object.__setattr__

# While run_with_cache runs a forward in this thread, `_RECORDER.current` is its recorder
# (vecinterp.cache._Recorder): the hooked path of `HookPoint.forward` shows it each
# activation before the point's hooks run and after, so that it can keep what flowed at
# every point and see which hooks edited. Never read on the no-hook fast path.
_RECORDER = threading.local()

# PyTorch's global module hook dicts (register_module_forward_hook and its kin), as live
# read-only views. torch.compile does not guard on the dicts it reads as a module's or
# torch's hook dicts (dynamo's `skip_nnmodule_hook_guards`), and it knows a dict by its
# identity wherever it is read, so a graph traced without hooks would go on running when
# one is added. A view is another object: dynamo guards its length like any mapping's,
# so adding or removing a PyTorch hook is seen at the next compiled call. Each point's
# own dicts are read through such views too (`HookPoint._torch_hooks`).
_GLOBAL_HOOK_DICTS = tuple(
    MappingProxyType(d)
    for d in (
        _module._global_forward_hooks,
        _module._global_forward_pre_hooks,
        _module._global_backward_hooks,
        _module._global_backward_pre_hooks,
    )
)


class HookHandle:
    """Removes one hook from its :class:`HookPoint` when :meth:`remove` is called.

    Returned by :meth:`HookPoint.add_hook` (and by the model's ``add_hook``).

    Attributes:
        hook_point: the :class:`HookPoint` the hook is attached to.
        fn: the hook function.
        direction: ``"fwd"`` or ``"bwd"``.
        is_permanent: whether it survives ``reset_hooks()``.
        owner: ``None`` for a hook every thread sees (added by ``add_hook``), or the
            :class:`threading.Thread` that opened the ``hooks()`` context (or
            ``run_with_hooks`` / ``run_with_cache`` call) that added it: only that
            thread's forward passes call it.

    Example:
        >>> import torch
        >>> from vecinterp.hooks import HookPoint
        >>> point = HookPoint()
        >>> handle = point.add_hook(lambda x, hook: 10 * x)
        >>> point(torch.ones(2))
        tensor([10., 10.])
        >>> handle.remove()
        >>> point(torch.ones(2)), point.has_hooks
        (tensor([1., 1.]), False)
    """

    __slots__ = ("hook_point", "fn", "direction", "is_permanent", "owner")

    def __init__(
        self,
        hook_point: "HookPoint",
        fn: HookFn,
        direction: str,
        is_permanent: bool,
        owner: threading.Thread | None = None,
    ):
        self.hook_point = hook_point
        self.fn = fn
        self.direction = direction
        self.is_permanent = is_permanent
        self.owner = owner

    def remove(self) -> None:
        """Detach the hook; removing twice is harmless."""
        _remove_all([self])

    def __repr__(self) -> str:
        scope = "every thread" if self.owner is None else f"thread {self.owner.name!r}"
        return f"HookHandle({self.hook_point.name!r}, {self.direction}, {scope}, fn={self.fn!r})"


class HookPoint(nn.Module):
    """An identity module that calls the hooks attached to it.

    With no hook attached, ``forward`` returns its input untouched, so a model can carry
    one at every activation for almost no cost. Forward hooks run in the order added;
    backward hooks are attached to the activation tensor itself, so they fire whenever
    a gradient flows through it, even after the hook context that added them has closed.

    Threads: a hook added by :meth:`add_hook` is seen by every thread. A hook added by a
    ``hooks()`` context, ``run_with_hooks`` or ``run_with_cache`` (a *scoped* hook) is
    seen only by the thread that added it, so forward passes on one model from several
    threads do not see each other's scoped hooks. ``copy.deepcopy`` (and pickling) keeps
    the hooks every thread sees and drops the scoped ones.

    Subclasses: a subclass that overrides ``forward`` runs the point's hooks (and a
    ``run_with_cache`` recording) by calling ``super().forward(x)``. A component never
    skips a subclass, or another module put in a hook point's place, as it may skip an
    idle stock point (see :func:`idle`).

    Attributes:
        name: the module path, e.g. ``"blocks.0.attn.hook_pattern"`` (set by the model
            that holds it, at its first lookup by name after its module tree changed).

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> point = model.hook_dict["blocks.0.attn.hook_pattern"]
        >>> point.name
        'blocks.0.attn.hook_pattern'
        >>> seen = []
        >>> handle = point.add_hook(lambda pattern, hook: seen.append(pattern.shape))
        >>> _ = model(torch.randn(4, 5, 3))
        >>> handle.remove()
        >>> seen  # [batch, n_heads, dest_pos, src_pos]
        [torch.Size([4, 2, 5, 5])]
    """

    _torch_hooks: tuple[MappingProxyType[Any, Any], ...]

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""
        # never edited in place (see _EDIT_LOCK): a new list replaces the old one
        self._fwd: list[HookHandle] = []
        self._bwd: list[HookHandle] = []
        self._alias_torch_hooks()

    def _alias_torch_hooks(self) -> None:
        # live read-only views of this point's PyTorch hook dicts, which __call__ and
        # idle() read so that a compiled model sees hooks added later (_GLOBAL_HOOK_DICTS)
        _set(
            self,
            "_torch_hooks",
            tuple(
                MappingProxyType(d)
                for d in (
                    self._forward_hooks,
                    self._forward_pre_hooks,
                    self._backward_hooks,
                    self._backward_pre_hooks,
                )
            ),
        )

    def add_hook(self, fn: HookFn, dir: str = "fwd", is_permanent: bool = False) -> HookHandle:
        """Attach ``fn`` for every thread; returns a handle whose ``remove()`` detaches it.

        Args:
            fn: called as ``fn(tensor, hook=self)``.
            dir: ``"fwd"`` for the activation, ``"bwd"`` for its gradient.
            is_permanent: survives :meth:`remove_hooks` unless ``including_permanent``.
        """
        return self._add(fn, dir, is_permanent, owner=None)

    def _add(
        self, fn: HookFn, dir: str, is_permanent: bool, owner: threading.Thread | None
    ) -> HookHandle:
        """Attach ``fn``, seen by ``owner`` only (``None``: by every thread)."""
        return _add_all([self], fn, dir, is_permanent, owner)[0]

    def remove_hooks(self, dir: str = "both", including_permanent: bool = False) -> None:
        """Detach hooks in direction ``dir`` (``"fwd"``, ``"bwd"`` or ``"both"``).

        Removes the hooks every thread sees and the calling thread's scoped hooks (and
        those of threads that have ended); another running thread's ``hooks()`` context
        keeps its hooks until it exits.
        """
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        me = threading.current_thread()

        def kept(h: HookHandle) -> bool:
            if h.owner is not None and h.owner is not me and h.owner.is_alive():
                return True  # another live thread's scoped hook
            return h.is_permanent and not including_permanent

        with _EDIT_LOCK:
            for attr, d in (("_fwd", "fwd"), ("_bwd", "bwd")):
                if dir in (d, "both"):
                    _set(self, attr, [h for h in getattr(self, attr) if kept(h)])

    @property
    def has_hooks(self) -> bool:
        """Whether any forward or backward hook is attached (by any thread)."""
        return bool(self._fwd or self._bwd)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``forward(x)`` without ``nn.Module.__call__``'s dispatch unless PyTorch's own
        module hooks (``register_forward_hook`` and its kin on this point, or the global
        ones) need it: a model calls ~20 hook points per block, and on a launch-bound GPU
        (or any small batch) that dispatch was a tenth of a forward pass.

        What leaves the point is what PyTorch's hooks leave: a ``run_with_cache``
        recording keeps that (not the value before a PyTorch forward hook edited it) and
        counts their edits as edits of the point."""
        if _hooked(self._torch_hooks) or _torch_module_hooks():
            recorder = getattr(_RECORDER, "current", None)
            if recorder is not None:
                return recorder.through(self, x, super().__call__)
            return super().__call__(x)
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fwd, bwd = self._fwd, self._bwd  # snapshots: writers replace, never edit
        if not (fwd or bwd):
            return x
        recorder = getattr(_RECORDER, "current", None)
        token = None if recorder is None else recorder.before(self, x)
        me: threading.Thread | None = None
        for handle in fwd:  # _visible(fwd), inlined: this runs at every hooked point
            owner = handle.owner
            if owner is not None:
                if me is None:
                    me = threading.current_thread()
                if owner is not me:
                    continue
            out = handle.fn(x, hook=self)
            if out is not None:
                _check_replacement(out, x, self, handle.fn, "forward hook", "activation")
                x = out
        if recorder is not None:
            recorder.after(self, token, x)
        if bwd and x.requires_grad:
            for handle in _visible(bwd):
                x.register_hook(_grad_hook(handle.fn, self))
        return x

    def __getstate__(self) -> dict[str, Any]:
        """``copy.deepcopy`` and pickling keep the hooks every thread sees, not the scoped
        ones: those belong to the ``hooks()`` context that added them, in the original."""
        state = super().__getstate__()
        for attr in ("_fwd", "_bwd"):
            state[attr] = [h for h in state[attr] if h.owner is None]
        state.pop("_torch_hooks", None)  # rebuilt from the copy's own dicts
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._alias_torch_hooks()

    def extra_repr(self) -> str:
        return f"name={self.name!r}, fwd={len(self._fwd)}, bwd={len(self._bwd)}"


def idle(*points: nn.Module) -> bool:
    """Whether every one of ``points`` is a stock :class:`HookPoint` (not a subclass, not
    another module put in its place) that nothing at all watches: no hook of ours (any
    thread's), no PyTorch module hook on it and no global PyTorch module hook. Such a
    point returns its input unchanged, so a component may skip calling it and building
    the views it would show it (``Attention`` does). ``run_with_cache`` records through
    hooks it attaches to the points it caches, so they are not idle while it runs (and
    :meth:`HookPoint.forward` shows its recorder nothing at a point without hooks
    either).

    Anything new that lets a point see or change activations must make this return False.

    Example:
        >>> import torch
        >>> from vecinterp.hooks.hook_point import HookPoint, idle
        >>> point = HookPoint()
        >>> idle(point)
        True
        >>> handle = point.add_hook(lambda x, hook: None)
        >>> idle(point), idle(torch.nn.Identity())
        (False, False)
    """
    for p in points:
        if type(p) is not HookPoint or p._fwd or p._bwd:
            return False
        if _hooked(cast(HookPoint, p)._torch_hooks):
            return False
    return not _torch_module_hooks()


def _add_all(
    points: list[HookPoint],
    fn: HookFn,
    dir: str,
    is_permanent: bool,
    owner: threading.Thread | None,
) -> list[HookHandle]:
    """Attach ``fn`` at each of ``points`` (after the hooks there), seen by ``owner`` only
    (``None``: by every thread), under one hold of the edit lock; one handle per point.
    The same as ``point._add(...)`` point by point, with the same errors."""
    if points:
        if not callable(fn):
            raise TypeError(
                f"hook for {points[0].name!r} must be callable, got {type(fn).__name__}"
            )
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"hook direction must be 'fwd' or 'bwd', got {dir!r}")
    attr = "_fwd" if dir == "fwd" else "_bwd"
    handles = [HookHandle(point, fn, dir, is_permanent, owner) for point in points]
    with _EDIT_LOCK:
        for point, handle in zip(points, handles, strict=True):
            _set(point, attr, [*getattr(point, attr), handle])
    return handles


def _remove_all(handles: list[HookHandle]) -> None:
    """Detach each of ``handles`` (those already detached are skipped), under one hold of
    the edit lock: the same as ``handle.remove()`` for each."""
    with _EDIT_LOCK:
        for handle in handles:
            point = handle.hook_point
            attr = "_fwd" if handle.direction == "fwd" else "_bwd"
            hooks = getattr(point, attr)
            if len(hooks) == 1 and hooks[0] is handle:  # the usual case: the only one
                _set(point, attr, [])
            elif handle in hooks:
                _set(point, attr, [h for h in hooks if h is not handle])


def _torch_module_hooks() -> bool:
    """Whether PyTorch's global module hooks are set (``register_module_forward_hook``
    and its kin), which apply to every module's call, hook points included."""
    return _hooked(_GLOBAL_HOOK_DICTS)


def _hooked(views: tuple[MappingProxyType[Any, Any], ...]) -> bool:
    """Whether any of four hook-dict views holds a hook (``len``: dynamo reads a view's
    length, and guards it, but not its truth value)."""
    return bool(len(views[0]) or len(views[1]) or len(views[2]) or len(views[3]))


def _visible(handles: list[HookHandle]) -> Iterator[HookHandle]:
    """The hooks the calling thread sees: global ones and its own scoped ones."""
    me: threading.Thread | None = None
    for handle in handles:
        if handle.owner is not None:
            if me is None:
                me = threading.current_thread()
            if handle.owner is not me:
                continue
        yield handle


def _check_replacement(
    out: object, like: torch.Tensor, point: HookPoint, fn: HookFn, kind: str, what: str
) -> None:
    """Raise if a hook's return value cannot replace ``like`` (shape, dtype, device)."""
    if not isinstance(out, torch.Tensor):
        got = type(out).__name__
    elif out.shape != like.shape:
        got = f"shape {tuple(out.shape)}"
    elif out.dtype != like.dtype:
        got = f"dtype {out.dtype}"
    elif out.device != like.device:
        got = f"device {out.device}"
    else:
        return
    raise ValueError(
        f"{kind} {fn!r} on {point.name!r} must return None or a tensor of shape "
        f"{tuple(like.shape)}, dtype {like.dtype}, device {like.device} (the {what}'s), "
        f"got {got}"
    )


def _grad_hook(fn: HookFn, hook_point: HookPoint) -> Callable[[torch.Tensor], Any]:
    def call(grad: torch.Tensor) -> Any:
        out = fn(grad, hook=hook_point)
        if out is None:
            return None
        if isinstance(out, tuple | list) and len(out) == 1:
            out = out[0]  # TransformerLens's backward hooks return (grad,)
        _check_replacement(out, grad, hook_point, fn, "backward hook", "gradient")
        return out

    return call
