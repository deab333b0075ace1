"""Distributed alignment search: learn the subspace where the model keeps a variable.

Given pairs of inputs (a base and a source) and, for each pair, the output a high-level
model predicts when one variable of the base takes its value from the source (the
counterfactual: e.g. "the base's recurrence with the source's ``c``"), search for a
``k``-dimensional subspace at one hook point whose interchange (the source's component
in it patched into the base run, :func:`~vecinterp.subspace_patch_hook`) moves the
model's output to the counterfactual. The subspace is ``span(Q)`` with ``Q =
U qr(A).Q`` for a free ``[r, k]`` matrix ``A`` (``U``: an orthonormal basis of the ``r``
dimensions in which source and base activations differ) trained (L-BFGS, or Adam on mini-batches) on
the squared error between the intervened output and the counterfactual.

This is distributed alignment search (DAS) of Atticus Geiger, Zhengxuan Wu, Christopher
Potts, Thomas Icard and Noah Goodman, "Finding Alignments Between Interpretable Causal
Variables and Distributed Neural Representations", 2023, arXiv:2303.02536, for regression
outputs: instead of interchange-intervention accuracy it reports the fraction of the
counterfactual change explained on held-out pairs,
``1 - sum |intervened - counterfactual|^2 / sum |base - counterfactual|^2``
(1: the intervention moves the output exactly to the counterfactual; 0: no better than
leaving the base run alone; negative: worse), and the same search on a randomly
initialised model of the same architecture as the control.
"""

import dataclasses
import math

import torch
from jaxtyping import Bool, Float
from tqdm.auto import tqdm

from ..model import HookedVectorTransformer
from ..model.validation import check_input, check_seed
from ..threads import check_threads, use_threads
from ._alignment_args import (
    Optimiser,
    check_counterfactual,
    check_mask,
    check_optimiser,
    check_position,
    check_test_fraction,
)
from ._points import block_of, capture, random_twin, resolve_points

__all__ = ["AlignmentResult", "alignment_search"]


@dataclasses.dataclass(frozen=True)
class AlignmentResult:
    """The subspace :func:`alignment_search` found, and how well its interchange works.

    Attributes:
        hook_name: the full hook name searched.
        position: the position patched (``None``: every position).
        basis: ``[d, k]``, an orthonormal basis of the subspace (pass it to
            :func:`~vecinterp.patch_subspace`).
        fraction_explained: on the held-out pairs, ``1 - SSE(intervened, counterfactual)
            / SSE(base, counterfactual)``, the sums over the pairs, the positions of
            ``output_mask`` and the output coordinates.
        train_fraction_explained: the same on the training pairs.
        control_fraction_explained: the held-out fraction of the same search on the
            random model (NaN without the control).
        control_basis: the random model's subspace (``None`` without the control).
        loss: the training loss at each evaluation (one per L-BFGS function evaluation,
            one per Adam step): the intervened run's squared error to the counterfactual
            over the base run's, i.e. ``1 - fraction explained`` on the pairs used.
        test_pairs: ``[n_test]``, the indices of the held-out pairs (the others trained).
        control_seed: the control seed the random model was drawn with (``control_seed``,
            or the next one if that model shared a weight matrix with ``model``; see
            :func:`alignment_search`); ``None`` without the control.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> base, source = torch.randn(30, 4, 3), torch.randn(30, 4, 3)
        >>> with torch.no_grad():
        ...     counterfactual = model(source)
        >>> found = vi.alignment_search(model, base, source, counterfactual,
        ...                             "blocks.0.hook_resid_post", k=2, steps=5,
        ...                             progress=False)
        >>> found.basis.shape, found.hook_name, found.position, found.test_pairs.shape
        (torch.Size([8, 2]), 'blocks.0.hook_resid_post', None, torch.Size([6]))
    """

    hook_name: str
    position: int | None
    basis: Float[torch.Tensor, "d k"]
    fraction_explained: float
    train_fraction_explained: float
    control_fraction_explained: float
    control_basis: Float[torch.Tensor, "d k"] | None
    loss: Float[torch.Tensor, " evaluations"]
    test_pairs: torch.Tensor
    control_seed: int | None = None


def alignment_search(
    model: HookedVectorTransformer,
    base_x: Float[torch.Tensor, "batch pos d_in"],
    source_x: Float[torch.Tensor, "batch pos d_in"],
    counterfactual: Float[torch.Tensor, "batch pos d_out"],
    hook_name: str,
    k: int = 1,
    *,
    position: int | None = None,
    output_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None,
    optimizer: str = "lbfgs",
    steps: int = 100,
    lr: float = 0.05,
    batch_size: int | None = None,
    test_fraction: float = 0.2,
    control: bool = True,
    control_seed: int = 0,
    seed: int = 0,
    progress: bool = True,
    threads: int | str | None = None,
) -> AlignmentResult:
    """Learn a ``k``-dimensional subspace whose interchange gives the counterfactual output.

    Pairs ``(base_x[i], source_x[i])`` are split into training and held-out pairs (by
    ``seed``). The intervened run is the base run with ``a + ((s - a) Q) Q^T`` at
    ``hook_name`` (and ``position``), ``Q = qr(A).Q``. On the training pairs, ``A``
    minimises the intervened output's squared error to the counterfactual (summed over
    the positions of ``output_mask`` and the output coordinates) divided by the base
    output's: ``optimizer="lbfgs"`` (default) runs L-BFGS with a strong-Wolfe line
    search on all training pairs for at most ``steps`` iterations; ``"adam"`` runs
    ``steps`` steps of Adam (``lr`` with a cosine decay to ``lr / 1000``) on all training
    pairs or ``batch_size`` drawn at random per step. The runs start at the hook's block
    from the base's cached residual stream; only ``A`` gets gradients (the model's
    ``.grad`` are left alone). The subspace is searched within the span of the
    source-minus-base differences of the activation at the intervened position(s) over
    the training pairs (``Q = U qr(A).Q``, ``U`` an orthonormal basis of that span):
    a direction in which no pair differs changes no interchange, so no interchange can
    identify it, and leaving it out keeps the search well posed (e.g. a positional
    direction, constant across sequences). ``A`` starts from a seeded Gaussian draw; the search is
    not convex, so for a hard case try several seeds and keep the best training fraction.

    Args:
        model: the model (not modified).
        base_x: the base inputs ``[batch, pos, d_in]``.
        source_x: the source inputs, the same shape (pair ``i`` is row ``i`` of both).
        counterfactual: ``[batch, pos, d_out]``, the output the high-level variable
            predicts for the base with the source's value (may hold NaN outside
            ``output_mask``).
        hook_name: one full hook name laid out ``[batch, pos, d]`` (e.g.
            ``"blocks.1.hook_resid_mid"``).
        k: the subspace's dimension, in ``[1, d]``.
        position: the position to intervene on; ``None``: every position (one subspace).
        output_mask: the outputs that count, ``[batch, pos]`` or ``[pos]`` (default all).
        optimizer: ``"lbfgs"`` or ``"adam"``.
        steps: L-BFGS iterations (at most ``1.25 * steps`` evaluations) or Adam steps.
        lr: Adam's peak learning rate (L-BFGS: unused, its line search picks steps).
        batch_size: with Adam, pairs per step (``None``: all training pairs).
        test_fraction: the share of pairs held out, in (0, 1).
        control: also run the same search (same split, same start) on the architecture
            with random weights.
        control_seed: seeds the random model, drawn by ``init_weights`` from a stream
            that no model's ``seed=`` starts (SHA-256 of the seed, one draw discarded), so
            the control never equals a model built with some ``seed=``, ``seed=0`` included;
            if one of its weight matrices still equals ``model``'s, it is drawn again with
            ``control_seed + 1`` (the seed used is ``AlignmentResult.control_seed``).
        seed: seed of the split, the starting ``A`` and the mini-batches.
        progress: show a progress bar over the evaluations.
        threads: CPU threads for the call (``torch.set_num_threads``, torch's setting
            restored when it returns): an int >= 1, ``"auto"`` (the idle cores, at most
            torch's setting: :func:`~vecinterp.choose_threads`), or ``None`` (default:
            torch's setting as it is).

    Returns:
        An :class:`AlignmentResult`.

    Raises:
        ValueError: inputs of different shapes or not valid for the model; a
            counterfactual of the wrong shape or not finite where the mask counts; a hook
            name that is not exactly one ``[batch, pos, d]`` point; a bad ``k``,
            ``position``, ``optimizer``, ``steps``, ``lr``, ``batch_size`` (with L-BFGS)
            or ``test_fraction``.
        TypeError: arguments of the wrong type.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
        >>> base, source = torch.randn(40, 5, 3), torch.randn(40, 5, 3)
        >>> with torch.no_grad():                 # what patching the whole input gives
        ...     counterfactual = model(source)
        >>> found = vi.alignment_search(model, base, source, counterfactual, "hook_embed",
        ...                             k=3, control=False, progress=False)
        >>> found.basis.shape, found.fraction_explained > 0.99
        (torch.Size([8, 3]), True)
    """
    check_threads("threads", threads)
    with use_threads(threads):
        if not isinstance(model, HookedVectorTransformer):
            raise TypeError(
                f"model: expected a HookedVectorTransformer, got {type(model).__name__}"
            )
        base_x = check_input(base_x, model.cfg, model.W_E, name="base_x")
        source_x = check_input(source_x, model.cfg, model.W_E, name="source_x")
        if source_x.shape != base_x.shape:
            raise ValueError(
                f"base_x and source_x must have the same shape, got {tuple(base_x.shape)} and "
                f"{tuple(source_x.shape)}"
            )
        names = resolve_points(model, hook_name, "hook_name")
        if len(names) != 1:
            raise ValueError(
                f"hook_name must name one hook point (a full name such as "
                f"'blocks.1.hook_resid_mid'), got {hook_name!r}, which names {len(names)}"
            )
        name = names[0]
        batch, n_pos = base_x.shape[0], base_x.shape[1]
        mask = check_mask(output_mask, batch, n_pos, base_x.device)
        cf = check_counterfactual(counterfactual, batch, n_pos, model, mask)
        pos = check_position(position, n_pos)
        how = check_optimiser(optimizer, steps, lr, batch_size)
        check_test_fraction(test_fraction, batch)
        check_seed("seed", seed)
        check_seed("control_seed", control_seed)
        if not isinstance(control, bool):
            raise TypeError(f"control must be a bool, got {control!r}")
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(batch, generator=gen)
        n_test = max(1, round(test_fraction * batch))
        test, train = order[:n_test].sort().values, order[n_test:].sort().values
        run = _Search(model, base_x, source_x, cf, mask, name, pos)
        d = run.source.shape[-1]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d:
            raise ValueError(f"k must be an int in [1, {d}] (the hook point's width), got {k!r}")
        basis, loss = run.fit(k, train, how, seed, progress)
        control_basis, control_fraction, used_seed = None, math.nan, None
        if control:
            random_model, used_seed = random_twin(model, control_seed)
            twin = _Search(random_model, base_x, source_x, cf, mask, name, pos)
            control_basis, _ = twin.fit(k, train, how, seed, progress)
            control_fraction = twin.fraction(control_basis, test)
        return AlignmentResult(
            hook_name=name,
            position=pos,
            basis=basis,
            fraction_explained=run.fraction(basis, test),
            train_fraction_explained=run.fraction(basis, train),
            control_fraction_explained=control_fraction,
            control_basis=control_basis,
            loss=loss,
            test_pairs=test,
            control_seed=used_seed,
        )


class _Search:
    """One model's cached runs: the base residual entering the hook's block, the source
    activations at the hook point, the base outputs."""

    def __init__(
        self,
        model: HookedVectorTransformer,
        base_x: torch.Tensor,
        source_x: torch.Tensor,
        cf: torch.Tensor,
        mask: torch.Tensor,
        name: str,
        pos: int | None,
    ) -> None:
        self.model, self.cf, self.mask, self.name, self.pos = model, cf, mask, name, pos
        block = block_of(name)
        self.start = 0 if block is None else model.cfg.n_layers if block == -1 else block
        n_pos = base_x.shape[1]
        with torch.no_grad():
            self.resid = model(base_x, stop_at_layer=self.start) if self.start else base_x
            self.source, base = (
                capture(model, x, [name], range(n_pos), chunk_size=len(x), progress=False, desc="")[
                    name
                ]
                for x in (source_x, base_x)
            )
            self.diff = self.source - base
            self.base_out = model(base_x)

    def span(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        """``[d, r]``: an orthonormal basis of the span of the source-minus-base
        differences at the intervened position(s) over the pairs ``rows``."""
        diff = self.diff[rows] if self.pos is None else self.diff[rows, self.pos]
        diff = diff.reshape(-1, diff.shape[-1]).to(torch.float64)
        _, s, vh = torch.linalg.svd(diff, full_matrices=False)
        tol = max(diff.shape) * torch.finfo(self.diff.dtype).eps * float(s.max())
        rank = int((s > tol).sum()) if float(s.max()) > 0 else 0
        if rank < k:
            raise ValueError(
                f"at {self.name!r} the source and base activations differ in a space of "
                f"dimension {rank} only (over the training pairs), so no {k}-dimensional "
                "subspace can be identified; lower k or use pairs that differ more"
            )
        return vh[:rank].T.to(self.source.dtype)

    def output(self, q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        where = (slice(None), slice(None) if self.pos is None else self.pos)
        source = self.source[rows]

        def hook(act: torch.Tensor, hook: object) -> torch.Tensor:
            patched = act.clone()
            a = act[where]
            patched[where] = a + ((source[where] - a) @ q) @ q.mT
            return patched

        resid = self.resid[rows]
        with self.model.hooks(fwd_hooks=[(self.name, hook)]):
            return self.model(resid, start_at_layer=self.start) if self.start else self.model(resid)

    def sse(self, out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        err = (out - self.cf[rows]).pow(2).sum(-1)
        return torch.where(self.mask[rows], err, 0.0).sum()

    def fit(
        self, k: int, train: torch.Tensor, how: "Optimiser", seed: int, progress: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The basis ``[d, k]`` found, and the loss at each evaluation."""
        span = self.span(train, k)
        gen = torch.Generator().manual_seed(seed)
        start = torch.randn(span.shape[1], k, generator=gen, dtype=torch.float64)
        a = start.to(device=span.device, dtype=span.dtype).requires_grad_(True)
        base_sse: dict[int, torch.Tensor] = {}
        losses: list[float] = []

        def loss_of(rows: torch.Tensor) -> torch.Tensor:
            key = id(rows)
            if key not in base_sse:
                with torch.no_grad():
                    base_sse[key] = self.sse(self.base_out[rows], rows).clamp_min(
                        torch.finfo(a.dtype).tiny
                    )
            q = span @ torch.linalg.qr(a).Q
            loss = self.sse(self.output(q, rows), rows) / base_sse[key]
            (grad,) = torch.autograd.grad(loss, [a])
            a.grad = grad.contiguous()
            losses.append(float(loss.detach()))
            return loss.detach()

        bar = tqdm(total=how.steps, desc="alignment search", disable=not progress)
        if how.optimizer == "lbfgs":
            opt: torch.optim.Optimizer = torch.optim.LBFGS(
                [a],
                lr=1,
                max_iter=how.steps,
                line_search_fn="strong_wolfe",
                tolerance_grad=1e-14,
                tolerance_change=1e-16,
                history_size=20,
            )

            def closure() -> float:
                bar.update(1)
                return float(loss_of(train))

            opt.step(closure)
        else:
            opt = torch.optim.Adam([a], lr=how.lr)
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
                opt, how.steps, eta_min=how.lr / 1000
            )
            for _ in range(how.steps):
                rows = train
                if how.batch_size is not None and how.batch_size < len(train):
                    rows = train[torch.randperm(len(train), generator=gen)[: how.batch_size]]
                    base_sse.clear()
                loss_of(rows)
                opt.step()
                schedule.step()
                bar.update(1)
        bar.close()
        with torch.no_grad():
            basis = span @ torch.linalg.qr(a).Q
        return basis.detach(), torch.tensor(losses, dtype=torch.float64)

    def fraction(self, basis: torch.Tensor, rows: torch.Tensor) -> float:
        with torch.no_grad():
            sse = self.sse(self.output(basis, rows), rows)
            base = self.sse(self.base_out[rows], rows)
        return float(1 - sse / base) if float(base) > 0 else math.nan
