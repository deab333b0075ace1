"""alignment_search (DAS): recovers a planted subspace, its fraction explained agrees with
patch_subspace, the random-model control, the model left untouched, clear errors."""

import pytest
import torch

import vecinterp as vi
from planted_variable import planted_model, sin_principal_angles

N, POS = 120, 2


@pytest.fixture(scope="module")
def planted():
    model, direction = planted_model()
    gen = torch.Generator().manual_seed(4)
    base, source = (torch.randn(N, 6, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    # the high-level variable v = x[0, 0], swapped: the output (v everywhere) becomes the
    # source's v; only position POS, where the intervention happens, is scored
    counterfactual = source[:, :1, :1].expand(N, 6, 1).clone()
    mask = torch.zeros(6, dtype=torch.bool)
    mask[POS] = True
    found = vi.alignment_search(
        model,
        base,
        source,
        counterfactual,
        "blocks.0.hook_resid_post",
        1,
        position=POS,
        output_mask=mask,
        steps=40,
        progress=False,
    )
    return model, direction, base, source, counterfactual, mask, found


def test_recovers_the_planted_subspace(planted):
    _, direction, *_, found = planted
    assert found.basis.shape == (8, 1)
    assert float(sin_principal_angles(found.basis, direction[:, None]).max()) <= 1e-3
    assert found.fraction_explained > 1 - 1e-9
    assert found.train_fraction_explained > 1 - 1e-9
    # the same search on a random network moves nothing towards the counterfactual
    assert found.control_fraction_explained < 0.5
    assert found.control_basis is not None and found.control_basis.shape == (8, 1)
    assert found.loss[-1] < found.loss[0]


def test_fraction_explained_agrees_with_patch_subspace(planted):
    model, _, base, source, counterfactual, mask, found = planted
    test = found.test_pairs
    cf = counterfactual[test][:, POS]

    def sse(y):
        return (y[:, POS] - cf).pow(2).sum()

    patched = vi.patch_subspace(
        model, source[test], base[test], sse, found.hook_name, found.basis, progress=False
    )[POS]
    expected = 1 - patched / sse(model(base[test]))
    torch.testing.assert_close(
        torch.tensor(found.fraction_explained, dtype=torch.float64),
        expected.detach(),
        rtol=1e-9,
        atol=1e-12,
    )


def test_model_is_left_untouched(planted):
    model, _, base, source, counterfactual, mask, _ = planted
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vi.alignment_search(
        model,
        base,
        source,
        counterfactual,
        "blocks.0.hook_resid_post",
        1,
        position=POS,
        output_mask=mask,
        steps=3,
        control=False,
        progress=False,
    )
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_adam_finds_it_too(planted):
    model, direction, base, source, counterfactual, mask, _ = planted
    found = vi.alignment_search(
        model,
        base,
        source,
        counterfactual,
        "blocks.0.hook_resid_post",
        1,
        position=POS,
        output_mask=mask,
        optimizer="adam",
        steps=150,
        lr=0.05,
        batch_size=48,
        control=False,
        progress=False,
    )
    assert found.fraction_explained > 0.99
    assert float(sin_principal_angles(found.basis, direction[:, None]).max()) < 0.1
    assert found.loss.shape == (150,)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(hook_name="resid_pre"), ValueError, "one hook point"),
        (dict(k=9), ValueError, "k must be"),
        (dict(k=5), ValueError, "dimension 4"),
        (dict(position=6), ValueError, "position"),
        (dict(batch_size=10), ValueError, "batch_size is for optimizer='adam'"),
        (dict(optimizer="sgd"), ValueError, "optimizer"),
        (dict(counterfactual=torch.zeros(N, 6, 2, dtype=torch.float64)), ValueError, "d_out"),
        (dict(output_mask=torch.zeros(6, dtype=torch.bool)), ValueError, "no output"),
    ],
)
def test_bad_arguments(planted, kwargs, error, match):
    model, _, base, source, counterfactual, mask, _ = planted
    args = dict(
        hook_name="blocks.0.hook_resid_post",
        k=1,
        counterfactual=counterfactual,
        position=POS,
        output_mask=mask,
    )
    args.update(kwargs)
    with pytest.raises(error, match=match):
        vi.alignment_search(
            model,
            base,
            source,
            args.pop("counterfactual"),
            args.pop("hook_name"),
            args.pop("k"),
            steps=2,
            control=False,
            progress=False,
            **args,
        )
