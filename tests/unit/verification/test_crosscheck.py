"""Node mode's cross-check: a hasher's claims about its peers' windows against what the peers read.

Each scenario is a node of ranks reading windows of real byte arrays; the hash split comes from
policy.hash_plan, fingerprints from host_fingerprint, and one rank may read a changed file.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpload.kernels.fingerprint import host_fingerprint
from tpload.model.values import DIGEST_BYTES, SLOTS, Box
from tpload.verification.crosscheck import claims, fold, seen, verdict
from tpload.verification.policy import HashPlan, hash_plan

Files = dict[str, np.ndarray]


def checkpoint(ranks: int) -> Files:
    rng = np.random.default_rng(ranks)
    files = {
        f"layers.{i}.w": rng.integers(0, 256, (8 * ranks, 64), dtype=np.uint8)
        for i in range(3 * ranks)
    }
    files["norm"] = rng.integers(0, 256, (1, 32), dtype=np.uint8)
    return files


def reads_of(files: Files, node: list[int]) -> dict[int, dict[str, Box]]:
    """Every rank reads its row share of each layer (tp over the node) and the whole norm."""
    tp = len(node)
    out: dict[int, dict[str, Box]] = {}
    for k, r in enumerate(node):
        out[r] = {
            n: ((k * a.shape[0] // tp, (k + 1) * a.shape[0] // tp), (0, a.shape[1]))
            for n, a in files.items()
        }
    return out


def window(a: np.ndarray, box: Box) -> np.ndarray:
    (r0, r1), (c0, c1) = box
    return a[r0:r1, c0:c1]


def exchange(
    node: list[int], files: Files, view_of: dict[int, Files] | None = None
) -> tuple[dict, dict]:
    """Every rank's claim row and seen row; ``view_of[r]``: the files as rank r read them (default:
    ``files``)."""
    reads = reads_of(files, node)
    sizes = {n: a.nbytes for n, a in files.items()}
    claim_rows, seen_rows = {}, {}
    for r in node:
        mine = (view_of or {}).get(r, files)
        plan: HashPlan = hash_plan("node", r, reads, sizes, per_rank=False)
        fingerprints = {
            n: {p: host_fingerprint(window(mine[n], box)) for p, box in plan.peers[n].items()}
            for n in plan.mine
        }
        claim_rows[r] = claims(plan.peers, fingerprints, node, r)
        windows = {
            n: (reads[r][n], host_fingerprint(window(mine[n], reads[r][n]))) for n in plan.owner
        }
        seen_rows[r] = seen(plan.owner, windows, node, r)
    return claim_rows, seen_rows


def hasher_of(name: str, node: list[int], files: Files) -> int:
    reads = reads_of(files, node)
    sizes = {n: a.nbytes for n, a in files.items()}
    return next(r for r in node if name in hash_plan("node", r, reads, sizes, per_rank=False).mine)


def changed(files: Files, name: str) -> Files:
    out = dict(files)
    out[name] = files[name].copy()
    out[name][-1, 5] ^= 0x40  # the last row: the last rank's window
    return out


@pytest.mark.parametrize("ranks", [2, 4, 8, 10])
def test_every_window_matching_gives_no_verdict(ranks: int) -> None:
    node = list(range(100, 100 + ranks))
    files = checkpoint(ranks)
    claim_rows, seen_rows = exchange(node, files)
    assert all(
        len(row) == SLOTS and all(len(v) == DIGEST_BYTES for v in row)
        for row in claim_rows.values()
    )
    assert any(v != bytes(DIGEST_BYTES) for row in claim_rows.values() for v in row)
    assert verdict([node], claim_rows, seen_rows) == []


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_one_reader_that_read_other_bytes_is_named_with_its_hasher(ranks: int) -> None:
    node = list(range(ranks))
    files = checkpoint(ranks)
    name = next(n for n in files if n != "norm" and hasher_of(n, node, files) != node[-1])
    hasher = hasher_of(name, node, files)
    reader = node[-1]  # the changed row is in its window only
    claim_rows, seen_rows = exchange(node, files, {reader: changed(files, name)})
    assert verdict([node], claim_rows, seen_rows) == [
        f"rank {reader} served bytes of tensors hashed by rank {hasher} that differ from the "
        "bytes that were hashed (a file changed while the node loaded it?)"
    ]


def test_a_hasher_that_read_other_bytes_is_named_with_the_reader() -> None:
    node = [0, 1, 2, 3]
    files = checkpoint(4)
    name = next(n for n in files if n != "norm" and hasher_of(n, node, files) != 3)
    hasher = hasher_of(name, node, files)
    claim_rows, seen_rows = exchange(node, files, {hasher: changed(files, name)})
    assert verdict([node], claim_rows, seen_rows) == [
        f"rank 3 served bytes of tensors hashed by rank {hasher} that differ from the bytes that "
        "were hashed (a file changed while the node loaded it?)"
    ]


def test_a_change_outside_every_peer_window_is_not_a_crosscheck_failure() -> None:
    # the hasher's own window differs only in the bytes it serves itself: its sha256 judges those
    node = [0, 1, 2, 3]
    files = checkpoint(4)
    name = next(n for n in files if n != "norm" and hasher_of(n, node, files) == 3)
    claim_rows, seen_rows = exchange(node, files, {3: changed(files, name)})
    assert verdict([node], claim_rows, seen_rows) == []


def test_on_a_node_of_more_ranks_than_slots_a_difference_is_still_caught() -> None:
    node = list(range(10))  # ranks 8 and 9 share slots 0 and 1 with ranks 0 and 1
    assert len(node) > SLOTS
    files = checkpoint(10)
    name = next(n for n in files if n != "norm" and hasher_of(n, node, files) not in (1, 9))
    hasher = hasher_of(name, node, files)
    claim_rows, seen_rows = exchange(node, files, {9: changed(files, name)})
    by = f"rank {hasher}" if hasher not in (0, 8) else "one of ranks 0, 8"
    assert verdict([node], claim_rows, seen_rows) == [
        f"one of ranks 1, 9 served bytes of tensors hashed by {by} that differ from the bytes "
        "that were hashed (a file changed while the node loaded it?)"
    ]


def test_verdict_judges_each_node_on_its_own() -> None:
    files = checkpoint(4)
    a, b = [0, 1, 2, 3], [4, 5, 6, 7]
    name = next(n for n in files if n != "norm" and hasher_of(n, b, files) != 7)
    claims_a, seen_a = exchange(a, files)
    claims_b, seen_b = exchange(b, files, {7: changed(files, name)})
    problems = verdict([a, b], claims_a | claims_b, seen_a | seen_b)
    assert len(problems) == 1 and problems[0].startswith(
        f"rank 7 served bytes of tensors hashed by rank {hasher_of(name, b, files)} "
    )


def test_fold_is_zero_for_nothing_order_free_and_sensitive() -> None:
    lines = [("x.10", ((0, 4), (0, 8)), (1, 2, 3)), ("x.2", ((4, 8), (0, 8)), (4, 5, 6))]
    assert fold([]) == bytes(DIGEST_BYTES)
    assert fold(lines) == fold(reversed(lines)) != bytes(DIGEST_BYTES)
    assert len(fold(lines)) == DIGEST_BYTES
    variants = [
        [lines[0], ("x.2", ((4, 8), (0, 9)), (4, 5, 6))],
        [lines[0], ("x.2", ((5, 8), (0, 8)), (4, 5, 6))],
        [lines[0], ("x.2", ((4, 8), (0, 8)), (4, 5, 7))],
        [lines[0], ("x.3", ((4, 8), (0, 8)), (4, 5, 6))],
    ]
    assert len({fold(v) for v in variants} | {fold(lines)}) == len(variants) + 1


def test_on_a_node_of_more_ranks_than_slots_a_pair_sharing_a_slot_is_caught() -> None:
    # hasher and reader both in slot 1 (ranks 1 and 9): their values fold into the same slot
    node = list(range(10))
    files = checkpoint(10)
    name = next(n for n in files if n != "norm" and hasher_of(n, node, files) == 1)
    claim_rows, seen_rows = exchange(node, files, {9: changed(files, name)})
    assert verdict([node], claim_rows, seen_rows) == [
        "one of ranks 1, 9 served bytes of tensors hashed by one of ranks 1, 9 that differ from "
        "the bytes that were hashed (a file changed while the node loaded it?)"
    ]
