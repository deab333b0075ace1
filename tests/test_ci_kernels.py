"""CI runs the suite a second time under another kernel selection (``.ci/run``), so that a
test that holds only with one instruction set or one BLAS code path fails there."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECOND = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def test_ci_runs_the_suite_under_a_second_kernel_selection():
    ci = (ROOT / ".ci" / "run").read_text()
    runs = re.findall(r"^(.*)python -m pytest\b.*$", ci, flags=re.M)
    prefixes = [p.split() for p in runs]
    assert [] in [[w for w in p if "=" in w] for p in prefixes]  # README's plain run
    assert [f"{k}={v}" for k, v in SECOND.items()] in prefixes


def test_the_second_selection_changes_torchs_kernels():
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {**os.environ, **SECOND}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "DEFAULT"
