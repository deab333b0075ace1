"""examples/in_context_regression.py runs end to end: on the shipped model (its summary
holds the curves, attention shares summing to 1, the attribution and the ablation grid) and
on a checkpoint of Garg et al.'s code given with --checkpoint."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "in_context_regression.py"


def run(tmp_path, *extra):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--prompts",
            "64",
            "--out",
            str(out),
            "--no-figures",
            *extra,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = json.loads((out / "summary.json").read_text())
    # the error table's header names every column whole (it cut "3-nearest_neighbours")
    header = next(line for line in done.stdout.splitlines() if line.strip().startswith("k "))
    assert header.split() == ["k", "model", "least_squares", "3-nearest_neighbours", "averaging"]
    return summary


def test_help_and_checkpoint_without_n_head():
    """--help's description is a whole sentence (it was the docstring's first line, cut
    mid-sentence), and --checkpoint without --n-head is refused (it assumed 8 heads)."""
    help_text = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], check=True, capture_output=True, text=True
    ).stdout
    description = " ".join(help_text.split("\n\n")[1].split())
    assert description.startswith("In-context linear regression") and description.endswith(".")
    assert "required with --checkpoint" in " ".join(help_text.split())
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--checkpoint", "state.pt", "--no-figures"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "--checkpoint needs --n-head" in done.stderr


def test_shipped_model(tmp_path):
    summary = run(tmp_path)
    assert (summary["dim"], summary["n_points"]) == (5, 11)
    curves = summary["curves"]
    assert set(curves) == {"model", "least_squares", "3-nearest_neighbours", "averaging", "zero"}
    assert all(len(c) == 11 for c in curves.values())
    for shares in summary["attention_from_x"].values():
        assert abs(sum(shares.values()) - 1) < 1e-5 and min(shares.values()) > -1e-6
    assert len(summary["ablation_past_d"]["heads"]) == 4


@pytest.mark.hf
def test_garg_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    parts = torch.nn.Module()
    parts._read_in = torch.nn.Linear(3, 16)
    config = transformers.GPT2Config(n_positions=2 * 4, n_embd=16, n_layer=2, n_head=2)
    parts._backbone = transformers.GPT2Model(config)
    parts._read_out = torch.nn.Linear(16, 1)
    torch.save({"model_state_dict": parts.state_dict()}, tmp_path / "state.pt")
    summary = run(tmp_path, "--checkpoint", str(tmp_path / "state.pt"), "--n-head", "2")
    assert (summary["dim"], summary["n_points"]) == (3, 4)
    assert len(summary["attention_from_x"]) == 4
