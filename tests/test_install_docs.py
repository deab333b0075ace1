"""The install commands of docs/getting_started.rst are README.md's, and neither page cites
a file of the authors' notes (``papers/...``) that the repository does not ship."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pip_installs(text: str) -> list[str]:
    """Each ``pip install ...`` command of a page, up to ``&&``, a comment or a line end."""
    return [c.strip() for c in re.findall(r"pip install ([^&#\n`]+)", text)]


def test_getting_started_installs_what_readme_installs():
    readme_setup = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    page = (ROOT / "docs" / "getting_started.rst").read_text()
    page_setup = re.findall(r"code-block:: bash\n\n(.*?)\n\n", page, re.S)[0]
    # the torch pin, then vecinterp with its extras
    # hf: the importers' tests run instead of skipping (issue 34)
    assert _pip_installs(readme_setup) == ["torch==2.13.0", '-e ".[dev,plot,docs,hf]"']
    assert _pip_installs(page_setup) == _pip_installs(readme_setup)
    # the CPU build the page names is the same release from PyTorch's CPU index
    cpu = [c for c in _pip_installs(page) if "--index-url" in c]
    assert cpu == ["torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"]


def test_no_docstring_or_page_cites_a_papers_file():
    """Papers are cited by authors, title, year and arXiv id: ``papers/`` is not shipped."""
    assert not (ROOT / "papers").exists()
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "examples").glob("*.py")]
    files += [*(ROOT / "docs").glob("*.rst"), ROOT / "README.md"]
    assert len(files) > 50
    citing = [str(f.relative_to(ROOT)) for f in files if "papers/" in f.read_text()]
    assert citing == []


def test_every_skip_is_listed_with_the_install_that_removes_it():
    """README's test command lists each skipped test with its reason (-rs in pyproject's
    addopts), a missing extra's reason names its install (the root conftest.py adds it to
    pytest.importorskip's "could not import"), and so does the summary line of each module
    whose doctests are left out for a missing extra."""
    import importlib.util

    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is Python 3.11 on
    addopts = re.search(r'^addopts = "(.*)"$', pyproject, flags=re.M).group(1)
    assert "-rs" in addopts.split()
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    extras = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
    for package in set(conftest._NEEDS.values()):
        install = conftest._EXTRA[package]
        extra = re.fullmatch(r'pip install -e "\.\[([a-z-]+)\]"', install).group(1)
        assert re.search(rf"^{extra} = \[", extras, flags=re.M), install
    reason = "could not import 'matplotlib': No module named 'matplotlib'"
    assert conftest.with_install(reason) == reason + ' (pip install -e ".[plot]")'
    named = 'transformers is not installed (pip install "vecinterp[hf]")'
    assert conftest.with_install(named) == named  # already says it
    assert conftest.with_install("needs a GPU") == "needs a GPU"
