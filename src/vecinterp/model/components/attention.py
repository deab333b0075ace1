"""Multi-head self-attention with a hook at every intermediate activation."""

import math
from typing import Any

import torch
from jaxtyping import Float
from torch import nn

from ...hooks import HookPoint
from ...hooks.hook_point import idle
from ..config import VectorTransformerConfig
from .rotary import Rotary


class Attention(nn.Module):
    """Multi-head attention on the (normalised) residual stream.

    ``q = x W_Q + b_Q`` (likewise ``k``, ``v``); ``scores = q k^T / sqrt(d_head)``, masked
    causally if ``cfg.causal``; ``pattern = softmax(scores)`` over source positions;
    ``z = pattern v``; each head writes ``result_h = z_h W_O[h]`` and the layer writes
    ``Σ_h result_h + b_O``.

    Hooks: ``hook_q``, ``hook_k``, ``hook_v``, ``hook_z`` ``[batch, pos, n_heads, d_head]``;
    ``hook_rot_q``, ``hook_rot_k`` (rotary only); ``hook_attn_scores`` and ``hook_pattern``
    ``[batch, n_heads, dest_pos, src_pos]``; ``hook_result`` ``[batch, pos, n_heads,
    d_model]``. With grouped-query attention (``cfg.n_key_value_heads < n_heads``, the
    subclass :class:`GroupedQueryAttention`) ``hook_k``, ``hook_v`` and ``hook_rot_k``
    are ``[batch, pos, n_key_value_heads, d_head]`` and query head ``h`` reads key/value
    head ``h // (n_heads // n_key_value_heads)``; every other hook stays per query head.
    The layer's output is always ``Σ_h result_h + b_O`` computed the same way,
    so attaching or caching hooks never changes a bit of it.

    Layout: internally every per-head tensor is stored heads-first (``[n_heads, batch,
    pos, ...]``, one batched matrix product per step and no weight copies); hooks see
    the documented ``[batch, pos, n_heads, ...]`` axes as views of that storage, so an
    in-place edit in a hook is an edit of the activation itself.
    """

    mask_bias: torch.Tensor  # a non-persistent buffer registered in __init__
    W_K: nn.Parameter  # these four registered in __init__ (by name)
    W_V: nn.Parameter
    b_K: nn.Parameter
    b_V: nn.Parameter

    def __init__(self, cfg: VectorTransformerConfig):
        super().__init__()
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        n_kv = cfg.n_kv_heads
        # grouped-query attention stores keys and values as _W_K, ... (TransformerLens's
        # names); registered in the same order either way
        kv = "_" if n_kv < h else ""
        self._kv_names = tuple(kv + name for name in ("W_K", "b_K", "W_V", "b_V"))
        self.W_Q = nn.Parameter(torch.empty(h, d, dh))
        self.register_parameter(kv + "W_K", nn.Parameter(torch.empty(n_kv, d, dh)))
        self.register_parameter(kv + "W_V", nn.Parameter(torch.empty(n_kv, d, dh)))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        self.b_Q = nn.Parameter(torch.zeros(h, dh))
        self.register_parameter(kv + "b_K", nn.Parameter(torch.zeros(n_kv, dh)))
        self.register_parameter(kv + "b_V", nn.Parameter(torch.zeros(n_kv, dh)))
        self.b_O = nn.Parameter(torch.zeros(d))
        self.causal = cfg.causal
        self.scale = 1.0 / math.sqrt(dh)
        self.n_heads = h
        self.n_kv_heads = cfg.n_kv_heads
        future = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1)
        # added to the scores: 0 where a position may attend, -inf where it may not
        self.register_buffer(
            "mask_bias",
            torch.zeros(cfg.n_ctx, cfg.n_ctx).masked_fill(future, float("-inf")),
            persistent=False,
        )
        self.rotary = Rotary(cfg) if cfg.positional == "rotary" else None
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        if self.rotary is not None:
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self.hook_result = HookPoint()

    def kv_parameters(self) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter, nn.Parameter]:
        """The stored key/value parameters ``(W_K, b_K, W_V, b_V)``, one per key/value
        head (``[n_key_value_heads, ...]``): what to write to change the keys and values
        (under grouped-query attention ``W_K`` etc. are expanded copies and these are
        ``_W_K``, ``_b_K``, ``_W_V``, ``_b_V``)."""
        W_K, b_K, W_V, b_V = (self._parameters[name] for name in self._kv_names)
        assert W_K is not None and b_K is not None and W_V is not None and b_V is not None
        return W_K, b_K, W_V, b_V

    def _causal_bias(self, n_pos: int) -> torch.Tensor:
        """The causal mask added to ``[.., n_pos, n_pos]`` scores: 0 where a position may
        attend, -inf where it may not (``mask_bias`` cut to ``n_pos``)."""
        if not torch.compiler.is_compiling():
            return self.mask_bias[:n_pos, :n_pos]
        # Under torch.compile, built for the length instead: a length marked dynamic and
        # traced at n_ctx would be fixed at n_ctx by the cut of the [n_ctx, n_ctx] buffer
        # (its row stride is n_ctx), and dynamo refuses that (ConstraintViolationError).
        # The same values, so the same scores to the bit.
        bias = self.mask_bias
        future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=bias.device).triu(1)
        zeros = torch.zeros(n_pos, n_pos, dtype=bias.dtype, device=bias.device)
        return zeros.masked_fill(future, float("-inf"))

    def _expand_kv(self, t: torch.Tensor, batch: int) -> torch.Tensor:
        """Heads-first key/value storage ``[n_kv*batch, pos, d]`` as one row block per
        query head ``[n_heads*batch, pos, d]`` (itself when every head has its own)."""
        group = self.n_heads // self.n_kv_heads
        if group == 1:
            return t
        n_kv = self.n_kv_heads
        return t.view(n_kv, batch, *t.shape[1:]).repeat_interleave(group, dim=0).flatten(0, 1)

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        if idle(
            self.hook_q,
            self.hook_k,
            self.hook_v,
            self.hook_attn_scores,
            self.hook_pattern,
            self.hook_z,
            self.hook_result,
            *((self.hook_rot_q, self.hook_rot_k) if self.rotary is not None else ()),
        ):
            return self._forward_idle(x)
        batch, n_pos, d_model = x.shape
        h = self.n_heads
        W_K, b_K, W_V, b_V = self.kv_parameters()
        # [n_heads, batch*pos, d_model] view of x: q_h = x W_Q[h] + b_Q[h] for every head
        rows = x.reshape(1, batch * n_pos, d_model).expand(h, -1, -1)
        kv_rows = rows[: self.n_kv_heads]
        q = self.hook_q(_split(torch.baddbmm(self.b_Q.unsqueeze(1), rows, self.W_Q), batch))
        k = self.hook_k(_split(torch.baddbmm(b_K.unsqueeze(1), kv_rows, W_K), batch))
        v = self.hook_v(_split(torch.baddbmm(b_V.unsqueeze(1), kv_rows, W_V), batch))
        if self.rotary is not None:
            q = self.hook_rot_q(self.rotary(q))
            k = self.hook_rot_k(self.rotary(k))
        # [n_heads*batch, dest_pos, src_pos]: scores = q k^T / sqrt(d_head) (+ causal mask)
        q_hb, k_hb = _merge(q), self._expand_kv(_merge(k), batch)
        if self.causal:
            scores = torch.baddbmm(
                self._causal_bias(n_pos), q_hb, k_hb.transpose(1, 2), alpha=self.scale
            )
        else:
            scores = torch.bmm(q_hb, k_hb.transpose(1, 2)).mul_(self.scale)
        scores = _merge_scores(self.hook_attn_scores(_split_scores(scores, h)))
        pattern = _merge_scores(self.hook_pattern(_split_scores(scores.softmax(dim=-1), h)))
        # z = pattern v, then each head's result z_h W_O[h]
        v_hb = self._expand_kv(_merge(v), batch)
        z = self.hook_z(_split(torch.bmm(pattern, v_hb).view(h, -1, v.shape[-1]), batch))
        result = torch.bmm(_merge(z).view(h, batch * n_pos, -1), self.W_O)
        result = _merge(self.hook_result(_split(result, batch))).view(h, batch * n_pos, -1)
        return (result.sum(dim=0) + self.b_O).view(batch, n_pos, d_model)

    def _forward_idle(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """:meth:`forward` when none of its hook points has anything attached: the same
        kernels on the same storage, without the hook calls and without the round trips
        between the heads-first storage and the ``[batch, pos, n_heads, ...]`` views
        they would be shown, so the output is the same to the bit (tested)."""
        batch, n_pos, d_model = x.shape
        h, n_kv = self.n_heads, self.n_kv_heads
        W_K, b_K, W_V, b_V = self.kv_parameters()
        rows = x.reshape(1, batch * n_pos, d_model).expand(h, -1, -1)
        kv_rows = rows[:n_kv]
        q = torch.baddbmm(self.b_Q.unsqueeze(1), rows, self.W_Q).view(h * batch, n_pos, -1)
        k = torch.baddbmm(b_K.unsqueeze(1), kv_rows, W_K).view(n_kv * batch, n_pos, -1)
        v = torch.baddbmm(b_V.unsqueeze(1), kv_rows, W_V).view(n_kv * batch, n_pos, -1)
        if self.rotary is not None:  # rotated as forward rotates them, on the same views
            q = _merge(self.rotary(_split(q.view(h, batch * n_pos, -1), batch)))
            k = _merge(self.rotary(_split(k.view(n_kv, batch * n_pos, -1), batch)))
        k, v = self._expand_kv(k, batch), self._expand_kv(v, batch)
        if self.causal:
            scores = torch.baddbmm(self._causal_bias(n_pos), q, k.transpose(1, 2), alpha=self.scale)
        else:
            scores = torch.bmm(q, k.transpose(1, 2)).mul_(self.scale)
        z = torch.bmm(scores.softmax(dim=-1), v).view(h, batch * n_pos, -1)
        result = torch.bmm(z, self.W_O)
        return (result.sum(dim=0) + self.b_O).view(batch, n_pos, d_model)


class GroupedQueryAttention(Attention):
    """:class:`Attention` whose keys and values are shared by groups of query heads.

    TransformerLens's ``GroupedQueryAttention`` storage and names: the parameters are
    ``_W_K``, ``_W_V`` ``[n_key_value_heads, d_model, d_head]`` and ``_b_K``, ``_b_V``
    ``[n_key_value_heads, d_head]``; query head ``h`` uses key/value head
    ``h // (n_heads // n_key_value_heads)`` (``repeat_interleave``, as Llama's
    ``repeat_kv``). ``W_K``, ``W_V``, ``b_K`` and ``b_V`` read the parameters expanded to
    one per query head, ``[n_heads, ...]``: for reading only. They are new tensors, so a
    write into one could not reach the parameters (and one query head's row cannot be
    changed alone: its group shares one key/value head); every in-place operation on
    them or on a view of them (``copy_``, ``normal_``, ``zero_``, ``x[...] = v``, ``+=``,
    ``torch.nn.init``, ``out=``) raises a ``RuntimeError`` saying to write ``_W_K`` etc.
    (or :meth:`kv_parameters`) instead, and assigning them raises ``AttributeError``.
    Reading them (products, ``clone()``, gradients) works as for any tensor.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=4, n_key_value_heads=2, n_layers=1,
        ...     n_ctx=5), seed=0)
        >>> attn = model.blocks[0].attn
        >>> attn.W_V.shape, attn._W_V.shape
        (torch.Size([4, 8, 4]), torch.Size([2, 8, 4]))
        >>> with torch.no_grad():
        ...     attn.W_V.zero_()
        Traceback (most recent call last):
        ...
        RuntimeError: zero_ on GroupedQueryAttention.W_V...
        >>> with torch.no_grad():
        ...     _ = attn._W_V.zero_()  # key/value head g serves query heads 2g and 2g + 1
        >>> bool((attn.W_V == 0).all())
        True
    """

    _W_K: nn.Parameter
    _W_V: nn.Parameter
    _b_K: nn.Parameter
    _b_V: nn.Parameter

    def _per_query_head(self, name: str) -> torch.Tensor:
        stored = getattr(self, "_" + name)
        expanded = stored.repeat_interleave(self.n_heads // self.n_kv_heads, dim=0)
        return ReadOnlyTensor.of(
            expanded,
            f"GroupedQueryAttention.{name} is _{name} [n_key_value_heads, ...] expanded per "
            f"query head, a new tensor: a write into it would not reach the model. Write "
            f"_{name} (query head h reads key/value head h // "
            f"{self.n_heads // self.n_kv_heads}), or the tensors of kv_parameters()",
        )

    @property
    def W_K(self) -> Float[torch.Tensor, "n_heads d_model d_head"]:  # type: ignore[override]
        """``_W_K`` expanded per query head (a new tensor: read only, writes raise)."""
        return self._per_query_head("W_K")

    @property
    def W_V(self) -> Float[torch.Tensor, "n_heads d_model d_head"]:  # type: ignore[override]
        """``_W_V`` expanded per query head (a new tensor: read only, writes raise)."""
        return self._per_query_head("W_V")

    @property
    def b_K(self) -> Float[torch.Tensor, "n_heads d_head"]:  # type: ignore[override]
        """``_b_K`` expanded per query head (a new tensor: read only, writes raise)."""
        return self._per_query_head("b_K")

    @property
    def b_V(self) -> Float[torch.Tensor, "n_heads d_head"]:  # type: ignore[override]
        """``_b_V`` expanded per query head (a new tensor: read only, writes raise)."""
        return self._per_query_head("b_V")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("W_K", "W_V", "b_K", "b_V"):
            raise AttributeError(
                f"GroupedQueryAttention.{name} is the key/value parameter _{name} "
                f"[n_key_value_heads, ...] expanded per query head, read only: write _{name}"
            )
        super().__setattr__(name, value)


# in-place Python operators and the descriptor setter (`t.data = ...`) among the
# functions __torch_function__ sees; any other name ending in one "_" is in place
_INPLACE_DUNDERS = frozenset(
    f"__i{op}__"
    for op in ("add sub mul matmul truediv floordiv mod pow lshift rshift and or xor".split())
) | {"__setitem__", "__set__"}
# in-place by name, but they change no value of the tensor
_METADATA_ONLY = frozenset({"requires_grad_", "retain_grad", "share_memory_"})


class ReadOnlyTensor(torch.Tensor):
    """A tensor whose values cannot be changed in place: a copy computed from a model's
    parameters (such as :class:`GroupedQueryAttention`'s ``W_K``), where a write would
    silently not reach the model.

    Every in-place operation on it or on a view of it (``copy_``, ``zero_``,
    ``normal_``, ``t[...] = v``, ``t += v``, ``torch.nn.init.*``, ``out=t``, ``t.data =
    ...``) raises a ``RuntimeError`` with the reason given by :meth:`of`; it works as a
    source (``other.copy_(t)``). Operations that make new tensors return ordinary
    tensors, so products, ``clone()``, ``detach().clone()`` and gradients behave as
    usual; views (``t[0]``, ``t.T``, ``t.detach()``) stay read-only.

    Example:
        >>> import torch
        >>> from vecinterp.model.components.attention import ReadOnlyTensor
        >>> t = ReadOnlyTensor.of(torch.ones(2, 3), "t is a copy: write the source")
        >>> t[0].add_(1.0)
        Traceback (most recent call last):
        ...
        RuntimeError: add_ on t is a copy: write the source
        >>> type(t.clone() * 2).__name__, float(t.sum())
        ('Tensor', 6.0)
    """

    _reason: str

    @staticmethod
    def of(t: torch.Tensor, reason: str) -> "ReadOnlyTensor":
        """``t`` (same storage and autograd history) as a read-only tensor whose in-place
        operations raise, naming ``reason``."""
        out = t.as_subclass(ReadOnlyTensor)
        out._reason = reason
        return out

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = {} if kwargs is None else kwargs
        name = getattr(func, "__name__", "")
        in_place = name in _INPLACE_DUNDERS or (
            name.endswith("_") and not name.endswith("__") and name not in _METADATA_ONLY
        )
        written: list[Any] = []
        if in_place:  # the tensor written: the first argument (torch.nn.init: `tensor=`)
            written.append(args[0] if args else kwargs.get("tensor", kwargs.get("input")))
        out_arg = kwargs.get("out")
        written += list(out_arg) if isinstance(out_arg, tuple | list) else [out_arg]
        for target in written:
            if isinstance(target, ReadOnlyTensor):
                raise RuntimeError(f"{name} on {target._reason}")
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        sources = [a for a in args if isinstance(a, ReadOnlyTensor)]
        if not sources:
            return result
        return _keep_read_only(result, sources)


def _keep_read_only(result: Any, sources: list[ReadOnlyTensor]) -> Any:
    """``result`` with every tensor that shares storage with one of ``sources`` (a view)
    made read-only too, and every other tensor an ordinary tensor."""
    if isinstance(result, tuple | list):
        return type(result)(_keep_read_only(r, sources) for r in result)
    if not isinstance(result, torch.Tensor):
        return result
    ptr = result.untyped_storage().data_ptr()
    for source in sources:
        if ptr == source.untyped_storage().data_ptr():
            return ReadOnlyTensor.of(result, source._reason)
    return result


def _split(t: torch.Tensor, batch: int) -> torch.Tensor:
    """``[n_heads, batch*pos, d]`` storage as a ``[batch, pos, n_heads, d]`` view."""
    h, rows, d = t.shape
    return t.view(h, batch, rows // batch, d).permute(1, 2, 0, 3)


def _merge(t: torch.Tensor) -> torch.Tensor:
    """``[batch, pos, n_heads, d]`` as ``[n_heads*batch, pos, d]`` (a view when ``t``
    came from :func:`_split`, a copy when a hook replaced it)."""
    batch, n_pos, h, d = t.shape
    return t.permute(2, 0, 1, 3).reshape(h * batch, n_pos, d)


def _split_scores(t: torch.Tensor, h: int) -> torch.Tensor:
    """``[n_heads*batch, dest, src]`` storage as a ``[batch, n_heads, dest, src]`` view."""
    hb, dest, src = t.shape
    return t.view(h, hb // h, dest, src).transpose(0, 1)


def _merge_scores(t: torch.Tensor) -> torch.Tensor:
    batch, h, dest, src = t.shape
    return t.transpose(0, 1).reshape(h * batch, dest, src)
