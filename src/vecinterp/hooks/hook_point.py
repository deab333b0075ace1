"""A named place in the forward pass where an activation can be read or edited."""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

HookFn = Callable[..., Any]
"""A hook is called as ``fn(activation, hook=hook_point)``. A forward hook may return a
tensor of the same shape to replace the activation; returning ``None`` keeps it. A
backward hook receives the gradient of the activation and may return a replacement."""


class HookHandle:
    """Removes one hook from its :class:`HookPoint` when :meth:`remove` is called.

    Returned by :meth:`HookPoint.add_hook` (and by the model's ``add_hook``).

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

    __slots__ = ("hook_point", "fn", "direction", "is_permanent")

    def __init__(self, hook_point: "HookPoint", fn: HookFn, direction: str, is_permanent: bool):
        self.hook_point = hook_point
        self.fn = fn
        self.direction = direction
        self.is_permanent = is_permanent

    def remove(self) -> None:
        """Detach the hook; removing twice is harmless."""
        hooks = self.hook_point._fwd if self.direction == "fwd" else self.hook_point._bwd
        if self in hooks:
            hooks.remove(self)

    def __repr__(self) -> str:
        return f"HookHandle({self.hook_point.name!r}, {self.direction}, fn={self.fn!r})"


class HookPoint(nn.Module):
    """An identity module that calls the hooks attached to it.

    With no hook attached, ``forward`` returns its input untouched, so a model can carry
    one at every activation for almost no cost. Forward hooks run in the order added;
    backward hooks are attached to the activation tensor itself, so they fire whenever
    a gradient flows through it, even after the hook context that added them has closed.

    Attributes:
        name: the module path, e.g. ``"blocks.0.attn.hook_pattern"`` (set by the model).

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

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""
        self._fwd: list[HookHandle] = []
        self._bwd: list[HookHandle] = []

    def add_hook(self, fn: HookFn, dir: str = "fwd", is_permanent: bool = False) -> HookHandle:
        """Attach ``fn``; returns a handle whose ``remove()`` detaches it.

        Args:
            fn: called as ``fn(tensor, hook=self)``.
            dir: ``"fwd"`` for the activation, ``"bwd"`` for its gradient.
            is_permanent: survives :meth:`remove_hooks` unless ``including_permanent``.
        """
        if not callable(fn):
            raise TypeError(f"hook for {self.name!r} must be callable, got {type(fn).__name__}")
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"hook direction must be 'fwd' or 'bwd', got {dir!r}")
        handle = HookHandle(self, fn, dir, is_permanent)
        (self._fwd if dir == "fwd" else self._bwd).append(handle)
        return handle

    def remove_hooks(self, dir: str = "both", including_permanent: bool = False) -> None:
        """Detach hooks in direction ``dir`` (``"fwd"``, ``"bwd"`` or ``"both"``)."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        for attr, d in (("_fwd", "fwd"), ("_bwd", "bwd")):
            if dir in (d, "both"):
                kept = [
                    h for h in getattr(self, attr) if h.is_permanent and not including_permanent
                ]
                setattr(self, attr, kept)

    @property
    def has_hooks(self) -> bool:
        """Whether any forward or backward hook is attached."""
        return bool(self._fwd or self._bwd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self._fwd or self._bwd):
            return x
        for handle in list(self._fwd):
            out = handle.fn(x, hook=self)
            if out is not None:
                if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise ValueError(
                        f"forward hook {handle.fn!r} on {self.name!r} must return None or a "
                        f"tensor of shape {tuple(x.shape)}, got {got}"
                    )
                x = out
        if self._bwd and x.requires_grad:
            for handle in list(self._bwd):
                x.register_hook(_grad_hook(handle.fn, self))
        return x

    def extra_repr(self) -> str:
        return f"name={self.name!r}, fwd={len(self._fwd)}, bwd={len(self._bwd)}"


def _grad_hook(fn: HookFn, hook_point: HookPoint) -> Callable[[torch.Tensor], Any]:
    def call(grad: torch.Tensor) -> Any:
        return fn(grad, hook=hook_point)

    return call
