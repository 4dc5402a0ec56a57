"""Read once per node (issue 38): in a real two-rank launch each rank reads first the tensors it
leads (in node mode, the ones it hashes), then its peer's, out of the page cache the peer filled;
both ranks compute the same leads, and every digest is the one the plan's order gave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpload.sources.order import read_turns
from tpload.storage.sharded import ShardedStorage
from tpload.verification.node import hash_plan

from ..helpers import HERE, torchrun
from ..unit.sources.test_order import tp2_node

WORKER = str(HERE / "workers" / "read_order.py")


@pytest.mark.parametrize("mode", ["node", "off"])
def test_each_rank_reads_what_it_leads_first(small_ckpt: Path, tmp_path: Path, mode: str) -> None:
    run = torchrun(2, [WORKER, str(small_ckpt), str(tmp_path), mode], timeout=180)
    assert run.rc == 0, run.text
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [g["error"] for g in got] == ["", ""]
    assert got[0]["digest"].startswith("70e17cbc") and got[1]["digest"].startswith("42c10de7")
    storage = ShardedStorage(small_ckpt)
    try:
        plans, reads, sizes = tp2_node(storage)
    finally:
        storage.close()
    led: list[set[str]] = []
    for r in (0, 1):
        owner = hash_plan(mode, r, reads, sizes, per_rank=False).owner  # type: ignore[arg-type]
        turns = read_turns(r, reads, sizes, owner)
        assert turns is not None
        led.append({n for n, t in turns.items() if t == 0})
        # each item goes by its weight's turn (its scale may have another lead)
        item_turn = {c.name: turns[i.weight.name] for i in plans[r].items for c in i.cuts}
        seen = [item_turn[n] for n in got[r]["reads"] if n in item_turn]
        assert seen and seen[0] == 0 and seen == sorted(seen), (r, seen)
    # one lead a tensor the node reads: the leads the ranks computed apart agree
    shared = set(reads[0]) & set(reads[1])
    assert not led[0] & led[1] and shared <= led[0] | led[1]
