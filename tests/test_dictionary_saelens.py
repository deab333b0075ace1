"""SAELens's on-disk layout (vecinterp.dictionary.saelens), checked against the layout of
SAELens 6.54.12 as its source documents it (against SAELens itself: the live tests): round
trips ours -> SAELens files -> ours bit for bit, files by hand read as SAELens's formulas
say, the files we write laid out as SAELens writes them, and refusals."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import random_dictionary
from vecinterp.dictionary import (
    SAELENS_VERSION,
    SparseDictionary,
    load_saelens,
    save_saelens,
)

KINDS = [
    ("standard", dict(activation="relu")),
    ("topk", dict(activation="topk", k=3)),
    ("jumprelu", dict(activation="jumprelu")),
    ("jumprelu", dict(activation="batchtopk", k=3)),
    ("transcoder", dict(activation="relu", transcoder=True, d_out=5)),
    ("skip_transcoder", dict(activation="relu", transcoder=True, d_out=5, skip=True)),
    ("jumprelu_transcoder", dict(activation="jumprelu", transcoder=True, d_out=5)),
    (
        "jumprelu_skip_transcoder",
        dict(activation="jumprelu", transcoder=True, d_out=5, skip=True),
    ),
]


def _dictionary(dtype: str, **kw: object) -> SparseDictionary:
    return random_dictionary(dtype, (-5.0, 1.0), **kw)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("arch", "kw"), KINDS, ids=[k[1]["activation"] + k[0] for k in KINDS])
def test_round_trip_is_bitwise(tmp_path: Path, arch: str, kw: dict, dtype: str) -> None:
    d = _dictionary(dtype, **kw)
    save_saelens(d, tmp_path / "sae")
    record = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert record["architecture"] == arch
    assert record["metadata"]["sae_lens_version"] == SAELENS_VERSION
    back = load_saelens(tmp_path / "sae")
    assert type(back) is type(d) and back.cfg == d.cfg
    mine, theirs = d.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    for key in mine:
        if key == "log_threshold":  # the threshold used, exp(log_threshold), is bitwise
            assert torch.equal(mine[key].exp(), theirs[key].exp())
        else:
            assert torch.equal(mine[key], theirs[key]), key
    x = torch.randn(7, 6, dtype=d.cfg.torch_dtype)
    assert torch.equal(d(x), back(x))
    # read back by SAELens's fields alone (no vecinterp metadata): the same function
    del record["metadata"]["vecinterp_config"]
    (tmp_path / "sae" / "cfg.json").write_text(json.dumps(record))
    plain = load_saelens(tmp_path / "sae")
    with torch.no_grad():
        assert torch.equal(d(x), plain(x))
    assert plain.cfg.hook_in == "blocks.0.hook_resid_pre"


def test_files_are_laid_out_as_saelens_writes_them(tmp_path: Path) -> None:
    d = _dictionary("float32", activation="relu", transcoder=True, d_out=5, skip=True)
    d.cfg  # noqa: B018
    save_saelens(d, tmp_path / "tc")
    record = json.loads((tmp_path / "tc" / "cfg.json").read_text())
    for field, value in [
        ("d_in", 6), ("d_sae", 10), ("d_out", 5), ("dtype", "float32"), ("device", "cpu"),
        ("apply_b_dec_to_input", False), ("normalize_activations", "none"),
        ("reshape_activations", "none"), ("architecture", "skip_transcoder"),
    ]:  # fmt: skip
        assert record[field] == value, field
    assert record["metadata"]["hook_name"] == "blocks.0.hook_resid_pre"
    tensors = load_file(str(tmp_path / "tc" / "sae_weights.safetensors"))
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    assert shapes == {"W_enc": (6, 10), "b_enc": (10,), "W_dec": (10, 5), "b_dec": (5,),
                      "W_skip": (5, 6)}  # fmt: skip
    assert d.W_skip is not None and torch.equal(tensors["W_skip"], d.W_skip.detach().T)
    jump = _dictionary("float64", activation="jumprelu")
    save_saelens(jump, tmp_path / "j")
    stored = load_file(str(tmp_path / "j" / "sae_weights.safetensors"))
    assert jump.log_threshold is not None
    assert torch.equal(stored["threshold"], jump.log_threshold.detach().exp())
    batch = _dictionary("float32", activation="batchtopk", k=3)
    save_saelens(batch, tmp_path / "b")
    stored = load_file(str(tmp_path / "b" / "sae_weights.safetensors"))
    assert torch.equal(stored["threshold"], torch.full((10,), 0.125))


def _write(directory: Path, record: dict, tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir()
    (directory / "cfg.json").write_text(json.dumps(record))
    save_file(tensors, str(directory / "sae_weights.safetensors"))
    return directory


def test_hand_written_jumprelu_file(tmp_path: Path) -> None:
    # relu(pre) * 1{pre > threshold} @ W_dec + b_dec, pre = (x - b_dec) @ W_enc + b_enc
    record = {"architecture": "jumprelu", "d_in": 2, "d_sae": 3, "dtype": "float32",
              "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
              "metadata": {"hook_name": "blocks.1.hook_resid_mid",
                           "sae_lens_version": "6.18.0"}}  # fmt: skip
    tensors = {
        "W_enc": torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 2.0]]),
        "b_enc": torch.tensor([0.0, -0.5, 0.0]),
        "W_dec": torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]),
        "b_dec": torch.tensor([1.0, 1.0]),
        "threshold": torch.tensor([0.5, 0.5, 10.0]),
    }
    sae = load_saelens(_write(tmp_path / "j", record, tensors))
    assert sae.cfg.activation == "jumprelu" and sae.cfg.hook_in == "blocks.1.hook_resid_mid"
    # x = (2, 2): x - b_dec = (1, 1); pre = (1, 0.5, 4): kept, not > 0.5, not > 10
    with torch.no_grad():
        assert sae(torch.tensor([[2.0, 2.0]])).tolist() == [[2.0, 1.0]]
        assert sae.encode(torch.tensor([[2.0, 2.0]])).tolist() == [[1.0, 0.0, 0.0]]


def test_hand_written_skip_transcoder_and_topk_files(tmp_path: Path) -> None:
    record = {"architecture": "skip_transcoder", "d_in": 2, "d_sae": 2, "d_out": 3,
              "dtype": "float64", "apply_b_dec_to_input": False, "hook_name_out": "out",
              "metadata": {"hook_name": "in"}}  # fmt: skip
    tensors = {
        "W_enc": torch.eye(2, dtype=torch.float64),
        "b_enc": torch.zeros(2, dtype=torch.float64),
        "W_dec": torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64),
        "b_dec": torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64),
        "W_skip": torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 2.0]], dtype=torch.float64),
    }  # SAELens: x @ W_skip.T, W_skip [d_out, d_in]
    tc = load_saelens(_write(tmp_path / "t", record, tensors))
    assert (tc.cfg.transcoder, tc.cfg.skip, tc.cfg.hook_in, tc.cfg.hook_out) == (
        True, True, "in", "out"
    )  # fmt: skip
    with torch.no_grad():  # x = (3, -1): acts (3, 0); skip 3 - 2 = 1; b_dec adds 1
        assert tc(torch.tensor([[3.0, -1.0]], dtype=torch.float64)).tolist() == [[3.0, 0.0, 2.0]]
    # TopK with rescale_acts_by_decoder_norm: pre * ||W_dec[i]||, acts / ||W_dec[i]||
    record = {"architecture": "topk", "d_in": 2, "d_sae": 3, "k": 1, "dtype": "float64",
              "rescale_acts_by_decoder_norm": True}  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    shapes = {"W_enc": (2, 3), "b_enc": (3,), "W_dec": (3, 2), "b_dec": (2,)}
    t = {k: torch.randn(*s, generator=gen, dtype=torch.float64) for k, s in shapes.items()}
    sae = load_saelens(_write(tmp_path / "k", record, t))
    x = torch.randn(20, 2, generator=gen, dtype=torch.float64)
    norms = t["W_dec"].norm(dim=1)
    pre = ((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]) * norms
    top = pre.topk(1, dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    expected = (acts / norms) @ t["W_dec"] + t["b_dec"]
    with torch.no_grad():
        assert torch.allclose(sae(x), expected, rtol=0, atol=1e-12)


def test_refusals(tmp_path: Path) -> None:
    topk_tc = _dictionary("float32", activation="topk", k=2, transcoder=True)
    with pytest.raises(ValueError, match="has no transcoder with activation='topk'"):
        save_saelens(topk_tc, tmp_path / "x")
    base = {"d_in": 2, "d_sae": 1, "dtype": "float32"}
    w = {"W_enc": torch.ones(2, 1), "b_enc": torch.zeros(1), "W_dec": torch.ones(1, 2),
         "b_dec": torch.zeros(2)}  # fmt: skip
    cases = [
        ({"architecture": "gated"}, w, "architecture 'gated' has no counterpart"),
        ({"normalize_activations": "expected_average_only_in"}, w, "normalize_activations"),
        ({"reshape_activations": "hook_z"}, w, "reshape_activations"),
        ({"apply_b_dec_to_input": False}, w, "always subtracts b_dec"),
        ({"dtype": "bfloat16"}, w, "pass dtype='float32'"),
        ({}, {**w, "threshold": torch.ones(1)}, "the file holds"),
        ({}, {**w, "W_dec": torch.ones(1, 3)}, "W_dec has shape"),
        ({"d_sae": 0}, w, "not a valid dictionary"),
    ]
    for i, (extra, tensors, message) in enumerate(cases):
        directory = _write(tmp_path / f"c{i}", {**base, **extra}, tensors)
        with pytest.raises(ValueError, match=message):
            load_saelens(directory)
    half = _write(tmp_path / "half", {**base, "dtype": "float16"},
                  {k: v.half() for k, v in w.items()})  # fmt: skip
    assert load_saelens(half, dtype="float32").W_enc.dtype == torch.float32
    with pytest.raises(FileNotFoundError, match="cfg.json is missing"):
        load_saelens(tmp_path / "nowhere")
    # our files carry a checksum: a flipped byte in the tensor data is caught
    d = _dictionary("float32", activation="relu")
    save_saelens(d, tmp_path / "ok")
    file = tmp_path / "ok" / "sae_weights.safetensors"
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x01
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted"):
        load_saelens(tmp_path / "ok")


def test_log_threshold_is_exact_where_a_float_allows() -> None:
    from vecinterp.dictionary.saelens import _log_exactly

    t = torch.tensor([1e-3, 0.37, 1.0, 2.5, 123.0], dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        logs = torch.linspace(-7, 5, 101, dtype=dtype)
        assert torch.equal(_log_exactly(logs.exp()).exp(), logs.exp())
    assert float((_log_exactly(t) - t.log()).abs().max()) <= 8 * math.ulp(5.0)
