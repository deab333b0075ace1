"""README.md's quickstart snippet and its commands stay true."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_quickstart_snippet_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README.md has no python snippet"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["y"].shape == (8, 16, 4)
    assert namespace["y_ablated"].shape == (8, 16, 4)
    assert not (namespace["y_ablated"] - namespace["y"]).abs().max() == 0


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    assert len(commands) >= 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1].strip() in ci
    install = commands[0].split("&& python examples")[0].strip()
    assert install in ci


def test_ci_runs_the_importer_tests_under_the_oldest_transformers_too():
    """pyproject.toml's hf extra declares a floor and a ceiling; .ci/run installs the floor
    (read from pyproject.toml) in a second venv and runs the tests marked hf there, the
    main venv (README's set-up, with the hf extra) running them under the newest."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    floor, ceiling = re.search(
        r'^hf = \["transformers>=([0-9.]+),<=([0-9.]+)"\]', pyproject, flags=re.M
    ).groups()
    assert tuple(map(int, floor.split("."))) < tuple(map(int, ceiling.split(".")))
    assert re.search(r'^markers = \[\n    "hf: ', pyproject, flags=re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'install -q -e ".[dev,hf]" "transformers==$hf_oldest"' in ci
    run = ci.split('"$wheel_check/hf-oldest/bin/python" -m pytest -p no:cacheprovider -m hf')[1]
    files = run.split("\n\n")[0].replace("\\\n", " ").split("\n")[0].split()
    assert files == ["tests/test_import_*.py", "tests/test_example_regression.py"]
    # ... which are the files whose tests are marked hf
    marked = sorted(
        f"tests/{f.name}"
        for f in (ROOT / "tests").glob("test_*.py")
        if re.search(r"^(pytestmark = pytest\.mark\.hf|@pytest\.mark\.hf)$", f.read_text(), re.M)
    )
    assert marked == [
        "tests/test_example_regression.py",
        "tests/test_import_garg.py",
        "tests/test_import_hf.py",
        "tests/test_import_llama.py",
    ]
    assert "hf]" in re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)[0]
