"""The reference models shipped inside the package: found there, loaded, and as recorded."""

from pathlib import Path

import pytest
import torch

import vecinterp as vi
from vecinterp.model.io import read_config
from vecinterp.tasks import affine_recurrence as ar

PACKAGE = Path(vi.__file__).resolve().parent


def test_every_reference_model_has_a_folder_and_every_folder_a_name():
    folders = {
        p.name.removeprefix("affine_recurrence_")
        for p in (PACKAGE / "tasks" / "reference").iterdir()
        if p.is_dir() and p.name.startswith("affine_recurrence_")
    }
    assert folders == set(ar.REFERENCE_MODELS) and "fast" in folders
    for name, description in ar.REFERENCE_MODELS.items():
        assert isinstance(description, str) and description and "\n" not in description
        path = ar.reference_path(name)
        assert path == PACKAGE / "tasks" / "reference" / f"affine_recurrence_{name}"
        assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def test_reference_path_is_independent_of_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ar.reference_path().is_absolute()
    assert ar.reference_path() == ar.reference_path("fast")
    assert ar.reference_path().is_relative_to(PACKAGE)


@pytest.mark.parametrize(
    ("name", "recipe", "steps", "bound"),
    [("fast", "fast", 12_000, 1e-4), ("paper", "paper", 100_000, 1.5e-4)],
)
def test_load_reference_reproduces_the_recorded_eval_mse(name, recipe, steps, bound):
    model = ar.load_reference(name)
    assert model.cfg == vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
    _, meta = read_config(ar.reference_path(name))
    assert (meta["recipe"], meta["seed"], meta["steps"]) == (recipe, 0, steps)
    # the eval set examples/train_affine.py measured it on (recorded in the metadata)
    mse = vi.evaluate(model, ar.fixed_eval_set(24, 64, seed=10_000))
    assert mse == pytest.approx(meta["eval_mse"], rel=1e-4)
    assert mse < bound  # a trained model, as REFERENCE_MODELS describes it
    # and loading is exactly vi.load of the folder
    again = vi.load(ar.reference_path(name))
    for (name, p), (_, q) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert torch.equal(p, q), name


def test_load_reference_dtype_and_device():
    model = ar.load_reference("fast", device="cpu", dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    x = ar.generate(2, length=5, seed=0).inputs
    reference = ar.load_reference()(x)
    assert torch.allclose(model(x.double()).float(), reference, atol=1e-5)


def test_unknown_name_lists_the_reference_models():
    with pytest.raises(ValueError, match=r"name must be one of .*'fast'.*got 'paperr'"):
        ar.reference_path("paperr")
    with pytest.raises(ValueError, match=r"name must be one of .*'fast'"):
        ar.load_reference("slow")
    with pytest.raises(TypeError, match="name"):  # ours, or the test run's type checker
        ar.reference_path(0)


def test_bad_dtype_and_device_are_named():
    with pytest.raises(ValueError, match="dtype must be one of"):
        ar.load_reference(dtype=torch.int64)
    with pytest.raises(ValueError, match="device must be a valid torch device"):
        ar.load_reference(device="gpu7")


def test_a_name_without_its_folder_says_what_to_do(monkeypatch):
    monkeypatch.setitem(ar.REFERENCE_MODELS, "not_shipped", "a model whose folder is missing")
    with pytest.raises(FileNotFoundError, match=r"'not_shipped' is missing .*[Rr]einstall"):
        ar.load_reference("not_shipped")
