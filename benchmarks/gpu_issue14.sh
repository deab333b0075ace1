#!/usr/bin/env bash
# Every GPU figure issue 14 asks for, in one call (each script prints its own table):
# forward and run_with_cache vs plain PyTorch at the paper's widths and at tiny widths
# (host cost), a training step (sync_every 1 / default / a plain PyTorch loop), and
# 64 paper-size affine models trained as one ensemble vs one model; then issue 27's
# compiled columns (forward b1/b16/b256, run_with_cache, a training step; eager vs
# compiled vs plain vs compiled plain, and the compile times; reduce-overhead captures
# CUDA graphs), the suite's CUDA-only tests, and benchmarks/gpu_agreement.py (the same
# numbers on the GPU as on the CPU).
#
# Run from the repository root in an environment with vecinterp (or PYTHONPATH=src) and a
# CUDA torch:
#   bash benchmarks/gpu_issue14.sh [LOG_DIR]
# Each step runs under its own time limit and a failing step does not stop the others, so
# one call on a lent machine returns every figure that can be measured; each step's table
# is also written to LOG_DIR (default: gpu_logs).
set -uo pipefail
log_dir=${1:-gpu_logs}
mkdir -p "$log_dir"
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$log_dir/$name.txt"
    echo "=== $name: rc ${PIPESTATUS[0]}, $((SECONDS - t0)) s"
}
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$log_dir/gpu.txt"
step hook_paper 60 python benchmarks/hook_overhead.py --device cuda --batches 16 256 --rounds 30
step hook_tiny 40 python benchmarks/hook_overhead.py --device cuda --widths tiny --batches 16 --rounds 30
step train_step 60 python benchmarks/train_step.py --device cuda --sync-every 1 default plain --steps 100 --rounds 5
step ensemble 60 python benchmarks/ensemble.py --device cuda --tasks affine --ks 1 64 --steps 20 --rounds 3
step cuda_tests 45 python -m pytest -q -p no:cacheprovider -k "cuda or non_cpu or generator" \
    tests/test_task_affine_recurrence.py tests/test_task_induction.py tests/test_training.py
step agreement 150 python benchmarks/gpu_agreement.py
step compiled 170 python benchmarks/compiled.py --device cuda --mode reduce-overhead --rounds 10 --reps 50
