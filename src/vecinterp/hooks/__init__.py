"""Hook points and hook management."""

from .hook_point import HookFn, HookHandle, HookPoint
from .hooked_module import HookedModule, HookSpec, NameFilter

__all__ = ["HookFn", "HookHandle", "HookPoint", "HookSpec", "HookedModule", "NameFilter"]
