"""pytest set-up shared by the test suite (tests/) and the doctests (src/vecinterp).

``pyproject.toml`` runs every docstring example in ``src/vecinterp`` with
``--doctest-modules``. A module that needs an optional extra cannot be imported without
it, so its doctests are left out when the extra is missing (the suite's own tests skip
with ``pytest.importorskip``).
"""

import importlib.util

import pytest
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
    "src/vecinterp/interop/garg.py": "transformers",
}
# the optional package -> the install that brings it
_EXTRA = {
    "matplotlib": 'pip install -e ".[plot]"',
    "transformer_lens": 'pip install -e ".[transformer-lens]"',
    "transformers": 'pip install -e ".[hf]"',
}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: a module stubbed out in sys.modules
        return False


collect_ignore = [path for path, package in _NEEDS.items() if not _installed(package)]


def pytest_terminal_summary(terminalreporter):
    """The doctests left out for a missing extra, each with the install that brings them
    back, at the end of the run (tests that skip say so themselves: -rs in pyproject.toml
    lists them)."""
    dropped = [
        f"{path}: {package} is not installed ({_EXTRA[package]})"
        for path, package in _NEEDS.items()
        if path in collect_ignore
    ]
    if dropped:
        terminalreporter.write_sep("=", "doctests not collected")
        for line in dropped:
            terminalreporter.write_line(line)


def with_install(reason: str) -> str:
    """A skip reason, with the install that removes it where the reason is a missing
    optional package (``pytest.importorskip``'s "could not import 'matplotlib'")."""
    for package, install in _EXTRA.items():
        if f"'{package}'" in reason and "pip install" not in reason:
            return f"{reason} ({install})"
    return reason


def _name_the_install(report):
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, line, reason = report.longrepr
        report.longrepr = (path, line, with_install(reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _name_the_install(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _name_the_install(outcome.get_result())
