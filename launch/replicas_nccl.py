"""Run under torchrun on 2 or more GPUs (launch/gpu-check.sh, section ``replicas``): 2 replicas x tp
WORLD/2 on CUDA, in the world tpload makes under torchrun (``cpu:gloo,cuda:nccl``).

1. NCCL point-to-point GB/s per rank: each rank sends 256 MiB to the rank at its position in the
   other replica while receiving as much from it (batched isend/irecv on the NCCL backend), best of
   5 after a warm-up: the GPUs' interconnect between replicas, the most the load's transfers can
   reach.
2. The load: ``tpload.load(CKPT, tp=WORLD/2, replicas=2)`` onto ``cuda:LOCAL_RANK``. Its replicas'
   bytes travel over NCCL as device tensors (distributed/wire.py: the group has an NCCL backend), so
   the peer GB/s every rank prints (bytes from peers over the load's time) is an NCCL figure, beside
   its bytes from storage; rank 0 checks that the two ranks at every position serve equal digests,
   and that the cluster read each position's windows once (storage + peers = each rank's windows),
   exiting 1 otherwise.

argv: CHECKPOINT REPORT_JSON
"""

from __future__ import annotations

import os
import sys
import time

PEER_BYTES = 256 << 20
REPS = 5


def nccl_gbps(rank: int, peer: int, device: object) -> float:
    """This rank's NCCL send (and, at the same time, receive) rate to ``peer``, in GB/s each way."""
    import torch
    import torch.distributed as dist

    out = torch.full((PEER_BYTES,), rank % 251, dtype=torch.uint8, device=device)
    got = torch.empty_like(out)
    best = float("inf")
    for k in range(REPS + 1):  # the first exchange sets up the NCCL communicator: not timed
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, got, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        torch.cuda.synchronize(device)
        if k:
            best = min(best, time.perf_counter() - t0)
    if int(got[0]) != peer % 251 or int(got[-1]) != peer % 251:
        raise SystemExit(f"rank {rank}: NCCL delivered other bytes than rank {peer} sent")
    return PEER_BYTES / best / 1e9


def main() -> int:
    import torch
    import torch.distributed as dist

    from tpload.distributed.world import init_world

    ckpt, report = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if world < 2 or world % 2:
        raise SystemExit("replicas_nccl: run 2 replicas: an even number of ranks, one GPU each")
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    # the group tpload.load() would make (cpu:gloo,cuda:nccl), kept for the p2p figure and the load
    made = init_world(timeout_s=120.0)
    try:
        return _run(ckpt, report, rank, world, device)
    finally:
        if made and dist.is_initialized():
            dist.destroy_process_group()


def _run(ckpt: str, report: str, rank: int, world: int, device: object) -> int:
    import tpload

    size = world // 2
    peer = (rank + size) % world
    gbps = nccl_gbps(rank, peer, device)
    print(f"rank {rank}: NCCL p2p with rank {peer}: {gbps:.1f} GB/s each way", flush=True)
    shards = tpload.load(
        ckpt,
        tp=size,
        replicas=2,
        progress=False,
        timeout_s=120.0,
        report=report,
        device=str(device),
    )
    ranks = shards.report.ranks
    mine = ranks[rank]
    seconds = mine.ns / 1e9
    print(
        f"rank {rank}: load {seconds:.2f} s, {(mine.bytes_from_storage or 0) / 1e9:.3f} GB from "
        f"storage, {(mine.bytes_from_peers or 0) / 1e9:.3f} GB from peers "
        f"({(mine.bytes_from_peers or 0) / 1e9 / max(seconds, 1e-9):.2f} GB/s over the load, NCCL)",
        flush=True,
    )
    if rank != 0:
        return 0
    bad = [p for p in range(size) if ranks[p].digest != ranks[p + size].digest]
    whole = [
        (r.bytes_from_storage or 0) + (r.bytes_from_peers or 0) for r in ranks
    ]  # each rank's windows, read or received
    shared = [
        (ranks[p].bytes_from_storage or 0) + (ranks[p + size].bytes_from_storage or 0)
        for p in range(size)
    ]
    once = all(shared[p] == whole[p] == whole[p + size] for p in range(size))
    print(
        f"replicas on {world} GPUs: digests equal at every position: {not bad}; "
        f"each position's windows read once in the cluster: {once}",
        flush=True,
    )
    return 0 if not bad and once else 1


if __name__ == "__main__":
    sys.exit(main())
