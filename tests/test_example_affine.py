"""The affine-recurrence example: runs end to end (``--fast``, several checkpoints), explains
a missing checkpoint, resolves reference names from any directory, and the shipped model's
figures are the ones the docs show (tutorial and replication page)."""

import contextlib
import importlib.util
import io
import json
import math
import re
import struct
from pathlib import Path

import pytest

import vecinterp as vi
from vecinterp.tasks import affine_claims as ac
from vecinterp.tasks import affine_recurrence as ar

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "affine_recurrence.py"
VERDICTS = ("holds", "partly", "does not hold")
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def _example():
    spec = importlib.util.spec_from_file_location("affine_recurrence_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(argv):
    # --threads 1: the default takes the cores the load average leaves idle, and torch's
    # thread count is global (the rest of the suite runs on one thread; conftest.py)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = _example().main([*argv, "--threads", "1"])
    return results, out.getvalue()


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("affine_fast")
    results, printed = _run(["--fast", "--no-progress", "--out", str(out)])
    return out, results, printed


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">II", data[16:24])


LABELS = [str(n) for n in range(1, 10)] + ["10a", "10b", "11", "12", "13"]


def test_the_example_stays_a_short_script():
    assert len(EXAMPLE.read_text().splitlines()) <= 200


def test_fast_run_prints_a_line_per_analysis_then_the_table(fast_run):
    _, results, printed = fast_run
    lines = printed.splitlines()
    timed = [line for line in lines if re.search(r"\d+\.\d s   \(elapsed \d+\.\d s\)$", line)]
    assert [line.split()[0] for line in timed[:-1]] == [
        label.split()[0] for label in results[0].timings
    ]
    assert timed[-1].split()[0] == "figures"
    for label in LABELS:
        assert any(line.startswith(f"{label:>3}  ") for line in lines), label
    assert lines[-1].startswith("wall time: ")


def test_fast_run_writes_the_report_with_one_column_per_model(fast_run):
    out, results, _ = fast_run
    report = (out / "report.md").read_text()
    assert "| # | claim | paper | trained |" in report
    table = report.split("## Claims on trained, every reading")[1]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+[ab]? \|", line)]
    assert [line.split("|")[1].strip() for line in rows] == LABELS
    for line in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        assert len(cells) == 6, line
        ours, verdict = cells[3], cells[5]
        assert NUMBER.search(ours), f"no number in the 'ours' cell: {line}"
        assert "nan" not in ours.lower() and "inf" not in ours.lower(), line
        assert verdict in VERDICTS, line
    for c in results[0].claims:
        assert c.basis in report
    values = json.loads((out / "values_trained.json").read_text())
    assert ac.judge_claims(values) == results[0].claims


def test_fast_run_writes_every_figure_legibly(fast_run):
    out, _, _ = fast_run
    report = (out / "report.md").read_text()
    for name in ac.FIGURES:
        path = out / f"{name}.png"
        assert path.is_file(), f"{name} missing"
        width, height = _png_size(path)
        assert width >= 500 and height >= 300, (name, width, height)  # not a thumbnail
        assert f"]({name}.png)" in report, f"report.md does not link {name}"


def test_several_checkpoints_give_one_column_each(tmp_path):
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**ac.FAST_MODEL_CONFIG), seed=3)
    vi.save(model, tmp_path / "tiny")
    out = tmp_path / "out"
    argv = ["--checkpoint", str(tmp_path / "tiny"), str(tmp_path / "tiny"), "--no-figures"]
    results, printed = _run([*argv, "--out", str(out)])
    assert len(results) == 2
    # the same weights loaded twice: the same verdicts and readings, to rounding (CPU matmul
    # kernels may round differently with the alignment of the loaded buffers)
    for a, b in zip(results[0].claims, results[1].claims, strict=True):
        assert (a.number, a.verdict) == (b.number, b.verdict)
        for ra, rb in zip((a.primary, *a.alternatives), (b.primary, *b.alternatives), strict=True):
            assert ra.name == rb.name
            assert math.isclose(ra.value, rb.value, rel_tol=1e-6, abs_tol=1e-9) or (
                math.isnan(ra.value) and math.isnan(rb.value)
            ), (a.number, ra.name, ra.value, rb.value)
    report = (out / "report.md").read_text()
    assert "| # | claim | paper | tiny_0 | tiny_1 |" in report
    assert "| # | claim | paper | tiny_0 | tiny_1 |" in printed
    assert (out / "values_tiny_0.json").is_file() and (out / "values_tiny_1.json").is_file()
    assert results[0].values["normalise"] == "inputs"
    assert not list(out.glob("*.png"))


def test_missing_checkpoint_says_how_to_get_one(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    with pytest.raises(SystemExit) as info:
        _example().main(
            ["--checkpoint", str(missing), "--out", str(tmp_path / "out"), "--threads", "1"]
        )
    message = str(info.value.code)
    assert str(missing) in message
    assert "examples/train_affine.py" in message
    assert "--train" in message
    assert "fast" in message  # the reference names
    assert not (tmp_path / "out").exists()


def test_reference_names_resolve_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, history, source, normalise = _example().load_model("fast")
    assert model.cfg == vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
    assert history is not None and len(history["train_loss"]) == len(history["steps"]) > 1000
    assert "fast" in source and normalise == "inputs"


def test_a_checkpoint_is_judged_on_data_normalised_as_its_metadata_says(tmp_path):
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**ac.FAST_MODEL_CONFIG), seed=3)
    vi.save(model, tmp_path / "all", metadata={"normalise": "all"})
    vi.save(model, tmp_path / "plain")
    assert _example().load_model(str(tmp_path / "all"))[3] == "all"
    assert _example().load_model(str(tmp_path / "plain"))[3] == "inputs"


# --------------------------------------------------- the shipped model, as the docs show it


@pytest.fixture(scope="module")
def reference():
    return ac.measure_claims(ar.load_reference("fast"))


def _list_table_rows(text: str, after: str) -> list[list[str]]:
    """The rows of the first ``list-table`` after ``after`` in an rst page."""
    block = text.split(after, 1)[1].split(".. list-table::", 1)[1]
    rows: list[list[str]] = []
    for line in block.splitlines()[1:]:
        if line.startswith("   * - "):
            rows.append([line[7:].strip()])
        elif line.startswith("     - ") or line.rstrip() == "     -":
            rows[-1].append(line[7:].strip())
        elif line and not line.startswith(" "):
            break
    return rows


def test_replication_page_shows_the_reference_models_figures(reference):
    # the two shipped models' columns, measured now; claim 11' picks different heads on
    # the two, so its label is the generic one, as on the page's four models
    page = (ROOT / "docs" / "replication_affine.rst").read_text()
    rows = _list_table_rows(page, "Robustness across models")
    header, body = rows[0], rows[1:]
    names = ["fast, seed 0 (shipped)", "paper, seed 0 (shipped)"]
    columns = [header.index(name) for name in names]
    paper = ac.measure_claims(ar.load_reference("paper"))
    expected = ac.robustness_table([reference, paper], names, fmt="rst")
    expected_rows = _list_table_rows("x\n" + expected, "x")
    assert len(body) == len(expected_rows) - 1
    for row, want in zip(body, expected_rows[1:], strict=True):
        assert row[:3] == want[:3] and [row[c] for c in columns] == want[3:], (row, want)


def test_tutorial_claims_table_is_the_reference_model(reference):
    page = (ROOT / "docs" / "tutorial.rst").read_text()
    rows = _list_table_rows(page, "All the claims\n")
    expected = _list_table_rows("x\n" + ac.claims_table(reference, fmt="rst"), "x")
    assert rows == expected
