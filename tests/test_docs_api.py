"""The documentation keeps up with the code.

- every public name has an entry in docs/api.rst, a docstring and an ``Example:`` doctest
  (the doctests themselves run through ``--doctest-modules``, see pyproject.toml);
- the code snippets of the landing page, Getting started and How-to run;
- the tutorial's code lines are the example script's own lines, and its figures exist.
"""

import doctest
import importlib.util
import inspect
import re
import types
from pathlib import Path

import pytest
import torch

import vecinterp as vi
import vecinterp.analysis
import vecinterp.testing
from vecinterp.tasks import (
    affine_claims,
    affine_recurrence,
    induction,
    induction_claims,
    retrieval,
    retrieval_claims,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_RST = (DOCS / "api.rst").read_text()

# Public names that need no ``Example:`` section, with the reason.
EXAMPLE_EXEMPT: dict[str, str] = {}

# The task modules: their functions and classes need an entry and an example; their
# module-level constants (UPPER_CASE) need an ``.. autodata::`` entry.
TASK_MODULES = [
    affine_recurrence,
    affine_claims,
    induction,
    induction_claims,
    retrieval,
    retrieval_claims,
]


def _constants(module: types.ModuleType) -> list[str]:
    return [n for n in vars(module) if n.isupper() and not n.startswith("_")]


def _defined_in(module: types.ModuleType) -> list[str]:
    """Public functions and classes defined in ``module`` itself (no ``__all__`` there)."""
    return sorted(
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__.startswith(module.__name__)  # a package: its submodules too
    )


def _public() -> dict[str, object]:
    """Qualified name -> object, for every name the API reference must cover."""
    names = {f"vecinterp.{n}": getattr(vi, n) for n in vi.__all__}
    names.update(
        {
            f"vecinterp.analysis.{n}": getattr(vecinterp.analysis, n)
            for n in vecinterp.analysis.__all__
        }
    )
    names.update(
        {f"vecinterp.testing.{n}": getattr(vecinterp.testing, n) for n in vecinterp.testing.__all__}
    )
    for task in TASK_MODULES:
        names.update({f"{task.__name__}.{n}": getattr(task, n) for n in _defined_in(task)})
    try:
        import vecinterp.plot as plot
    except ImportError:  # the plot extra is optional
        plot = None
    if plot is not None:
        names.update({f"vecinterp.plot.{n}": getattr(plot, n) for n in plot.__all__})
    return names


def _api_entries() -> list[tuple[str, str]]:
    """``(currentmodule, name)`` for every autosummary/autodata entry of api.rst."""
    entries, module = [], "vecinterp"
    in_autosummary = False
    for line in API_RST.splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            module = m.group(1)
        elif line.startswith(".. autosummary::"):
            in_autosummary = True
        elif m := re.match(r"\.\. auto(?:data|function|class):: (\S+)", line):
            entries.append((module, m.group(1)))
            in_autosummary = False
        elif in_autosummary and (m := re.fullmatch(r"   ([A-Za-z_]\w*)", line)):
            entries.append((module, m.group(1)))
        elif line and not line.startswith(" "):
            in_autosummary = False
    return entries


def _resolve(module: str, name: str) -> object:
    obj: object = __import__(module, fromlist=["_"])
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def test_api_rst_entries_resolve():
    entries = _api_entries()
    assert len(entries) > 60
    for module, name in entries:
        _resolve(module, name)  # raises AttributeError for a stale entry


@pytest.mark.parametrize("qualname", sorted(_public()))
def test_public_name_is_in_api_reference(qualname):
    documented = [_resolve(m, n) for m, n in _api_entries()]
    obj = _public()[qualname]
    assert any(obj is d for d in documented), f"{qualname} has no entry in docs/api.rst"


@pytest.mark.parametrize("qualname", sorted(_public()))
def test_public_name_has_docstring_and_example(qualname):
    name = qualname.rsplit(".", 1)[1]
    doc = inspect.getdoc(_public()[qualname]) or ""
    assert len(doc.split()) >= 5, f"{qualname} has no real docstring"
    if name in EXAMPLE_EXEMPT:
        return
    section = re.search(r"^(\s*)Examples?:\s*\n(.*)", doc, flags=re.M | re.S)
    assert section, f"{qualname}'s docstring has no 'Example:' section"
    assert ">>> " in section.group(2), f"{qualname}'s Example section has no doctest"


@pytest.mark.parametrize("task", TASK_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_task_constants_are_documented(task):
    entries = set(_api_entries())
    assert _constants(task), f"{task.__name__} has no constants?"
    for name in _constants(task):
        assert (task.__name__, name) in entries, f"{task.__name__}.{name} missing from api.rst"


def test_the_exemption_list_is_current():
    public = {q.rsplit(".", 1)[1] for q in _public()}
    assert set(EXAMPLE_EXEMPT) <= public, set(EXAMPLE_EXEMPT) - public


# ------------------------------------------------------------------------ page snippets


def _python_blocks(page: str) -> list[str]:
    """The ``.. code-block:: python`` blocks of ``docs/<page>.rst``, dedented."""
    text = (DOCS / f"{page}.rst").read_text()
    blocks = []
    for m in re.finditer(r"^\.\. code-block:: python\n((?:\n|   .*\n)+)", text, flags=re.M):
        lines = m.group(1).splitlines()
        blocks.append("\n".join(line[3:] for line in lines) + "\n")
    return blocks


def _run(page: str, blocks: list[str]) -> dict:
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/{page}.rst[{i}]", "exec"), namespace)
    return namespace


def test_landing_page_quickstart_runs():
    blocks = _python_blocks("index")
    assert len(blocks) == 1
    code = blocks[0].strip().splitlines()
    assert len([line for line in code if line.strip()]) <= 20  # stays a quickstart
    ns = _run("index", blocks)
    assert ns["y"].shape == (8, 16, 4)
    assert not torch.equal(ns["y_ablated"], ns["y"])


def test_getting_started_snippets_run():
    ns = _run("getting_started", _python_blocks("getting_started"))
    assert ns["y"].shape == (8, 16, 4)
    assert ns["loss"].ndim == 0
    assert not torch.equal(ns["y_ablated"], ns["y"])


def test_howto_snippets_run(tmp_path, monkeypatch):
    blocks = _python_blocks("howto")
    assert len(blocks) >= 7
    # The training recipe asks for 2,000 steps; a few show the same calls work.
    train_block = [i for i, b in enumerate(blocks) if "vi.train(" in b]
    assert len(train_block) == 1 and "steps=2000" in blocks[train_block[0]]
    blocks[train_block[0]] = (
        blocks[train_block[0]]
        .replace("steps=2000", "steps=4")
        .replace("warmup_steps=100", "warmup_steps=1")
        .replace("eval_every=200", "eval_every=2")
        .replace("checkpoint_every=500", "checkpoint_every=2")
    )
    monkeypatch.chdir(tmp_path)  # the recipes write checkpoints/ into the working directory
    ns = _run(
        "howto",
        [b.replace("model, make_batch,", "model, make_batch, progress=False,") for b in blocks],
    )
    assert ns["per_head"].shape == (2, 4)
    assert ns["k_comp"].shape == (2, 4, 2, 4)
    assert ns["attr"].values.shape[1:] == (8, 16)
    assert len(ns["result"].history.train_loss) == 4
    assert (tmp_path / "checkpoints" / "cumsum").is_dir()


# ----------------------------------------------------------------------------- tutorial

TUTORIAL_PATH = DOCS / "tutorial.rst"
TUTORIAL = TUTORIAL_PATH.read_text()
EXAMPLE_PATH = ROOT / "examples" / "affine_recurrence.py"
CHECKPOINT = affine_recurrence.reference_path("fast")


def _example_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("affine_recurrence_example", EXAMPLE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tutorial_session_gives_the_numbers_it_shows(monkeypatch):
    """Run the tutorial's ``>>>`` session on the shipped checkpoint, as a doctest."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert (CHECKPOINT / "config.json").is_file()
    example = _example_module()
    # The helpers the page shows with literalinclude: the example's or the library's.
    included = re.findall(r":pyobject: (\w+)", TUTORIAL)
    assert included
    globs = {
        name: getattr(example, name, None) or getattr(affine_claims, name) for name in included
    }
    monkeypatch.chdir(ROOT)  # the page runs as a user would, from the repository root
    try:
        result = doctest.testfile(
            str(TUTORIAL_PATH),
            module_relative=False,
            globs=globs,
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
            verbose=False,
            report=True,
        )
    finally:
        plt.close("all")
    assert result.attempted >= 30
    assert result.failed == 0, f"{result.failed} tutorial examples failed (see the output above)"


def test_tutorial_figures_exist_and_are_small():
    figures = re.findall(r"^\.\. (?:figure|image):: (\S+)", TUTORIAL, flags=re.M)
    assert len(figures) >= 8
    for figure in figures:
        path = DOCS / figure
        assert path.is_file(), figure
        assert path.stat().st_size < 300_000, f"{figure} is over 300 KB"
    # every figure the example writes is in the tutorial
    written = {f"{name}.png" for name in affine_claims.FIGURES}
    assert written <= {Path(f).name for f in figures}


def test_concepts_hook_table_lists_every_hook_point():
    table = (DOCS / "concepts.rst").read_text().split("Hook names\n----------")[1]
    documented = {
        name.replace(".L.", ".0.") for name in re.findall(r"^``([\w.]+)``\s{2,}", table, re.M)
    }
    hooks = set()
    for positional, gated in (("learned", False), ("rotary", True)):
        cfg = vi.VectorTransformerConfig(
            d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5, positional=positional,
            gated_mlp=gated,
        )  # fmt: skip
        hooks |= set(vi.HookedVectorTransformer(cfg, seed=0).hook_dict)
    assert documented == hooks
