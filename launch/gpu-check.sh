#!/usr/bin/env bash
# On a machine with one (or more) CUDA GPUs: the tests that need CUDA, then the bench on the
# seed-size checkpoint at tp 1 (one GPU). About 5-8 minutes, most of it writing the 3.8 GB
# checkpoint once (cached under ~/.cache/tpload) and the bench's rounds.
#   launch/gpu-check.sh [extra bench flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu-check: no CUDA device")'
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 240 python -m pytest -q tests/test_cuda.py
timeout 300 python -m tpload bench --preset seed --nproc 1 --tp 1 --rounds 1 \
    --methods floor,tpload,tpload-noverify,tpload-expanded,safetensors,seed --json "${BENCH_JSON:-gpu-bench.json}" "$@"
