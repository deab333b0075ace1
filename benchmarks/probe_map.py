"""Time the probe map issue 28 sizes: the shipped affine model (3 layers), 4,096 sequences
of 14 positions, targets c, d and a_{t-1}, at resid_pre, resid_mid and resid_post of every
layer (9 points × 14 positions), with both controls. Prints the total and its parts
(capture of the activations, the ridge solves), the thread count and the load average.

    python benchmarks/probe_map.py [--threads 2] [--sequences 4096] [--rounds 2]
"""

import argparse
import cProfile
import os
import pstats
import time

import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence as ar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = ar.load_reference("fast", device="cpu")
    data = ar.generate(args.sequences, length=14, seed=0)
    prev = torch.full_like(data.inputs, torch.nan)
    prev[:, 1:] = data.inputs[:, :-1]
    targets = {"c": data.c, "d": data.d, "a_prev": prev}
    points = ["resid_pre", "resid_mid", "resid_post"]
    print(f"threads {torch.get_num_threads()}, cores visible {len(os.sched_getaffinity(0))}")
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        vi.fit_probes(model, data.inputs, targets, points, progress=False)
        profile.disable()
        total = time.perf_counter() - t0
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        parts = {
            name: max(v[3] for k, v in stats.items() if k[2] == fn)
            for name, fn in (("capture (2 models)", "capture"), ("solves", "_solve"))
        }
        print(
            f"round {r}: total {total:.1f} s; "
            + "; ".join(f"{k} {v:.1f} s" for k, v in parts.items())
            + f"; load average before {load:.2f}, after {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
