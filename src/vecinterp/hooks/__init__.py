"""Hook points and hook management."""

from ._naming import NameFilter
from .hook_point import HookFn, HookHandle, HookPoint
from .hooked_module import HookedModule, HookSpec

__all__ = ["HookFn", "HookHandle", "HookPoint", "HookSpec", "HookedModule", "NameFilter"]
