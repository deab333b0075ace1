"""Helpers shared by the importers of models trained elsewhere (:mod:`vecinterp.interop.hf`,
:mod:`vecinterp.interop.hf_gpt2`, :mod:`vecinterp.interop.torch_encoder`): reading the
linear maps around a backbone, splitting fused projections into heads, and filling a new
:class:`~vecinterp.HookedVectorTransformer` with every parameter.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..model.components.mlp import ACTIVATIONS
from ..model.config import VectorTransformerConfig
from ..model.tensor_files import refuse_non_finite
from ..model.transformer import HookedVectorTransformer, uninitialised_weights
from ..model.validation import check_float_dtype


def fail(what: str, problems: list[str]) -> None:
    """Raise one ``ValueError`` listing every reason ``what`` cannot be converted."""
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise ValueError(f"cannot convert {what}:{listed}")


def linear_parts(
    name: str, linear: object, *, d_in: int | None = None, d_out: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight [out, in], bias [out] or None)`` of an ``nn.Linear`` or a ``(weight,
    bias)`` / ``(weight,)`` tuple in ``nn.Linear``'s layout (``y = x W^T + b``), checked
    against the expected ``d_in`` (columns) and ``d_out`` (rows) where given."""
    weight: Any
    bias: Any
    if isinstance(linear, nn.Linear):
        weight, bias = linear.weight, linear.bias
    elif isinstance(linear, tuple | list) and len(linear) in (1, 2):
        weight = linear[0]
        bias = linear[1] if len(linear) == 2 else None
    else:
        raise TypeError(
            f"{name} must be an nn.Linear or a (weight, bias) tuple in nn.Linear's layout "
            f"(weight [out, in], bias [out] or None), got {type(linear).__name__}"
        )
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        raise ValueError(
            f"{name}'s weight must be a 2-dim torch.Tensor [out, in], got "
            + (f"shape {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else repr(weight))
        )
    if not weight.is_floating_point():
        raise TypeError(f"{name}'s weight must be a floating-point tensor, got {weight.dtype}")
    if weight.is_meta or (isinstance(bias, torch.Tensor) and bias.is_meta):
        raise ValueError(f"{name} is on the meta device (no values): load its weights first")
    if d_in is not None and weight.shape[1] != d_in:
        raise ValueError(
            f"{name}'s weight must be [out, in] with in = {d_in} (the backbone's width), "
            f"got shape {tuple(weight.shape)}"
        )
    if d_out is not None and weight.shape[0] != d_out:
        raise ValueError(
            f"{name}'s weight must be [out, in] with out = {d_out} (the backbone's width), "
            f"got shape {tuple(weight.shape)}"
        )
    if bias is not None and (
        not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)
    ):
        raise ValueError(
            f"{name}'s bias must be a torch.Tensor [out] = [{weight.shape[0]}] or None, got "
            + (f"shape {tuple(bias.shape)}" if isinstance(bias, torch.Tensor) else repr(bias))
        )
    return weight.detach(), None if bias is None else bias.detach()


def heads_in(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[d_model, n_heads * d_head]`` (heads side by side in the columns, as a fused
    projection writes them) as vecinterp's ``[n_heads, d_model, d_head]``."""
    d_model = weight.shape[0]
    return weight.reshape(d_model, n_heads, -1).permute(1, 0, 2)


def heads_out(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[n_heads * d_head, d_model]`` (heads stacked in the rows) as ``[n_heads, d_head,
    d_model]``."""
    return weight.reshape(n_heads, -1, weight.shape[-1])


def merge_heads_in(W: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`heads_in`: ``[n_heads, d_model, d_head]`` to ``[d_model,
    n_heads * d_head]``."""
    return W.permute(1, 0, 2).reshape(W.shape[1], -1)


def check_dtype(dtype: object, default: torch.dtype) -> torch.dtype:
    """``dtype`` (a floating-point ``torch.dtype``), or ``default`` when it is ``None``."""
    if dtype is None:
        return default
    check_float_dtype("dtype", dtype)
    assert isinstance(dtype, torch.dtype)
    return dtype


def build_model(
    cfg: VectorTransformerConfig,
    params: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype,
    device: torch.device,
    source: str,
) -> HookedVectorTransformer:
    """A new model of ``cfg`` whose every parameter is copied from ``params`` (by name),
    cast to ``dtype`` on ``device``. A missing, extra or misshapen parameter means the
    checks of the importer missed a configuration: a ``ValueError`` says so; so does a
    NaN/inf weight, which ``vi.save`` and ``vi.load`` refuse too."""
    with uninitialised_weights():  # every parameter is overwritten below
        model = HookedVectorTransformer(cfg, seed=None, dtype=dtype, device=device)
    target = dict(model.named_parameters())
    problems = [
        f"{source} gives {name}, which the model lacks" for name in set(params) - set(target)
    ]
    problems += [f"nothing fills the model's {name}" for name in set(target) - set(params)]
    problems += [
        f"{name}: {source} gives shape {tuple(params[name].shape)}, the model needs "
        f"{tuple(p.shape)}"
        for name, p in target.items()
        if name in params and params[name].shape != p.shape
    ]
    fail(f"the {source} model's parameters", sorted(problems))
    with torch.no_grad():
        for name, p in target.items():
            p.copy_(params[name].to(device=device, dtype=dtype))
    # as vi.save and vi.load do: a NaN/inf weight (in the source, or from a cast to a
    # narrower dtype) would make every analysis of the import silently NaN
    refuse_non_finite(
        dict(model.named_parameters()), f"cannot import the {source} model as {dtype}"
    )
    return model


def layer_norm_parts(
    name: str, norm: object, d_model: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, float, list[str]]:
    """``(weight, bias, eps, problems)`` of an ``nn.LayerNorm`` over ``d_model``; the weight
    and bias are ``None`` where the norm has none (``elementwise_affine=False``,
    ``bias=False``): they are 1 and 0."""
    if not isinstance(norm, nn.LayerNorm):
        return (
            None,
            None,
            0.0,
            [
                f"{name} is a {type(norm).__name__}, not an nn.LayerNorm (vecinterp's "
                "normalization is LayerNorm here)"
            ],
        )
    if tuple(norm.normalized_shape) != (d_model,):
        return (
            None,
            None,
            0.0,
            [
                f"{name} normalizes over {tuple(norm.normalized_shape)}, not the last axis "
                f"({d_model},)"
            ],
        )
    return norm.weight, norm.bias, float(norm.eps), []


def ln_params(
    prefix: str, weight: torch.Tensor | None, bias: torch.Tensor | None, d_model: int
) -> dict[str, torch.Tensor]:
    """``{prefix}.w`` and ``{prefix}.b``, ones and zeros where the source has none."""
    ones = torch.ones(d_model, dtype=torch.float64)
    return {
        f"{prefix}.w": ones if weight is None else weight.detach(),
        f"{prefix}.b": torch.zeros_like(ones) if bias is None else bias.detach(),
    }


def module_device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device and dtype of ``module``'s first floating-point parameter."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device("cpu"), torch.float32


_DROPOUTS = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)


def check_source(what: str, module: nn.Module) -> None:
    """Refuse a source whose import would not compute what the caller compares it with.

    - Parameters or buffers on the meta device have no values: a ``ValueError`` says to
      load the weights first.
    - A source in training mode with a nonzero dropout (an ``nn.Dropout`` module, or a
      float ``dropout`` / ``attention_dropout`` rate that attention applies in training
      mode, as ``nn.MultiheadAttention`` and Llama's attention do) computes a random
      function, while the import computes its eval-mode one: a ``ValueError`` names the
      dropouts and says to call ``.eval()`` on the source first. The importers never
      change the source's mode themselves.
    """
    meta = [name for name, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
    if meta:
        raise ValueError(
            f"{what} has {len(meta)} tensors on the meta device (no values; e.g. {meta[0]}): "
            "load its weights first (from_pretrained without device_map='meta' or "
            "init_empty_weights, or load_state_dict(..., assign=True)), then import it"
        )
    dropouts = []
    for name, m in module.named_modules():
        if not m.training:
            continue
        if isinstance(m, _DROPOUTS) and m.p > 0:
            dropouts.append(f"{name or what} (p={m.p})")
        for attr in ("dropout", "attention_dropout"):
            rate = getattr(m, attr, None)
            if isinstance(rate, float) and rate > 0:
                dropouts.append(f"{name + '.' if name else ''}{attr}={rate}")
    if dropouts:
        shown = ", ".join(dropouts[:4]) + (f", ... ({len(dropouts)} in all)" * (len(dropouts) > 4))
        raise ValueError(
            f"{what} is in training mode with dropout ({shown}): its outputs are random, "
            "while the imported model computes its eval-mode function, so the two would not "
            f"agree; call .eval() on it first (and compare against it in eval mode)"
        )


# Points at which the activations vecinterp has differ (relu, gelu, gelu_tanh and silu
# differ by at least 1e-4 at |x| ~ 2): both signs, around 0 and in the tails.
_PROBE = torch.cat(
    [
        torch.linspace(-8.0, 8.0, 161, dtype=torch.float64),
        torch.tensor([-30.0, -12.0, 12.0, 30.0], dtype=torch.float64),
    ]
)
# GPT-2's gelu_fast writes sqrt(2/pi) with 10 digits: 4e-12 relative in the tanh's argument
_ACT_TOL = 1e-9


def module_activation(name: str, act: object) -> tuple[str | None, str | None]:
    """``(act_fn, None)``: which of vecinterp's activations the module (or function)
    ``act`` computes, checked on probe points in float64 to ``1e-9``; ``(None, problem)``
    where it computes none of them (an activation-swap experiment with another function,
    a module with parameters, a hook that changes its output)."""
    x = _PROBE.clone()
    try:
        with torch.no_grad():
            out = act(x)  # type: ignore[operator]
    except Exception as err:  # noqa: BLE001 - any failure means: not one we can read
        return None, f"{name} ({_describe(act)}) fails on a float64 vector: {err}"
    if isinstance(out, torch.Tensor) and out.shape == _PROBE.shape:
        out = out.to(torch.float64)
        for act_fn, f in ACTIVATIONS.items():
            if bool(((out - f(_PROBE)).abs() <= _ACT_TOL).all()):
                return act_fn, None
    return None, (
        f"{name} is {_describe(act)}, which computes none of vecinterp's activations "
        f"{sorted(ACTIVATIONS)} (checked on points in [-30, 30])"
    )


def _describe(act: object) -> str:
    if isinstance(act, nn.Module):
        return f"a {type(act).__module__}.{type(act).__name__}"
    return getattr(act, "__qualname__", None) or type(act).__name__


def module_activations(acts: list[tuple[str, object]]) -> tuple[str | None, list[str]]:
    """``(act_fn, problems)`` for the activation modules of every layer (``(name,
    module)``): the activation they all compute (``None`` without layers), or why they
    cannot be read (one that is none of vecinterp's, or layers that differ)."""
    found: dict[str, list[str]] = {}
    problems = []
    for name, act in acts:
        act_fn, problem = module_activation(name, act)
        if problem is not None:
            problems.append(problem)
        else:
            found.setdefault(str(act_fn), []).append(name)
    if not problems and len(found) > 1:
        which = "; ".join(f"{act_fn}: {', '.join(names)}" for act_fn, names in found.items())
        problems.append(f"the layers compute different activations ({which}; vecinterp has one)")
    return (next(iter(found)) if found and not problems else None), problems


def embed_params(
    read_in: tuple[torch.Tensor, torch.Tensor | None],
    read_out: tuple[torch.Tensor, torch.Tensor | None],
) -> dict[str, Any]:
    """``embed.W_E`` (and ``embed.b_E``), ``unembed.W_U`` and ``unembed.b_U`` from the
    linear maps ``read_in`` and ``read_out`` (``nn.Linear`` layout)."""
    (w_in, b_in), (w_out, b_out) = read_in, read_out
    params = {"embed.W_E": w_in.T, "unembed.W_U": w_out.T}
    if b_in is not None:
        params["embed.b_E"] = b_in
    params["unembed.b_U"] = torch.zeros_like(w_out[:, 0]) if b_out is None else b_out
    return params


def export_maps(model: HookedVectorTransformer) -> tuple[nn.Linear, nn.Linear]:
    """``(read_in, read_out)``: ``nn.Linear`` modules holding ``model``'s ``W_E``/``b_E``
    and ``W_U``/``b_U`` (the exporters' linear maps around a backbone), on its device and
    in its dtype, in eval mode; the global random state is left alone."""
    cfg, W_E = model.cfg, model.embed.W_E
    like: dict[str, Any] = {"device": W_E.device, "dtype": W_E.dtype}
    with torch.random.fork_rng(devices=[]):  # the initialisation is overwritten below
        read_in = nn.Linear(cfg.d_in, cfg.d_model, bias=cfg.embed_bias, **like)
        read_out = nn.Linear(cfg.d_model, int(cfg.d_out or 0), **like)
    b_E: Any = model.embed.b_E
    with torch.no_grad():
        read_in.weight.copy_(W_E.T)
        if cfg.embed_bias:
            read_in.bias.copy_(b_E)
        read_out.weight.copy_(model.unembed.W_U.T)
        read_out.bias.copy_(model.unembed.b_U)
    return read_in.eval(), read_out.eval()


def copy_norm(target: nn.Module, norm: nn.Module) -> None:
    """Copy a vecinterp normalization's ``w`` (and ``b``) into ``target``'s ``weight``
    (and ``bias``, if it has one): ones and zeros where ``norm`` has none (the ``Pre``
    kinds). Call under ``torch.no_grad()``."""
    weight: Any = target.weight
    w, b = getattr(norm, "w", None), getattr(norm, "b", None)
    weight.copy_(torch.ones_like(weight) if w is None else w)
    bias: Any = getattr(target, "bias", None)
    if bias is not None:
        bias.copy_(torch.zeros_like(bias) if b is None else b)
