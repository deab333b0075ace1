#!/usr/bin/env bash
# Every GPU figure issue 14 asks for, in one call (each script prints its own table):
# forward and run_with_cache vs plain PyTorch at the paper's widths and at tiny widths
# (host cost), a training step (sync_every 1 / default / a plain PyTorch loop), and
# 64 paper-size affine models trained as one ensemble vs one model.
# Run from the repository root in an environment with vecinterp and a CUDA torch:
#   bash benchmarks/gpu_issue14.sh
set -euo pipefail
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
python benchmarks/hook_overhead.py --device cuda --batches 16 256 --rounds 30
python benchmarks/hook_overhead.py --device cuda --widths tiny --batches 16 --rounds 30
python benchmarks/train_step.py --device cuda --sync-every 1 default plain --steps 100 --rounds 5
python benchmarks/ensemble.py --device cuda --tasks affine --ks 1 64 --steps 20 --rounds 3
# issue 27: the compiled columns (forward b1/b16/b256, run_with_cache, a training step;
# eager vs compiled vs plain vs compiled plain, and the compile times); reduce-overhead
# captures CUDA graphs
python benchmarks/compiled.py --device cuda --mode reduce-overhead --rounds 10 --reps 50
