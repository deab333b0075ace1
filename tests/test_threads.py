"""One rule for the CPU threads of long work (issue 34, item 1): ``vi.choose_threads``,
``vi.use_threads``, the count a training run chooses once, records in its checkpoints and
reuses when resumed, and the opt-in ``threads=`` of the long analyses, each restoring
torch's setting."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import vecinterp as vi
from helpers import random_model, tiny_cfg, unchecked
from test_trust_io import assert_same_run, make_batch
from vecinterp import threads as th
from vecinterp.training import _speed
from vecinterp.training._record import sealed

KW = dict(lr=1e-2, progress=False, device="cpu", checkpoint_every=2, keep_last=None)


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Put torch's setting back as the suite had it (1), whatever a test does."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def fake_machine(monkeypatch, idle_share: float | None, cores: int, usable: int) -> None:
    monkeypatch.setattr(th, "_idle_share", lambda window: None if idle_share is None else
                        (idle_share, cores))  # fmt: skip
    monkeypatch.setattr(th, "_usable_cores", lambda: usable)


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("share", "cores", "usable", "expected"),
    [(1.0, 2, 2, 2), (0.5, 2, 2, 1), (0.02, 2, 2, 1), (0.75, 8, 8, 6), (0.75, 8, 4, 4)],
)
def test_idle_cores_is_the_idle_share_of_the_cores(monkeypatch, share, cores, usable, expected):
    """round(idle share * cores), at least 1, at most the cores this process may use."""
    fake_machine(monkeypatch, share, cores, usable)
    assert th.idle_cores() == expected


def test_idle_cores_without_proc_stat_uses_the_load_average(monkeypatch):
    fake_machine(monkeypatch, None, 0, 4)
    monkeypatch.setattr(th.os, "getloadavg", lambda: (2.6, 0.0, 0.0))
    assert th.idle_cores() == 1  # round(4 - 2.6)
    monkeypatch.setattr(th.os, "getloadavg", lambda: (0.4, 0.0, 0.0))
    assert th.idle_cores() == 4


def test_idle_cores_reads_this_machines_proc_stat():
    share = th._idle_share(0.05)
    if share is None:
        pytest.skip("no /proc/stat on this system (the load average is used instead)")
    assert 0.0 <= share[0] <= 1.0 and share[1] >= 1
    assert 1 <= th.idle_cores(0.05) <= th._usable_cores()


def test_choose_threads_is_capped_by_torchs_setting(monkeypatch, torch_threads):
    fake_machine(monkeypatch, 1.0, 8, 8)
    torch.set_num_threads(3)
    assert vi.choose_threads() == 3
    fake_machine(monkeypatch, 0.25, 8, 8)
    assert vi.choose_threads() == 2


def test_choose_threads_at_one_thread_does_not_measure(monkeypatch, torch_threads):
    torch.set_num_threads(1)

    def measured(window):
        raise AssertionError("measured the load although torch runs one thread")

    monkeypatch.setattr(th, "_idle_share", measured)
    assert vi.choose_threads() == 1


def test_use_threads_sets_and_restores_torchs_setting_even_on_errors(monkeypatch, torch_threads):
    torch.set_num_threads(3)
    with vi.use_threads(2) as n:
        assert n == torch.get_num_threads() == 2
    assert torch.get_num_threads() == 3
    with pytest.raises(RuntimeError, match="inside"), vi.use_threads(1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 3
    with vi.use_threads(None) as n:
        assert n == 3
    fake_machine(monkeypatch, 0.5, 4, 4)
    with vi.use_threads("auto") as n:
        assert n == torch.get_num_threads() == 2
    assert torch.get_num_threads() == 3
    for bad in (0, -1, True, 1.5, "2", "all"):
        with unchecked(), pytest.raises(ValueError, match=r"count must be an int >= 1, 'auto'"):
            with vi.use_threads(bad):
                pass


# ---------------------------------------------------------------- training


def trainer_record(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer.json").read_text())


def test_train_records_the_count_it_chose_and_restores_torchs(monkeypatch, tmp_path, torch_threads):
    torch.set_num_threads(3)
    monkeypatch.setattr(_speed, "choose_threads", lambda: 2)
    seen = []
    vi.train(random_model(tiny_cfg()), make_batch, steps=2, checkpoint_dir=tmp_path / "auto",
             callback=lambda s, m: seen.append(torch.get_num_threads()), **KW)  # fmt: skip
    assert seen == [2, 2]
    assert torch.get_num_threads() == 3
    assert trainer_record(tmp_path / "auto" / "step_00000002")["threads"] == 2
    vi.train(random_model(tiny_cfg()), make_batch, steps=2, checkpoint_dir=tmp_path / "four",
             threads=4, **KW)  # fmt: skip
    assert trainer_record(tmp_path / "four" / "step_00000002")["threads"] == 4
    vi.train(random_model(tiny_cfg()), make_batch, steps=2, checkpoint_dir=tmp_path / "none",
             threads=None, **KW)  # fmt: skip
    assert trainer_record(tmp_path / "none" / "step_00000002")["threads"] == 3
    assert torch.get_num_threads() == 3


def test_a_resume_reuses_the_recorded_count_and_stays_bit_identical(
    monkeypatch, tmp_path, torch_threads
):
    """The first part of the run chose 2 threads; the resuming process has torch at 1 and
    its rule would choose 1: the resume runs with the recorded 2 and ends bit-identical to
    an uninterrupted run."""
    monkeypatch.setattr(_speed, "choose_threads", lambda: 2)
    torch.set_num_threads(2)
    whole = vi.train(random_model(tiny_cfg()), make_batch, steps=6, checkpoint_dir=tmp_path /
                     "whole", **KW)  # fmt: skip
    part = vi.train(random_model(tiny_cfg()), make_batch, steps=4, checkpoint_dir=tmp_path /
                    "cut", **KW)  # fmt: skip
    assert trainer_record(part.checkpoint)["threads"] == 2
    torch.set_num_threads(1)
    monkeypatch.setattr(_speed, "choose_threads", lambda: 1)
    seen = []
    resumed = vi.train(random_model(tiny_cfg()), make_batch, steps=6, resume=True,
                       checkpoint_dir=tmp_path / "cut",
                       callback=lambda s, m: seen.append(torch.get_num_threads()),
                       **KW)  # fmt: skip
    assert seen == [2, 2]
    assert torch.get_num_threads() == 1
    assert_same_run(resumed, whole)
    assert trainer_record(resumed.checkpoint)["threads"] == 2


def test_a_checkpoint_without_a_count_still_resumes(monkeypatch, tmp_path, torch_threads):
    """Checkpoints written before the count was recorded resume with the rule's count."""
    torch.set_num_threads(1)
    whole = vi.train(random_model(tiny_cfg()), make_batch, steps=4, checkpoint_dir=tmp_path /
                     "whole", **KW)  # fmt: skip
    part = vi.train(random_model(tiny_cfg()), make_batch, steps=2, checkpoint_dir=tmp_path /
                    "old", **KW)  # fmt: skip
    file = part.checkpoint / "trainer.json"
    record = json.loads(file.read_text())
    record.pop("vecinterp.sha256")
    record.pop("threads")
    file.write_text(json.dumps(sealed(record), indent=2, sort_keys=True))
    monkeypatch.setattr(_speed, "choose_threads", lambda: 1)
    resumed = vi.train(random_model(tiny_cfg()), make_batch, steps=4, resume=True,
                       checkpoint_dir=tmp_path / "old", **KW)  # fmt: skip
    assert_same_run(resumed, whole)


def test_a_recorded_count_that_is_not_a_count_is_refused(tmp_path, torch_threads):
    part = vi.train(random_model(tiny_cfg()), make_batch, steps=2, checkpoint_dir=tmp_path, **KW)
    file = part.checkpoint / "trainer.json"
    record = json.loads(file.read_text())
    record.pop("vecinterp.sha256")
    record["threads"] = 0
    file.write_text(json.dumps(sealed(record), indent=2, sort_keys=True))
    with pytest.raises(ValueError, match=r"field 'threads' must be an int >= 1"):
        vi.train(random_model(tiny_cfg()), make_batch, steps=4, resume=True,
                 checkpoint_dir=tmp_path, **KW)  # fmt: skip


def test_an_ensemble_records_and_reuses_its_count(monkeypatch, tmp_path, torch_threads):
    members = [random_model(tiny_cfg(), seed=s) for s in range(2)]
    kw = dict(KW, seed=[0, 1])
    monkeypatch.setattr(_speed, "choose_threads", lambda: 2)
    torch.set_num_threads(3)
    whole = vi.train_ensemble(members, make_batch, steps=4, checkpoint_dir=tmp_path / "whole",
                              **kw)  # fmt: skip
    assert torch.get_num_threads() == 3
    vi.train_ensemble(members, make_batch, steps=2, checkpoint_dir=tmp_path / "cut", **kw)
    for m in ("member_000", "member_001"):
        assert trainer_record(tmp_path / "cut" / m / "step_00000002")["threads"] == 2
    monkeypatch.setattr(_speed, "choose_threads", lambda: 1)
    seen = []
    resumed = vi.train_ensemble(members, make_batch, steps=4, resume=True,
                                checkpoint_dir=tmp_path / "cut",
                                callback=lambda s, m: seen.append(torch.get_num_threads()),
                                **kw)  # fmt: skip
    assert seen == [2, 2] and torch.get_num_threads() == 3
    for a, b in zip(resumed, whole, strict=True):
        assert_same_run(a, b)


# ---------------------------------------------------------------- the analyses


def small() -> vi.HookedVectorTransformer:
    return vi.HookedVectorTransformer(vi.VectorTransformerConfig(
        d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)  # fmt: skip


def recording(model: vi.HookedVectorTransformer, seen: list[int]) -> None:
    model.add_hook("blocks.0.hook_resid_pre",
                   lambda act, hook: seen.append(torch.get_num_threads()))  # fmt: skip


@pytest.mark.parametrize("analysis", ["fit_probes", "alignment_search", "head_ablation_sweep",
                                      "discover_circuit", "circuit_threshold_sweep"])  # fmt: skip
def test_the_long_analyses_run_with_threads_and_restore_torchs_setting(analysis, torch_threads):
    torch.set_num_threads(3)
    model, seen = small(), []
    x, y = torch.randn(30, 5, 3), torch.randn(30, 5, 3)
    with torch.no_grad():
        counterfactual = model(y)

    def metric(out, *rest):
        seen.append(torch.get_num_threads())
        return out.sum()

    calls = {
        "fit_probes": lambda t: (recording(model, seen), vi.fit_probes(
            model, x, x[:, 0], "blocks.0.hook_resid_pre", n_bootstrap=2, progress=False,
            threads=t)),
        "alignment_search": lambda t: (recording(model, seen), vi.alignment_search(
            model, x, y, counterfactual, "blocks.0.hook_resid_post", steps=1,
            control=False, progress=False, threads=t)),
        "head_ablation_sweep": lambda t: vi.head_ablation_sweep(
            model, x, y, "zero", metric=metric, progress=False, threads=t),
        "discover_circuit": lambda t: vi.discover_circuit(
            model, x[:8], y[:8], metric=metric, threshold=0.0, progress=False, threads=t),
        "circuit_threshold_sweep": lambda t: vi.circuit_threshold_sweep(
            model, x[:8], y[:8], metric=metric, thresholds=[0.0], progress=False, threads=t),
    }  # fmt: skip
    calls[analysis](2)
    assert seen and set(seen) == {2}
    assert torch.get_num_threads() == 3
    seen.clear()
    model.reset_hooks()
    calls[analysis](None)
    assert set(seen) == {3}
    with unchecked(), pytest.raises(ValueError, match=r"threads must be an int >= 1, 'auto'"):
        calls[analysis](0)
    assert torch.get_num_threads() == 3
