"""The batched arithmetic of :func:`~vecinterp.training.ensemble.train_ensemble`: K models'
weights stacked on a leading ``member`` axis, their forward pass and masked MSE as one
computation, and the per-member gradient clipping and AdamW step.

Every function here is the math of one model done for K at once: a member's slice of each
result is what :class:`~vecinterp.HookedVectorTransformer`, ``clip_grad_norm_`` and
``torch.optim.AdamW`` compute for that member alone, up to the rounding of a different
summation order, and does not depend on the other members' slices (a NaN in one member's
weights stays in its slice). The forward pass has no hook points. Nothing on a training step's
path reads a value back from the device: a step queues its work and returns.
"""

import functools
import math
from collections.abc import Callable

import torch
from torch import nn

from ..loss import loss_positions
from ..model.components.mlp import ACTIVATIONS
from ..model.components.norm import statistics_dtype
from ..model.components.rotary import Rotary
from ..model.config import VectorTransformerConfig
from ..model.transformer import HookedVectorTransformer
from .data import Tensors, _move


def stack_weights(
    models: list[HookedVectorTransformer], device: torch.device
) -> dict[str, torch.Tensor]:
    """Every entry of the members' state dicts (parameters and saved buffers) stacked on a
    new leading axis ``[K, ...]``; the parameters' stacks require gradients."""
    params = {name for name, _ in models[0].named_parameters()}
    states = [m.state_dict() for m in models]
    out = {}
    for name in states[0]:
        stacked = torch.stack([s[name].detach() for s in states]).to(device).contiguous()
        out[name] = stacked.requires_grad_(name in params)
    return out


def alias(net: nn.Module, stacked: dict[str, torch.Tensor], member: int) -> None:
    """Make ``net``'s parameters and saved buffers views of slice ``member`` of
    ``stacked``: in-place updates of the stacks show in ``net``, and a load into ``net``
    writes into the stacks."""
    with torch.no_grad():
        for name, tensor in list(net.named_parameters()) + list(net.named_buffers()):
            if name in stacked:
                tensor.data = stacked[name].detach()[member]


def stack_batches(
    cfg: VectorTransformerConfig, batches: list[Tensors], where: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The members' batches (on the model's device and dtype) stacked: ``inputs [K, batch,
    pos, d_in]``, ``targets [K, batch, pos, d_out]``, ``loss_mask [K, batch, pos]``, and
    whether each member's inputs are all finite (``[K]`` bool, on the device: not read
    here, so that a step does not wait for the device).

    Batches of fewer sequences or positions than the largest are padded with zeros and
    ``loss_mask`` False, which changes no member's loss or gradient: a padded sequence is
    scored nowhere, and a causal model's real positions never attend to the padded ones
    after them. A non-causal model's would, so its members' batches must share a length.

    Refuses, naming the member and its batch (``where``): inputs or targets of the wrong
    shape, a bad ``loss_mask`` (all checked on the host, without reading the device). NaN/inf
    inputs are the caller's to refuse, from the flags (:func:`member_inputs_error`)."""
    for i, (x, t, _) in enumerate(batches):
        if (
            x.dim() != 3
            or x.shape[-1] != cfg.d_in
            or not 1 <= x.shape[1] <= cfg.n_ctx
            or (x.shape[0] == 0)
        ):
            raise ValueError(
                f"member {i}: {where[i]}: inputs must be [batch, pos, d_in={cfg.d_in}] with 1 "
                f"<= pos <= n_ctx={cfg.n_ctx} and batch >= 1, got shape {tuple(x.shape)}"
            )
        if tuple(t.shape) != (*x.shape[:2], cfg.d_out):
            raise ValueError(
                f"member {i}: {where[i]}: targets have shape {tuple(t.shape)}, but the model's "
                f"outputs [batch, pos, d_out] have {(*x.shape[:2], cfg.d_out)}"
            )
        if not cfg.causal and x.shape[1] != batches[0][0].shape[1]:
            raise ValueError(
                f"member {i}: {where[i]}: {x.shape[1]} positions, but member 0's batch has "
                f"{batches[0][0].shape[1]}: a non-causal model's batches cannot be padded to "
                "one length (the padding would be attended to), so at each step the members' "
                "batches must have the same number of positions"
            )
    x0 = batches[0][0]
    n_batch, n_pos = max(b[0].shape[0] for b in batches), max(b[0].shape[1] for b in batches)
    inputs = x0.new_zeros(len(batches), n_batch, n_pos, cfg.d_in)
    assert cfg.d_out is not None
    targets = x0.new_zeros(len(batches), n_batch, n_pos, cfg.d_out)
    masks = torch.zeros(len(batches), n_batch, n_pos, dtype=torch.bool, device=x0.device)
    for i, (x, t, mask) in enumerate(batches):
        inputs[i, : x.shape[0], : x.shape[1]] = x
        targets[i, : x.shape[0], : x.shape[1]] = t
        try:
            used = loss_positions(mask, x.shape[:2], x0.device)
        except (TypeError, ValueError) as err:
            raise type(err)(f"member {i}: {where[i]}: {err}") from None
        masks[i, : x.shape[0], : x.shape[1]] = used
    return inputs, targets, masks, torch.isfinite(inputs).flatten(1).all(1)


def member_inputs_error(member: int, inputs: torch.Tensor, where: str) -> ValueError:
    """The error for member ``member``'s batch (``where``) whose ``inputs`` hold NaN or
    inf, naming the first bad index (this reads the device)."""
    at = (~torch.isfinite(inputs)).nonzero()[0].tolist()
    return ValueError(f"member {member}: {where}: inputs contain NaN or inf (first at index {at})")


def _lin(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x [K, rows, a] @ w [K, a, c] (+ b [K, c])``, one batched product."""
    return torch.bmm(x, w) if b is None else torch.baddbmm(b.unsqueeze(1), x, w)


def _norm(cfg: VectorTransformerConfig, x: torch.Tensor, w: object, b: object) -> torch.Tensor:
    """:class:`~vecinterp.model.components.Norm` with stacked ``w``, ``b`` ``[K, d]``."""
    if cfg.normalization is None:
        return x
    dtype = x.dtype
    x = x.to(statistics_dtype(dtype))  # Norm's precision: float32 for half-precision models
    if cfg.normalization in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    x = (x / (x.pow(2).mean(-1, keepdim=True) + cfg.eps).sqrt()).to(dtype)
    if not isinstance(w, torch.Tensor):
        return x
    if not isinstance(b, torch.Tensor):
        return x * w.unsqueeze(1)
    return torch.addcmul(b.unsqueeze(1), x, w.unsqueeze(1))


def forward(
    cfg: VectorTransformerConfig, p: dict[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """The outputs ``[K, batch, pos, d_out]`` of K models of config ``cfg`` with stacked
    weights ``p`` (see :func:`stack_weights`) on inputs ``x [K, batch, pos, d_in]``:
    the forward pass of :class:`~vecinterp.HookedVectorTransformer` without hook points,
    with the heads' queries, keys and values of a layer in one product.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.training._stacked import forward, stack_weights
        >>> cfg = vi.VectorTransformerConfig(d_in=2, d_model=8, d_head=4, n_heads=2,
        ...                                  n_layers=1, n_ctx=4)
        >>> models = [vi.HookedVectorTransformer(cfg, seed=s) for s in (0, 1)]
        >>> x = torch.randn(2, 3, 4, 2)
        >>> out = forward(cfg, stack_weights(models, torch.device("cpu")), x)
        >>> bool(torch.allclose(out[1], models[1](x[1]), atol=1e-6))
        True
    """
    k, batch, n_pos, _ = x.shape
    h, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    rows = batch * n_pos
    resid = _lin(x.reshape(k, rows, -1), p["embed.W_E"], p.get("embed.b_E"))
    if "pos_embed.W_pos" in p:
        pos = p["pos_embed.W_pos"][:, None, :n_pos]
        resid = (resid.view(k, batch, n_pos, d) + pos).view(k, rows, d)
    rotary = _rotary(cfg, x.device) if cfg.positional == "rotary" else None
    mask = torch.full((n_pos, n_pos), -math.inf, dtype=x.dtype, device=x.device).triu(1)
    for layer in range(cfg.n_layers):
        a = f"blocks.{layer}."
        y = _norm(cfg, resid, p.get(a + "ln1.w"), p.get(a + "ln1.b"))
        w = torch.cat([_heads(cfg, p, a + f"attn.W_{n}") for n in "QKV"], 1)  # [K, 3h, d, dh]
        bias = torch.cat([_heads(cfg, p, a + f"attn.b_{n}") for n in "QKV"], 1)
        bias = bias.reshape(k, 3 * h * dh)
        qkv = _lin(y, w.permute(0, 2, 1, 3).reshape(k, d, 3 * h * dh), bias)
        q, key, v = qkv.view(k * batch, n_pos, 3, h, dh).unbind(2)  # [K*batch, pos, h, dh]
        if rotary is not None:
            q, key = rotary(q), rotary(key)

        def heads(t: torch.Tensor) -> torch.Tensor:  # -> [K*batch*h, pos, dh]
            return t.transpose(1, 2).reshape(k * batch * h, n_pos, dh)

        q, key, v = heads(q), heads(key), heads(v)
        if cfg.causal:
            scores = torch.baddbmm(mask, q, key.transpose(1, 2), alpha=1.0 / math.sqrt(dh))
        else:
            scores = torch.bmm(q, key.transpose(1, 2)) * (1.0 / math.sqrt(dh))
        z = torch.bmm(scores.softmax(dim=-1), v).view(k, batch, h, n_pos, dh)
        z = z.transpose(2, 3).reshape(k, rows, h * dh)
        resid = resid + _lin(z, p[a + "attn.W_O"].reshape(k, h * dh, d), p[a + "attn.b_O"])
        if not cfg.attn_only:
            y = _norm(cfg, resid, p.get(a + "ln2.w"), p.get(a + "ln2.b"))
            hidden = _lin(y, p[a + "mlp.W_in"], p[a + "mlp.b_in"])
            if cfg.gated_mlp:  # act(x W_gate + b_gate) * (x W_in + b_in)
                gate = _lin(y, p[a + "mlp.W_gate"], p[a + "mlp.b_gate"])
                hidden = ACTIVATIONS[cfg.act_fn](gate) * hidden
            else:
                hidden = ACTIVATIONS[cfg.act_fn](hidden)
            resid = resid + _lin(hidden, p[a + "mlp.W_out"], p[a + "mlp.b_out"])
    resid = _norm(cfg, resid, p.get("ln_final.w"), p.get("ln_final.b"))
    return _lin(resid, p["unembed.W_U"], p["unembed.b_U"]).view(k, batch, n_pos, -1)


def _heads(cfg: VectorTransformerConfig, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The stacked ``[K, n_heads, ...]`` weight ``name`` of every query head: under
    grouped-query attention a key/value weight is stored once per key/value head (as
    ``_W_K``, ...) and each is repeated for the query heads of its group."""
    if not cfg.is_gqa or name.endswith(("W_Q", "b_Q")):
        return p[name]
    layer, leaf = name.rsplit(".", 1)
    return p[f"{layer}._{leaf}"].repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=1)


@functools.lru_cache(maxsize=16)
def _rotary(cfg: VectorTransformerConfig, device: torch.device) -> Rotary:
    """The rotary encoding of ``cfg`` with its frequencies already on ``device``, kept
    with the cos/sin tables it computes: made per call, it would compute them again at
    every step, after copying its frequencies from the host (on a GPU, a copy from
    pageable memory that waits for the device)."""
    rotary = Rotary(cfg)
    rotary.inv_freq = rotary.inv_freq.to(device)
    return rotary


def losses_and_grads(
    cfg: VectorTransformerConfig,
    p: dict[str, torch.Tensor],
    leaves: list[torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    grad_clip: float | None,
    check: Callable[[torch.Tensor], None] | None = None,
    run: Callable[..., torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One step's batched pass: each member's masked MSE ``[K]``, the gradients of their
    sum with respect to ``leaves`` (the stacked parameters in ``p``; member ``i``'s slice
    is member ``i``'s own gradient), clipped per member to ``grad_clip``, and each member's
    gradient norm before clipping ``[K]``. ``check(out)`` sees the outputs first.
    ``run``: what computes the outputs in place of :func:`forward`, called as it is (the
    compiled forward of ``train_ensemble(compile=True)``)."""
    out = (forward if run is None else run)(cfg, p, inputs)
    if check is not None:
        check(out)
    losses = masked_losses(out, targets, mask)
    grads = list(torch.autograd.grad(losses.sum(), leaves))
    return losses, grads, clip_per_member(grads, grad_clip)


def masked_losses(out: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each member's masked MSE ``[K]`` (:func:`~vecinterp.loss.mse_at` per member) of
    ``out``, ``targets`` ``[K, batch, pos, d_out]`` at the positions ``mask [K, batch,
    pos]`` selects; ``nan`` for a member whose mask selects nothing."""
    diff = torch.where(mask[..., None], out - targets, torch.zeros((), dtype=out.dtype))
    return diff.pow(2).mean(-1).sum((1, 2)) / mask.sum((1, 2))


def clip_per_member(grads: list[torch.Tensor], grad_clip: float | None) -> torch.Tensor:
    """Each member's total gradient norm ``[K]`` before clipping; with ``grad_clip``, each
    member's slice is scaled as ``clip_grad_norm_`` scales that member's gradients alone."""
    k = grads[0].shape[0]
    per_tensor = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), dim=1) for g in grads])
    norms = torch.linalg.vector_norm(per_tensor, dim=0)
    if grad_clip is not None:
        coef = torch.clamp(grad_clip / (norms + 1e-6), max=1.0)
        torch._foreach_mul_(grads, [coef.view(_member_shape(g)) for g in grads])
    return norms


def _member_shape(t: torch.Tensor) -> tuple[int, ...]:
    return (t.shape[0],) + (1,) * (t.dim() - 1)


@torch.no_grad()
def adamw_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    *,
    step: int,
    lrs: list[float],
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """Update ``step`` (1-based) of ``torch.optim.AdamW`` for K members at once, member
    ``i`` with learning rate ``lrs[i]``: ``p <- p (1 - lr wd)``, then the bias-corrected
    Adam step ``p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.

    Where torch has the fused AdamW kernel for the device and dtype (the one
    :func:`vecinterp.train` uses), it runs on the stacks, one call per distinct learning
    rate (on the members' slices when the rates differ): elementwise, the same arithmetic
    as each member's own optimizer. Elsewhere, a few ``torch._foreach`` operations with
    the per-member factors broadcast along the member axis."""
    beta1, beta2 = betas
    if not fused_available(params[0]):
        _foreach_adamw(params, grads, exp_avgs, exp_avg_sqs, step, lrs, weight_decay, betas, eps)
        return
    members: dict[float, list[int]] = {}
    for i, lr in enumerate(lrs):
        members.setdefault(lr, []).append(i)
    # filled on the device: torch.tensor(step, device=...) would copy from the host, on a
    # GPU a copy that waits for every queued kernel
    count = torch.full((), float(step), dtype=torch.float32, device=params[0].device)
    # the kernel walks memory in order: a strided gradient (autograd.grad returns some,
    # e.g. through a permute) would be read in the wrong order
    grads = [g.contiguous() for g in grads]
    for lr, group in members.items():
        p, g, m, v = params, grads, exp_avgs, exp_avg_sqs
        if len(group) < len(lrs):  # the slices of this rate's members
            p, g, m, v = ([t[i] for t in ts for i in group] for ts in (p, g, m, v))
        torch._fused_adamw_(
            p, g, m, v, [], [count] * len(p), amsgrad=False, lr=lr, beta1=beta1,
            beta2=beta2, weight_decay=weight_decay, eps=eps, maximize=False,
        )  # fmt: skip


_FUSED: dict[tuple[str, torch.dtype], bool] = {}


def fused_available(t: torch.Tensor) -> bool:
    """Whether torch's fused AdamW kernel runs on ``t``'s device type and dtype."""
    key = (t.device.type, t.dtype)
    if key not in _FUSED:
        probe = [torch.zeros(1, dtype=t.dtype, device=t.device) for _ in range(4)]
        count = [torch.ones((), dtype=torch.float32, device=t.device)]
        try:
            p, g, m, v = ([x] for x in probe)
            torch._fused_adamw_(p, g, m, v, [], count, amsgrad=False, lr=1e-3, beta1=0.9,
                                beta2=0.999, weight_decay=0.0, eps=1e-8,
                                maximize=False)  # fmt: skip
            _FUSED[key] = True
        except (RuntimeError, NotImplementedError, AttributeError):
            _FUSED[key] = False
    return _FUSED[key]


def _foreach_adamw(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    step: int,
    lrs: list[float],
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    beta1, beta2 = betas
    rates = _move(torch.tensor(lrs, dtype=torch.float64), params[0].device, params[0].dtype)
    decay = [(1.0 - rates * weight_decay).view(_member_shape(p)) for p in params]
    size = [(rates / (1.0 - beta1**step)).view(_member_shape(p)) for p in params]
    torch._foreach_mul_(params, decay)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, math.sqrt(1.0 - beta2**step))
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avgs, denom)
    torch._foreach_mul_(update, size)
    torch._foreach_sub_(params, update)
