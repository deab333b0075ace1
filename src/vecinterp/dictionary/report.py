"""What a trained dictionary's features are: how often each fires (:func:`feature_density`),
how its decoder rows line up with given directions (:func:`decoder_similarity`), how each
feature's activation follows a variable (:func:`feature_correlations`), and one report per
dictionary (:func:`feature_report`, a :class:`FeatureReport` with a Markdown table). The
pictures of these are in :mod:`vecinterp.plot` (``plot_feature_density``,
``plot_decoder_similarity``, ``plot_feature_activation``)."""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float

from ..model import HookedVectorTransformer
from .evaluate import evaluate_dictionary
from .modules import SparseDictionary
from .splice import splice


@torch.no_grad()
def feature_density(
    dictionary: SparseDictionary, inputs: torch.Tensor, *, batch_size: int = 65536
) -> torch.Tensor:
    """``[d_sae]`` float64: the fraction of the rows ``inputs [n, d_in]`` on which each
    feature is active (non-zero). Dead features have density 0.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder, feature_density
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=2, d_sae=2))
        >>> with torch.no_grad():
        ...     _ = sae.W_enc.copy_(torch.eye(2)), sae.b_enc.zero_(), sae.b_dec.zero_()
        >>> feature_density(sae, torch.tensor([[1.0, 0.0], [1.0, -1.0], [-1.0, 0.0]]))
        tensor([0.6667, 0.0000], dtype=torch.float64)
    """
    if not isinstance(dictionary, SparseDictionary):
        raise TypeError(f"dictionary must be a SparseDictionary, got {type(dictionary).__name__}")
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.shape[0] < 1:
        raise ValueError("inputs must be rows [n >= 1, d_in]")
    active = torch.zeros(dictionary.cfg.d_sae, dtype=torch.float64)
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start : start + batch_size].to(dictionary.W_dec)
        active += (dictionary.encode(x) != 0).double().sum(0)
    return active / inputs.shape[0]


@torch.no_grad()
def decoder_similarity(
    dictionary: SparseDictionary | torch.Tensor, directions: torch.Tensor
) -> torch.Tensor:
    """``[n_directions, d_sae]`` float64: the cosine of each given direction (rows of
    ``directions [n_directions, d_out]``, e.g. probe directions) with each decoder row
    (``W_dec [d_sae, d_out]``, or that matrix itself). A zero row gives NaN. The best
    match of direction ``j`` is ``sim[j].abs().max()``.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import decoder_similarity
        >>> W_dec = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> decoder_similarity(W_dec, torch.tensor([[1.0, 1.0], [0.0, -2.0]]))
        tensor([[ 0.7071,  0.7071],
                [ 0.0000, -1.0000]], dtype=torch.float64)
    """
    rows = dictionary.W_dec if isinstance(dictionary, SparseDictionary) else dictionary
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
        raise ValueError("the decoder must be a matrix [d_sae, d_out]")
    if not isinstance(directions, torch.Tensor) or directions.dim() not in (1, 2):
        raise ValueError("directions must be [n_directions, d_out] (or one [d_out])")
    directions = directions.reshape(-1, directions.shape[-1]).double().cpu()
    rows = rows.detach().double().cpu()
    if directions.shape[1] != rows.shape[1]:
        raise ValueError(
            f"directions have width {directions.shape[1]}, the decoder rows {rows.shape[1]}"
        )
    a = directions / directions.norm(dim=1, keepdim=True)
    b = rows / rows.norm(dim=1, keepdim=True)
    return a @ b.T


@dataclass(frozen=True)
class SpliceMetric:
    """What splicing without the error term costs on given data (:func:`splice_metric`).

    Attributes:
        original_mse: the original model's masked MSE.
        spliced_mse: the spliced model's (every dictionary's reconstruction in place).
        increase: ``spliced_mse - original_mse`` (the vector-output analogue of the
            loss increase behind "loss recovered").

    Example:
        >>> from vecinterp.dictionary import SpliceMetric
        >>> SpliceMetric(original_mse=0.5, spliced_mse=0.75, increase=0.25).increase
        0.25
    """

    original_mse: float
    spliced_mse: float
    increase: float


def feature_correlations(acts: torch.Tensor, variable: torch.Tensor) -> torch.Tensor:
    """``[d_sae]`` float64: Pearson's correlation of each feature's activation (columns
    of ``acts [n, d_sae]``) with ``variable [n]``. A feature that never varies (dead, or
    constant) gets NaN, as does every feature when the variable is constant.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import feature_correlations
        >>> acts = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 2.0], [2.0, 0.0, 2.0]])
        >>> feature_correlations(acts, torch.tensor([1.0, 2.0, 3.0]))
        tensor([ 1.0000, -0.8660,     nan], dtype=torch.float64)
    """
    if not isinstance(acts, torch.Tensor) or acts.dim() != 2:
        raise ValueError("acts must be [n, d_sae]")
    if not isinstance(variable, torch.Tensor) or variable.shape != (acts.shape[0],):
        raise ValueError(f"variable must be [n] = [{acts.shape[0]}]")
    a = acts.detach().double().cpu()
    v = variable.detach().double().cpu()
    a = a - a.mean(0)
    v = v - v.mean()
    denom = a.norm(dim=0) * v.norm()
    out = (a * v[:, None]).sum(0) / denom
    return torch.where(denom > 0, out, torch.full_like(out, math.nan))


@dataclass(frozen=True)
class FeatureReport:
    """One dictionary's evaluation (:func:`feature_report`).

    Attributes:
        name: what the report calls the dictionary (its hook point, by default).
        architecture: ``relu``, ``topk``, ``batchtopk`` or ``jumprelu``, with
            ``transcoder`` for a transcoder.
        d_sae: the number of features.
        fvu, l0, n_dead, n_dense, n_rows, dense_above: as :func:`evaluate_dictionary`
            measured them.
        splice: the MSE without the error term (:func:`splice_metric`), or None when no
            model was given.

    Example:
        >>> from vecinterp.dictionary import FeatureReport
        >>> r = FeatureReport("sae", "topk", 64, 0.05, 4.0, 3, 1, 1000, 0.1, None)
        >>> table = r.to_markdown().splitlines()
        >>> table[0].startswith("| dictionary | architecture | d_sae | FVU | L0 |")
        True
        >>> print(table[2])
        | sae | topk | 64 | 0.0500 | 4.00 | 3 | 1 | 1000 | – | – | – |
    """

    name: str
    architecture: str
    d_sae: int
    fvu: float
    l0: float
    n_dead: int
    n_dense: int
    n_rows: int
    dense_above: float
    splice: SpliceMetric | None

    def row(self) -> str:
        """This report as one Markdown table row (the header is :meth:`header`).

        Example:
            >>> from vecinterp.dictionary import FeatureReport
            >>> FeatureReport("x", "relu", 8, 0.5, 2.0, 0, 0, 10, 0.1, None).row()[:25]
            '| x | relu | 8 | 0.5000 |'
        """
        s = self.splice
        mse = (
            [f"{s.original_mse:.4g}", f"{s.spliced_mse:.4g}", f"{s.increase:+.4g}"]
            if s is not None
            else ["–"] * 3
        )
        cells = [self.name, self.architecture, str(self.d_sae), f"{self.fvu:.4f}"]
        cells += [f"{self.l0:.2f}", str(self.n_dead), str(self.n_dense), str(self.n_rows)]
        return "| " + " | ".join(cells + mse) + " |"

    def header(self) -> str:
        """The Markdown table header (two lines) that :meth:`row` fits.

        Example:
            >>> from vecinterp.dictionary import FeatureReport
            >>> FeatureReport("x", "relu", 8, 0.5, 2.0, 0, 0, 10, 0.1, None).header()[:17]
            '| dictionary | ar'
        """
        names = ["dictionary", "architecture", "d_sae", "FVU", "L0", "dead"]
        names += [f"dense (> {self.dense_above:g})", "rows"]
        names += ["MSE original", "MSE spliced", "increase"]
        return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)

    def to_markdown(self) -> str:
        """This report as a Markdown table (header and one row); several reports make
        one table with :meth:`markdown_table`."""
        return self.header() + "\n" + self.row()

    @staticmethod
    def markdown_table(reports: Sequence["FeatureReport"]) -> str:
        """Several reports as one Markdown table (the first one's header).

        Example:
            >>> from vecinterp.dictionary import FeatureReport
            >>> r = FeatureReport("x", "relu", 8, 0.5, 2.0, 0, 0, 10, 0.1, None)
            >>> len(FeatureReport.markdown_table([r, r]).splitlines())
            4
        """
        if not reports:
            raise ValueError("no reports to tabulate")
        return "\n".join([reports[0].header()] + [r.row() for r in reports])


def feature_report(
    dictionary: SparseDictionary,
    inputs: torch.Tensor,
    targets: torch.Tensor | None = None,
    *,
    name: str | None = None,
    model: HookedVectorTransformer | None = None,
    point: str | None = None,
    x: torch.Tensor | None = None,
    model_targets: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    dense_above: float = 0.1,
) -> FeatureReport:
    """FVU, L0, dead and dense features of ``dictionary`` on the rows ``inputs`` (and
    ``targets`` for a transcoder; see :func:`evaluate_dictionary`) and, given ``model``,
    the hook ``point`` it is spliced at (default: its ``hook_out``, else ``hook_in``) and
    the model's data ``x``/``model_targets``/``loss_mask``, the MSE without the error
    term (:func:`splice_metric`).

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder, feature_report
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=16,
        ...                         hook_in="blocks.0.hook_resid_mid"))
        >>> x, t = torch.randn(4, 5, 3), torch.randn(4, 5, 3)
        >>> _, cache = model.run_with_cache(x)
        >>> rows = cache["blocks.0.hook_resid_mid"].reshape(-1, 8)
        >>> r = feature_report(sae, rows, model=model, x=x, model_targets=t)
        >>> r.name, r.n_rows, r.splice is not None
        ('blocks.0.hook_resid_mid', 20, True)
    """
    cfg = dictionary.cfg
    stats = evaluate_dictionary(dictionary, inputs, targets, dense_above=dense_above)
    point = point or (cfg.hook_out if cfg.transcoder else None) or cfg.hook_in
    metric = None
    if model is not None:
        if x is None or model_targets is None:
            raise ValueError("with a model, give its inputs x and model_targets")
        if not point:
            raise ValueError("the dictionary names no hook point: pass point=")
        metric = splice_metric(model, {point: dictionary}, x, model_targets, loss_mask)
    arch = cfg.activation + (" transcoder" if cfg.transcoder else "")
    return FeatureReport(
        name=name or point or "dictionary",
        architecture=arch,
        d_sae=cfg.d_sae,
        fvu=stats.fvu,
        l0=stats.l0,
        n_dead=stats.n_dead,
        n_dense=stats.n_dense,
        n_rows=stats.n_rows,
        dense_above=dense_above,
        splice=metric,
    )


def splice_metric(
    model: HookedVectorTransformer,
    dictionaries: Mapping[str, SparseDictionary] | Iterable[tuple[str, SparseDictionary]],
    x: Float[torch.Tensor, "batch pos d_in"],
    targets: Float[torch.Tensor, "batch pos d_out"],
    loss_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None,
) -> SpliceMetric:
    """The task's MSE when ``dictionaries`` replace what they read (spliced without the
    error term) against the original model's, on ``x`` and ``targets``.

    Example:
        >>> import torch, vecinterp as vi
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder, splice_metric
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=16))
        >>> x, t = torch.randn(4, 5, 3), torch.randn(4, 5, 3)
        >>> m = splice_metric(model, {"blocks.0.hook_resid_mid": sae}, x, t)
        >>> abs(m.increase - (m.spliced_mse - m.original_mse)) < 1e-12
        True
    """
    spliced = splice(model, dictionaries, error_term=False)
    with torch.no_grad():
        original = model(x, targets=targets, loss_mask=loss_mask, return_type="loss")
        replaced = spliced(x, targets=targets, loss_mask=loss_mask, return_type="loss")
    return SpliceMetric(float(original), float(replaced), float(replaced) - float(original))
