"""pytest set-up shared by the test suite (tests/) and the doctests (src/vecinterp).

``pyproject.toml`` runs every docstring example in ``src/vecinterp`` with
``--doctest-modules``. A module that needs an optional extra cannot be imported without
it, so its doctests are left out when the extra is missing (the suite's own tests skip
with ``pytest.importorskip``).
"""

import importlib.util

import torch

# Do not import vecinterp here: conftest files load before jaxtyping's import hook is
# installed (--jaxtyping-packages), and a module imported now would go unchecked.

# Tiny models everywhere (tests and doctests): with more than one thread, OpenMP wake-ups
# cost more than the arithmetic (a 2x2x6x6 softmax took 20 ms on a busy 2-core machine).
torch.set_num_threads(1)

# path (relative to this file) -> the optional package its doctests import
_NEEDS = {
    "src/vecinterp/plot": "matplotlib",  # the "plot" extra
    # interop: TransformerLens (its extra) and Hugging Face transformers (the "hf" extra);
    # interop/torch_encoder.py needs only torch
    "src/vecinterp/interop/transformer_lens.py": "transformer_lens",
    "src/vecinterp/interop/tl_vectors.py": "transformer_lens",
    "src/vecinterp/interop/hf.py": "transformers",
    "src/vecinterp/interop/hf_gpt2.py": "transformers",
}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: a module stubbed out in sys.modules
        return False


collect_ignore = [path for path, package in _NEEDS.items() if not _installed(package)]
