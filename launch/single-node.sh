#!/usr/bin/env bash
# Load a checkpoint with one process per GPU of this node (CPU and gloo when there is no GPU).
#   launch/single-node.sh CHECKPOINT [tpload flags...]     e.g. --kind expanded --tp 4 --ep 2
# NPROC overrides the process count (default: the GPU count, or 2 without GPUs).
set -euo pipefail
ckpt=${1:?usage: $0 CHECKPOINT [tpload flags...]}
shift
nproc=${NPROC:-$(python -c 'import torch; print(torch.cuda.device_count() or 2)')}
exec torchrun --standalone --nproc-per-node "$nproc" -m tpload --checkpoint "$ckpt" "$@"
