"""How ``run_with_cache`` builds a cache: it runs the model with a recorder on its hook
points and hands what flowed to an :class:`~vecinterp.ActivationCache`.

:meth:`HookedVectorTransformer.run_with_cache <vecinterp.HookedVectorTransformer.run_with_cache>`
calls :func:`run_with_cache` here. Building the cache is the cache layer's work, and the
cache layer sits above the model layer: this module uses the model it is given, and the
model reaches this module only by an import when its method is called.

- :class:`_Recorder`: what the run learns at each hook point (installed through
  :mod:`vecinterp.hooks.hook_point`'s per-thread recorder slot): the values, which hooks
  edited, and, for gradients, the tensors attached to the graph.
- :func:`_exact_derivations`: the activations that need not be stored because they follow
  bit for bit from another (a ``relu`` MLP's ``hook_post``).
- :func:`_own_storage`: copies of the activations that are views of the weights.
"""

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import nn
from torch.nn.modules import module as _module

from ..hooks import NameFilter
from ..hooks._naming import _select_names
from ..hooks.hook_point import _RECORDER, HookPoint, _add_all, _remove_all, idle
from ..model.components.mlp import GatedMLP
from .activation_cache import ActivationCache
from .weights_record import _read_values, _record_weights, _version, _Weights

if TYPE_CHECKING:
    from ..model import HookedVectorTransformer
    from ..model.components import TransformerBlock


_EXACT_ACT_FNS = (F.relu, torch.relu)
"""Nonlinearities whose recomputation is exact on any device, dtype and thread count:
``relu`` is ``max(x, 0)``, with no rounding. (``gelu``, ``silu`` and friends may differ in
the last bit between a vectorised and a scalar path, so their output is stored.)"""


def _exact_derivations(
    model: "HookedVectorTransformer", hook_dict: dict[str, HookPoint], names: Sequence[str]
) -> dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    """Of the hook names ``names``, those ``run_with_cache`` may leave out because the
    cache can recompute them bit for bit from another cached activation of the same run:
    ``blocks.{l}.mlp.hook_post`` when the block's (ungated) MLP's ``act_fn`` is ``relu``
    (captured now, so a later change of ``act_fn`` does not matter), ``hook_pre`` is cached, and
    ``hook_post`` is a stock hook point that nothing watches (a hook of ours or of
    PyTorch's could edit what flows there; see :func:`~vecinterp.hooks.hook_point.idle`).
    Call it with the run's hooks attached; ``hook_dict`` is ``model.hook_dict``. Returns
    ``name -> (source name, function of the source)``."""
    out: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {}
    wanted = set(names)
    for name in names:
        if not name.endswith(".mlp.hook_post"):
            continue
        source = name[: -len("hook_post")] + "hook_pre"
        layer = int(name.split(".")[1])
        mlp = cast("TransformerBlock", model.blocks[layer]).mlp
        if isinstance(mlp, GatedMLP):  # hook_post is act(hook_pre) * hook_pre_linear
            continue
        act_fn = mlp.act_fn
        if source in wanted and any(act_fn is f for f in _EXACT_ACT_FNS) and idle(hook_dict[name]):
            out[name] = (source, act_fn)
    return out


def _own_storage(
    acts: dict[str, torch.Tensor],
    model: "HookedVectorTransformer",
    record: _Weights | None = None,
) -> None:
    """Copy, in place in ``acts``, every activation that is a view of a parameter or
    buffer of ``model`` (``hook_pos_embed`` is ``W_pos`` broadcast over the batch), so
    that a later change of the weights (in place, ``load_state_dict``) cannot reach the
    cache. A broadcast axis stays broadcast: only the distinct values are copied.

    ``record``: ``model``'s weights as they are now (:func:`_record_weights`), if the
    caller has it; it lists every parameter and buffer, so the model's module tree need
    not be walked again."""
    if record is None:
        record = _record_weights(model)
    weights = _weight_storages(model, record)
    for name, t in acts.items():
        if t.untyped_storage().data_ptr() in weights:
            # the distinct values: one entry along each broadcast (stride-0) axis
            index = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in t.stride())
            acts[name] = t[index].clone().expand(t.shape)


_STORAGES: "weakref.WeakKeyDictionary[nn.Module, tuple[_Weights, frozenset[int]]]"
_STORAGES = weakref.WeakKeyDictionary()


def _weight_storages(model: nn.Module, record: _Weights) -> frozenset[int]:
    """The storage addresses of the tensors ``record`` (``model``'s weights) lists, kept
    with the model's last record. :func:`_record_weights` hands out the same record only
    while every tensor in it is the same object at the same address with the same version
    counter, so its storages are the same too."""
    entry = _STORAGES.get(model)
    if entry is not None and entry[0] is record:
        return entry[1]
    storages = frozenset(row[3].untyped_storage().data_ptr() for row in record.tensors)
    _STORAGES[model] = (record, storages)
    return storages


def _hooked_points(hook_dict: dict[str, HookPoint]) -> frozenset[str]:
    """The hook points (of a model's ``hook_dict``) where a forward hook is attached that
    the calling thread's forward passes call: ours that every thread sees, this thread's
    scoped ones, and PyTorch's module forward hooks and pre-hooks on the point or global
    (every point then)."""
    me = threading.current_thread()
    everywhere = bool(_module._global_forward_hooks or _module._global_forward_pre_hooks)
    return frozenset(
        name
        for name, point in hook_dict.items()
        if everywhere
        or point._forward_hooks
        or point._forward_pre_hooks
        or (point._fwd and any(h.owner is None or h.owner is me for h in point._fwd))
    )


_FORWARD_ARGS: "weakref.WeakKeyDictionary[Callable[..., Any], list[str]]"
_FORWARD_ARGS = weakref.WeakKeyDictionary()
"""``forward``'s arguments (``x`` aside) by the function a model class defines: reading a
signature costs tens of microseconds, and a function's signature does not change."""


def _forward_args(model: "HookedVectorTransformer") -> list[str]:
    """The names of the arguments of ``model.forward`` other than ``x``."""
    forward = model.forward
    func = getattr(forward, "__func__", None)  # the function of a bound method
    if func is None or getattr(forward, "__self__", None) is not model:
        return [p for p in inspect.signature(forward).parameters if p != "x"]
    known = _FORWARD_ARGS.get(func)
    if known is None:
        known = [p for p in inspect.signature(forward).parameters if p != "x"]
        _FORWARD_ARGS[func] = known
    return known


@contextlib.contextmanager
def _caching_hooks(points: list[HookPoint], save: Callable[..., None]) -> Iterator[None]:
    """``save`` as a forward hook at each of ``points`` for the block, seen by the calling
    thread only: ``model.hooks(fwd_hooks=[(name, save) for name in names])``, attached and
    removed in one hold of the hook lock each."""
    handles = _add_all(points, save, "fwd", False, threading.current_thread())
    try:
        yield
    finally:
        _remove_all(handles)


class _Recorder:
    """What ``run_with_cache`` learns while its forward runs in the calling thread.

    Installed by :meth:`recording`; ``HookPoint.forward`` calls :meth:`before` and
    :meth:`after` around a point's hooks (only on its hooked path), and :meth:`save` is the
    caching hook, the last one at each cached point.

    - ``values``: each cached activation as it left its point, detached. When a point with
      a hook of this run receives a tensor that shares storage with a cached one
      (``resid_pre`` of block ``l + 1`` is the tensor ``resid_post`` of ``l`` put out), the
      cached one is copied before that hook runs, so a hook writing into its input cannot
      reach it. Copy on write: a run without such a hook copies nothing.
    - ``graph`` and ``versions``: with ``incl_bwd``, the activations attached to the graph
      (for the gradients) and their version counters when cached.
    - ``edited``: the points where a hook replaced the activation or wrote into it (its
      version counter moved; inference tensors have none, so there only replacements).

    A point that PyTorch's module hooks watch runs through ``nn.Module``'s dispatch, and
    :meth:`through` records around the whole call: what is kept is what left the point
    after PyTorch's forward hooks, and their edits count as edits.

    Args:
        hooked: the points with a forward hook of this thread's, ours aside (taken when
            the run begins).
        cached: the points whose values are kept (where :meth:`save` is attached).
        incl_bwd: whether gradients will be taken.
    """

    def __init__(self, hooked: frozenset[HookPoint], cached: frozenset[HookPoint], incl_bwd: bool):
        self.hooked = hooked
        self.cached = cached
        self.incl_bwd = incl_bwd
        self.values: dict[str, torch.Tensor] = {}
        self.graph: dict[str, torch.Tensor] = {}
        self.versions: dict[str, int] = {}
        self.edited: set[HookPoint] = set()
        self._uncopied: dict[int, list[str]] = {}  # storage address -> cached names
        self._outer: HookPoint | None = None  # the point :meth:`through` records around

    @contextlib.contextmanager
    def recording(self) -> Iterator["_Recorder"]:
        """Make this the calling thread's recorder for the block (nested ones restore)."""
        previous = getattr(_RECORDER, "current", None)
        _RECORDER.current = self
        try:
            yield self
        finally:
            _RECORDER.current = previous

    def save(self, act: torch.Tensor, hook: HookPoint) -> None:
        """The caching hook (at a point :meth:`through` records around, it keeps the value
        that leaves the whole call instead)."""
        if hook is not self._outer:
            self._keep(hook, act)

    def _keep(self, point: HookPoint, act: torch.Tensor) -> None:
        name = point.name
        if self.incl_bwd:
            self.graph[name] = act
            self.versions[name] = _version(act)
        self.values[name] = act.detach()
        if self.hooked:
            self._uncopied.setdefault(act.untyped_storage().data_ptr(), []).append(name)

    def before(
        self, point: HookPoint, x: torch.Tensor, always: bool = False
    ) -> tuple[torch.Tensor, int] | None:
        """``x`` is about to go through ``point``'s hooks (``always``: hooks that may write
        into it, whoever attached them)."""
        if point is self._outer:
            return None  # through() records around this call
        if self._uncopied and (always or point in self.hooked):
            for name in self._uncopied.pop(x.untyped_storage().data_ptr(), ()):
                self.values[name] = self.values[name].clone()
        return x, -1 if x.is_inference() else x._version  # _version(x), inlined

    def after(
        self, point: HookPoint, token: tuple[torch.Tensor, int] | None, x: torch.Tensor
    ) -> None:
        """``x`` leaves ``point``; ``token`` is what :meth:`before` returned."""
        if token is None:
            return
        x_in, v_in = token
        if x is not x_in or (v_in >= 0 and _version(x) != v_in):
            self.edited.add(point)

    def through(
        self, point: HookPoint, x: torch.Tensor, call: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``call(x)``: ``point`` run through ``nn.Module.__call__`` (PyTorch's module hooks
        watch it), recorded around the whole call: PyTorch's pre-hooks, the point's own
        hooks and PyTorch's forward hooks. An edit by any of them counts; the value kept
        is the one that leaves. A tensor that PyTorch's dispatch hands back in place of
        the input (an alias of the same storage and layout, as its backward-hook
        machinery returns) is not an edit unless written into."""
        token = self.before(point, x, always=True)
        outer, self._outer = self._outer, point
        try:
            out = call(x)
        finally:
            self._outer = outer
        if token is not None:
            x_in, v_in = token
            alias = out is x_in or (
                isinstance(out, torch.Tensor)
                and out.data_ptr() == x_in.data_ptr()
                and out.shape == x_in.shape
                and out.stride() == x_in.stride()
                and out.dtype == x_in.dtype
            )
            if not alias or (v_in >= 0 and _version(out) != v_in):
                self.edited.add(point)
        if point in self.cached:
            self._keep(point, out)
        return out

    def check_gradients(self, names: Sequence[str]) -> None:
        """Refuse when a hook wrote into a cached tensor after it was cached: autograd
        then differentiates the written tensor, so that point's gradient would silently be
        the later point's."""
        for name in names:
            if _version(self.graph[name]) != self.versions[name]:
                raise ValueError(
                    f"incl_bwd=True: a hook after {name!r} wrote in place into the tensor "
                    "that flowed there (a later hook point receives the same tensor), so the "
                    f"gradient with respect to what flowed at {name!r} cannot be taken; "
                    "return an edited tensor from that hook instead of writing into its input"
                )


def run_with_cache(
    model: "HookedVectorTransformer",
    x: Float[torch.Tensor, "batch pos d_in"],
    names_filter: NameFilter = None,
    *,
    incl_bwd: bool = False,
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    device: str | torch.device | None = None,
    fwd_hooks: Sequence[Any] = (),
    **forward_kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """Run ``model`` on ``x`` and keep the activations of the selected hook points: the
    implementation of :meth:`vecinterp.HookedVectorTransformer.run_with_cache`, whose
    docstring gives the arguments and what the cache holds."""

    known = _forward_args(model)
    for key in forward_kwargs:
        if key not in known:
            hint = (
                ": the cache always keeps the batch axis (index cache[name][0] for one item)"
                if key == "remove_batch_dim"
                else ""
            )
            raise TypeError(
                f"run_with_cache() got an unexpected keyword argument {key!r}{hint}; it "
                "takes names_filter, incl_bwd, loss_fn, device, fwd_hooks and the "
                f"arguments of forward(): {', '.join(known)}"
            )
    hook_dict = model.hook_dict  # checked against the module tree once per run
    names = _select_names(hook_dict, names_filter)
    if not isinstance(incl_bwd, bool):
        raise TypeError(f"run_with_cache: incl_bwd must be a bool, got {incl_bwd!r}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(
            f"run_with_cache: loss_fn must be a function from the output to a scalar, "
            f"got {type(loss_fn).__name__}"
        )
    if incl_bwd and loss_fn is None:
        raise ValueError(
            "incl_bwd=True needs loss_fn, a function from the output to a scalar, "
            "e.g. loss_fn=lambda y: vi.masked_mse(y, targets)"
        )
    weights = _record_weights(model)  # as the run begins: analyses check them later
    values = _read_values(weights)  # a copy of the few the analyses read (p.data writes)
    # the run's own hooks first: they decide what may be recomputed, and they run
    # before the caching hooks, so the cache holds what flowed after them
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        hooked = _hooked_points(hook_dict)
        derived = {}
        if names_filter is None and not incl_bwd:  # gradients cannot be recomputed
            derived = _exact_derivations(model, hook_dict, names)
            names = [n for n in names if n not in derived]
        points = [hook_dict[name] for name in names]
        rec = _Recorder(frozenset(hook_dict[n] for n in hooked), frozenset(points), incl_bwd)
        with rec.recording(), _caching_hooks(points, rec.save):
            if incl_bwd:
                with torch.enable_grad():
                    out = model(x, **forward_kwargs)
                    loss = loss_fn(out)  # type: ignore[misc]
                    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                        raise ValueError("loss_fn must return a scalar tensor")
                    graph = rec.graph
                    needing = [n for n in names if n in graph and graph[n].requires_grad]
                    if not needing:
                        raise ValueError(
                            "incl_bwd=True but no cached activation requires grad: "
                            "are the model's parameters frozen (requires_grad=False)?"
                        )
                    rec.check_gradients(needing)
                    grads = torch.autograd.grad(
                        loss, [graph[n] for n in needing], allow_unused=True
                    )
                for n, g in zip(needing, grads, strict=True):
                    rec.values[n + "_grad"] = (
                        torch.zeros_like(graph[n]) if g is None else g.detach()
                    )
            else:
                out = model(x, **forward_kwargs)
    # every value is a detached tensor of the recorder's own (saved detached, a clone of
    # one, a detached gradient or zeros): no second detach
    acts = rec.values if device is None else {n: t.to(device) for n, t in rec.values.items()}
    _own_storage(acts, model, _record_weights(model))  # e.g. hook_pos_embed, a view of W_pos
    if isinstance(out, torch.Tensor) and incl_bwd:
        out = out.detach()
    # start_at_layer / stop_at_layer skip blocks: derive only what ran
    derived = {k: v for k, v in derived.items() if v[0] in acts}
    edited = (
        {name for name, point in hook_dict.items() if point in rec.edited} if rec.edited else set()
    )
    if torch.is_inference_mode_enabled():  # no version counters: a write is unseen
        edited |= hooked
    return out, ActivationCache(
        acts,
        model,
        derived=derived,
        hooked_points=hooked,
        edited_points=edited,
        _weights=weights,
        _values=values,
    )
