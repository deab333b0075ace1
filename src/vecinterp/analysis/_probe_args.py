"""The argument checks of :func:`~vecinterp.fit_probes` (targets, positions, controls,
penalties, the split) and the layout of its targets as cells (one per probed position)."""

from collections.abc import Mapping, Sequence

import torch

CONTROLS = ("random_model", "shuffled")


def check_targets(targets: object, batch: int, n_pos: int) -> dict[str, torch.Tensor]:
    if isinstance(targets, torch.Tensor):
        targets = {"target": targets}
    if not isinstance(targets, Mapping) or not targets:
        raise TypeError(
            f"targets must be a tensor or a non-empty dict {{name: tensor}}, got "
            f"{type(targets).__name__}"
        )
    out = {}
    for name, t in targets.items():
        if not isinstance(name, str) or "/" in name:
            raise ValueError(f"targets: each name must be a str without '/', got {name!r}")
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"targets[{name!r}] must be a float tensor, got {t!r:.60}")
        t = t.detach().to("cpu", torch.float64)
        if t.ndim == 1:
            t = t[:, None]
        if t.ndim == 2 and t.shape[1] == n_pos and n_pos > 1:
            raise ValueError(
                f"targets[{name!r}] is [batch={batch}, {n_pos}] and x has {n_pos} positions: "
                f"it could be one value per position or {n_pos} values per sequence. Say "
                f"which: targets[{name!r}][..., None] ([batch, pos, 1]) probes each "
                f"position's value at its own position; targets[{name!r}][:, None, :]"
                f".expand(-1, {n_pos}, -1) ([batch, pos, {n_pos}]) probes the {n_pos} values "
                "of each sequence at every position"
            )
        ok = t.ndim in (2, 3) and t.shape[0] == batch and (t.ndim == 2 or t.shape[1] == n_pos)
        if not ok or t.shape[-1] == 0:
            raise ValueError(
                f"targets[{name!r}] must be [batch={batch}] or [batch, k] (one value per "
                f"sequence) or [batch, pos={n_pos}, k] (one per position), got "
                f"{tuple(t.shape)}"
            )
        if t.ndim == 2 and not t.isfinite().all():
            raise ValueError(f"targets[{name!r}] (one value per sequence) must be finite")
        if t.ndim == 3 and t.isinf().any():
            raise ValueError(f"targets[{name!r}] has an infinite value (NaN marks undefined)")
        out[name] = t
    return out


def cells_of(t: torch.Tensor, pos: list[int]) -> torch.Tensor:
    """``[cells or 1, batch, k]``: one target per probed position, or one shared by all."""
    if t.ndim == 2:
        return t[None]
    return t[:, pos].transpose(0, 1).nan_to_num(0.0)


def undefined_cells(t: torch.Tensor, pos: list[int]) -> torch.Tensor:
    if t.ndim == 2:
        return torch.zeros(len(pos), dtype=torch.bool)
    return t[:, pos].isnan().flatten(2).any(-1).any(0)


def check_positions(positions: object, n_pos: int) -> list[int]:
    if positions is None:
        return list(range(n_pos))
    if not isinstance(positions, Sequence) or not positions:
        raise TypeError(
            f"positions must be a non-empty sequence of ints or None, got {positions!r}"
        )
    out = []
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not -n_pos <= p < n_pos:
            raise ValueError(
                f"positions: each must be an int in [{-n_pos}, {n_pos - 1}] (x has {n_pos} "
                f"positions), got {p!r}"
            )
        if p % n_pos in out:
            raise ValueError(f"positions: position {p % n_pos} is given twice")
        out.append(p % n_pos)
    return out


def check_controls(controls: object) -> set[str]:
    if isinstance(controls, str) or not isinstance(controls, Sequence):
        raise TypeError(f"controls must be a sequence of names from {CONTROLS}, got {controls!r}")
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise ValueError(f"controls must be names from {CONTROLS}, got {bad!r}")
    return set(controls)


def check_alphas(alphas: object) -> torch.Tensor:
    if not isinstance(alphas, Sequence) or not alphas:
        raise TypeError(f"alphas must be a non-empty sequence of positive floats, got {alphas!r}")
    values = torch.tensor([float(a) for a in alphas], dtype=torch.float64)
    if not (values.isfinite() & (values > 0)).all():
        raise ValueError(f"alphas must be positive and finite, got {list(alphas)!r}")
    return values


def check_split(
    batch: int, n_folds: object, test_fraction: object, n_bootstrap: object, ci: object
) -> None:
    if isinstance(n_folds, bool) or not isinstance(n_folds, int) or n_folds < 2:
        raise ValueError(f"n_folds must be an int >= 2, got {n_folds!r}")
    if not isinstance(test_fraction, float | int) or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be a positive int, got {n_bootstrap!r}")
    if not isinstance(ci, float) or not 0 < ci < 1:
        raise ValueError(f"ci must be a float in (0, 1), got {ci!r}")
    n_test = max(1, round(test_fraction * batch))
    if n_test < 2 or batch - n_test < 2 * n_folds:
        raise ValueError(
            f"x has {batch} sequences: with test_fraction={test_fraction} that leaves "
            f"{n_test} held out and {batch - n_test} to train in {n_folds} folds; need at "
            f"least 2 held out and 2 per fold"
        )
