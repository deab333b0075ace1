"""vi.from_garg_checkpoint: a checkpoint of Garg et al.'s in-context-learning code (a
``TransformerModel`` of _read_in, a GPT2Model _backbone and _read_out, saved as
``{"model_state_dict": ...}``) opens in one call and predicts what the source predicts;
what is not such a checkpoint is refused with the reason. Nothing is downloaded."""

import pytest
import torch
from torch import nn

# the hf extra's tests: .ci/run runs them (-m hf) under the oldest supported transformers too
pytestmark = pytest.mark.hf
pytest.importorskip(
    "transformers", reason='transformers is not installed (pip install "vecinterp[hf]")'
)

import transformers  # noqa: E402

import vecinterp as vi  # noqa: E402


class TransformerModel(nn.Module):
    """Garg et al. (2022, arXiv:2208.01066)'s model, as their code writes it."""

    def __init__(self, n_dims, n_positions, n_embd=16, n_layer=2, n_head=4, vocab_size=50257):
        super().__init__()
        config = transformers.GPT2Config(
            vocab_size=vocab_size,
            n_positions=2 * n_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
        )
        self._read_in = nn.Linear(n_dims, n_embd)
        self._backbone = transformers.GPT2Model(config)
        self._read_out = nn.Linear(n_embd, 1)

    @staticmethod
    def _combine(xs_b, ys_b):
        bsize, points, dim = xs_b.shape
        ys_b_wide = torch.cat(
            (ys_b.view(bsize, points, 1), torch.zeros(bsize, points, dim - 1)), axis=2
        )
        return torch.stack((xs_b, ys_b_wide), dim=2).view(bsize, 2 * points, dim)

    def forward(self, xs, ys):
        output = self._backbone(
            inputs_embeds=self._read_in(self._combine(xs, ys))
        ).last_hidden_state
        return self._read_out(output)[:, ::2, 0]  # predictions at the x positions


def garg(seed=0, **kwargs):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TransformerModel(**kwargs).eval()
    with torch.no_grad():  # LayerNorms and biases away from GPT-2's initial 1 and 0
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def predictions_agree(source, model, n_dims, n_points, tol):
    gen = torch.Generator().manual_seed(1)
    xs, ys = (
        torch.randn(3, n_points, n_dims, generator=gen),
        torch.randn(3, n_points, generator=gen),
    )
    with torch.no_grad():
        expected = source(xs, ys)
        ours = model(source._combine(xs, ys).to(model.W_E.dtype))[:, ::2, 0]
    assert ((ours - expected).abs().max() / expected.abs().max()).item() <= tol


@pytest.mark.parametrize(
    "shape",
    [dict(n_dims=5, n_positions=6), dict(n_dims=3, n_positions=4, n_embd=12, n_layer=3, n_head=3)],
)
def test_a_saved_state_opens_and_predicts_what_the_source_predicts(tmp_path, shape):
    source = garg(**shape)
    path = tmp_path / "state.pt"
    torch.save(
        {"model_state_dict": source.state_dict(), "optimizer_state_dict": {}, "train_step": 7}, path
    )
    model = vi.from_garg_checkpoint(path, n_head=shape.get("n_head", 4))
    cfg = model.cfg
    assert (cfg.d_in, cfg.d_out, cfg.n_ctx) == (shape["n_dims"], 1, 2 * shape["n_positions"])
    assert cfg.n_layers == shape.get("n_layer", 2) and cfg.n_heads == shape.get("n_head", 4)
    predictions_agree(source, model, shape["n_dims"], shape["n_positions"], 1e-5)
    # a float64 import of the float32 weights computes the same function more exactly
    model64 = vi.from_garg_checkpoint(
        source.state_dict(), n_head=shape.get("n_head", 4), dtype=torch.float64
    )
    source64 = source.double()
    gen = torch.Generator().manual_seed(2)
    n, d = shape["n_positions"], shape["n_dims"]
    xs, ys = (
        torch.randn(2, n, d, generator=gen, dtype=torch.float64),
        torch.randn(2, n, generator=gen, dtype=torch.float64),
    )
    zs = torch.stack(
        (xs, torch.cat((ys[..., None], torch.zeros(2, n, d - 1, dtype=torch.float64)), -1)), 2
    ).view(2, 2 * n, d)
    with torch.no_grad():
        out = source64._read_out(
            source64._backbone(inputs_embeds=source64._read_in(zs)).last_hidden_state
        )
        assert ((model64(zs) - out).abs().max() / out.abs().max()).item() <= 1e-10


def test_released_model_files_hold_the_state_dict_alone(tmp_path):
    source = garg(vocab_size=1, n_dims=4, n_positions=5)
    torch.save(source.state_dict(), tmp_path / "model.pt")
    model = vi.from_garg_checkpoint(str(tmp_path / "model.pt"), n_head=4)
    predictions_agree(source, model, 4, 5, 1e-5)


def test_what_is_not_a_garg_checkpoint_is_refused(tmp_path):
    state = garg(n_dims=4, n_positions=5).state_dict()
    with pytest.raises(ValueError, match=r"lacks \['_read_in\.weight'\]"):
        vi.from_garg_checkpoint(
            {k: v for k, v in state.items() if not k.startswith("_read_in")}, n_head=4
        )
    with pytest.raises(ValueError, match=r"n_head=3 does not divide the width n_embd=16"):
        vi.from_garg_checkpoint(state, n_head=3)
    with pytest.raises(ValueError, match=r"n_head must be a positive int, got 0"):
        vi.from_garg_checkpoint(state, n_head=0)
    with pytest.raises(TypeError, match=r"checkpoint must be a path to a torch\.save file"):
        vi.from_garg_checkpoint([1, 2], n_head=4)
    broken = dict(state)
    broken["_backbone.h.0.mlp.c_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"weights do not fit Garg et al\.'s model"):
        vi.from_garg_checkpoint(broken, n_head=4)
    extra = dict(state) | {"_backbone.h.0.attn.q_norm.weight": torch.ones(16)}
    with pytest.raises(ValueError, match=r"unexpected \['h\.0\.attn\.q_norm\.weight'\]"):
        vi.from_garg_checkpoint(extra, n_head=4)


def test_files_that_are_not_checkpoints_are_refused_with_the_reason(tmp_path):
    """Before: a text file gave IndexError("pop from empty list") or KeyError(101), a whole
    module saved with torch.save(model) torch's advice to pass weights_only=False (which
    from_garg_checkpoint does not take), activation_function='gelu_approx' a bare
    KeyError."""
    not_torch = r"is not a file torch\.save wrote, or it is damaged \(torch\.load: "
    for name, content in {
        "notes.txt": b"hello world\n",
        "empty.pt": b"",
        "zip.pt": b"PK\x03\x04 not a zip archive",
        "random.pt": bytes(range(256)) * 4,
    }.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=not_torch) as info:
            vi.from_garg_checkpoint(tmp_path / name, n_head=4)
        assert "weights_only" not in str(info.value)
    with pytest.raises(ValueError, match=r"is not a regular file: pass the path of the state"):
        vi.from_garg_checkpoint(tmp_path, n_head=4)
    with pytest.raises(FileNotFoundError, match=r"missing\.pt' does not exist"):
        vi.from_garg_checkpoint(tmp_path / "missing.pt", n_head=4)
    source = garg(n_dims=4, n_positions=5)
    torch.save(source, tmp_path / "whole.pt")
    with pytest.raises(
        ValueError,
        match=r"holds pickled Python objects, not only tensors \(a whole module saved with "
        r"torch\.save\(model\)\?\).* load it yourself, module = torch\.load\(path, "
        r"weights_only=False\), and pass module\.state_dict\(\)",
    ):
        vi.from_garg_checkpoint(tmp_path / "whole.pt", n_head=4)
    # ... which is the way out
    module = torch.load(tmp_path / "whole.pt", weights_only=False)
    predictions_agree(source, vi.from_garg_checkpoint(module.state_dict(), n_head=4), 4, 5, 1e-5)
    with pytest.raises(
        ValueError, match=r"activation_function='gelu_approx' is not one of GPT-2's .*'gelu_new'"
    ):
        vi.from_garg_checkpoint(source.state_dict(), n_head=4, activation_function="gelu_approx")
