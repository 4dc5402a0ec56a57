"""The order a rank reads its plan in (sources/order.py): what it leads first, its node peers'
after, so each stored byte is read from storage once a node, by the rank that leads it (issue 38).
The leads are the hash plan's hashers in node mode and the same split in every other mode; the
loop keeps the served bytes, the digests and the evidence as they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.loading.loop import in_turns, run
from tpload.loading.planner import planner_of
from tpload.model.progress import Silent
from tpload.model.values import Box, Stored
from tpload.planning.layout import Layout
from tpload.planning.planner import RankPlan
from tpload.selection.config import load_config
from tpload.sources.hashing import Hasher
from tpload.sources.order import read_turns
from tpload.sources.storage import StorageSource
from tpload.storage.sharded import ShardedStorage
from tpload.transfer.cpu import CpuTransfer
from tpload.verification.node import hash_plan

from ..verification.test_node import SIZES, node_reads


def _leads(reads: dict[int, dict[str, Box]], owner_of: dict[int, dict[str, int]]) -> dict:
    """Each tensor's ranks whose turn for it is 0."""
    leads: dict[str, list[int]] = {}
    for r in reads:
        turns = read_turns(r, reads, SIZES, owner_of.get(r, {}))
        assert turns is not None and set(turns) == set(reads[r])
        for name, turn in turns.items():
            if turn == 0:
                leads.setdefault(name, []).append(r)
    return leads


def test_every_tensor_has_one_lead_among_its_readers_the_hasher_in_node_mode() -> None:
    reads = node_reads()
    plans = {r: hash_plan("node", r, reads, SIZES, per_rank=False) for r in reads}
    leads = _leads(reads, {r: dict(p.owner) for r, p in plans.items()})
    assert set(leads) == set(SIZES) and all(len(who) == 1 for who in leads.values())
    for name, (lead,) in leads.items():
        assert name in reads[lead] and name in plans[lead].mine  # the hasher reads it first
    # no hash plan (off, digest, rank): the same split leads
    assert _leads(reads, {}) == leads


def test_turns_go_round_the_node_from_each_rank() -> None:
    reads = node_reads()
    lead = {name: who[0] for name, who in _leads(reads, {}).items()}
    for r in reads:
        turns = read_turns(r, reads, SIZES, {})
        assert turns is not None
        for name, turn in turns.items():
            assert turn == (lead[name] - r) % 4  # the next rank's share next, and so on


def test_a_lone_rank_or_a_rank_that_reads_nothing_keeps_its_order() -> None:
    reads = node_reads()
    assert read_turns(0, {0: reads[0]}, SIZES, {}) is None
    assert read_turns(0, {0: {}, 1: reads[1]}, SIZES, {}) is None


def test_runs_in_turns_keep_the_reading_order_within_a_turn() -> None:
    runs = [(0, 1, False), (1, 3, True), (3, 4, False), (4, 5, False)]
    order = [3, 2, 1, 0, 4]
    names = ["a", "b", "c", "d", "e"]  # entry -> weight
    turns = {"a": 0, "b": 1, "c": 1, "d": 1, "e": 0}
    # places 0..4 hold entries 3 (d: 1), 2 (c: 1, a batch with b), 0 (a: 0), 4 (e: 0)
    assert in_turns(runs, order, names, turns) == [(3, 4, False), (4, 5, False)] + runs[:2]
    assert in_turns(runs, order, names, None) == runs


def tp2_node(
    storage: ShardedStorage,
) -> tuple[dict[int, RankPlan], dict[int, dict[str, Box]], dict[str, int]]:
    """The two ranks of tp 2 on one node: their plans, the windows each reads, each tensor's
    stored bytes."""
    planner = planner_of(storage.catalogue, load_config())
    plans = {r: planner.plan(Layout(2), "packed", r) for r in (0, 1)}
    sizes = {n: storage.catalogue.get(n).nbytes for n in storage.catalogue.names()}
    return plans, {r: p.reads for r, p in plans.items()}, sizes


class Recording(ShardedStorage):
    """The small checkpoint's shards, every read and readahead hint recorded."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []
        self.asked: list[Stored] = []

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        self.reads.append(stored.name)
        super().read(stored, r0, r1, out)

    def will_need(self, stored: Stored) -> None:
        self.asked.append(stored)
        super().will_need(stored)


@pytest.mark.parametrize("mode", ["node", "off"])
def test_a_rank_reads_what_it_leads_first_and_serves_the_same_bytes(
    small_ckpt: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tpload.loading.loop.READAHEAD_FROM", 0)  # every entry asked ahead
    storage = Recording(small_ckpt)
    try:
        plans, reads, sizes = tp2_node(storage)
        got = {}
        for me in (0, 1):
            hashes = hash_plan(mode, me, reads, sizes, per_rank=False)  # type: ignore[arg-type]
            turns = read_turns(me, reads, sizes, hashes.owner)
            assert turns is not None and set(turns.values()) == {0, 1}
            for order in (None, turns):
                storage.reads.clear()
                storage.asked.clear()
                result = run(
                    StorageSource(storage),
                    plans[me],
                    transfer=CpuTransfer(torch.device("cpu")),
                    hasher=Hasher(hashes),
                    samples=0,
                    progress=Silent(),
                    ranks=storage.catalogue.ranks(),
                    turns=order,
                )
                got[me, order is None] = (
                    result.digest(),
                    (result.hashed.hexes("sha256"), result.hashed.peers()),
                    dict(result.windows),
                )
            # in turns: each item whose weight it leads read before any its peer leads (its scale
            # may have another lead; a batch goes by its first entry's turn)
            item_turn = {c.name: turns[i.weight.name] for i in plans[me].items for c in i.cuts}
            seen = [item_turn[n] for n in storage.reads if n in item_turn]
            assert seen[0] == 0 and seen[-1] == 1 and seen == sorted(seen)
            # readahead asks for what this rank reads: a tensor it hashes whole, else its rows
            for s in storage.asked:
                whole = storage.stored(s.name)
                if s.name in hashes.mine:
                    assert s == whole
                    continue
                (r0, r1), _ = reads[me][s.name]
                assert (
                    s.offset >= whole.offset and s.offset + s.nbytes <= whole.offset + whole.nbytes
                )
                assert s.nbytes == whole.nbytes or s.nbytes == (r1 - r0) * s.row_bytes
            # the same digest, hashes, peer fingerprints and windows (the cross-check's evidence)
            assert got[me, True] == got[me, False]
        digests = {me: got[me, False][0] for me in (0, 1)}
        assert digests[0].startswith("70e17cbc") and digests[1].startswith("42c10de7")
    finally:
        storage.close()
