"""Training: one loop for every task (masked MSE, AdamW, checkpoints, exact resume).

- :func:`train` — the loop; returns a :class:`TrainResult` with a :class:`TrainHistory`.
- :func:`train_ensemble` — K models of one config as one batched computation; returns an
  :class:`EnsembleResult` of K :class:`TrainResult`.
- :func:`evaluate` — mean masked MSE over an evaluation set.
- :func:`lr_at` — the warm-up + constant/cosine/linear learning-rate schedule.
- :func:`latest_checkpoint` — the newest checkpoint of a run (load its model with
  ``vecinterp.load(path / "model")``).
- :func:`default_device` — ``cuda`` if present, else ``cpu``.
- :class:`TrainingDivergedError` — a NaN/inf loss, with the step.
- :class:`SlowTrainingWarning` — training steps became far slower than the first ones
  (busy CPU cores: pass ``threads=1``).
- :class:`RankFailedError` — raised on the other ranks when one rank of a data-parallel run
  (or of an ensemble split across ranks) fails; :func:`one_process` trains on this process
  alone even under ``torchrun``.
"""

from ._speed import SlowTrainingWarning
from .checkpoint import latest_checkpoint
from .data import evaluate
from .distributed import RankFailedError, one_process
from .ensemble import EnsembleResult, train_ensemble
from .loop import train
from .result import TrainHistory, TrainingDivergedError, TrainResult
from .schedule import lr_at
from .setup import default_device

__all__ = [
    "EnsembleResult",
    "RankFailedError",
    "SlowTrainingWarning",
    "TrainHistory",
    "TrainResult",
    "TrainingDivergedError",
    "default_device",
    "evaluate",
    "latest_checkpoint",
    "lr_at",
    "one_process",
    "train",
    "train_ensemble",
]
