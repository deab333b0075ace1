"""Shared by the probes, subspace patching and alignment search: hook names expanded to
full names, the block a run can start or stop at for a hook point, and a capture of only
the requested hook points at the requested positions."""

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..cache import act_name
from ..hooks import HookPoint
from ..model import HookedVectorTransformer

_FEATURE_LEAVES = (
    "hook_embed",
    "hook_pos_embed",
    "hook_resid_pre",
    "hook_resid_mid",
    "hook_resid_post",
    "hook_attn_out",
    "hook_mlp_out",
    "hook_pre",
    "hook_pre_linear",
    "hook_post",
    "hook_normalized",
    # a spliced dictionary's points (vecinterp.dictionary.splice), under the point it is at
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
)
"""Hook points laid out ``[batch, pos, features]``: the ones a probe or a subspace reads."""


def resolve_points(model: HookedVectorTransformer, hook_names: object, name: str) -> list[str]:
    """Full hook names, in order: a short name (``"resid_post"``) gives one per layer, a
    full name (``"blocks.1.hook_resid_mid"``, ``"hook_embed"``,
    ``"blocks.0.hook_resid_post.hook_sae_acts_post"`` of a spliced model) itself. Only hook
    points laid out ``[batch, pos, features]`` are accepted (a dictionary's features
    included); errors call the argument ``name``."""
    given = [hook_names] if isinstance(hook_names, str) else hook_names
    if not isinstance(given, Sequence) or not given or not all(isinstance(n, str) for n in given):
        raise TypeError(
            f"{name} must be a hook name or a non-empty sequence of hook names (str), "
            f"got {hook_names!r}"
        )
    names: list[str] = []
    for short in given:
        if "." in short or short.startswith("hook_"):
            expanded = [short]
        else:
            try:
                expanded = [act_name(short, layer) for layer in range(model.cfg.n_layers)]
            except KeyError:
                try:
                    expanded = [act_name(short)]
                except KeyError:
                    raise ValueError(
                        f"{name}: unknown hook name {short!r}: expected a short name such as "
                        "'resid_pre', 'resid_mid', 'resid_post', 'attn_out', 'mlp_out', or a "
                        "full hook name such as 'blocks.0.hook_resid_pre'"
                    ) from None
        for full in expanded:
            full = model.hook_point(full).name
            if full.rsplit(".", 1)[-1] not in _FEATURE_LEAVES:
                raise ValueError(
                    f"{name}: {full!r} is not laid out [batch, pos, features]; use a residual "
                    "point (resid_pre, resid_mid, resid_post), attn_out, mlp_out, an MLP's "
                    "pre/post (and a gated MLP's pre_linear), hook_embed, hook_pos_embed, "
                    "ln_final.hook_normalized or a spliced dictionary's point "
                    "('<point>.hook_sae_acts_post', ...)"
                )
            if full in names:
                raise ValueError(f"{name}: {full!r} is requested twice")
            names.append(full)
    return names


def block_of(name: str) -> int | None:
    """The block of hook point ``name`` (``blocks.L.*``); ``None`` before every block
    (``hook_embed``, ``hook_pos_embed``); ``-1`` after every block (``ln_final.*``)."""
    parts = name.split(".")
    if parts[0] == "blocks":
        return int(parts[1])
    return None if parts[0].startswith("hook_") else -1


def capture(
    model: HookedVectorTransformer,
    x: torch.Tensor,
    names: Sequence[str],
    positions: Sequence[int],
    *,
    chunk_size: int,
    progress: bool,
    desc: str,
) -> dict[str, torch.Tensor]:
    """``{name: activation[:, positions]}`` for each hook point, ``[batch, len(positions),
    features]``, computed ``chunk_size`` sequences at a time by hooks on exactly these points;
    each run stops after the last block any of them needs (no unembedding)."""
    blocks = [block_of(name) for name in names]
    n = model.cfg.n_layers
    stop = n if -1 in blocks else max([b + 1 for b in blocks if b is not None], default=0)
    index = torch.as_tensor(list(positions), dtype=torch.long, device=x.device)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}

    def keep(act: torch.Tensor, hook: HookPoint) -> None:
        parts[hook.name].append(act.index_select(1, index).detach().clone())

    starts = range(0, x.shape[0], chunk_size)
    with torch.no_grad(), model.hooks(fwd_hooks=[(name, keep) for name in names]):
        for start in tqdm(starts, desc=desc, disable=not progress):
            chunk = x[start : start + chunk_size]
            if stop == n and -1 in blocks:
                model(chunk)
            else:
                model(chunk, stop_at_layer=stop)
    return {name: torch.cat(parts[name]) for name in names}


_CONTROL_DOMAIN = b"vecinterp random-model control\n"
_CONTROL_TRIES = 3


def control_generator_seed(control_seed: int) -> int:
    """The 64-bit seed of the random control's stream for ``control_seed``: the first 8
    bytes of a SHA-256 of a fixed domain string and ``control_seed`` (so ``control_seed=0``
    is not seed 0, the default ``seed=`` of every model)."""
    text = _CONTROL_DOMAIN + str(control_seed % 2**64).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def random_twin(
    model: HookedVectorTransformer, control_seed: int
) -> tuple[HookedVectorTransformer, int]:
    """The control of the probes and the alignment search: ``model``'s architecture (its
    config) with freshly initialised weights, on its device and dtype; returns it and the
    control seed it was drawn with.

    Independent of every model by construction: the weights are drawn by the model's own
    ``init_weights`` from torch's CPU generator seeded with
    :func:`control_generator_seed` ``(control_seed)`` *after one discarded draw*, a stream
    that no model's ``seed=`` argument starts (a model's initialisation starts its stream
    at the first draw), so ``control_seed=0`` is not the initial state of a model built
    with ``seed=0``, as it was. Should a weight matrix still equal ``model``'s (a model
    made to match), the control is drawn again with ``control_seed + 1`` (at most 3
    tries, then ``ValueError``); the seed returned is the one used. The global RNG is
    left as it was.

    A spliced model (:func:`vecinterp.dictionary.splice`) gets a twin with the same
    dictionaries spliced at the same points, with the same error term: the control of a
    feature point is the same dictionary reading a random network (the dictionaries'
    weights are not drawn again, and are not compared)."""
    for attempt in range(_CONTROL_TRIES):
        seed = (control_seed + attempt) % 2**64
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(control_generator_seed(seed))
            torch.randn(1, dtype=torch.float64)  # the discarded draw
            twin = HookedVectorTransformer(
                model.cfg, seed=None, device=model.W_E.device, dtype=model.W_E.dtype
            )
        if not _shares_a_matrix(twin, model):
            return _splice_like(twin, model), seed
    raise ValueError(
        f"the random-model control drawn with control_seed {control_seed} .. {seed} shares a "
        "weight matrix with the model every time: pass another control_seed"
    )


def _splice_like(
    twin: HookedVectorTransformer, model: HookedVectorTransformer
) -> HookedVectorTransformer:
    """``twin`` with ``model``'s spliced dictionaries at the same points (if any)."""
    from ..dictionary.splice import SplicedPoint, splice, unspliced_copy  # (a cycle)

    def fresh(d: Any) -> Any:  # a spliced dictionary lent its hook points to the point
        return unspliced_copy(d).to(device=twin.W_E.device, dtype=twin.W_E.dtype)

    for error_term in (True, False):
        same = {
            name: fresh(point.dictionary)
            for name, point in model.hook_dict.items()
            if isinstance(point, SplicedPoint) and point.error_term is error_term
        }
        if same:
            twin = splice(twin, same, error_term=error_term)
    return twin


def _shares_a_matrix(a: HookedVectorTransformer, b: HookedVectorTransformer) -> bool:
    mine = dict(b.named_parameters())
    return any(
        name.rsplit(".", 1)[-1].lstrip("_").startswith("W_")
        and name in mine
        and p.numel() > 0
        and torch.equal(p.detach(), mine[name].detach())
        for name, p in a.named_parameters()
    )
