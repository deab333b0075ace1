"""affine_claims.discover_affine_circuit: the documented setting (threshold a fraction of
the fully corrupted metric, the metric the distance to the model's own output), and the
example's --acdc."""

import pytest
import torch

import vecinterp as vi
from helpers import unchecked
from vecinterp.tasks import affine_claims as ac
from vecinterp.tasks import affine_recurrence as ar


@pytest.fixture(scope="module")
def model():
    return vi.HookedVectorTransformer(vi.VectorTransformerConfig(**ac.FAST_MODEL_CONFIG), seed=0)


def test_threshold_is_tau_times_the_corrupted_metric_and_the_full_model_scores_zero(model):
    result = ac.discover_affine_circuit(model, tau=0.05, n=6, length=8)
    assert result.full_metric == 0.0  # the metric is the distance to the model itself
    assert result.threshold == pytest.approx(0.05 * result.corrupted_metric, rel=1e-12)
    clean = ar.generate(6, length=8, dim=model.cfg.d_in, seed=1)
    corrupted = ar.generate(6, length=8, dim=model.cfg.d_in, seed=2)
    with torch.no_grad():
        expected = vi.masked_mse(model(corrupted.inputs), model(clean.inputs), clean.loss_mask)
    assert result.corrupted_metric == pytest.approx(float(expected), rel=1e-6)


def test_the_same_as_discover_circuit_called_by_hand(model):
    clean = ar.generate(5, length=9, dim=model.cfg.d_in, seed=3)
    corrupted = ar.generate(5, length=9, dim=model.cfg.d_in, seed=4)
    with torch.no_grad():
        reference = model(clean.inputs)
        scale = float(vi.masked_mse(model(corrupted.inputs), reference, clean.loss_mask))
    by_hand = vi.discover_circuit(
        model,
        clean.inputs,
        corrupted.inputs,
        threshold=0.02 * scale,
        metric=lambda y: vi.masked_mse(y, reference, clean.loss_mask),
        progress=False,
    )
    ours = ac.discover_affine_circuit(model, tau=0.02, n=5, length=9, seed=3)
    assert ours.edges == by_hand.edges
    assert ours.metric == by_hand.metric


@pytest.mark.parametrize("bad", [0, -0.1, float("inf"), float("nan"), True])
def test_bad_tau(model, bad):
    with unchecked(), pytest.raises(ValueError, match="tau must be a positive fraction"):
        ac.discover_affine_circuit(model, tau=bad)


def test_the_example_adds_the_circuit_to_its_report(tmp_path):
    pytest.importorskip("matplotlib")
    import contextlib
    import importlib.util
    import io
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "affine_recurrence.py"
    spec = importlib.util.spec_from_file_location("affine_example_acdc", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--fast", "--acdc", "--no-progress", "--threads", "1", "--out", str(tmp_path)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        example.main(argv)
    assert "automated circuit discovery (ACDC)" in printed.getvalue()
    report = (tmp_path / "report.md").read_text()
    assert "## Circuit found by ACDC" in report and "edges kept" in report
    assert "![circuit.png](circuit.png)" in report
    assert (tmp_path / "circuit.png").stat().st_size > 0
