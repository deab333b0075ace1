"""Circuits (OV, QK, full, positional) and their scores (eigenvalue, composition):
factored vs dense, hand-worked values, batched vs looped, bad inputs."""

import doctest
import math

import pytest
import torch

from helpers import random_model, tiny_cfg
from vecinterp import FactoredMatrix
from vecinterp.analysis import circuits, scores
from vecinterp.analysis.circuits import (
    full_ov_circuit,
    full_qk_circuit,
    ov_circuit,
    pos_qk_circuit,
    qk_circuit,
)
from vecinterp.analysis.scores import (
    composition_baseline,
    composition_scores,
    eigenvalue_scores,
)

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def attn_weights(model, name: str, layer: int, head: int) -> torch.Tensor:
    return getattr(model.blocks[layer].attn, name)[head].detach()


def set_head(model, layer: int, head: int, **weights: torch.Tensor) -> None:
    """Overwrite some of W_Q/W_K/W_V/W_O of one head in place (test fixtures only)."""
    with torch.no_grad():
        for name, value in weights.items():
            getattr(model.blocks[layer].attn, name)[head].copy_(value)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_cfg(embed_bias=True, n_layers=3))


# ---------------------------------------------------------------- circuits: factored == dense


def test_ov_and_qk_circuits_equal_the_dense_products_per_head(model):
    ov, qk = ov_circuit(model), qk_circuit(model)
    cfg = model.cfg
    assert tuple(ov.shape) == tuple(qk.shape) == (3, 2, cfg.d_model, cfg.d_model)
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            W = {n: attn_weights(model, n, layer, head) for n in ("W_Q", "W_K", "W_V", "W_O")}
            torch.testing.assert_close(ov.AB[layer, head], W["W_V"] @ W["W_O"], **TOL)
            torch.testing.assert_close(qk.AB[layer, head], W["W_Q"] @ W["W_K"].T, **TOL)
    torch.testing.assert_close(ov.AB, model.OV.AB, **TOL)
    torch.testing.assert_close(qk.AB, model.QK.AB, **TOL)
    torch.testing.assert_close(ov_circuit(model, layer=-1).AB, ov.AB[2], **TOL)
    torch.testing.assert_close(qk_circuit(model, layer=1).AB, qk.AB[1], **TOL)


def test_full_circuits_equal_the_dense_products_per_head(model):
    W_E, W_U, W_pos = (t.detach() for t in (model.W_E, model.W_U, model.pos_embed.W_pos))
    full_ov, full_qk, pos_qk = full_ov_circuit(model), full_qk_circuit(model), pos_qk_circuit(model)
    cfg = model.cfg
    assert tuple(full_ov.shape) == (3, 2, cfg.d_in, cfg.d_out)
    assert tuple(full_qk.shape) == (3, 2, cfg.d_in, cfg.d_in)
    assert tuple(pos_qk.shape) == (3, 2, cfg.n_ctx, cfg.n_ctx)
    assert full_ov.mdim == full_qk.mdim == pos_qk.mdim == cfg.d_head
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            W = {n: attn_weights(model, n, layer, head) for n in ("W_Q", "W_K", "W_V", "W_O")}
            qk = W["W_Q"] @ W["W_K"].T
            dense_ov = W_E @ W["W_V"] @ W["W_O"] @ W_U
            torch.testing.assert_close(full_ov.AB[layer, head], dense_ov, **TOL)
            torch.testing.assert_close(full_qk.AB[layer, head], W_E @ qk @ W_E.T, **TOL)
            torch.testing.assert_close(pos_qk.AB[layer, head], W_pos @ qk @ W_pos.T, **TOL)
    torch.testing.assert_close(full_ov_circuit(model, layer=2).AB, full_ov.AB[2], **TOL)
    torch.testing.assert_close(full_qk_circuit(model, layer=0).AB, full_qk.AB[0], **TOL)
    torch.testing.assert_close(pos_qk_circuit(model, layer=-2).AB, pos_qk.AB[1], **TOL)


def test_embed_bias_row_is_the_bias_contribution(model):
    """With a constant 1 appended to x, [x, 1] @ circuit is the circuit of x W_E + b_E."""
    b_E, W_E = model.embed.b_E.detach(), model.W_E.detach()
    x = randn(4, model.cfg.d_in, seed=3)
    x1 = torch.cat([x, torch.ones(4, 1, dtype=F64)], dim=1)
    resid = x @ W_E + b_E
    ov = full_ov_circuit(model, include_embed_bias=True)
    assert tuple(ov.shape) == (3, 2, model.cfg.d_in + 1, model.cfg.d_out)
    torch.testing.assert_close(x1 @ ov.AB, resid @ model.OV.AB.detach() @ model.W_U.detach(), **TOL)
    qk = full_qk_circuit(model, layer=1, include_embed_bias=True)
    dense = resid @ model.QK.AB[1].detach() @ resid.T
    torch.testing.assert_close(x1 @ qk.AB @ x1.T, dense, **TOL)


def test_pos_qk_circuit_of_a_sinusoidal_model_uses_the_fixed_table():
    model = random_model(tiny_cfg(positional="sinusoidal"))
    W_pos = model.pos_embed.W_pos
    assert not isinstance(W_pos, torch.nn.Parameter)
    torch.testing.assert_close(pos_qk_circuit(model).AB, W_pos @ model.QK.AB.detach() @ W_pos.T)


def test_circuits_are_detached_and_leave_the_model_alone(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    made = [
        ov_circuit(model),
        qk_circuit(model, 0),
        full_ov_circuit(model, include_embed_bias=True),
        full_qk_circuit(model),
        pos_qk_circuit(model),
    ]
    assert all(p.requires_grad for p in model.parameters())
    for fm in made:
        assert not fm.A.requires_grad and not fm.B.requires_grad
    assert not eigenvalue_scores(model, kind="ov").requires_grad
    assert not composition_scores(model, kind="Q").requires_grad
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


# ---------------------------------------------------------------- eigenvalue scores: exact values


def test_ov_minus_identity_scores_exactly_minus_one_and_plus_identity_plus_one():
    """d_head = d_model: W_V = I with W_O = −I (head 0) or W_O = +I (head 1)."""
    model = random_model(tiny_cfg(d_head=8, n_layers=1, attn_only=True))
    eye = torch.eye(8, dtype=F64)
    set_head(model, 0, 0, W_V=eye, W_O=-eye)
    set_head(model, 0, 1, W_V=eye, W_O=eye)
    assert eigenvalue_scores(model, kind="ov").tolist() == [[-1.0, 1.0]]
    # the same through QK: W_Q = W_K = I gives QK = +I
    set_head(model, 0, 0, W_Q=eye, W_K=eye)
    assert eigenvalue_scores(model, kind="qk")[0, 0].item() == 1.0


def test_rotation_by_90_degrees_scores_zero():
    """Two 2-d rotation blocks: eigenvalues ±i twice, Re(Σλ) = 0, Σ|λ| = 4."""
    rot = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=F64)
    R = torch.block_diag(rot, rot)
    score = eigenvalue_scores(FactoredMatrix(R, torch.eye(4, dtype=F64)))
    assert score.shape == () and abs(score.item()) < 1e-15
    # half copying, half rotating: Re Σλ = 2 of Σ|λ| = 4
    half = torch.block_diag(torch.eye(2, dtype=F64), rot)
    assert eigenvalue_scores(FactoredMatrix(half, torch.eye(4, dtype=F64))).item() == 0.5


def test_zero_matrix_scores_zero_not_nan():
    fm = FactoredMatrix(torch.zeros(2, 5, 3, dtype=F64), randn(2, 3, 5, seed=0))
    assert eigenvalue_scores(fm).tolist() == [0.0, 0.0]


def test_low_rank_projection_scores_by_its_nonzero_eigenvalues_only():
    """u v^T (rank 1, d_model 6): one eigenvalue v·u; the five zeros change nothing."""
    u = torch.tensor([[1.0], [2.0], [0.0], [0.0], [0.0], [0.0]], dtype=F64)
    v = torch.tensor([[-3.0, 1.0, 5.0, 0.0, 0.0, 0.0]], dtype=F64)  # v·u = -1
    assert eigenvalue_scores(FactoredMatrix(u, v)).item() == -1.0


# ---------------------------------------------------------------- eigenvalue scores: equivalences


def dense_scores(matrices: torch.Tensor) -> torch.Tensor:
    """Loop of dense eigvals, one square matrix at a time."""
    flat = matrices.reshape(-1, *matrices.shape[-2:])
    out = []
    for m in flat:
        lam = torch.linalg.eigvals(m)
        out.append(lam.real.sum() / lam.abs().sum())
    return torch.stack(out).reshape(matrices.shape[:-2])


@pytest.mark.parametrize(("m", "k"), [(7, 3), (5, 5), (4, 6)])
def test_batched_factored_scores_equal_a_loop_of_dense_eigvals(m, k):
    fm = FactoredMatrix(randn(2, 3, m, k, seed=m), randn(3, k, m, seed=k))
    got = eigenvalue_scores(fm)
    assert got.shape == (2, 3) and got.dtype == F64
    torch.testing.assert_close(got, dense_scores(fm.AB), atol=1e-10, rtol=0)


def test_model_kinds_equal_the_scores_of_the_circuits():
    model = random_model(tiny_cfg(d_out=3))  # d_in == d_out: full OV is square
    for kind, make in [
        ("ov", ov_circuit),
        ("qk", qk_circuit),
        ("full_ov", full_ov_circuit),
        ("full_qk", full_qk_circuit),
        ("pos_qk", pos_qk_circuit),
    ]:
        got = eigenvalue_scores(model, kind=kind)
        assert got.shape == (2, 2)
        assert torch.equal(got, eigenvalue_scores(make(model)))
        torch.testing.assert_close(got, dense_scores(make(model).AB), atol=1e-10, rtol=0)
        assert bool((got.abs() <= 1).all())


def test_float32_circuits_give_float32_scores():
    model = random_model(tiny_cfg(), dtype=torch.float32)
    assert eigenvalue_scores(model, kind="ov").dtype == torch.float32
    assert composition_scores(model, kind="V").dtype == torch.float32


# ---------------------------------------------------------------- composition: hand-worked


def basis(i: int, d: int = 4) -> torch.Tensor:
    return torch.eye(d, dtype=F64)[i]


def two_layer_model():
    """d_model 4, d_head 2, one head per layer, every weight zero until set."""
    cfg = tiny_cfg(d_model=4, d_head=2, n_heads=1, n_layers=2, attn_only=True)
    model = random_model(cfg)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            for block in model.blocks:
                getattr(block.attn, name).zero_()
    return model


def cols(*vectors: torch.Tensor) -> torch.Tensor:
    """[d_model, d_head] with the given vectors as columns (the rest zero)."""
    out = torch.zeros(4, 2, dtype=F64)
    for j, v in enumerate(vectors):
        out[:, j] = v
    return out


def test_heads_on_orthogonal_subspaces_compose_zero():
    """Layer 0 writes into span(e0, e1); layer 1 reads queries, keys, values from span(e2, e3).
    (Reading from span(e2, e3) and writing into span(e0, e1) layer 0 is not zero itself.)"""
    model = two_layer_model()
    for kind in "QKV":  # all-zero heads: 0 by definition, not NaN
        assert composition_scores(model, kind=kind)[0, 0, 1, 0].item() == 0.0
    e = [basis(i) for i in range(4)]
    set_head(model, 0, 0, W_V=cols(e[2], e[3]), W_O=cols(e[0], e[1]).T)
    set_head(model, 1, 0, W_Q=cols(e[2], e[3]), W_K=cols(e[3], e[2]), W_V=cols(e[2], e[3]))
    set_head(model, 1, 0, W_O=cols(e[0], e[1]).T)
    for kind in "QKV":
        assert composition_scores(model, kind=kind)[0, 0, 1, 0].item() == 0.0


def test_aligned_rank_one_heads_compose_one_and_hand_worked_partial_overlap():
    """OV_1 = e0 e0^T. Layer 1: QK_2 = e0 e1^T, so OV_1 QK_2 = e0 e1^T (score 1) while
    OV_1 QK_2^T = e0 e0^T e1 e0^T = 0 (K score 0); OV_2 = e0 e2^T: OV_1 OV_2 = e0 e2^T (1)."""
    model = two_layer_model()
    e = [basis(i) for i in range(4)]
    set_head(model, 0, 0, W_V=cols(e[0]), W_O=cols(e[0]).T)
    set_head(model, 1, 0, W_Q=cols(e[0]), W_K=cols(e[1]), W_V=cols(e[0]), W_O=cols(e[2]).T)
    got = {kind: composition_scores(model, kind=kind)[0, 0, 1, 0].item() for kind in "QKV"}
    assert got == {"Q": 1.0, "K": 0.0, "V": 1.0}
    # keys read e0 instead: QK_2 = e1 e0^T, now K-composition is the aligned one
    set_head(model, 1, 0, W_Q=cols(e[1]), W_K=cols(e[0]))
    assert composition_scores(model, kind="K")[0, 0, 1, 0].item() == 1.0
    assert composition_scores(model, kind="Q")[0, 0, 1, 0].item() == 0.0
    # rank 2 writer OV_1 = e0 e0^T + e1 e1^T (norm √2), rank-1 reader QK_2 = e1 e0^T:
    # OV_1 QK_2^T = e0 e1^T (norm 1), so the K score is 1/√2
    set_head(model, 0, 0, W_V=cols(e[0], e[1]), W_O=cols(e[0], e[1]).T)
    torch.testing.assert_close(
        composition_scores(model, kind="K")[0, 0, 1, 0], torch.tensor(1 / math.sqrt(2), dtype=F64)
    )


# ---------------------------------------------------------------- composition: equivalences


def naive_composition(model, kind: str) -> torch.Tensor:
    """Dense matrices, one (earlier head, later head) pair at a time."""
    cfg = model.cfg
    n_l, n_h = cfg.n_layers, cfg.n_heads
    ov, qk = model.OV.AB.detach(), model.QK.AB.detach()
    right = {"Q": qk, "K": qk.mT, "V": ov}[kind]
    out = torch.full((n_l, n_h, n_l, n_h), torch.nan, dtype=F64)
    for l1 in range(n_l):
        for h1 in range(n_h):
            for l2 in range(l1 + 1, n_l):
                for h2 in range(n_h):
                    L, R = ov[l1, h1], right[l2, h2]
                    out[l1, h1, l2, h2] = torch.linalg.norm(L @ R) / (
                        torch.linalg.norm(L) * torch.linalg.norm(R)
                    )
    return out


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
@pytest.mark.parametrize(("d_model", "d_head"), [(8, 4), (6, 10)])
def test_composition_scores_equal_a_naive_per_pair_loop(kind, d_model, d_head):
    model = random_model(tiny_cfg(d_model=d_model, d_head=d_head, n_heads=3, n_layers=3))
    got = composition_scores(model, kind=kind)
    want = naive_composition(model, kind)
    assert got.shape == (3, 3, 3, 3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10, equal_nan=True)
    defined = got[~got.isnan()]
    assert defined.numel() == 27  # pairs (0,1), (0,2), (1,2) times 3 x 3 heads
    assert bool(((defined > 0) & (defined < 1)).all())


def test_entries_with_earlier_layer_not_before_later_are_nan(model):
    got = composition_scores(model, kind="K")
    layers = torch.arange(3)
    before = (layers[:, None] < layers[None, :])[:, None, :, None].expand(3, 2, 3, 2)
    assert bool(got[before].isfinite().all())
    assert bool(got[~before].isnan().all())


def test_baseline_true_subtracts_the_baseline_mean(model):
    raw = composition_scores(model, kind="Q")
    mean = composition_baseline(model, kind="Q").mean
    torch.testing.assert_close(
        composition_scores(model, kind="Q", baseline=True), raw - mean, equal_nan=True
    )


def test_composition_baseline_is_about_one_over_sqrt_d_model():
    for d_model, d_head in [(16, 4), (64, 8)]:
        model = random_model(tiny_cfg(d_model=d_model, d_head=d_head))
        base = composition_baseline(model, kind="K", n_samples=300, seed=1)
        assert base.samples.shape == (300,) and base.samples.dtype == F64
        assert bool(((base.samples > 0) & (base.samples < 1)).all())
        assert 0 < base.std < base.mean < 1
        assert 0.5 < base.mean * math.sqrt(d_model) < 2.0
        assert base.mean == pytest.approx(base.samples.mean().item())


def test_composition_baseline_is_reproducible_and_seeded(model):
    a = composition_baseline(model, kind="K", n_samples=20, seed=5)
    b = composition_baseline(model, kind="K", n_samples=20, seed=5)
    c = composition_baseline(model, kind="K", n_samples=20, seed=6)
    assert torch.equal(a.samples, b.samples)
    assert not torch.equal(a.samples, c.samples)
    # the three kinds have the same shapes, hence the same draws and baseline
    assert torch.equal(a.samples, composition_baseline(model, "V", n_samples=20, seed=5).samples)


def test_composition_baseline_equals_its_dense_definition_whatever_the_chunking(monkeypatch):
    """Sample i draws the flattened factors A1, B1, A2, B2 as one row of the stream."""
    d_model, d_head, n = 16, 3, 7
    model = random_model(tiny_cfg(d_model=d_model, d_head=d_head))
    whole = composition_baseline(model, "K", n_samples=n, seed=2).samples
    flat = torch.randn(
        n, 4 * d_model * d_head, generator=torch.Generator().manual_seed(2), dtype=F64
    )
    A1, B1, A2, B2 = flat.split(d_model * d_head, dim=1)
    L = A1.reshape(n, d_model, d_head) @ B1.reshape(n, d_head, d_model)
    R = A2.reshape(n, d_model, d_head) @ B2.reshape(n, d_head, d_model)
    norm = torch.linalg.matrix_norm
    torch.testing.assert_close(whole, norm(L @ R) / (norm(L) * norm(R)), atol=1e-12, rtol=1e-10)
    # force chunks of 2 samples (and a last one of 1): the same samples come out (the same
    # draws; batched products of another batch count may round the last bit differently)
    monkeypatch.setattr(scores, "_BASELINE_CHUNK_ENTRIES", 2 * 4 * d_model * d_head)
    chunked = composition_baseline(model, "K", n_samples=n, seed=2).samples
    torch.testing.assert_close(chunked, whole, rtol=1e-13, atol=0)


# ---------------------------------------------------------------- errors


def test_full_ov_with_d_in_not_d_out_is_not_square(model):
    assert model.cfg.d_in != model.cfg.d_out
    with pytest.raises(ValueError, match=r"square.*full OV circuit is d_in × d_out.*3 rows != 5"):
        eigenvalue_scores(model, kind="full_ov")
    with pytest.raises(ValueError, match=r"square.*\(2, 3, 5\).*3 rows != 5 columns"):
        eigenvalue_scores(full_ov_circuit(model, layer=0))


def test_bad_kinds(model):
    with pytest.raises(ValueError, match=r"kind must be one of \('ov', 'qk'"):
        eigenvalue_scores(model, kind="OV")
    with pytest.raises(ValueError, match="needs kind"):
        eigenvalue_scores(model)
    with pytest.raises(ValueError, match="leave it None"):
        eigenvalue_scores(model.OV, kind="ov")
    with pytest.raises(ValueError, match=r"kind must be one of \('Q', 'K', 'V'\)"):
        composition_scores(model, kind="q")
    with pytest.raises(ValueError, match=r"kind must be one of \('Q', 'K', 'V'\)"):
        composition_baseline(model, kind="QK")


def test_pos_qk_needs_w_pos():
    for positional in ("rotary", "none"):
        model = random_model(tiny_cfg(positional=positional))
        with pytest.raises(ValueError, match=f"W_pos.*positional='{positional}'"):
            pos_qk_circuit(model)
        with pytest.raises(ValueError, match="W_pos"):
            eigenvalue_scores(model, kind="pos_qk")


def test_embed_bias_requested_on_a_model_without_one():
    model = random_model(tiny_cfg(embed_bias=False))
    with pytest.raises(ValueError, match="no embedding bias"):
        full_ov_circuit(model, include_embed_bias=True)
    with pytest.raises(ValueError, match="no embedding bias"):
        full_qk_circuit(model, include_embed_bias=True)


def test_bad_layers_and_samples(model):
    with pytest.raises(ValueError, match=r"layer must be an int in \[-3, 2\]"):
        ov_circuit(model, layer=3)
    with pytest.raises(ValueError, match="layer must be"):
        pos_qk_circuit(model, layer=-4)
    with pytest.raises(ValueError, match="n_samples must be an int >= 2"):
        composition_baseline(model, "K", n_samples=1)


def test_every_score_with_a_kind_requires_it(model):
    # one rule: the argument that selects the quantity has no default (K was one before)
    for fn in (composition_scores, composition_baseline):
        with pytest.raises(ValueError, match=rf"{fn.__name__}\(model, kind=...\) needs kind, one "
                           r"of \('Q', 'K', 'V'\)"):  # fmt: skip
            fn(model)
    with pytest.raises(ValueError, match=r"eigenvalue_scores\(model, kind=...\) needs kind"):
        eigenvalue_scores(model)
    # positional kinds still work, and are the keyword ones
    by_position, by_keyword = composition_scores(model, "Q"), composition_scores(model, kind="Q")
    torch.testing.assert_close(by_position, by_keyword, rtol=0, atol=0, equal_nan=True)


def test_wrong_types(model):
    with pytest.raises(TypeError, match="HookedVectorTransformer"):
        ov_circuit(model.state_dict())
    with pytest.raises(TypeError, match="HookedVectorTransformer"):
        composition_scores(model.OV, kind="K")
    with pytest.raises(TypeError, match="FactoredMatrix"):
        eigenvalue_scores(model.OV.AB)
    with pytest.raises(TypeError):
        composition_scores(model, kind=1)
    with pytest.raises(TypeError):
        full_ov_circuit(model, include_embed_bias=1)
    with pytest.raises(TypeError):
        composition_scores(model, kind="K", baseline="yes")


def test_errors_without_the_runtime_type_checker(model):
    """Users run without beartype: the functions' own checks must still give TypeErrors."""
    unwrapped = {
        f: getattr(f, "__wrapped__", f)
        for f in (ov_circuit, eigenvalue_scores, composition_scores, full_ov_circuit)
    }
    with pytest.raises(TypeError, match="expected a HookedVectorTransformer, got dict"):
        unwrapped[ov_circuit]({})
    with pytest.raises(TypeError, match="expects a FactoredMatrix or a HookedVectorTransformer"):
        unwrapped[eigenvalue_scores](model.OV.AB)
    with pytest.raises(TypeError, match="kind must be a str"):
        unwrapped[composition_scores](model, kind=1)
    with pytest.raises(TypeError, match="include_embed_bias must be a bool"):
        unwrapped[full_ov_circuit](model, include_embed_bias=1)
    with pytest.raises(TypeError, match="baseline must be a bool"):
        unwrapped[composition_scores](model, kind="K", baseline="yes")


# ---------------------------------------------------------------- docs


@pytest.mark.parametrize("module", [circuits, scores])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
