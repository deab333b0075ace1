"""How good a dictionary is: fraction of variance unexplained, L0, dead and dense
features."""

from dataclasses import dataclass

import torch

from .modules import SparseDictionary


@dataclass(frozen=True)
class DictionaryStats:
    """What :func:`evaluate_dictionary` measured.

    Attributes:
        fvu: fraction of variance unexplained, ``sum |target - recons|^2 /
            sum |target - mean(target)|^2`` over the rows (0 is perfect).
        l0: mean number of active (non-zero) features per row.
        feature_density: ``[d_sae]``, the fraction of rows on which each feature is active.
        n_dead: features active on no row.
        n_dense: features active on more than ``dense_above`` of the rows.
        n_rows: rows evaluated.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder,
        ...                                   evaluate_dictionary)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8, activation="topk", k=2))
        >>> stats = evaluate_dictionary(sae, torch.randn(100, 4))
        >>> stats.l0 <= 2, stats.n_rows
        (True, 100)
    """

    fvu: float
    l0: float
    feature_density: torch.Tensor
    n_dead: int
    n_dense: int
    n_rows: int


@torch.no_grad()
def evaluate_dictionary(
    dictionary: SparseDictionary,
    inputs: torch.Tensor,
    targets: torch.Tensor | None = None,
    *,
    dense_above: float = 0.1,
    batch_size: int = 65536,
) -> DictionaryStats:
    """FVU, L0, feature density, dead and dense features of ``dictionary`` on rows
    ``inputs [n, d_in]`` (an SAE's targets are its inputs; a transcoder needs ``targets
    [n, d_out]``).

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import (DictionaryConfig, SparseAutoencoder,
        ...                                   evaluate_dictionary)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
        >>> 0 <= evaluate_dictionary(sae, torch.randn(50, 4)).fvu
        True
    """
    if not isinstance(dictionary, SparseDictionary):
        raise TypeError(f"dictionary must be a SparseDictionary, got {type(dictionary).__name__}")
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.shape[0] < 2:
        raise ValueError("inputs must be rows [n >= 2, d_in]")
    if targets is None:
        if dictionary.cfg.transcoder:
            raise ValueError("a transcoder is evaluated against targets [n, d_out]: pass them")
        targets = inputs
    if targets.shape[0] != inputs.shape[0]:
        raise ValueError(f"targets have {targets.shape[0]} rows, inputs {inputs.shape[0]}")
    if not (0 <= dense_above <= 1):
        raise ValueError(f"dense_above must be in [0, 1], got {dense_above!r}")
    for name, t in (("inputs", inputs), ("targets", targets)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} hold NaN or inf")
    dtype = dictionary.W_dec.dtype
    err = torch.zeros((), dtype=torch.float64)
    active_rows = torch.zeros(dictionary.cfg.d_sae, dtype=torch.float64)
    active_total = torch.zeros((), dtype=torch.float64)
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start : start + batch_size].to(dtype)
        t = targets[start : start + batch_size].to(dtype)
        acts = dictionary.encode(x)
        recons = dictionary.decode(acts, x)
        err += ((t - recons).double() ** 2).sum()
        active = acts != 0
        active_rows += active.double().sum(0)
        active_total += active.double().sum()
    t64 = targets.double()
    var = ((t64 - t64.mean(0)) ** 2).sum()
    n = inputs.shape[0]
    density = active_rows / n
    return DictionaryStats(
        fvu=float(err / var),
        l0=float(active_total / n),
        feature_density=density,
        n_dead=int((density == 0).sum()),
        n_dense=int((density > dense_above).sum()),
        n_rows=n,
    )
