"""Our SAELens files against SAELens itself (skipped where ``sae_lens`` is not installed;
it is not a dependency: run in a separate environment with ``pip install sae-lens``).

Both directions, for each architecture both sides have: SAELens's ``SAE.load_from_disk``
reads what :func:`save_saelens` wrote and computes what ours does, and :func:`load_saelens`
reads what SAELens's ``save_model`` wrote and computes what SAELens does."""

from pathlib import Path

import pytest
import torch

from helpers import random_dictionary
from vecinterp.dictionary import load_saelens, save_saelens

sae_lens = pytest.importorskip(
    "sae_lens",
    reason="sae_lens is not installed: in a separate environment, pip install -e '.[saelens]' "
    "(it brings transformer-lens and transformers)",
)

KINDS = [
    dict(activation="relu"),
    dict(activation="topk", k=3),
    dict(activation="jumprelu"),
    dict(activation="batchtopk", k=3),
    dict(activation="relu", transcoder=True, d_out=5),
    dict(activation="relu", transcoder=True, d_out=5, skip=True),
    dict(activation="jumprelu", transcoder=True, d_out=5),
    dict(activation="jumprelu", transcoder=True, d_out=5, skip=True),
]


def _ours(**kw: object):
    return random_dictionary("float64", (-3.0, -1.0), **kw)


def _theirs_forward(sae, x: torch.Tensor) -> torch.Tensor:
    return sae(x)


@pytest.mark.parametrize("kw", KINDS, ids=lambda kw: "-".join(map(str, kw.values())))
def test_saelens_reads_ours_and_we_read_theirs(tmp_path: Path, kw: dict) -> None:
    ours = _ours(**kw)
    save_saelens(ours, tmp_path / "ours")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "ours"), device="cpu")
    x = torch.randn(9, 6, dtype=torch.float64)
    with torch.no_grad():
        expected = ours(x)
        assert torch.allclose(_theirs_forward(theirs, x), expected, rtol=0, atol=1e-12)
        assert torch.equal(theirs.encode(x) > 0, ours.encode(x) > 0)
    theirs.save_model(str(tmp_path / "theirs"))
    back = load_saelens(tmp_path / "theirs")
    with torch.no_grad():
        assert torch.allclose(back(x), _theirs_forward(theirs, x), rtol=0, atol=1e-12)
