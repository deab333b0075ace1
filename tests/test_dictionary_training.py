"""Training sparse dictionaries: exact resume after a kill, float32 against float64, the
activation buffer, and the refusals of bad input (issue 35)."""

import pytest
import torch

import vecinterp as vi
from vecinterp.dictionary import (
    ActivationBuffer,
    DictionaryConfig,
    SparseAutoencoder,
    Transcoder,
    harvest_activations,
    train_dictionary,
)


class Killed(Exception):
    """Stands in for a kill after a step."""


def _model():
    cfg = vi.VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, n_ctx=5)
    return vi.HookedVectorTransformer(cfg, seed=0)


def _make_batch(step, gen):
    return torch.randn(8, 5, 3, generator=gen)


def _rows(n=512, d=6, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64).to(dtype)


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("activation", ["relu", "topk"])
def test_resume_after_a_kill_is_bit_identical(tmp_path, activation):
    """Tensors as data; the TopK run has dead features (aux loss) and the ReLU run resamples
    within the window, so their state (firing counters, generator) is part of the resume."""
    k = 2 if activation == "topk" else None
    cfg = DictionaryConfig(d_in=6, d_sae=24, activation=activation, k=k)
    extra = {"resample_every": 4} if activation == "relu" else {}
    kwargs = dict(
        steps=12, batch_size=16, lr=1e-2, warmup_steps=3, dead_after=2, seed=3, threads=1,
        **extra,
    )  # fmt: skip
    data = _rows()
    whole = SparseAutoencoder(cfg, seed=1)
    full = train_dictionary(whole, data, **kwargs)

    def kill_at_7(step, dictionary):
        if step == 7:
            raise Killed

    cut = SparseAutoencoder(cfg, seed=1)
    with pytest.raises(Killed):
        train_dictionary(
            cut, data, checkpoint_dir=tmp_path, checkpoint_every=5, callback=kill_at_7, **kwargs
        )
    fresh = SparseAutoencoder(cfg, seed=99)  # the checkpoint's weights replace these
    resumed = train_dictionary(fresh, data, checkpoint_dir=tmp_path, checkpoint_every=5, **kwargs)
    assert resumed.resumed_from == 5
    for name, tensor in _state(whole).items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    for key, values in full.history.items():
        assert torch.equal(resumed.history[key], values), key


def test_resume_from_a_buffer_is_bit_identical(tmp_path):
    model = _model()
    name = "blocks.1.hook_resid_post"
    cfg = DictionaryConfig(d_in=8, d_sae=16, activation="topk", k=3, hook_in=name)
    kwargs = dict(steps=8, batch_size=32, lr=1e-2, seed=0, threads=1)

    def buffer():
        return ActivationBuffer(model, [name], _make_batch, capacity=100, seed=2)

    whole = SparseAutoencoder(cfg, seed=0)
    train_dictionary(whole, buffer(), **kwargs)

    def kill_at_5(step, dictionary):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train_dictionary(
            SparseAutoencoder(cfg, seed=0), buffer(), checkpoint_dir=tmp_path,
            checkpoint_every=3, callback=kill_at_5, **kwargs,
        )  # fmt: skip
    again = SparseAutoencoder(cfg, seed=0)
    result = train_dictionary(
        again, buffer(), checkpoint_dir=tmp_path, checkpoint_every=3, **kwargs
    )
    assert result.resumed_from == 3
    for key, tensor in _state(whole).items():
        assert torch.equal(again.state_dict()[key], tensor), key


def test_resume_refuses_another_config_or_data(tmp_path):
    cfg = DictionaryConfig(d_in=6, d_sae=8)
    data = _rows()
    train_dictionary(SparseAutoencoder(cfg), data, steps=2, batch_size=4, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="another config.*lr"):
        train_dictionary(
            SparseAutoencoder(cfg), data, steps=2, batch_size=4, lr=0.5, checkpoint_dir=tmp_path
        )
    with pytest.raises(ValueError, match="other data"):
        train_dictionary(
            SparseAutoencoder(cfg), data + 1, steps=2, batch_size=4, checkpoint_dir=tmp_path
        )
    (tmp_path / ".vecinterp-train.lock").write_text("")  # a stale lock file is taken over
    held = vi.training.checkpoint.own_directory(tmp_path)
    try:
        with pytest.raises(ValueError, match="in use by another training run"):
            train_dictionary(SparseAutoencoder(cfg), data, steps=2, checkpoint_dir=tmp_path)
    finally:
        held.release()


def test_float32_and_float64_agree():
    """The same start (drawn in float64), the same batches: after 30 Adam steps the
    weights agree to 1e-5 (float32 rounding, ~1e-7 per step and grown by Adam's division
    by the root of small second moments; measured 2.4e-7)."""
    data = _rows(d=6)
    out = {}
    for dtype in ("float32", "float64"):
        sae = SparseAutoencoder(DictionaryConfig(d_in=6, d_sae=12, dtype=dtype), seed=0)
        train_dictionary(sae, data, steps=30, batch_size=32, lr=1e-3, seed=0, threads=1)
        out[dtype] = _state(sae)
    for name, w64 in out["float64"].items():
        torch.testing.assert_close(out["float32"][name].double(), w64, atol=1e-5, rtol=0)


def test_decoder_rows_stay_unit_norm_and_warmup_is_linear():
    sae = SparseAutoencoder(DictionaryConfig(d_in=6, d_sae=12), seed=0)
    result = train_dictionary(sae, _rows(), steps=6, batch_size=8, lr=0.01, warmup_steps=4)
    torch.testing.assert_close(result.history["lr"], torch.tensor(
        [0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01], dtype=torch.float64))  # fmt: skip
    norms = sae.W_dec.detach().norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(12), atol=1e-6, rtol=0)


def test_harvest_stops_after_the_last_needed_block():
    model = _model()
    ran = []
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda module, args, out, i=i: ran.append(i))
    x = torch.randn(2, 5, 3)
    rows = next(harvest_activations(model, ["blocks.1.attn.hook_z"], [x], positions=[0, 2]))
    assert ran == [0, 1]
    _, cache = model.run_with_cache(x)
    want = cache["blocks.1.attn.hook_z"][:, [0, 2]].reshape(4, 8)  # heads flattened
    assert torch.equal(rows["blocks.1.attn.hook_z"], want)


def test_buffer_rows_are_a_shuffle_of_the_harvest():
    model = _model()
    name = "blocks.0.hook_mlp_out"
    batches = [torch.randn(4, 5, 3) for _ in range(5)]
    buffer = ActivationBuffer(model, [name, "blocks.0.hook_resid_pre"], batches, capacity=50)
    got = [buffer.next_batch(10) for _ in range(10)]
    with pytest.raises(ValueError, match="data ran out"):
        buffer.next_batch(10)
    every = torch.cat([g[name] for g in got])
    harvested = torch.cat([r[name] for r in harvest_activations(model, name, batches)])
    assert every.shape == harvested.shape == (100, 8)
    assert torch.equal(every.sort(0).values, harvested.sort(0).values)
    assert not torch.equal(every, harvested)  # shuffled


def test_bad_inputs_get_clear_errors():
    model = _model()
    with pytest.raises(ValueError, match="blocks.0.hook_resid_post"):  # names what is close
        ActivationBuffer(model, ["blocks.0.hook_resid_postt"], _make_batch)
    with pytest.raises(ValueError, match="blocks.7"):
        next(harvest_activations(model, "blocks.7.hook_resid_post", [torch.randn(2, 5, 3)]))
    with torch.no_grad():
        model.blocks[0].mlp.W_out[0, 0] = float("nan")
    with pytest.raises(ValueError, match="blocks.0.hook_mlp_out.*non-finite"):
        next(harvest_activations(model, "blocks.0.hook_mlp_out", [torch.randn(2, 5, 3)]))
    sae = SparseAutoencoder(DictionaryConfig(d_in=6, d_sae=8))
    bad = _rows()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="1 non-finite"):
        train_dictionary(sae, bad, steps=1)
    with pytest.raises(ValueError, match=r"rows \[n, 6\]"):
        train_dictionary(sae, torch.randn(10, 5), steps=1)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        train_dictionary(sae, _rows(), steps=0)
    with pytest.raises(ValueError, match="resample_every must be an int >= 1"):
        train_dictionary(sae, _rows(), steps=1, resample_every=0)
    tc = Transcoder(DictionaryConfig(d_in=6, d_sae=8, transcoder=True))
    with pytest.raises(ValueError, match="pair"):
        train_dictionary(tc, _rows(), steps=1)
    buffer = ActivationBuffer(model, ["blocks.1.hook_resid_post"], _make_batch)
    other = SparseAutoencoder(DictionaryConfig(d_in=8, d_sae=8, hook_in="blocks.2.hook_resid_post"))
    with pytest.raises(ValueError, match="harvest those hook points"):
        train_dictionary(other, buffer, steps=1)
