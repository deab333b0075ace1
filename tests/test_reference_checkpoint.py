"""The shipped affine-recurrence checkpoint loads and meets the paper's eval MSE."""

from pathlib import Path

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "affine_recurrence"


def test_reference_checkpoint_eval_mse_is_at_most_1e_4():
    model = vi.load(CHECKPOINT)
    assert model.cfg == vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
    eval_set = ar.fixed_eval_set(24, 64, seed=10_000)  # the set examples/train_affine.py uses
    assert vi.evaluate(model, eval_set) <= 1e-4
