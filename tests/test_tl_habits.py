"""The TransformerLens habits that behave differently in vecinterp, as ``docs/migrating.rst``
lists them, checked against TransformerLens itself: each difference is documented there,
and it is what the two libraries really do (so the page cannot go stale unnoticed).

TransformerLens is the optional extra ``vecinterp[transformer-lens]``: without it this
module is skipped (with the reason shown by ``pytest -rs``).
"""

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "transformer_lens",
    reason='TransformerLens is not installed (pip install "vecinterp[transformer-lens]")',
)

from transformer_lens import FactoredMatrix as TLFactoredMatrix  # noqa: E402

import vecinterp as vi  # noqa: E402
from helpers import random_model, tiny_cfg  # noqa: E402
from vecinterp.interop.transformer_lens import to_transformer_lens  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "migrating.rst"


def habit(title: str) -> str:
    """The bullet of "Habits that behave differently" whose bold title starts with ``title``."""
    text = PAGE.read_text(encoding="utf-8")
    after = text.split("Habits that behave differently\n", 1)[1].split("\n", 1)[1]
    section = re.split(r"\n[^\n]+\n-{3,}\n", after, maxsplit=1)[0]  # up to the next heading
    bullets = section.split("\n- **")[1:]
    found = [b for b in bullets if b.startswith(title)]
    assert found, f"docs/migrating.rst lists no habit {title!r} under its section"
    return " ".join(found[0].split())


def by_value(eigenvalues: torch.Tensor) -> torch.Tensor:
    """Complex eigenvalues in a canonical order (neither library sorts them)."""
    key = eigenvalues.real * 1e6 + eigenvalues.imag
    return eigenvalues[key.argsort()]


def test_eigenvalue_counts_differ_as_documented():
    text = habit("FactoredMatrix.eigenvalues")
    assert "min(ldim, mdim)" in text and "mdim - ldim" in text and "extra zeros" in text
    gen = torch.Generator().manual_seed(0)
    f64 = torch.float64
    # inner dimension the larger (3 x 5 @ 5 x 3): TransformerLens adds 2 zeros
    A, B = torch.randn(3, 5, generator=gen, dtype=f64), torch.randn(5, 3, generator=gen, dtype=f64)
    ours, theirs = vi.FactoredMatrix(A, B).eigenvalues, TLFactoredMatrix(A, B).eigenvalues
    assert ours.shape == (3,) and theirs.shape == (5,)
    big = theirs[theirs.abs() > 1e-10]
    assert big.shape == (3,) and (theirs.abs() <= 1e-10).sum() == 2
    torch.testing.assert_close(by_value(ours), by_value(big), rtol=1e-10, atol=1e-12)
    # ... and so on a circuit of a model: the full QK circuit of d_in = 3 through d_head = 4
    model = random_model(tiny_cfg(d_in=3, d_head=4))
    circuit = vi.full_qk_circuit(model)
    assert circuit.eigenvalues.shape[-1] == 3
    assert TLFactoredMatrix(circuit.A, circuit.B).eigenvalues.shape[-1] == 4
    # inner dimension the smaller (6 x 2 @ 2 x 6): the same two eigenvalues
    A, B = torch.randn(6, 2, generator=gen, dtype=f64), torch.randn(2, 6, generator=gen, dtype=f64)
    ours, theirs = vi.FactoredMatrix(A, B).eigenvalues, TLFactoredMatrix(A, B).eigenvalues
    assert ours.shape == theirs.shape == (2,)
    torch.testing.assert_close(by_value(ours), by_value(theirs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_composition_scores_are_nan_where_transformer_lens_puts_0(kind):
    text = habit("Composition scores")
    assert "**NaN**" in text and "**0**" in text and "requires ``kind``" in text
    model = random_model(tiny_cfg(n_layers=3, n_heads=2, normalization=None))
    ours = vi.composition_scores(model, kind=kind)
    theirs = to_transformer_lens(model).all_composition_scores(kind)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    later = torch.arange(n_layers)[:, None, None, None] < torch.arange(n_layers)[:, None]
    later = later.expand(n_layers, n_heads, n_layers, n_heads)
    assert bool(ours[~later].isnan().all()) and bool((theirs[~later] == 0).all())
    # the defined entries are the same numbers (norms from the factors vs dense products)
    torch.testing.assert_close(ours[later], theirs[later], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.nan_to_num(ours), theirs, rtol=1e-10, atol=1e-12)
