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
