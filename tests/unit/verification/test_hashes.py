"""Hash results held as columns (tpload/verification/hashes.py, HashResults)."""

from __future__ import annotations

import threading
from pathlib import Path

from tpload.model.text import sha256_mismatch
from tpload.model.values import Stored
from tpload.verification.hashes import NO_PEERS, SHA256, HashResults, mismatches


def _stored(i: int, want: str | None) -> Stored:
    return Stored(f"t.{i}", Path(f"/ckpt/s{i % 3}.safetensors"), 8 * i, 2, 4 + i, want)


def test_rows_added_from_many_threads_keep_their_columns_together() -> None:
    table = HashResults()

    def add(first: int) -> None:
        for i in range(first, 4000, 4):
            peers = {1: (i, i, i)} if i % 7 else None
            table.add(_stored(i, f"{i:064x}"), f"{i:064x}", f"b{i}", peers)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(table) == 4000 and "t.3999" in table and "t.4000" not in table
    for i in (0, 7, 1234, 3999):
        h = table[f"t.{i}"]
        assert h.stored == _stored(i, f"{i:064x}") and h.sha256 == f"{i:064x}"
        assert h.blake3 == f"b{i}" and h.peers == ({1: (i, i, i)} if i % 7 else NO_PEERS)
    assert table.nbytes() == sum(2 * (4 + i) for i in range(4000))
    assert table.hexes("sha256")["t.42"] == f"{42:064x}"
    assert mismatches(table, SHA256) == []


def test_mismatches_found_over_the_columns_match_those_found_record_by_record() -> None:
    table, records = HashResults(), {}
    for i in range(50):
        want = None if i == 3 else f"{i:064x}"
        got = f"{i + 1:064x}" if i in (5, 17) else f"{i:064x}"
        table.add(_stored(i, want), got, "", None)
        records[f"t.{i}"] = table[f"t.{i}"]
    found = mismatches(table, SHA256)
    reference = []  # the rule record by record, as it was written before the columns
    for name, h in records.items():
        if h.stored.sha256 is None:
            reference.append(f"{h.stored.path}: tensor {name} has no sha256 to check")
        elif h.sha256 != h.stored.sha256:
            reference.append(sha256_mismatch(h.stored.path, name, h.sha256, h.stored.sha256))
    assert found == reference
    assert len(found) == 3 and "t.3" in found[0] and "t.5" in found[1] and "t.17" in found[2]


def test_a_name_added_again_reads_as_its_latest_row_everywhere() -> None:
    table = HashResults()
    table.add(_stored(1, "a" * 64), "a" * 64, "", None)
    table.add(_stored(2, "b" * 64), "b" * 64, "", None)
    table.add(_stored(1, "a" * 64), "c" * 64, "", None)  # as a dict assignment would: the latest
    assert len(table) == 2 and table["t.1"].sha256 == "c" * 64
    assert table.hexes("sha256") == {"t.1": "c" * 64, "t.2": "b" * 64}
    assert table.nbytes() == 2 * 5 + 2 * 6
    assert [m.split(": tensor ")[1].split(":")[0] for m in mismatches(table, SHA256)] == ["t.1"]
