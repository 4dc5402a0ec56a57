"""verification/node.py: who hashes what (the byte-balanced split and each rank's HashPlan per
verify mode), and node mode's cross-check (a hasher's claims about its peers' windows against what
the peers read).

For the cross-check each scenario is a node of ranks reading windows of real byte arrays; the hash
split comes from node.hash_plan, fingerprints from host_fingerprint, and one rank may read a changed
file.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpload.kernels.fingerprint import host_fingerprint
from tpload.model.values import DIGEST_BYTES, SLOTS, Box
from tpload.verification.node import (
    ByteSizes,
    HashPlan,
    assign_hashing,
    claims,
    claims_of,
    fold,
    hash_plan,
    reader_sets,
    readers,
    seen,
    seen_of,
    split_tensors,
    verdict,
)


def test_assign_hashing_covers_everything_once_and_balances() -> None:
    sizes = {f"t{i}": (i % 5 + 1) * 100 for i in range(40)}
    split = assign_hashing(sizes, [0, 1, 2])
    names = [n for ns in split.values() for n in ns]
    assert sorted(names) == sorted(sizes)
    loads = [sum(sizes[n] for n in ns) for ns in split.values()]
    assert max(loads) - min(loads) <= max(sizes.values())


def test_assign_hashing_gives_each_tensor_to_one_of_its_readers() -> None:
    sizes = {f"e{i}": 1000 + i for i in range(12)} | {"embed": 50_000, "norm": 10}
    users = {f"e{i}": [i % 4] for i in range(12)} | {"embed": [0, 1, 2, 3], "norm": [2, 3]}
    split = assign_hashing(sizes, [0, 1, 2, 3], users)
    owner = {n: r for r, ns in split.items() for n in ns}
    assert set(owner) == set(sizes)
    assert all(owner[n] in users[n] for n in sizes)


def test_assign_hashing_is_deterministic_whatever_the_dict_order() -> None:
    sizes = {f"x.{i}": 7 * (i % 3) + 1 for i in range(30)}
    again = dict(reversed(list(sizes.items())))
    assert assign_hashing(sizes, [0, 1, 2, 3]) == assign_hashing(again, [0, 1, 2, 3])


def _greedy(
    sizes: dict[str, int], ranks: list[int], users: dict[str, list[int]]
) -> dict[int, list[str]]:
    """The split rule written plainly: largest first (names in order among equals), each to its
    lightest reader (the lowest rank among equals)."""
    load, out = dict.fromkeys(ranks, 0), {r: [] for r in ranks}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = min(users.get(name) or ranks, key=lambda k: (load[k], k))
        out[r].append(name)
        load[r] += sizes[name]
    return out


def test_assign_hashing_is_the_plain_greedy_rule() -> None:
    """Ties everywhere (a few sizes, shared readers): the fast split is exactly the rule's."""
    import random

    rng = random.Random(7)
    for trial in range(20):
        ranks = list(range(rng.randint(1, 8)))
        sizes = {
            f"m.{rng.randint(0, 999)}.w{i}": rng.choice([64, 64, 128, 4096]) for i in range(300)
        }
        users = {
            n: sorted(rng.sample(ranks, rng.randint(1, len(ranks))))
            for n in sizes
            if rng.random() < 0.8
        }
        assert assign_hashing(sizes, ranks, users) == _greedy(sizes, ranks, users), trial


def node_reads() -> dict[int, dict[str, Box]]:
    """Four ranks of tp 4: a replicated norm, a row-cut head, a column-cut w2, experts of two ep
    groups."""
    reads: dict[int, dict[str, Box]] = {}
    for r in range(4):
        reads[r] = {
            "norm": ((0, 1), (0, 128)),
            "head": ((r * 256, (r + 1) * 256), (0, 2048)),
            "w2": ((0, 512), (r * 64, (r + 1) * 64)),
            f"expert.{r % 2}": ((r // 2 * 32, r // 2 * 32 + 32), (0, 512)),
        }
    return reads


SIZES = {
    "norm": 128,
    "head": 1024 * 2048,
    "w2": 512 * 256,
    "expert.0": 64 * 512,
    "expert.1": 64 * 512,
}


def test_node_mode_gives_each_tensor_to_exactly_one_of_its_readers() -> None:
    reads = node_reads()
    plans = {r: hash_plan("node", r, reads, SIZES, per_rank=False) for r in reads}
    hashers: dict[str, list[int]] = {}
    for r, plan in plans.items():
        assert plan.rank == r
        assert plan.mine <= set(reads[r])  # a rank hashes only what it reads
        for n in plan.mine:
            hashers.setdefault(n, []).append(r)
    assert set(hashers) == set(SIZES) and all(len(h) == 1 for h in hashers.values())
    for r, plan in plans.items():
        assert dict(plan.owner) == {n: hashers[n][0] for n in reads[r] if hashers[n][0] != r}


def test_node_mode_lists_every_other_readers_window_under_peers() -> None:
    reads = node_reads()
    for r in reads:
        plan = hash_plan("node", r, reads, SIZES, per_rank=False)
        assert set(plan.peers) == set(plan.mine)
        for n in plan.mine:
            readers = {p for p in reads if n in reads[p]}
            assert dict(plan.peers[n]) == {p: reads[p][n] for p in readers - {r}}


def test_node_mode_expert_of_an_ep_group_is_hashed_inside_that_group() -> None:
    reads = node_reads()
    hasher = {n: r for r in reads for n in hash_plan("node", r, reads, SIZES, per_rank=False).mine}
    assert hasher["expert.0"] in (0, 2) and hasher["expert.1"] in (1, 3)


def test_reader_sets_are_the_readers_map_grouped() -> None:
    """Every tensor in the group of exactly its readers, in the lowest reader's order; the one-group
    shortcut (every rank reads every tensor) gives what the general path gives."""
    import random

    rng = random.Random(3)
    for trial in range(20):
        ranks = rng.sample(range(16), rng.randint(1, 6))
        pool = [f"m.{i}.w" for i in range(200)]
        reads = {
            r: dict.fromkeys(rng.sample(pool, rng.randint(1, 200)), ((0, 1), (0, 1))) for r in ranks
        }
        if trial % 4 == 0:  # tp only: every rank reads every tensor, in its own order
            reads = {r: dict.fromkeys(rng.sample(pool, len(pool)), ((0, 1), (0, 1))) for r in ranks}
        groups = reader_sets(reads)
        users = readers(reads)
        assert [w for w, _ in groups] == sorted(w for w, _ in groups)
        got = {n: list(who) for who, names in groups for n in names}
        assert got == users and sum(len(names) for _, names in groups) == len(users), trial
        for who, names in groups:  # in the order the lowest reader reads them
            order = list(reads[who[0]])
            assert names == sorted(names, key=order.index), trial


def test_the_tensor_split_balances_each_group_and_counts_too() -> None:
    """Read by several ranks: dealt round largest first, so any two readers' bytes differ by at most
    the group's largest tensor and their counts by at most one; read by one: that rank's."""
    import random

    rng = random.Random(11)
    for trial in range(20):
        k = rng.randint(2, 8)
        sizes = {f"t{i}": rng.choice([4, 4, 64, 4096, 1 << 20]) for i in range(500)}
        alone = {f"a{i}": 7 for i in range(rng.randint(0, 30))}
        groups = [(tuple(range(k)), list(sizes))] + [((rng.randrange(k),), list(alone))]
        split = split_tensors(groups, sizes | alone)
        by = split[0].tolist()
        loads = [sum(sizes[n] for n, r in zip(sizes, by, strict=True) if r == q) for q in range(k)]
        counts = [by.count(q) for q in range(k)]
        assert max(loads) - min(loads) <= max(sizes.values()), trial
        assert max(counts) - min(counts) <= 1, trial
        assert split[1].tolist() == [groups[1][0][0]] * len(alone)


def test_sizes_read_from_a_column_split_as_a_mapping_does() -> None:
    """ByteSizes (the catalogue's nbytes column, a row a name) reads as the mapping it replaces and
    gives the same split, and each peer group's peers and windows as columns in the same order."""
    import random

    rng = random.Random(5)
    sizes = {f"t{i}": rng.choice([4, 64, 4096, 1 << 20]) for i in range(300)}
    names = list(sizes)
    rng.shuffle(names)  # rows in another order than the mapping's
    column = ByteSizes({n: k for k, n in enumerate(names)}, np.array([sizes[n] for n in names]))
    assert dict(column) == sizes and len(column) == len(sizes)
    groups = [((0, 1, 2), list(sizes)[:200]), ((1,), list(sizes)[200:])]
    got, want = split_tensors(groups, column), split_tensors(groups, sizes)
    assert [g.tolist() for g in got] == [g.tolist() for g in want]
    reads = {r: {n: ((r, r + 1), (0, 8)) for n in sizes} for r in range(3)}
    plan = hash_plan("node", 0, reads, column, per_rank=False)
    mine = sorted(plan.mine)
    at, ranks, boxes = plan.peers.columns(mine)  # type: ignore[attr-defined]
    want_rows = [(k, p, reads[p][n]) for k, n in enumerate(mine) for p, b in plan.peers[n].items()]
    assert list(zip(at, ranks, boxes, strict=True)) == want_rows


def test_the_split_at_tp_only_is_the_same_on_every_rank() -> None:
    """Every rank of a tp-4 node reads every tensor: each computes the same split (disjoint,
    covering every tensor), and the hashers' peer windows are everyone else's."""
    names = [f"layers.{i}.{w}" for i in range(50) for w in ("q", "k", "norm")]
    reads = {r: {n: ((r, r + 1), (0, 8)) for n in names} for r in range(4)}
    sizes = {n: 8 * (1 + len(n) % 3) for n in names}
    plans = {r: hash_plan("node", r, reads, sizes, per_rank=False) for r in reads}
    mine = [n for p in plans.values() for n in p.mine]
    assert sorted(mine) == sorted(names)
    for r, plan in plans.items():
        for n in plan.mine:
            assert dict(plan.peers[n]) == {p: reads[p][n] for p in range(4) if p != r}
        assert all(n in plans[o].mine for n, o in plan.owner.items())


def test_rank_mode_hashes_everything_a_rank_reads() -> None:
    reads = node_reads()
    assert hash_plan("rank", 2, reads, SIZES, per_rank=False) == HashPlan(2, frozenset(reads[2]))


def test_node_mode_falls_back_to_rank_for_per_rank_files_and_a_lone_rank() -> None:
    reads = node_reads()
    assert hash_plan("node", 1, reads, SIZES, per_rank=True) == HashPlan(1, frozenset(reads[1]))
    alone = hash_plan("node", 1, {1: reads[1]}, SIZES, per_rank=False)
    assert alone == HashPlan(1, frozenset(reads[1]))


@pytest.mark.parametrize("mode", ["off", "digest"])
def test_off_and_digest_modes_hash_nothing(mode: str) -> None:
    plan = hash_plan(mode, 0, node_reads(), SIZES, per_rank=False)
    assert plan == HashPlan(0) and not plan.mine and not plan.owner and not plan.peers


def test_one_readers_map_and_one_box() -> None:
    from tpload.model.values import Box as PlanBox
    from tpload.verification.node import readers

    assert Box is PlanBox
    reads = {1: {"a": ((0, 1), (0, 4)), "b": ((0, 2), (0, 4))}, 0: {"b": ((0, 2), (0, 4))}}
    assert readers(reads) == {"b": [0, 1], "a": [1]}
    assert list(readers(reads)) == ["b", "a"]  # in the order the lowest rank reads them


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


def test_claims_and_seen_from_columns_are_the_mapping_versions() -> None:
    """The gate's columnar claims and sightings (claims_of, seen_of over the hash results' and the
    windows' columns) give the values the mappings give, for every rank of a 4-rank node."""
    from tpload.verification.evidence import WindowTable

    reads = node_reads()
    node = [0, 1, 2, 3]
    rng = np.random.default_rng(5)
    for r in node:
        plan = hash_plan("node", r, reads, SIZES, per_rank=False)
        fingerprints = {
            n: {p: tuple(rng.integers(0, 1 << 40, 3).tolist()) for p in plan.peers[n]}
            for n in plan.mine
        }
        flat = [(n, p, fp) for n, by in fingerprints.items() for p, fp in by.items()]
        names = [n for n, _, _ in flat]
        ranks = np.array([p for _, p, _ in flat], np.int64)
        fps = np.array([fp for _, _, fp in flat], np.int64).reshape(-1, 3)
        want = claims(plan.peers, fingerprints, node, r)
        assert claims_of(names, ranks, fps, plan.peers.box, node, r) == want
        assert claims_of(names, ranks, fps, plan.peers, node, r) == want  # a peer at a time
        windows = {
            n: (box, tuple(rng.integers(0, 1 << 40, 3).tolist())) for n, box in reads[r].items()
        }
        table = WindowTable(
            ["stale", *windows],
            [((0, 0), (0, 0)), *(b for b, _ in windows.values())],
            np.array([[0, 0, 0], *(fp for _, fp in windows.values())], np.int64),
        )
        assert dict(table.items()) == {"stale": (((0, 0), (0, 0)), (0, 0, 0)), **windows}
        assert seen_of(plan.owner, table, node, r) == seen(plan.owner, windows, node, r)
