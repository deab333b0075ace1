"""The learning-rate schedule: optional linear warm-up, then constant, cosine or linear decay."""

import math

SCHEDULES = ("constant", "cosine", "linear")


def lr_at(
    step: int,
    *,
    lr: float,
    steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    min_lr: float = 0.0,
) -> float:
    r"""The learning rate of update ``step`` (0-based) of a run of ``steps`` updates.

    With peak rate :math:`\eta` (``lr``), :math:`W` warm-up steps, :math:`S` steps and
    floor :math:`\eta_{\min}` (``min_lr``):

    .. math::
        \eta_s = \begin{cases}
            \eta \, \dfrac{s + 1}{W} & s < W \\[4pt]
            \eta & s \ge W,\ \text{constant} \\[4pt]
            \eta_{\min} + \tfrac12 (\eta - \eta_{\min})
                \left(1 + \cos \pi \dfrac{s - W}{S - W}\right) & s \ge W,\ \text{cosine}
                \\[4pt]
            \eta_{\min} + (\eta - \eta_{\min})
                \left(1 - \dfrac{s - W}{S - W}\right) & s \ge W,\ \text{linear}
        \end{cases}

    The first update already moves (``(0 + 1) / W``), the warm-up ends at the peak, and the
    decay (cosine or linear) starts at the peak and approaches ``min_lr`` at step ``S``.
    The linear decay to zero spends more of the run at a moderate rate than the cosine
    and, on the affine-recurrence task, reached a given MSE in fewer steps.

    Args:
        step: the update, ``0 <= step < steps``.
        lr: peak learning rate (> 0).
        steps: length of the run (>= 1).
        warmup_steps: linear warm-up length, ``0 <= warmup_steps <= steps``.
        schedule: ``"constant"``, ``"cosine"`` or ``"linear"``.
        min_lr: the decay's floor, ``0 <= min_lr <= lr`` (only for ``"cosine"`` and
            ``"linear"``).

    Example:
        >>> from vecinterp.training.schedule import lr_at
        >>> [round(lr_at(s, lr=1.0, steps=6, warmup_steps=2, schedule="cosine"), 4)
        ...  for s in range(6)]
        [0.5, 1.0, 1.0, 0.8536, 0.5, 0.1464]
        >>> [lr_at(s, lr=1.0, steps=6, warmup_steps=2, schedule="linear") for s in range(6)]
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    """
    check_schedule(lr=lr, steps=steps, warmup_steps=warmup_steps, schedule=schedule, min_lr=min_lr)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < steps:
        raise ValueError(f"step must be an int in [0, steps={steps}), got {step!r}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = (step - warmup_steps) / (steps - warmup_steps)
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def check_schedule(
    *, lr: float, steps: int, warmup_steps: int, schedule: str, min_lr: float
) -> None:
    """Raise ``ValueError`` naming the first schedule argument outside its allowed values."""
    check_int("steps", steps, minimum=1)
    check_positive("lr", lr)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    check_int("warmup_steps", warmup_steps, minimum=0)
    if warmup_steps > steps:
        raise ValueError(f"warmup_steps must be <= steps={steps}, got {warmup_steps}")
    if not _is_real(min_lr) or not 0.0 <= min_lr <= lr:
        raise ValueError(f"min_lr must be a number in [0, lr={lr}], got {min_lr!r}")
    if schedule == "constant" and min_lr != 0.0:
        raise ValueError(
            f"min_lr applies only to a decaying schedule ('cosine', 'linear'), got {schedule!r}"
        )


def check_int(name: str, value: object, *, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_positive(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0."""
    if not _is_real(value) or not 0.0 < value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
