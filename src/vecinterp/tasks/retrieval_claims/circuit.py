"""Finding the heads that carry a chain: chain-aligned attention maps, candidate paths and
the paper's validation by attention-map ablation (Musat 2024, §8.2 and Appendix E)."""

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float

from ...analysis import ablate_patterns, attention_patterns
from ...loss import masked_mse
from ...model import HookedVectorTransformer
from ..retrieval import RetrievalBatch, role_names
from .results import CANDIDATES, IDLE, THRESHOLDS, ChainPath

Head = tuple[int, int]


def _check_batch(batch: object) -> RetrievalBatch:
    if not isinstance(batch, RetrievalBatch):
        raise TypeError(
            f"batch must be a vecinterp.tasks.retrieval.RetrievalBatch, got {type(batch).__name__}"
        )
    return batch


def _label(key: Head) -> str:
    return f"L{key[0]}H{key[1]}"


def chain_aligned_maps(
    patterns: Float[torch.Tensor, "n_layers batch n_heads pos pos"], batch: RetrievalBatch
) -> Float[torch.Tensor, "n_layers n_heads n_roles n_roles"]:
    r"""Every head's attention between the roles of a chain, averaged over chains.

    .. math::
        M_{l,h}[r, s] = \frac{1}{B N} \sum_{b, c}
        A_l[b, h, \mathrm{pos}(b, c, r), \mathrm{pos}(b, c, s)]

    over the roles ``L0 R0 L1 R1 .. Q`` of a chain (:func:`~vecinterp.tasks.retrieval.
    role_names`; positions from :attr:`~vecinterp.tasks.retrieval.RetrievalBatch.
    role_positions`): ``M[r, s]`` is the share of attention a head puts, on average, from
    every chain's ``r`` token on the *same* chain's ``s`` token, wherever the chain sits.

    Args:
        patterns: attention patterns ``[n_layers, batch, n_heads, pos, pos]``, as
            :func:`vecinterp.attention_patterns` returns them, on ``batch.inputs``.
        batch: the batch the patterns were computed on.

    Returns:
        ``[n_layers, n_heads, 2D + 1, 2D + 1]``.

    Raises:
        ValueError: ``patterns`` does not match the batch's size and positions.

    Example:
        >>> import torch
        >>> from vecinterp.tasks import retrieval
        >>> from vecinterp.tasks.retrieval_claims import chain_aligned_maps
        >>> batch = retrieval.generate(4, 2, n_chains=2, seed=0)
        >>> previous = torch.eye(10).roll(-1, dims=1).tril()   # attend to position - 1
        >>> previous[0, 0] = 1.0
        >>> patterns = previous.expand(1, 4, 1, 10, 10)        # one layer, one head
        >>> chain_aligned_maps(patterns, batch)[0, 0, 1, 0]     # R0 -> L0: the pair
        tensor(1.)
    """
    batch = _check_batch(batch)
    if not isinstance(patterns, torch.Tensor) or patterns.ndim != 5:
        raise ValueError(
            "patterns must be a tensor [n_layers, batch, n_heads, pos, pos] "
            "(vecinterp.attention_patterns), got "
            + (f"shape {tuple(patterns.shape)}" if isinstance(patterns, torch.Tensor) else
               type(patterns).__name__)
        )  # fmt: skip
    n_batch, n_pos = batch.inputs.shape[:2]
    if patterns.shape[1] != n_batch or patterns.shape[3:] != (n_pos, n_pos):
        raise ValueError(
            f"patterns {tuple(patterns.shape)} do not belong to the batch: expected "
            f"[n_layers, {n_batch}, n_heads, {n_pos}, {n_pos}]"
        )
    pos = batch.role_positions.to(patterns.device)  # [B, N, roles]
    rows = torch.arange(n_batch, device=patterns.device)[:, None, None, None]
    dest, src = pos[:, :, :, None], pos[:, :, None, :]
    by_head = patterns.transpose(1, 2)  # [L, H, B, P, P]
    return by_head[:, :, rows, dest, src].mean((2, 3))


def role_maps(
    model: HookedVectorTransformer, batch: RetrievalBatch
) -> Float[torch.Tensor, "n_layers n_heads n_roles n_roles"]:
    """:func:`chain_aligned_maps` of the model's attention on ``batch.inputs``.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import retrieval
        >>> from vecinterp.tasks.retrieval_claims import role_maps
        >>> cfg = retrieval.model_config(2, 2, n_chains=2, d_model=16, n_heads=2)
        >>> batch = retrieval.generate(4, 2, n_chains=2, seed=0)
        >>> role_maps(vi.HookedVectorTransformer(cfg, seed=0), batch).shape
        torch.Size([2, 2, 5, 5])
    """
    batch = _check_batch(batch)
    return chain_aligned_maps(attention_patterns(model, batch.inputs), batch)


def find_paths(
    maps: Float[torch.Tensor, "n_layers n_heads n_roles n_roles"],
    threshold: float = THRESHOLDS["path"],
) -> list[ChainPath]:
    """Every ``(layer, head, r -> s)`` with ``s != r`` and ``maps[layer, head, r, s] >=
    threshold``: the chain paths a head carries, in (layer, head, r, s) order.

    Args:
        maps: chain-aligned maps ``[n_layers, n_heads, 2D + 1, 2D + 1]``
            (:func:`chain_aligned_maps`).
        threshold: the least average attention of a path, in ``(0, 1]``.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.retrieval_claims import find_paths
        >>> maps = torch.zeros(1, 2, 5, 5)
        >>> maps[0, 1, 4, 1] = 0.7                  # head 1: Q -> R0
        >>> [p["name"] for p in find_paths(maps, 0.5)]
        ['L0H1 Q->R0']
    """
    if not isinstance(maps, torch.Tensor) or maps.ndim != 4 or maps.shape[2] != maps.shape[3]:
        got = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise ValueError(f"maps must be a tensor [n_layers, n_heads, n_roles, n_roles], got {got}")
    n_layers, n_heads, n_roles, _ = maps.shape
    if n_roles < 3 or n_roles % 2 == 0:
        raise ValueError(f"maps must have 2D + 1 roles (L0 R0 .. Q), got {n_roles}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise TypeError(f"threshold must be a number, got {threshold!r}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1] (a share of attention), got {threshold}")
    names = role_names(n_roles // 2)
    found = []
    for layer in range(n_layers):
        for head in range(n_heads):
            for r in range(n_roles):
                for s in range(n_roles):
                    value = float(maps[layer, head, r, s])
                    if s != r and value >= threshold:
                        name = f"L{layer}H{head} {names[r]}->{names[s]}"
                        found.append(
                            ChainPath(layer=layer, head=head, dest=r, src=s, value=value,
                                      name=name)
                        )  # fmt: skip
    return found


def one_hot_map(
    batch: RetrievalBatch,
    paths: Sequence[ChainPath],
    base: Float[torch.Tensor, "pos pos"] | None = None,
    removed: Sequence[ChainPath] = (),
) -> Float[torch.Tensor, "batch pos pos"]:
    """A head's hypothesised attention map along chain paths, for :func:`vecinterp.ablate_patterns`.

    Row ``pos(b, c, r)`` is one-hot on ``pos(b, c, s)`` for each path ``r -> s`` and every
    chain ``c``; the rows of the ``removed`` paths are one-hot on themselves (identity);
    every other row is taken from ``base`` (the same ``[pos, pos]`` in every sequence,
    default the identity).

    Args:
        batch: the sequences the map is for.
        paths: the paths kept (their ``dest`` and ``src`` role indices are read).
        base: rows for the positions no path touches, or ``None`` (identity).
        removed: paths whose rows are set to identity instead.

    Returns:
        ``[batch, pos, pos]`` in the inputs' dtype; every row sums to 1 when ``base``'s do.

    Example:
        >>> from vecinterp.tasks import retrieval
        >>> from vecinterp.tasks.retrieval_claims import ChainPath, one_hot_map
        >>> batch = retrieval.generate(1, 2, n_chains=2, seed=0)
        >>> pair = ChainPath(layer=0, head=0, dest=1, src=0, value=1.0, name="L0H0 R0->L0")
        >>> attn = one_hot_map(batch, [pair])          # R0 -> L0 in both chains
        >>> r, l = int(batch.right_pos[0, 0, 0]), int(batch.left_pos[0, 0, 0])
        >>> float(attn[0, r, l]), float(attn[0, 9, 9])
        (1.0, 1.0)
    """
    batch = _check_batch(batch)
    n_batch, n_pos = batch.inputs.shape[:2]
    n_roles = batch.role_positions.shape[-1]
    for p in [*paths, *removed]:
        if not (0 <= p["dest"] < n_roles and 0 <= p["src"] < n_roles):
            raise ValueError(
                f"path {p.get('name', p)!r} has a role outside 0..{n_roles - 1} (the roles "
                f"of a depth-{batch.depth} chain)"
            )
    if base is not None and tuple(base.shape) != (n_pos, n_pos):
        raise ValueError(f"base must be [pos, pos] = [{n_pos}, {n_pos}], got {tuple(base.shape)}")
    attn = (torch.eye(n_pos) if base is None else base.float().cpu()).repeat(n_batch, 1, 1)
    pos = batch.role_positions.cpu()
    rows = torch.arange(n_batch)[:, None]
    for path, target in [(p, p["src"]) for p in paths] + [(p, p["dest"]) for p in removed]:
        dest, src = pos[:, :, path["dest"]], pos[:, :, target]  # [B, N]
        attn[rows, dest] = 0.0
        attn[rows, dest, src] = 1.0
    return attn.to(device=batch.inputs.device, dtype=batch.inputs.dtype)


def positional_maps(
    patterns: Float[torch.Tensor, "n_layers batch n_heads pos pos"],
) -> Float[torch.Tensor, "n_layers n_heads pos pos"]:
    """Each head's purely positional hypothesis: every destination row one-hot on the
    source position the head attends to most on average over the batch (the layout of
    positions is the same in every sequence; only the chains move).

    Example:
        >>> import torch
        >>> from vecinterp.tasks.retrieval_claims import positional_maps
        >>> patterns = torch.tensor([[[1.0, 0.0], [0.3, 0.7]],      # sequence 0
        ...                          [[1.0, 0.0], [0.9, 0.1]]])     # sequence 1
        >>> positional_maps(patterns[None, :, None])[0, 0]          # row 1: mean 0.6 on 0
        tensor([[1., 0.],
                [1., 0.]])
    """
    if not isinstance(patterns, torch.Tensor) or patterns.ndim != 5:
        got = tuple(patterns.shape) if isinstance(patterns, torch.Tensor) else type(patterns)
        raise ValueError(f"patterns must be [n_layers, batch, n_heads, pos, pos], got {got}")
    mean = patterns.mean(1)  # [L, H, P, P]
    return torch.nn.functional.one_hot(mean.argmax(-1), mean.shape[-1]).to(mean.dtype)


def _loss(outputs: torch.Tensor, batch: RetrievalBatch) -> float:
    return float(masked_mse(outputs, batch.targets, batch.loss_mask))


def validate_circuit(
    model: HookedVectorTransformer,
    batch: RetrievalBatch,
    paths: Sequence[ChainPath],
    positional: Float[torch.Tensor, "n_layers n_heads pos pos"],
    sweeps: int = 1,
) -> dict[str, Any]:
    """The paper's validation (Appendix E) with :func:`vecinterp.ablate_patterns`.

    1. Each head alone, every hypothesis of :data:`CANDIDATES` (``"paths"`` only for a head
       with chain paths); each head starts with the one of lowest loss.
    2. ``sweeps`` rounds over the heads: each head takes the hypothesis that gives the
       lowest loss with every head replaced (ties: the simpler); the result is ``full``.
    3. Simplest circuit: heads with a one-hot map, most dispensable first (lowest loss when
       idle alone), are made idle (uniform or identity, the better) while the combined
       loss stays at most ``max(limit, full)``, ``limit = max(ablation_holds,
       ablation_factor x base)`` (:data:`THRESHOLDS`).
    4. Not excessive: the combined loss with each circuit path's rows set to identity.

    Args:
        model: the trained IC model.
        batch: the validation batch (IC targets).
        paths: the candidate paths (:func:`find_paths`).
        positional: positional one-hot maps (:func:`positional_maps`).
        sweeps: rounds of step 2 (>= 0).

    Returns:
        A JSON-ready dict: ``base`` (unablated loss), ``full``, ``combined``, ``limit``,
        ``all_uniform`` (every head uniform), ``kept`` / ``dropped`` (the circuit's paths
        and the others), ``choice`` and ``single`` (per head label ``"L0H1"``: the map in
        the combined ablation, and the loss of each hypothesis alone), ``without`` (per
        circuit path: the loss without it), ``carrying`` (heads with one-hot maps along
        circuit paths), ``positional`` (heads with positional one-hot maps only) and
        ``found_heads`` (heads with any candidate path).

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import retrieval
        >>> from vecinterp.tasks import retrieval_claims as rc
        >>> cfg = retrieval.model_config(1, 1, n_chains=2, d_model=8, n_heads=2)
        >>> model = vi.HookedVectorTransformer(cfg, seed=0)
        >>> batch = retrieval.generate(8, 1, n_chains=2, seed=0)
        >>> positional = rc.positional_maps(vi.attention_patterns(model, batch.inputs))
        >>> v = rc.validate_circuit(model, batch, [], positional)
        >>> sorted(v["choice"]), v["carrying"]
        (['L0H0', 'L0H1'], [])
    """
    batch = _check_batch(batch)
    if not isinstance(model, HookedVectorTransformer):
        raise TypeError(f"model must be a HookedVectorTransformer, got {type(model).__name__}")
    if not batch.implicit_curriculum:
        raise ValueError("validate_circuit needs an IC batch (the model's targets x_1 .. x_D)")
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"sweeps must be an int >= 0, got {sweeps!r}")
    cfg = model.cfg
    heads = [(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    n_pos = batch.n_pos
    if not isinstance(positional, torch.Tensor) or tuple(positional.shape) != (
        cfg.n_layers, cfg.n_heads, n_pos, n_pos
    ):  # fmt: skip
        got = tuple(positional.shape) if isinstance(positional, torch.Tensor) else positional
        raise ValueError(
            f"positional must be [n_layers, n_heads, pos, pos] = "
            f"{[cfg.n_layers, cfg.n_heads, n_pos, n_pos]}, got {got}"
        )
    for p in paths:
        if (p["layer"], p["head"]) not in heads:
            raise ValueError(f"path {p['name']!r} names a head the model does not have")
    x = batch.inputs
    with torch.no_grad():
        base = _loss(model(x), batch)
    t = THRESHOLDS
    limit = max(t["ablation_holds"], t["ablation_factor"] * base)

    def paths_of(key: Head, among: Sequence[ChainPath]) -> list[ChainPath]:
        return [p for p in among if (p["layer"], p["head"]) == key]

    def build(key: Head, kind: str, removed: Sequence[ChainPath] = ()) -> Any:
        if kind in IDLE:
            return kind
        base_rows = positional[key] if kind == "paths+positional" else None
        mine = paths_of(key, paths)
        kept = [p for p in mine if p not in removed]
        return one_hot_map(batch, kept, base_rows, [p for p in mine if p in removed])

    def loss_with(choice: dict[Head, str], removed: Sequence[ChainPath] = ()) -> float:
        maps = {key: build(key, kind, removed) for key, kind in choice.items()}
        return _loss(ablate_patterns(model, x, maps), batch)

    kinds_of = {
        key: [k for k in CANDIDATES if k != "paths" or paths_of(key, paths)] for key in heads
    }
    single = {key: {k: loss_with({key: k}) for k in kinds_of[key]} for key in heads}
    choice = {key: min(kinds_of[key], key=single[key].__getitem__) for key in heads}
    for _ in range(sweeps):
        for key in heads:
            losses = {k: loss_with({**choice, key: k}) for k in kinds_of[key]}
            choice[key] = min(kinds_of[key], key=losses.__getitem__)
    full = loss_with(choice)
    bound = max(limit, full)
    idle_of = {key: min(IDLE, key=single[key].__getitem__) for key in heads}
    busy = [key for key in heads if choice[key] not in IDLE]
    for key in sorted(busy, key=lambda k: single[k][idle_of[k]]):
        trial = {**choice, key: idle_of[key]}
        if loss_with(trial) <= bound:
            choice = trial
    combined = loss_with(choice)
    circuit = [p for p in paths if choice[(p["layer"], p["head"])] not in IDLE]
    without = {p["name"]: loss_with(choice, [p]) for p in circuit}
    all_uniform = loss_with(dict.fromkeys(heads, "uniform"))
    one_hot = [key for key in heads if choice[key] not in IDLE]
    return {
        "base": base,
        "full": full,
        "combined": combined,
        "limit": limit,
        "all_uniform": all_uniform,
        "kept": circuit,
        "dropped": [p for p in paths if p not in circuit],
        "choice": {_label(k): choice[k] for k in heads},
        "single": {_label(k): single[k] for k in heads},
        "without": without,
        "carrying": [_label(k) for k in one_hot if paths_of(k, circuit)],
        "positional": [_label(k) for k in one_hot if not paths_of(k, circuit)],
        "found_heads": [_label(k) for k in sorted({(p["layer"], p["head"]) for p in paths})],
    }
