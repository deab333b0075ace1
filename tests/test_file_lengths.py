"""The house rule on long modules: a source file of vecinterp over ``MAX_LINES`` lines says,
in its module docstring, why it is one file (a sentence with "one file" or "the file is
long"). Without such a sentence a long module fails here, and the author splits it or
writes the reason."""

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "vecinterp"
MAX_LINES = 450
REASON = re.compile(r"\b(one file|the file is long)\b", re.IGNORECASE)


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _long_without_reason(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    if len(text.splitlines()) <= MAX_LINES:
        return False
    doc = ast.get_docstring(ast.parse(text)) or ""
    return REASON.search(doc) is None


def test_the_package_has_modules() -> None:
    assert len(_modules()) > 40  # the glob found the package, not an empty folder


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_a_long_module_says_why_it_is_one_file(path: Path) -> None:
    assert not _long_without_reason(path), (
        f"{path.relative_to(SRC)} has more than {MAX_LINES} lines and its module docstring "
        "does not say why it is one file (split it, or write the reason there)"
    )


def test_the_rule_catches_a_long_module_without_a_reason(tmp_path: Path) -> None:
    body = "\n".join(f"x{i} = {i}" for i in range(MAX_LINES + 1))
    bare = tmp_path / "bare.py"
    bare.write_text('"""A module."""\n' + body)
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text('"""A module.\n\nOne file because it is one table."""\n' + body)
    short = tmp_path / "short.py"
    short.write_text('"""A module."""\nx = 1\n')
    assert _long_without_reason(bare)
    assert not _long_without_reason(reasoned)
    assert not _long_without_reason(short)
