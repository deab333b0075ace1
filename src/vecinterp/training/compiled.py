"""The training step under ``torch.compile`` (``train(compile=True)``,
``train_ensemble(compile=True)``).

For ``train``, the forward pass and the masked MSE are compiled as one graph;
AOTAutograd compiles its backward with it. For ``train_ensemble``, the K members'
batched forward pass (the ensemble's masked losses are two kernels, left eager). The
gradient clipping and AdamW stay as they are in eager training: both are already fused
kernels per step on a CPU or a GPU (``clip_grad_norm_``'s fused norm, the fused AdamW),
so compiling them would change their rounding and save little.
"""

from collections.abc import Callable

import torch

from ..loss import loss_positions, mse_at
from ._stacked import forward as stacked_forward
from .data import Tensors

StepLoss = Callable[[torch.nn.Module, Tensors, str], tuple[torch.Tensor, torch.Tensor]]


def compiled_step_loss() -> StepLoss:
    """A compiled :func:`~vecinterp.training.data.step_loss`: the same ``(loss,
    inputs_finite)`` from ``(model, parts, where)``, equal to it to rounding.

    NaN/inf inputs: the flag ``inputs_finite`` is computed in the graph from the batch as
    given, and the model is shown ``inputs.nan_to_num()`` (the inputs themselves when
    they are finite, so the loss does not change), so that the model's own in-graph
    assert never fires before the training loop reads the flag and names the batch, as
    in eager training. A fresh compiled function per call (one per training run), so
    that runs do not share recompilations.
    """
    terms = torch.compile(_loss_terms)

    def step(
        model: torch.nn.Module, parts: Tensors, where: str = "batch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets, mask = parts
        d_out = model.cfg.d_out  # type: ignore[union-attr]
        expected = (*inputs.shape[:2], d_out)
        if tuple(targets.shape) != expected:  # where step_loss checks it, on the host
            raise ValueError(
                f"{where}: targets have shape {tuple(targets.shape)}, but the model's outputs "
                f"[batch, pos, d_out] have {expected}"
            )
        loss, finite = terms(model, inputs, targets, mask)
        return loss, finite

    return step


def _loss_terms(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    finite = torch.isfinite(inputs).all()
    out = model(torch.nan_to_num(inputs))
    count = loss_positions(mask, out.shape[:-1], out.device).sum()
    return mse_at(out, targets, mask, reduction="sum") / count, finite


def compiled_stacked_forward() -> Callable[..., torch.Tensor]:
    """The K-member forward pass of :func:`~vecinterp.train_ensemble`
    (:func:`vecinterp.training._stacked.forward`) under ``torch.compile``: same
    arguments, outputs equal to rounding; its backward is compiled with it. One fresh
    compiled function per call (one per training run)."""
    return torch.compile(stacked_forward)
