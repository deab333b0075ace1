"""Kill saves and training runs with SIGKILL at random instants, and count what breaks.

(a) ``vi.save`` over an existing save. A forked child saves two models in turn (their
    configs differ in shape; the metadata names the model) over one path; the parent kills
    it after a random delay, ``--saves`` times. After each kill the path must load, and its
    weights must be those of the model its metadata names. Debris: hidden entries beside the
    path or temporary files inside it, counted after the kills (before any clean-up) and
    after one more complete save.
(b) Training with checkpoints. A forked child runs ``vi.train(..., resume=True)``; the parent
    kills it at a random instant, ``--kills-per-run`` times per run, then lets the run finish.
    After each kill every checkpoint in the directory must be readable; each finished run
    must be bit-identical (weights, optimizer state, losses) to an uninterrupted run.
(c) Two runs started together on one ``checkpoint_dir``, ``--pairs`` times: does the first
    finish bit-identical to a run alone, and is the second refused with a clear message?
(d) Ensembles, ``--ensembles`` times: while a forked ``vi.train_ensemble`` runs, ``vi.train``
    (resume=True) in its ``member_000`` reached as ``"."`` from inside it and through a
    symbolic link must be refused without touching a file, and the ensemble must finish
    bit-identical to one alone; then its ``ensemble.json`` replaced by a FIFO, by a link to
    ``/dev/zero`` and removed, and its member directories swapped: each resume (in a forked
    child with 2 GiB of address space, killed after 60 s) must be refused clearly.

Run the same script against another checkout to compare (the before/after figures)::

    python benchmarks/kill_saves.py
    PYTHONPATH=<other checkout>/src python benchmarks/kill_saves.py

The defaults take about two minutes on a busy 2-core machine. POSIX only (fork, SIGKILL).
"""

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

import vecinterp as vi
from vecinterp.model.io import read_config
from vecinterp.training.checkpoint import list_checkpoints, read_checkpoint

F64 = torch.float64


def fork(fn: Callable[[], int]) -> int:
    """Run ``fn`` in a forked child whose exit code is ``fn``'s return value (1 if it
    raises; the traceback goes to stderr)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def reap(pid: int) -> int:
    """Wait for child ``pid``; its exit code (``-signal`` if a signal ended it)."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def kill(pid: int) -> int:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return reap(pid)


def tree_size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------- (a) saves


def save_models() -> dict[str, vi.HookedVectorTransformer]:
    """Two ~1.6 MB models whose configs differ in shape (d_mlp)."""
    base = dict(d_in=8, d_model=128, d_head=32, n_heads=4, n_layers=2, n_ctx=16)
    return {
        "a": vi.HookedVectorTransformer(vi.VectorTransformerConfig(**base, d_mlp=512), seed=0),
        "b": vi.HookedVectorTransformer(vi.VectorTransformerConfig(**base, d_mlp=384), seed=1),
    }


def check_save(target: Path, models: dict[str, vi.HookedVectorTransformer]) -> str:
    """``"ok"``, ``"unloadable"`` or ``"mismatched"`` (loads, but its weights are not the
    ones of the model its metadata names)."""
    try:
        loaded = vi.load(target)
        name = read_config(target)[1]["id"]
    except Exception:
        return "unloadable"
    expected = models[name].state_dict()
    same = loaded.cfg == models[name].cfg and all(
        torch.equal(v, expected[k]) for k, v in loaded.state_dict().items()
    )
    return "ok" if same else "mismatched"


def debris(parent: Path, target: Path) -> list[Path]:
    """What saves left that is not a save: entries beside ``target`` in ``parent`` and
    entries inside ``target`` other than the two files of a save."""
    beside = [p for p in parent.iterdir() if p != target]
    inside = [p for p in target.iterdir() if p.name not in ("config.json", "model.safetensors")]
    return beside + inside


def kill_saves(n: int, rng: random.Random, root: Path) -> dict[str, object]:
    models = save_models()
    parent = root / "saves"
    target = parent / "run"
    vi.save(models["a"], target, metadata={"id": "a"})
    t0 = time.perf_counter()
    for name in "abab":
        vi.save(models[name], target, metadata={"id": name})
    per_save = (time.perf_counter() - t0) / 4

    def save_forever() -> int:
        i = 0
        while True:
            name = "ab"[i % 2]
            vi.save(models[name], target, metadata={"id": name})
            i += 1

    counts = {"ok": 0, "unloadable": 0, "mismatched": 0}
    most_debris = 0
    for _ in range(n):
        pid = fork(save_forever)
        time.sleep(rng.uniform(0.0, 4 * per_save))
        kill(pid)
        counts[check_save(target, models)] += 1
        most_debris = max(most_debris, len(debris(parent, target)))
    left = debris(parent, target)
    after_kills = (len(left), sum(tree_size(p) for p in left))
    vi.save(models["a"], target, metadata={"id": "a"})
    left = debris(parent, target)
    after_save = (len(left), sum(tree_size(p) for p in left))
    return {
        "kills": n,
        "seconds_per_save": round(per_save, 4),
        **counts,
        "most_debris_seen": most_debris,
        "debris_after_kills": after_kills,
        "debris_after_one_more_save": after_save,
    }


# ---------------------------------------------------------------------- (b), (c) training

TRAIN_CFG = vi.VectorTransformerConfig(
    d_in=3, d_out=3, d_model=16, d_head=8, n_heads=2, n_layers=2, d_mlp=32, n_ctx=8
)
STEPS = 30


def make_batch(step: int, gen: torch.Generator):
    x = torch.randn(8, 8, 3, generator=gen, dtype=F64)
    return x, torch.cumsum(x, dim=1) / 4


def train(checkpoint_dir: Path, resume: bool) -> vi.TrainResult:
    model = vi.HookedVectorTransformer(TRAIN_CFG, seed=0, dtype=F64)
    return vi.train(
        model, make_batch, steps=STEPS, lr=3e-3, warmup_steps=5, schedule="cosine",
        grad_clip=1.0, ema_decay=0.9, checkpoint_dir=checkpoint_dir, checkpoint_every=3,
        keep_last=2, resume=resume, progress=False, device="cpu", seed=0,
    )  # fmt: skip


def resume_run(checkpoint_dir: Path) -> int:
    train(checkpoint_dir, resume=True)
    return 0


def same_checkpoint(a: Path, b: Path) -> bool:
    """Bit-identical weights, weight average, optimizer state and losses."""
    x, y = read_checkpoint(a), read_checkpoint(b)
    for key in ("model", "average"):
        sx, sy = x[key].state_dict(), y[key].state_dict()
        if sx.keys() != sy.keys() or not all(torch.equal(sx[k], sy[k]) for k in sx):
            return False
    ox, oy = x["optimizer"]["state"], y["optimizer"]["state"]
    if ox.keys() != oy.keys() or any(
        not torch.equal(ox[i][n], oy[i][n]) for i in ox for n in ox[i]
    ):
        return False
    return all(
        torch.equal(x["history"][k], y["history"][k]) for k in x["history"] if k != "wall_time"
    )


def unreadable_checkpoints(checkpoint_dir: Path) -> int:
    bad = 0
    for path in list_checkpoints(checkpoint_dir):
        try:
            read_checkpoint(path)
        except Exception:
            bad += 1
    return bad


def kill_training(runs: int, kills: int, rng: random.Random, root: Path) -> dict[str, object]:
    train(root / "warm-up", resume=False)  # the first run in a process pays one-off costs
    reference = root / "reference"
    t0 = time.perf_counter()
    train(reference, resume=False)
    per_run = time.perf_counter() - t0
    final = reference / f"step_{STEPS:08d}"
    counts = {"kills": 0, "unreadable": 0, "identical": 0, "different": 0, "crashed": 0}
    for run in range(runs):
        directory = root / f"run{run}"
        for _ in range(kills):
            pid = fork(lambda d=directory: resume_run(d))
            time.sleep(rng.uniform(0.0, per_run))
            kill(pid)
            counts["kills"] += 1
            counts["unreadable"] += unreadable_checkpoints(directory)
        pid = fork(lambda d=directory: resume_run(d))
        if reap(pid) != 0:
            counts["crashed"] += 1
            continue
        ok = same_checkpoint(directory / f"step_{STEPS:08d}", final)
        counts["identical" if ok else "different"] += 1
    return {"runs": runs, "seconds_per_run": round(per_run, 3), **counts}


def concurrent_runs(pairs: int, root: Path) -> dict[str, object]:
    final = root / "reference" / f"step_{STEPS:08d}"
    counts = {"pairs": pairs, "first_finished_identical": 0, "second_refused_clearly": 0,
              "runs_crashed": 0}  # fmt: skip
    for pair in range(pairs):
        directory = root / f"pair{pair}"
        status = root / f"pair{pair}.status"
        status.mkdir()

        def run(label: str, d: Path = directory, s: Path = status) -> int:
            try:
                train(d, resume=False)
                (s / label).write_text("finished")
                return 0
            except Exception as err:
                (s / label).write_text(f"{type(err).__name__}: {err}")
                return 2

        first = fork(lambda: run("first"))
        time.sleep(0.2)  # the first has started; the second comes while it trains
        second = fork(lambda: run("second"))
        reap(first), reap(second)
        outcome = {p.name: p.read_text() for p in status.iterdir()}
        clear = [
            label
            for label, other in (("first", second), ("second", first))
            if "in use by another training run" in outcome.get(label, "")
            and f"pid {other}" in outcome[label]
        ]
        counts["second_refused_clearly"] += "second" in clear
        counts["runs_crashed"] += sum(
            outcome.get(label) != "finished" and label not in clear for label in ("first", "second")
        )
        last = directory / f"step_{STEPS:08d}"
        if outcome.get("first") == "finished" and last.is_dir() and same_checkpoint(last, final):
            counts["first_finished_identical"] += 1
    return counts


ENSEMBLE_SEEDS = [0, 1]


def train_ensemble(checkpoint_dir: Path, resume: bool, callback=None) -> vi.EnsembleResult:
    models = [vi.HookedVectorTransformer(TRAIN_CFG, seed=s, dtype=F64) for s in ENSEMBLE_SEEDS]
    return vi.train_ensemble(
        models, make_batch, steps=STEPS, lr=3e-3, warmup_steps=5, schedule="cosine",
        grad_clip=1.0, ema_decay=0.9, checkpoint_dir=checkpoint_dir, checkpoint_every=3,
        keep_last=2, resume=resume, progress=False, device="cpu", seed=ENSEMBLE_SEEDS,
        callback=callback,
    )  # fmt: skip


def member_listing(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(directory)), p.lstat().st_size) for p in directory.rglob("*"))


def refused_in_child(action: Callable[[], None], status: Path) -> str:
    """Run ``action`` in a forked child (2 GiB of address space, killed after 60 s); its
    outcome: ``"refused: <message>"``, ``"accepted"``, ``"crashed"`` or ``"hung"``."""

    def child() -> int:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        try:
            action()
            status.write_text("accepted")
        except ValueError as err:
            status.write_text(f"refused: {err}")
        return 0

    pid = fork(child)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            return status.read_text() if status.exists() else "crashed"
        time.sleep(0.05)
    kill(pid)
    return "hung"


def ensembles(n: int, root: Path) -> dict[str, object]:
    """Section (d): an ensemble's directories."""
    reference = root / "ensemble-reference"
    train_ensemble(reference, resume=False)
    final = f"step_{STEPS:08d}"
    counts = {"ensembles": n, "member_runs_refused": 0, "member_runs_let_through": 0,
              "ensemble_identical": 0, "ensemble_different_or_crashed": 0,
              "bad_resumes_refused_clearly": 0, "bad_resumes_not_refused": []}  # fmt: skip
    for i in range(n):
        directory = root / f"ensemble{i}"
        started = root / f"ensemble{i}.started"

        def slow(step: int, metrics: object, s: Path = started) -> None:
            if step == 3:
                s.touch()
            if step >= 3:
                time.sleep(0.25)  # the attempts below come while it runs

        def ensemble_run(d: Path = directory, cb=slow) -> int:
            train_ensemble(d, resume=False, callback=cb)
            return 0

        pid = fork(ensemble_run)
        while not started.exists():
            time.sleep(0.01)
        here = Path.cwd()
        for how in ("cwd", "symlink"):
            if os.waitpid(pid, os.WNOHANG)[0]:
                raise RuntimeError("the ensemble ended before the runs in its member_000 came")
            before = member_listing(directory / "member_000")
            try:
                if how == "cwd":
                    os.chdir(directory / "member_000")
                    target = Path(".")
                else:
                    target = root / f"ensemble{i}-link"
                    target.symlink_to(directory / "member_000")
                model = vi.HookedVectorTransformer(TRAIN_CFG, seed=0, dtype=F64)
                vi.train(model, make_batch, steps=STEPS, lr=3e-3, checkpoint_dir=target,
                         checkpoint_every=3, keep_last=1, resume=True, progress=False,
                         device="cpu")  # fmt: skip
                counts["member_runs_let_through"] += 1
            except ValueError as err:
                untouched = member_listing(directory / "member_000") == before
                ok = "is a member's directory of the ensemble" in str(err) and untouched
                counts["member_runs_refused" if ok else "member_runs_let_through"] += 1
            finally:
                os.chdir(here)
        code = reap(pid)
        same = code == 0 and all(
            same_checkpoint(directory / m / final, reference / m / final)
            for m in ("member_000", "member_001")
        )
        counts["ensemble_identical" if same else "ensemble_different_or_crashed"] += 1

    def fifo(d: Path) -> None:
        (d / "ensemble.json").unlink()
        os.mkfifo(d / "ensemble.json")

    def dev_zero(d: Path) -> None:
        (d / "ensemble.json").unlink()
        (d / "ensemble.json").symlink_to("/dev/zero")

    def swap(d: Path) -> None:
        (d / "member_000").rename(d / "swap")
        (d / "member_001").rename(d / "member_000")
        (d / "swap").rename(d / "member_001")

    edits = {"ensemble.json a FIFO": fifo, "ensemble.json -> /dev/zero": dev_zero,
             "ensemble.json removed": lambda d: (d / "ensemble.json").unlink(),
             "member directories swapped": swap}  # fmt: skip
    for k, (label, edit) in enumerate(edits.items()):
        directory = root / f"bad-resume{k}"
        shutil.copytree(reference, directory, symlinks=True)
        edit(directory)
        outcome = refused_in_child(
            lambda d=directory: train_ensemble(d, resume=True), root / f"bad-resume{k}.status"
        )
        if outcome.startswith("refused: ") and len(outcome) < 1000:
            counts["bad_resumes_refused_clearly"] += 1
        else:
            counts["bad_resumes_not_refused"].append(f"{label}: {outcome[:120]}")  # type: ignore[union-attr]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saves", type=int, default=50, help="kills of vi.save (a)")
    parser.add_argument("--runs", type=int, default=6, help="training runs killed (b)")
    parser.add_argument("--kills-per-run", type=int, default=5, help="kills per run (b)")
    parser.add_argument("--pairs", type=int, default=3, help="concurrent pairs (c)")
    parser.add_argument("--ensembles", type=int, default=2, help="ensembles (d)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # forked children must not inherit a busy OpenMP pool
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="kill_saves_"))
    start = time.perf_counter()
    try:
        results = {
            "vecinterp": str(Path(vi.__file__).parent),
            "saves": kill_saves(args.saves, rng, root),
            "training": kill_training(args.runs, args.kills_per_run, rng, root),
            "concurrent": concurrent_runs(args.pairs, root),
            "ensembles": ensembles(args.ensembles, root),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["seconds"] = round(time.perf_counter() - start, 1)
    for section, figures in results.items():
        print(f"{section}: {json.dumps(figures)}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
