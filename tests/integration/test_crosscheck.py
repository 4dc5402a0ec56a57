"""Node verification against an accidental concurrent write: rank 0 hashes a tensor and finishes
(its files unchanged when it looks), then the file changes, then rank 1 opens it and copies its
window of the tensor. Rank 1 served bytes nobody hashed, and nothing rank 1 can see tells it so; the
cross-check carried by the one exchange must fail every rank."""

from __future__ import annotations

import json
from pathlib import Path

from tpload.loading.planner import planner_of
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.storage.sharded import ShardedStorage
from tpload.verification.node import hash_plan

from ..helpers import HERE, torchrun

RACE = str(HERE / "workers" / "race.py")


def _reads(plan) -> dict:
    return {c.name: (c.rows, c.cols) for item in plan.items for c in item.cuts}


def test_a_write_between_hash_and_copy_fails_every_rank(ckpt_copy: Path, tmp_path: Path) -> None:
    storage = ShardedStorage(ckpt_copy)
    planner = planner_of(storage.catalogue, load_config())
    plans = {r: planner.plan(Layout(2), "packed", r) for r in (0, 1)}
    sizes = {n: storage.catalogue.get(n).nbytes for n in storage.catalogue.names()}
    hashes = hash_plan("node", 0, {r: _reads(p) for r, p in plans.items()}, sizes, per_rank=False)
    storage.close()
    # a w1 weight that rank 0 hashes and rank 1 reads rows [128, 256) of
    tensor = next(
        n for n in sorted(hashes.peers) if n.endswith(".w1.weight") and 1 in hashes.peers[n]
    )
    (r0, _), _ = hashes.peers[tensor][1]
    offset = r0 * storage.catalogue.get(tensor).row_bytes + 5  # inside rank 1's window
    shard = storage.stored(tensor).path.name  # rank 1 opens it only after the write
    run = torchrun(
        2, [RACE, str(ckpt_copy), str(tmp_path), tensor, str(offset), shard], timeout=180
    )
    assert run.rc == 0, run.text
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert not outcomes[0]["returned"] and not outcomes[1]["returned"]
    assert outcomes[0]["error"] == outcomes[1]["error"]
    assert (
        "rank 1 served bytes of tensors hashed by rank 0 that differ from the bytes that were "
        "hashed" in outcomes[0]["error"]
    )
