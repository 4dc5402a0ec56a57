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


def test_digests_taken_on_the_spot_are_one_column_compared_at_once() -> None:
    """add_digests (the batches' path): 32 bytes a row and the peers' fingerprints as columns; the
    mismatch found by one array compare is the one the text compare finds, and upper-case hex in a
    manifest (which no digest equals as text) still mismatches."""
    import hashlib

    table = HashResults()
    data = [bytes([i]) * (i + 1) for i in range(20)]
    stored = [_stored(i, hashlib.sha256(d).hexdigest()) for i, d in enumerate(data)]
    stored[4] = stored[4]._replace(sha256="0" * 64)  # promised other bytes
    stored[9] = stored[9]._replace(sha256=stored[9].sha256.upper())
    digests = b"".join(hashlib.sha256(d).digest() for d in data)
    table.add_digests(stored, digests, ([0, 0, 3], [1, 2, 1], [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert table.hexes("sha256")["t.7"] == hashlib.sha256(data[7]).hexdigest()
    assert table["t.0"].peers == {1: (1, 2, 3), 2: (4, 5, 6)} and table["t.3"].peers == {
        1: (7, 8, 9)
    }
    assert table["t.1"].peers == NO_PEERS
    names, ranks, fps = table.peer_columns()
    assert names == ["t.0", "t.0", "t.3"] and ranks.tolist() == [1, 2, 1]
    assert fps.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    found = mismatches(table, SHA256)
    assert [m.split(": tensor ")[1].split(":")[0] for m in found] == ["t.4", "t.9"]
    assert found[0] == sha256_mismatch(
        stored[4].path, "t.4", hashlib.sha256(data[4]).hexdigest(), "0" * 64
    )
    assert table.nbytes() == sum(s.nbytes for s in stored)


def test_a_name_hashed_again_keeps_its_latest_peers_only() -> None:
    table = HashResults()
    table.add_digests([_stored(1, "a" * 64)], bytes(32), ([0], [1], [1, 1, 1]))
    table.add_digests([_stored(1, "a" * 64)], bytes(32), ([0], [2], [2, 2, 2]))
    names, ranks, fps = table.peer_columns()
    assert names == ["t.1"] and ranks.tolist() == [2] and fps.tolist() == [[2, 2, 2]]
    assert table["t.1"].peers == {2: (2, 2, 2)}


def test_a_batch_records_each_tensor_once_and_only_those_still_to_hash() -> None:
    """Hasher.record_batch: a tensor given twice is hashed once, one this rank does not hash (or
    hashed already) is left out, and the peers' columns follow the tensors kept."""
    import hashlib

    import numpy as np

    from tpload.sources.hashing import Hasher
    from tpload.verification.node import HashPlan

    hasher = Hasher(HashPlan(0, frozenset({"t.1", "t.2", "t.3"})))
    data = {i: np.full(4 + i, i, np.uint8) for i in range(4)}
    hasher.record_batch([_stored(1, None)], [data[1]], ([0], [1], [9, 9, 9]))
    stored = [_stored(i, None) for i in (0, 1, 2, 2, 3)]
    peers = ([0, 1, 2, 3, 4], [1, 1, 1, 2, 1], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4])
    hasher.record_batch(stored, [data[i] for i in (0, 1, 2, 2, 3)], peers)
    done = hasher.finish()
    assert list(done) == ["t.1", "t.2", "t.3"] and not hasher.todo
    assert done.hexes("sha256")["t.3"] == hashlib.sha256(data[3].tobytes()).hexdigest()
    assert done["t.1"].peers == {1: (9, 9, 9)}  # its first batch's
    assert done["t.2"].peers == {1: (2, 2, 2)} and done["t.3"].peers == {1: (4, 4, 4)}
