"""save/load: bitwise round trips, a pickle-free format, clear errors, atomic writes."""

import json
import os
import pickle
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg
from vecinterp.model import io
from vecinterp.model.components.pos_embed import sinusoidal_table
from vecinterp.model.io import read_config

CFGS = {
    "LN-learned": tiny_cfg(),
    "RMS-sinusoidal-gelu": tiny_cfg(normalization="RMS", positional="sinusoidal", act_fn="gelu"),
    "none-rotary-attn_only-bias": tiny_cfg(
        normalization=None, positional="rotary", attn_only=True, embed_bias=True
    ),
    "RMSPre-none-noncausal-1L": tiny_cfg(
        normalization="RMSPre", positional="none", causal=False, n_layers=1, d_out=2
    ),
}
DTYPES = {"f32": torch.float32, "f64": torch.float64}


def assert_identical(a: vi.HookedVectorTransformer, b: vi.HookedVectorTransformer) -> None:
    assert a.cfg == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    x = random_input(a.cfg, batch=2, seed=4, dtype=a.embed.W_E.dtype)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


@pytest.fixture
def saved(tmp_path) -> tuple[vi.HookedVectorTransformer, Path]:
    model = random_model(tiny_cfg())
    return model, vi.save(model, tmp_path / "run")


def edit_config(directory: Path, edit) -> None:
    file = directory / "config.json"
    record = json.loads(file.read_text())
    edit(record)
    file.write_text(json.dumps(record))


def edit_weights(directory: Path, edit) -> None:
    file = directory / "model.safetensors"
    tensors = safetensors.torch.load_file(str(file))
    edit(tensors)
    safetensors.torch.save_file(tensors, str(file))


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_round_trip_is_bitwise(tmp_path, cfg, dtype):
    model = random_model(cfg, dtype=dtype)
    directory = vi.save(model, tmp_path / "run")
    assert directory == tmp_path / "run"
    loaded = vi.load(directory)
    assert loaded.embed.W_E.dtype == dtype
    assert_identical(model, loaded)
    assert_identical(model, vi.load(str(directory), device="cpu"))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_round_trip_of_a_processed_sinusoidal_model(tmp_path, dtype):
    cfg = tiny_cfg(positional="sinusoidal", embed_bias=True)
    processed = vi.process_weights(random_model(cfg, dtype=dtype))
    assert processed.cfg.normalization == "LNPre"
    loaded = vi.load(vi.save(processed, tmp_path / "run"))
    assert loaded.cfg.normalization == "LNPre"
    assert_identical(processed, loaded)
    # the centred W_pos is what comes back, not a freshly built sinusoidal table
    table = sinusoidal_table(cfg.n_ctx, cfg.d_model).to(dtype)
    assert not torch.equal(loaded.pos_embed.W_pos, table)
    assert float(loaded.pos_embed.W_pos.mean(-1).abs().max()) <= 1e-6


def test_metadata_round_trips(tmp_path):
    model = random_model(tiny_cfg())
    metadata = {"step": 1200, "loss": 0.125, "note": "affine", "nested": {"a": [1, 2.5, None]}}
    vi.save(model, tmp_path / "run", metadata=metadata)
    cfg, read = read_config(tmp_path / "run")
    assert cfg == model.cfg
    assert read == metadata
    vi.save(model, tmp_path / "plain")
    assert read_config(str(tmp_path / "plain")) == (model.cfg, {})


def test_save_overwrites_and_creates_parents(tmp_path):
    a = random_model(tiny_cfg(), seed=0)
    b = random_model(tiny_cfg(normalization="RMS", n_layers=1), seed=1)
    target = tmp_path / "deep" / "er" / "run"
    vi.save(a, target)
    vi.save(b, target)
    assert_identical(b, vi.load(target))
    assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]


# ---------------------------------------------------------------- the format


def test_directory_holds_safetensors_and_json_only(saved):
    model, directory = saved
    assert sorted(os.listdir(directory)) == ["config.json", "model.safetensors"]
    record = json.loads((directory / "config.json").read_text())
    assert record["config"] == model.cfg.to_dict()
    assert record["format"] == "vecinterp-model"
    assert record["metadata"] == {}
    assert vi.VectorTransformerConfig.from_dict(record["config"]) == model.cfg
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == sorted(model.state_dict())
        assert torch.equal(f.get_tensor("unembed.W_U"), model.unembed.W_U.detach())


def test_loading_never_unpickles(saved, monkeypatch):
    model, directory = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("load must not unpickle")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    assert_identical(model, vi.load(directory))


# ---------------------------------------------------------------- errors on load


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved model"):
        vi.load(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError):
        vi.load(tmp_path / "file")


def test_missing_weights_file(saved):
    _, directory = saved
    (directory / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        vi.load(directory)


def test_missing_config_file(saved):
    _, directory = saved
    (directory / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        vi.load(directory)
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_config(directory)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: data[: len(data) // 2],
        lambda data: data[:-1],
        lambda data: b"",
        lambda data: b"\xff" * 8 + data[8:],
        lambda data: data[:8] + b"\x00" * 16 + data[24:],
        lambda data: b"not a safetensors file at all",
    ],
    ids=["half", "last-byte", "empty", "header-length", "header-json", "text"],
)
def test_corrupted_weights(saved, corrupt):
    _, directory = saved
    file = directory / "model.safetensors"
    file.write_bytes(corrupt(file.read_bytes()))
    with pytest.raises(ValueError, match="model.safetensors"):
        vi.load(directory)


@pytest.mark.parametrize(
    "data", [b"{not json", b"", b"\xff\xfe{\x00"], ids=["json", "empty", "utf8"]
)
def test_corrupted_json(saved, data):
    _, directory = saved
    (directory / "config.json").write_bytes(data)
    with pytest.raises(ValueError, match="config.json"):
        vi.load(directory)


@pytest.mark.parametrize("record", [[1, 2], {"config": {}}, {"format": "other"}, "vecinterp-model"])
def test_json_that_is_not_a_vecinterp_config(saved, record):
    _, directory = saved
    (directory / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="not a vecinterp model config"):
        vi.load(directory)


def test_newer_format_version(saved):
    _, directory = saved
    edit_config(directory, lambda r: r.update(format_version=99))
    with pytest.raises(ValueError, match="upgrade vecinterp"):
        vi.load(directory)


def test_config_without_its_config_record(saved):
    _, directory = saved
    edit_config(directory, lambda r: r.pop("config"))
    with pytest.raises(ValueError, match="config.json"):
        vi.load(directory)


def test_config_missing_a_field(saved):
    _, directory = saved
    edit_config(directory, lambda r: r["config"].pop("d_in"))
    with pytest.raises(ValueError, match="d_in"):
        vi.load(directory)


def test_unknown_config_field(saved):
    _, directory = saved
    edit_config(directory, lambda r: r["config"].update(dropout=0.1))
    with pytest.raises(ValueError, match="unknown VectorTransformerConfig fields.*dropout"):
        vi.load(directory)


def test_invalid_config_value(saved):
    _, directory = saved
    edit_config(directory, lambda r: r["config"].update(normalization="BatchNorm"))
    with pytest.raises(ValueError, match="normalization"):
        vi.load(directory)


def test_config_disagreeing_with_the_weights(saved):
    _, directory = saved
    edit_config(directory, lambda r: r["config"].update(d_model=12))
    with pytest.raises(ValueError, match="wrong shapes") as err:
        vi.load(directory)
    message = str(err.value)
    assert "model.safetensors" in message
    assert "embed.W_E: expected (3, 12), got (3, 8)" in message
    # the first three mismatches and a count, not all 29 (which took ~2,000 characters)
    assert "(29 tensor(s) differ)" in message and message.endswith("… and 26 more")
    assert len(message) < 500 and "unembed.W_U" not in message


def test_config_with_another_layer_count(saved):
    _, directory = saved
    edit_config(directory, lambda r: r["config"].update(n_layers=3))
    with pytest.raises(ValueError, match=r"missing \[.*'blocks\.2\.attn\.W_Q'"):
        vi.load(directory)


def test_extra_tensor(saved):
    _, directory = saved
    edit_weights(directory, lambda t: t.update(extra=torch.zeros(2)))
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        vi.load(directory)


def test_missing_tensors(saved):
    _, directory = saved

    def drop(tensors):
        del tensors["blocks.0.attn.W_Q"]
        del tensors["ln_final.b"]

    edit_weights(directory, drop)
    with pytest.raises(ValueError, match=r"missing \['blocks\.0\.attn\.W_Q', 'ln_final\.b'\]"):
        vi.load(directory)


def test_missing_and_extra_together(saved):
    _, directory = saved

    def swap(tensors):
        tensors["unembed.W_U_renamed"] = tensors.pop("unembed.W_U")

    edit_weights(directory, swap)
    with pytest.raises(ValueError) as err:
        vi.load(directory)
    assert "missing ['unembed.W_U']" in str(err.value)
    assert "unexpected ['unembed.W_U_renamed']" in str(err.value)


# ---------------------------------------------------------------- errors on save


@pytest.mark.parametrize(
    "thing", [torch.nn.Linear(2, 2), {"embed.W_E": torch.zeros(3, 8)}, None], ids=str
)
def test_save_refuses_a_non_model(tmp_path, thing):
    with pytest.raises(TypeError, match="HookedVectorTransformer"):
        vi.save(thing, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_save_into_a_file(tmp_path):
    file = tmp_path / "taken"
    file.write_text("keep me")
    with pytest.raises(ValueError, match="not a directory"):
        vi.save(random_model(tiny_cfg()), file)
    assert file.read_text() == "keep me"


def test_unserialisable_metadata_writes_nothing(saved):
    model, directory = saved
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    other = random_model(tiny_cfg(), seed=5)
    with pytest.raises(TypeError):
        vi.save(other, directory, metadata={"generator": object()})
    assert {name: (directory / name).read_bytes() for name in os.listdir(directory)} == before
    assert_identical(model, vi.load(directory))


# ---------------------------------------------------------------- atomic writes


def test_no_temporary_files_remain(tmp_path):
    model = random_model(tiny_cfg())
    for _ in range(2):
        vi.save(model, tmp_path / "run")
        assert sorted(os.listdir(tmp_path / "run")) == ["config.json", "model.safetensors"]


def test_a_failed_weights_write_leaves_the_previous_save_intact(saved, monkeypatch):
    model, directory = saved
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    real_save_file = io.save_file
    calls = []

    def crash_midway(tensors, filename, *args, **kwargs):
        calls.append(filename)
        real_save_file(tensors, filename, *args, **kwargs)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])  # the disk filled up ...
        raise OSError("No space left on device")  # ... and the write failed

    monkeypatch.setattr(io, "save_file", crash_midway)
    other = random_model(tiny_cfg(n_layers=1, normalization="RMS"), seed=3)
    with pytest.raises(OSError, match="No space left"):
        vi.save(other, directory)
    assert len(calls) == 1
    assert Path(calls[0]) != directory / "model.safetensors"  # it wrote to a temporary file
    assert sorted(os.listdir(directory)) == ["config.json", "model.safetensors"]
    after = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    assert after == before
    monkeypatch.undo()
    assert_identical(model, vi.load(directory))


def test_a_failed_first_save_leaves_no_weights_file(tmp_path, monkeypatch):
    def crash(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"\x00" * 10)
        raise RuntimeError("interrupted")

    monkeypatch.setattr(io, "save_file", crash)
    with pytest.raises(RuntimeError, match="interrupted"):
        vi.save(random_model(tiny_cfg()), tmp_path / "run")
    assert os.listdir(tmp_path / "run") == []
    with pytest.raises(FileNotFoundError):
        vi.load(tmp_path / "run")
