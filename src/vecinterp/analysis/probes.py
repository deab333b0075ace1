"""Linear probes: where is a continuous variable linearly decodable, hook point by position?

:func:`fit_probes` fits one ridge probe per hook point and position (the penalty chosen by
k-fold cross-validation, in closed form: see :mod:`vecinterp.analysis._ridge`), scores it
on held-out sequences with a bootstrap interval, and computes two controls the same way:
the same architecture randomly initialised, and the targets shuffled across sequences.
Selectivity is R² minus a control's R², in the sense of John Hewitt and Percy Liang,
"Designing and Interpreting Probes with Control Tasks", 2019, arXiv:1909.03368: a probe
that decodes the variable as well from a random network (or decodes shuffled targets)
shows what the probe can do, not what the model computed.
"""

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from ..model import HookedVectorTransformer
from ..model.validation import check_input, check_seed
from ..threads import check_threads, use_threads
from ._points import capture, random_twin, resolve_points
from ._probe_args import (
    CONTROLS,
    cells_of,
    check_alphas,
    check_controls,
    check_positions,
    check_split,
    check_targets,
    undefined_cells,
)
from ._ridge import RidgeCV, RidgeFit, make_split

__all__ = ["ProbeResult", "fit_probes"]

_DEFAULT_ALPHAS = tuple(10.0**e for e in range(-6, 5))
_CELL_BUDGET = 2**25
"""Cells of one hook point are solved together while ``cells * folds * d**2`` stays under
this many float64 numbers (256 MiB per array of that size)."""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The probes of one target at every hook point × position.

    Arrays are float64 on the CPU, laid out ``[point, pos]`` with ``point`` following
    :attr:`hook_names` and ``pos`` following :attr:`positions`. A cell whose target is not
    defined (a per-position target with NaN there) or has no variance on the held-out
    sequences is NaN.

    Attributes:
        target: the target's name (a key of ``targets``).
        hook_names: the full hook names, in the order of the ``point`` axis.
        positions: the positions probed, in the order of the ``pos`` axis.
        r2: held-out R², pooled over the target's outputs: ``1 - SSE / SST`` with both
            sums over held-out sequences and output coordinates (each coordinate centred
            on its own held-out mean).
        r2_low: lower end of the bootstrap interval of ``r2`` (percentile bootstrap over
            held-out sequences; the same resamples for every cell).
        r2_high: upper end of that interval.
        r2_per_output: ``[point, pos, k]``, held-out R² of each output coordinate.
        control_r2: held-out R² of the same probe fitted on the same architecture with
            random weights (NaN if that control was not asked for).
        shuffled_r2: held-out R² of the same probe fitted to targets shuffled across
            sequences (NaN if not asked for); about 0 or below.
        alpha: the relative ridge penalty chosen by cross-validation (the penalty is
            ``alpha * trace(G) / d`` for the centred Gram matrix ``G`` of the activations).
        weight: ``[point, pos, d, k]``, the probe, fitted on every training sequence:
            ``prediction = activation @ weight + bias``. Its columns span the probe's
            subspace (pass ``weight[i, p]`` to :func:`~vecinterp.patch_subspace`).
        bias: ``[point, pos, k]``.
        n_train: training sequences (cross-validated in ``n_folds`` folds).
        n_test: held-out sequences, which every R² is computed on.
        control_seed: the control seed the random model was drawn with (``fit_probes``'s
            ``control_seed``, or the next one if that model shared a weight matrix with
            ``model``: see ``control_seed`` there); ``None`` without that control.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(200, 4, 3)
        >>> probe = vi.fit_probes(model, x, {"x0": x[:, 0, 0]}, "blocks.0.hook_resid_pre",
        ...                       n_bootstrap=20, progress=False)["x0"]
        >>> probe.hook_names, probe.positions
        (('blocks.0.hook_resid_pre',), (0, 1, 2, 3))
        >>> bool(probe.r2[0, 0] > 0.99), bool(probe.r2[0, 3] < 0.1)  # only at position 0
        (True, True)
        >>> probe.weight.shape                 # [point, pos, d_model, k]
        torch.Size([1, 4, 8, 1])
    """

    target: str
    hook_names: tuple[str, ...]
    positions: tuple[int, ...]
    r2: Float[torch.Tensor, "point pos"]
    r2_low: Float[torch.Tensor, "point pos"]
    r2_high: Float[torch.Tensor, "point pos"]
    r2_per_output: Float[torch.Tensor, "point pos k"]
    control_r2: Float[torch.Tensor, "point pos"]
    shuffled_r2: Float[torch.Tensor, "point pos"]
    alpha: Float[torch.Tensor, "point pos"]
    weight: Float[torch.Tensor, "point pos d k"]
    bias: Float[torch.Tensor, "point pos k"]
    n_train: int
    n_test: int
    control_seed: int | None = None

    @property
    def selectivity(self) -> Float[torch.Tensor, "point pos"]:
        """``r2 - control_r2``: what the trained weights add over a random network's."""
        return self.r2 - self.control_r2

    @property
    def shuffled_selectivity(self) -> Float[torch.Tensor, "point pos"]:
        """``r2 - shuffled_r2``: R² above a probe of targets unrelated to the input."""
        return self.r2 - self.shuffled_r2


def fit_probes(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    targets: Mapping[str, torch.Tensor] | torch.Tensor,
    hook_names: str | Sequence[str],
    *,
    positions: Sequence[int] | None = None,
    controls: Sequence[str] = CONTROLS,
    control_seed: int = 0,
    alphas: Sequence[float] = _DEFAULT_ALPHAS,
    n_folds: int = 5,
    test_fraction: float = 0.2,
    n_bootstrap: int = 200,
    ci: float = 0.95,
    seed: int = 0,
    chunk_size: int = 64,
    progress: bool = True,
    threads: int | str | None = None,
) -> dict[str, ProbeResult]:
    """Fit a linear probe for each target at every hook point × position; score held out.

    One pass over ``x`` (``chunk_size`` sequences at a time) captures only the requested
    hook points at the requested positions, stopping after the last block they need; a
    second pass does the same on the random control model. The probes are then solved in
    closed form, batched over positions: ridge regression on the training sequences with
    the penalty (from ``alphas``, relative to the activations' variance) chosen by
    ``n_folds``-fold cross-validation on them, refitted on all of them and scored on the
    held-out ``test_fraction`` of the sequences. Sequences, not positions, are split, so a
    sequence never trains and tests the same probe. Every target, point and control uses
    the same split and the same bootstrap resamples.

    Targets (``batch = x.shape[0]``) are continuous:

    - ``[batch]`` or ``[batch, k]``: one value per sequence (e.g. the affine task's ``c``,
      ``d``), probed at every position. ``[batch, pos]`` (``k`` equal to the number of
      positions) is refused as ambiguous: write a scalar per position as ``[batch, pos,
      1]`` (``t[..., None]``), or ``pos`` values per sequence as ``t[:, None,
      :].expand(-1, pos, -1)``;
    - ``[batch, pos, k]``: one per position (``pos = x.shape[1]``), probed at the same
      position (e.g. ``a_{n-1}`` at position ``n``; a scalar per position is
      ``[batch, pos, 1]``). NaN at a position marks the target undefined there: that
      position's cells are NaN.

    The cost: the capture is one forward pass per model (without the unembedding); then
    per hook point one Gram matrix of its activations (``batch * pos * d**2``) and an
    eigendecomposition per fold and position (``d**3``), shared by all targets and
    controls; the solves run on the CPU in float64 whatever the model's device and dtype.
    Meant for points of residual width; an MLP's ``pre``/``post`` (``d_mlp``
    wide) costs ``(d_mlp / d_model)**3`` times more.

    Args:
        model: the model (not modified).
        x: inputs ``[batch, pos, d_in]``.
        targets: ``{name: tensor}`` as above, or one tensor (then named ``"target"``).
        hook_names: a short name (``"resid_post"``: every layer) or full hook name, or a
            sequence of them; points laid out ``[batch, pos, features]`` only (residual
            points, ``attn_out``, ``mlp_out``, ``pre``/``post``, the embeddings).
        positions: the positions to probe (default: all of ``x``'s).
        controls: which controls to compute, a subset of ``("random_model",
            "shuffled")``; the fields of the others are NaN.
        control_seed: seeds the random model, drawn by ``init_weights`` from a stream
            that no model's ``seed=`` starts (SHA-256 of the seed, one draw discarded), so
            the control never equals a model built with some ``seed=``, ``seed=0`` included;
            if one of its weight matrices still equals ``model``'s, it is drawn again with
            ``control_seed + 1`` (the seed used is :attr:`ProbeResult.control_seed`).
        alphas: the relative ridge penalties cross-validation chooses from (positive).
        n_folds: folds of the cross-validation (at least 2).
        test_fraction: the share of sequences held out for scoring, in (0, 1).
        n_bootstrap: resamples of the held-out sequences for the interval (at least 1).
        ci: the interval's coverage, in (0, 1).
        seed: seed of the split, the folds, the bootstrap and the shuffle.
        chunk_size: sequences per forward pass of the capture.
        progress: show progress bars.
        threads: CPU threads for the call (``torch.set_num_threads``, torch's setting
            restored when it returns): an int >= 1, ``"auto"`` (the idle cores, at most
            torch's setting: :func:`~vecinterp.choose_threads`), or ``None`` (default:
            torch's setting as it is).

    Returns:
        ``{target name: ProbeResult}``.

    Raises:
        ValueError: a target of the wrong shape or non-finite where it must not be; an
            unknown hook name or one not laid out ``[batch, pos, features]``; a position
            out of range; too few sequences for the folds and the test set; an unknown
            control; bad numeric arguments.
        TypeError: arguments of the wrong type.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> x = torch.randn(200, 5, 3)
        >>> probes = vi.fit_probes(model, x, {"x0": x[..., :1]}, "resid_pre",
        ...                        n_bootstrap=20, progress=False)
        >>> probes["x0"].r2.shape                      # [n_layers, pos]
        torch.Size([2, 5])
        >>> bool((probes["x0"].r2[0] > 0.99).all())    # the input itself, at layer 0
        True
    """
    check_threads("threads", threads)
    with use_threads(threads):
        if not isinstance(model, HookedVectorTransformer):
            raise TypeError(
                f"model: expected a HookedVectorTransformer, got {type(model).__name__}"
            )
        x = check_input(x, model.cfg, model.W_E, name="x")
        batch, n_pos = x.shape[0], x.shape[1]
        named = check_targets(targets, batch, n_pos)
        names = resolve_points(model, hook_names, "hook_names")
        pos = check_positions(positions, n_pos)
        wanted = check_controls(controls)
        alpha_grid = check_alphas(alphas)
        check_split(batch, n_folds, test_fraction, n_bootstrap, ci)
        check_seed("seed", seed)
        check_seed("control_seed", control_seed)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        split = make_split(batch, test_fraction, n_folds, n_bootstrap, seed)
        # seed + 1 wrapped into the generator's 64 bits (seed = 2**64 - 1 is accepted): the
        # same stream as seed + 1 for every seed below that
        shuffled_seed = (seed + 1) % 2**64
        shuffle = torch.randperm(batch, generator=torch.Generator().manual_seed(shuffled_seed))
        # per target: [cells or 1, batch, k] in the layout of one hook point's cells (positions)
        ys = {name: cells_of(t, pos) for name, t in named.items()}
        undefined = {name: undefined_cells(t, pos) for name, t in named.items()}
        runs: dict[str, dict[str, list[RidgeFit]]] = {}
        models = {"model": model}
        used_seed = None
        if "random_model" in wanted:
            models["random_model"], used_seed = random_twin(model, control_seed)
        for label, net in models.items():
            acts = capture(
                net,
                x,
                names,
                pos,
                chunk_size=chunk_size,
                progress=progress,
                desc=f"capture {label}",
            )
            shuffled = label == "model" and "shuffled" in wanted
            fits = _solve(
                acts,
                names,
                ys,
                split,
                alpha_grid,
                ci,
                shuffle if shuffled else None,
                progress,
                label,
            )
            for key, value in fits.items():
                runs.setdefault(key, {})[label] = value
        return {
            name: _result(name, names, pos, runs, undefined[name], split, used_seed)
            for name in named
        }


def _solve(
    acts: dict[str, torch.Tensor],
    names: list[str],
    ys: dict[str, torch.Tensor],
    split: object,
    alphas: torch.Tensor,
    ci: float,
    shuffle: torch.Tensor | None,
    progress: bool,
    label: str,
) -> dict[str, list[RidgeFit]]:
    """Per target (and ``name + "/shuffled"``), one fit per hook point over its cells."""
    out: dict[str, list[RidgeFit]] = {}
    for name in tqdm(names, desc=f"probes {label}", disable=not progress):
        act = acts.pop(name).cpu()  # [batch, cells, d], freed as we go; solved on the CPU
        cells, d = act.shape[1], act.shape[2]
        step = max(1, _CELL_BUDGET // (d * d * 8))
        per_chunk: dict[str, list[RidgeFit]] = {}
        for start in range(0, cells, step):
            sl = slice(start, start + step)
            solver = RidgeCV(act[:, sl].transpose(0, 1), split, alphas)  # type: ignore[arg-type]
            for target, y in ys.items():
                y_cells = y if y.shape[0] == 1 else y[sl]
                per_chunk.setdefault(target, []).append(solver.fit(y_cells, ci))
                if shuffle is not None:
                    fit = solver.fit(y_cells[:, shuffle], ci)
                    per_chunk.setdefault(target + "/shuffled", []).append(fit)
        for key, fits in per_chunk.items():
            out.setdefault(key, []).append(_concat(fits))
    return out


def _concat(fits: list[RidgeFit]) -> RidgeFit:
    if len(fits) == 1:
        return fits[0]
    fields = {
        f.name: torch.cat([getattr(r, f.name) for r in fits]) for f in dataclasses.fields(RidgeFit)
    }
    return RidgeFit(**fields)


def _result(
    name: str,
    names: list[str],
    pos: list[int],
    runs: dict[str, dict[str, list[RidgeFit]]],
    undefined: torch.Tensor,
    split: object,
    control_seed: int | None,
) -> ProbeResult:
    def stack(fits: list[RidgeFit] | None, field: str) -> torch.Tensor:
        if fits is None:
            return torch.full((len(names), len(pos)), torch.nan, dtype=torch.float64)
        value = torch.stack([getattr(f, field) for f in fits])
        mask = undefined.reshape(1, -1, *[1] * (value.ndim - 2))
        return value.masked_fill(mask, torch.nan)

    main = runs[name]["model"]
    control = runs[name].get("random_model")
    shuffled = runs.get(name + "/shuffled", {}).get("model")
    return ProbeResult(
        target=name,
        hook_names=tuple(names),
        positions=tuple(pos),
        r2=stack(main, "r2"),
        r2_low=stack(main, "r2_low"),
        r2_high=stack(main, "r2_high"),
        r2_per_output=stack(main, "r2_per_output"),
        control_r2=stack(control, "r2"),
        shuffled_r2=stack(shuffled, "r2"),
        alpha=stack(main, "alpha"),
        weight=stack(main, "weight"),
        bias=stack(main, "bias"),
        n_train=len(split.train),  # type: ignore[attr-defined]
        n_test=len(split.test),  # type: ignore[attr-defined]
        control_seed=control_seed,
    )
