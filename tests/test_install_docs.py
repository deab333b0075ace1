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
    assert _pip_installs(readme_setup) == ["torch==2.13.0", '-e ".[dev,plot,docs]"']
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
