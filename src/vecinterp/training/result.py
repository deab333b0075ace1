"""What :func:`vecinterp.training.train` returns, and the error it raises on divergence."""

import dataclasses
from pathlib import Path

import torch

from ..model.transformer import HookedVectorTransformer

_PER_STEP = ("steps", "train_loss", "lr", "grad_norm", "wall_time")
_PER_EVAL = ("eval_steps", "eval_loss")


@dataclasses.dataclass
class TrainHistory:
    """The loss history of a run, as plain lists ready to plot.

    Step ``s`` is the update that reads batch ``s`` (0-based); "the state at step ``s``"
    is the model after ``s`` updates.

    Attributes:
        steps: ``0, 1, ..., steps - 1``, one entry per update.
        train_loss: masked MSE of batch ``s`` under the weights before update ``s``.
        lr: the learning rate used by update ``s``.
        grad_norm: total L2 norm of the gradient of update ``s``, before clipping.
        wall_time: seconds since the run started (summed over resumed segments) at the end
            of update ``s``.
        eval_steps: the states that were evaluated, as numbers of updates done
            (``0`` is the initial model, ``steps`` the final one).
        eval_loss: the evaluation loss at each of ``eval_steps``.

    Example:
        >>> from vecinterp.training.result import TrainHistory
        >>> TrainHistory().train_loss
        []
    """

    steps: list[int] = dataclasses.field(default_factory=list)
    train_loss: list[float] = dataclasses.field(default_factory=list)
    lr: list[float] = dataclasses.field(default_factory=list)
    grad_norm: list[float] = dataclasses.field(default_factory=list)
    wall_time: list[float] = dataclasses.field(default_factory=list)
    eval_steps: list[int] = dataclasses.field(default_factory=list)
    eval_loss: list[float] = dataclasses.field(default_factory=list)

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The history as int64 / float64 vectors (for checkpoints; exact round trip)."""
        out = {}
        for name in _PER_STEP + _PER_EVAL:
            dtype = torch.int64 if name.endswith("steps") else torch.float64
            out[name] = torch.tensor(getattr(self, name), dtype=dtype)
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "TrainHistory":
        """Inverse of :meth:`to_tensors`."""
        return cls(**{name: tensors[name].tolist() for name in _PER_STEP + _PER_EVAL})


@dataclasses.dataclass
class TrainResult:
    """The outcome of :func:`vecinterp.training.train`.

    Attributes:
        model: the trained model (a new model; the one passed in is left unchanged): the
            weight average if ``train`` was given ``ema_decay``, else the last iterate.
        history: the :class:`TrainHistory`.
        optimizer: the AdamW optimizer, in its final state.
        device: where the model was trained.
        checkpoint: the newest checkpoint written (or resumed from), or ``None``.
        raw_model: the last iterate of the optimizer; the same object as ``model`` when
            no weight average was kept.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> def make_batch(step, gen):  # (inputs, targets), [batch, pos, d_in/d_out]
        ...     x = torch.randn(8, 4, 2, generator=gen)
        ...     return x, -x
        >>> result = vi.train(model, make_batch, steps=5, lr=1e-2, progress=False, device="cpu")
        >>> result.model is model, len(result.history.train_loss), result.device, result.checkpoint
        (False, 5, device(type='cpu'), None)
        >>> result.raw_model is result.model  # no ema_decay: no separate average
        True
    """

    model: HookedVectorTransformer
    history: TrainHistory
    optimizer: torch.optim.Optimizer
    device: torch.device
    checkpoint: Path | None = None
    raw_model: HookedVectorTransformer | None = None


class TrainingDivergedError(FloatingPointError):
    """Raised when a loss or gradient norm turns NaN or infinite; names the step.

    No checkpoint holds the failing update or a later one: every checkpoint already
    written holds a good state, the newest (``checkpoint``) the last one checked. (The
    run's own copy of the model may have taken up to ``sync_every - 1`` more updates on
    the device before the values were read; it is dropped with the run.)

    Attributes:
        step: the step whose loss (or gradient) was not finite.
        quantity: what was not finite (``"loss"``, ``"gradient norm"``, ``"eval loss"``).
        value: the non-finite value.
        checkpoint: the newest checkpoint (the one to resume from), or ``None``.
        cause: when the data are to blame, what is wrong with them (the batch's targets
            hold NaN or inf at a position the loss uses, named with the first index);
            ``None`` for a divergence of the optimisation.

    Example:
        >>> import torch, vecinterp as vi
        >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        ...     d_in=2, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=4), seed=0)
        >>> def bad_batch(step, gen):  # targets blow up at step 1
        ...     return torch.randn(2, 4, 2), torch.full((2, 4, 2), 1e30 if step == 1 else 0.0)
        >>> try:
        ...     vi.train(model, bad_batch, steps=3, lr=1e-3, progress=False, device="cpu")
        ... except vi.TrainingDivergedError as err:
        ...     print(err.step, err.quantity, err.value, err.checkpoint)
        1 loss inf None
    """

    def __init__(
        self,
        step: int,
        quantity: str,
        value: float,
        checkpoint: Path | None,
        cause: str | None = None,
    ):
        self.step, self.quantity, self.value, self.checkpoint = step, quantity, value, checkpoint
        self.cause = cause
        kept = (
            f"; the last good checkpoint, {checkpoint}, is kept" if checkpoint is not None else ""
        )
        if cause is not None:  # the data, not the optimisation
            super().__init__(
                f"training stopped: the {quantity} is {value} at step {step} because {cause}; "
                f"stopped before updating the weights{kept}. Fix the data (a target may be "
                "NaN only where loss_mask is False)"
            )
            return
        super().__init__(
            f"training diverged: the {quantity} is {value} at step {step}; stopped before "
            f"updating the weights{kept}. Try a lower lr, warmup_steps or grad_clip, and "
            "check the data for NaN/inf"
        )
