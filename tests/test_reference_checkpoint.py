"""The shipped affine-recurrence checkpoint loads and meets the paper's eval MSE."""

import vecinterp as vi
from vecinterp.model.io import read_config
from vecinterp.tasks import affine_recurrence as ar

CHECKPOINT = ar.reference_path("fast")


def test_reference_checkpoint_eval_mse_is_at_most_1e_4():
    model = vi.load(CHECKPOINT)
    assert model.cfg == vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
    eval_set = ar.fixed_eval_set(24, 64, seed=10_000)  # the set examples/train_affine.py uses
    assert vi.evaluate(model, eval_set) <= 1e-4


def test_reference_checkpoint_was_trained_with_the_fast_recipe():
    _, meta = read_config(CHECKPOINT)
    r = ar.FAST_RECIPE
    assert (meta["steps"], meta["batch_size"], meta["lr"], meta["schedule"]) == (
        r["steps"], r["batch_size"], r["lr"], r["schedule"]
    )  # fmt: skip
    assert meta["warmup"] == r["warmup_steps"]
