"""Run under torchrun (2 ranks, node verification): two loads in one launch, both checked by blake3
against the sidecar in STORE.

argv: CHECKPOINT STORE OUT_DIR TENSOR. The first load must pass; then, once both ranks are through
it, rank 0 flips a byte of TENSOR keeping the shard's size and mtime (the sidecar's stamp cannot
tell), and the second load runs. Each rank writes OUT_DIR/rank{R}.json: the first load's digest and
hash, and the second load's error ("" if it loaded).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import tpload
from tpload.model.errors import LoadError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers import poke, shard_of  # noqa: E402


def main() -> None:
    root, store, out, tensor = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    # the worker keeps a world between its two loads (for its barrier): it makes its own, as a
    # caller must (load() makes one only for its own call)
    dist.init_process_group("gloo")
    try:
        run(root, store, out, tensor)
    finally:
        dist.destroy_process_group()


def run(root: Path, store: str, out: Path, tensor: str) -> None:
    first = tpload.load(root, verify="node", digest_store=store, progress=False)
    rank = dist.get_rank()
    done = {
        "digest": first.report.mine.digest,
        "hash": first.report.hash,
        "hashed": first.report.mine.hashed,
    }
    first.release()
    if rank == 0:
        shard = root / shard_of(root, tensor)
        st = shard.stat()
        poke(root, tensor, 100)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    dist.barrier()
    try:
        tpload.load(root, verify="node", digest_store=store, progress=False).release()
        done["second"] = ""
    except LoadError as e:
        done["second"] = str(e)
    (out / f"rank{rank}.json").write_text(json.dumps(done))


if __name__ == "__main__":
    main()
