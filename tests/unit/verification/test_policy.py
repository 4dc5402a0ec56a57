"""Who hashes what: the byte-balanced split and each rank's HashPlan per verify mode."""

from __future__ import annotations

import pytest

from tpload.model.values import Box
from tpload.verification.policy import HashPlan, assign_hashing, hash_plan


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
    from tpload.model.windows import readers

    assert Box is PlanBox
    reads = {1: {"a": ((0, 1), (0, 4)), "b": ((0, 2), (0, 4))}, 0: {"b": ((0, 2), (0, 4))}}
    assert readers(reads) == {"b": [0, 1], "a": [1]}
    assert list(readers(reads)) == ["b", "a"]  # in the order the lowest rank reads them
