#!/usr/bin/env bash
# Load a checkpoint across several nodes: run this on every node with the same arguments.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 launch/multi-node.sh CHECKPOINT [tpload flags...]   # on node0
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 launch/multi-node.sh CHECKPOINT [tpload flags...]   # on node1
# MASTER_ADDR is an address of the first node every node can reach; MASTER_PORT (default 29500) a free
# port there. NPROC is the processes per node (default: the GPU count, or 2 without GPUs); RDZV_ID names
# the job (default tpload). Global ranks pick the tp/ep position, LOCAL_RANK the GPU, and each node
# hashes its own copy of the checkpoint once (--verify node).
set -euo pipefail
ckpt=${1:?usage: NNODES=N NODE_RANK=I MASTER_ADDR=HOST $0 CHECKPOINT [tpload flags...]}
shift
: "${NNODES:?set NNODES (how many nodes)}" "${NODE_RANK:?set NODE_RANK (this node, 0..NNODES-1)}"
: "${MASTER_ADDR:?set MASTER_ADDR (address of the first node)}"
nproc=${NPROC:-$(python -c 'import torch; print(torch.cuda.device_count() or 2)')}
exec torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$nproc" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv-id "${RDZV_ID:-tpload}" \
    --max-restarts 0 -m tpload --checkpoint "$ckpt" "$@"
