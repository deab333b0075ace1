"""CPU threads on a busy machine: a short training run (and, optionally, the examples)
idle and with one core held by another single-threaded process, under three thread rules.

Each timed run is a fresh Python process (so torch starts with its default threads):

``default``
    torch's default threads (one per core): ``vi.train(..., threads=None)``, and the
    examples with ``--threads <cores>``.
``auto``
    the library's rule (``vi.choose_threads``: the idle cores, at least one):
    ``vi.train``'s default, and the examples' default.
``one``
    one thread.

"Busy" starts one process that spins on one core (``while True: pass``, niced like
nothing: an ordinary competitor) before the timed run and stops it after. The table gives
each run's seconds and the ratio busy / idle per rule: the issue's target is that a run
with one core held stays within 1.5x of its idle time.

Usage::

    python benchmarks/threads.py                       # training run, 3 repeats
    python benchmarks/threads.py --steps 100 --repeats 1
    python benchmarks/threads.py --examples            # also the examples with --fast

Measure on an otherwise idle machine: a core already busy with other work makes "idle"
busy too (the script prints the 1-minute load average before each run).
"""

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """
import json, sys, time, torch
import vecinterp as vi
threads = {threads}
cfg = vi.VectorTransformerConfig(d_in=8, d_model=64, d_head=16, n_heads=4, n_layers=2,
                                 n_ctx=16, d_mlp=256)
model = vi.HookedVectorTransformer(cfg, seed=0)
def make_batch(step, gen):
    x = torch.randn(32, 16, 8, generator=gen)
    return x, x.flip(1)
start = time.perf_counter()
vi.train(model, make_batch, steps={steps}, lr=1e-3, progress=False, device="cpu",
         threads=threads)
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""

EXAMPLES = {
    "affine_probes": ["examples/affine_probes.py", "--fast", "--no-progress", "--no-figures"],
    "induction_heads": ["examples/induction_heads.py", "--fast", "--no-progress"],
    "retrieval_problem": ["examples/retrieval_problem.py", "--fast", "--no-progress"],
}

RULES = ("default", "auto", "one")


def spin() -> None:  # pragma: no cover - the competitor process
    while True:
        pass


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def train_seconds(rule: str, steps: int) -> float:
    threads = {"default": "None", "auto": '"auto"', "one": "1"}[rule]
    code = TRAIN.format(threads=threads, steps=steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_env())  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def example_seconds(name: str, rule: str, out_dir: Path) -> float:
    extra = {"default": ["--threads", str(cores())], "auto": [], "one": ["--threads", "1"]}[rule]
    command = [sys.executable, *EXAMPLES[name], *extra, "--out", str(out_dir / name)]
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=True, cwd=ROOT, env=_env())
    return time.perf_counter() - start


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


def timed(run, busy: bool, repeats: int) -> list[float]:
    hog = None
    if busy:
        hog = multiprocessing.Process(target=spin, daemon=True)
        hog.start()
        time.sleep(0.5)  # let it take its core
    try:
        return [run() for _ in range(repeats)]
    finally:
        if hog is not None:
            hog.kill()
            hog.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES)
    parser.add_argument("--examples", action="store_true", help="also time the examples")
    parser.add_argument("--out", default="/tmp/vecinterp_threads_bench")
    args = parser.parse_args()
    print(f"{cores()} usable cores; torch's default threads in a fresh process\n")
    jobs = {"train": lambda rule: lambda: train_seconds(rule, args.steps)}
    if args.examples:
        for name in EXAMPLES:
            jobs[name] = lambda rule, n=name: lambda: example_seconds(n, rule, Path(args.out))
    rows = []
    for job, make in jobs.items():
        for rule in args.rules:
            medians = {}
            for busy in (False, True):
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
                times = timed(make(rule), busy, args.repeats)
                medians[busy] = statistics.median(times)
                state = "busy" if busy else "idle"
                shown = ", ".join(f"{t:.2f}" for t in times)
                print(f"{job:18s} {rule:8s} {state}: {shown} s   (load before: {load:.2f})",
                      flush=True)  # fmt: skip
            rows.append((job, rule, medians[False], medians[True]))
    print(f"\n{'run':18s} {'threads':8s} {'idle s':>8s} {'busy s':>8s} {'busy/idle':>9s}")
    for job, rule, idle, busy in rows:
        print(f"{job:18s} {rule:8s} {idle:8.2f} {busy:8.2f} {busy / idle:9.2f}")


if __name__ == "__main__":
    main()
