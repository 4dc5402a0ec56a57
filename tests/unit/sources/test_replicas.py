"""Replicas' local logic: the split of a position's runs between replicas, and the bad input refused
before any read (one line naming the option and the sizes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpload.distributed.placement import (
    Placement,
    check_world,
    placement,
    planned_world,
    position,
)
from tpload.distributed.replica_split import split
from tpload.model.errors import OptionsError
from tpload.model.modes import Verify
from tpload.options.load_options import LoadOptions
from tpload.sources.open import open_source
from tpload.sources.storage import StorageSource


def test_the_split_balances_bytes_and_keeps_a_tensor_with_one_reader_at_every_position() -> None:
    runs = [
        (["a"], 100, None),
        (["b"], 100, None),
        (["c"], 50, None),
        (["d"], 50, None),
        (["a.scale", "a"], 10, ("f", 0)),
        (["e"], 200, None),
    ]
    (pos,) = split([runs], 2)
    owners = [pos.by_name[names[-1]] for names, _, _ in runs]
    assert owners[:4] == [0, 1, 0, 1]  # the lightest replica, the lowest among equals
    assert owners[4] == owners[0] and pos.by_batch == {
        ("f", 0): 0
    }  # "a" stays with its reader (one hash)
    assert owners[5] == 1  # 150 < 160
    assert pos.reads == [{"a", "a.scale", "c"}, {"b", "d", "e"}]
    # a second position (another tp rank: the same tensors, other windows) follows the first: one
    # replica reads every window of a tensor, so one node hashes it
    first, second = split([runs, [(names, n // 2, b) for names, n, b in runs]], 2)
    assert second.by_name == first.by_name and second.reads == first.reads
    assert [p.by_name for p in split([runs], 2)] == [pos.by_name]  # deterministic
    many = [([f"t{i}"], 100 + i % 7, None) for i in range(300)]
    (spread,) = split([many], 3)
    loads = [sum(n for (names, n, _) in many if spread.by_name[names[0]] == q) for q in range(3)]
    assert max(loads) - min(loads) <= 106  # about 1/R each


def test_a_world_that_is_not_replicas_x_tp_x_ep_is_one_line_with_the_sizes() -> None:
    check_world(8, 2, 2, 2)
    with pytest.raises(OptionsError) as e:
        check_world(6, 2, 2, 1)
    assert (
        str(e.value) == "replicas 2: a group of 6 ranks is not replicas 2 x tp 2 x ep 1 = 4 ranks"
    )


def test_positions_plan_each_rank_as_its_place_in_its_replica() -> None:
    opts = SimpleNamespace(replicas=3, replica_group=None)
    at = placement(opts, 12)
    assert [position(at, r) for r in range(12)] == [0, 1, 2, 3] * 3
    assert [position(None, r) for r in range(4)] == [0, 1, 2, 3]  # no replicas: the rank itself
    assert planned_world(opts, 12, 2, 2) == 4  # one replica's layout
    assert planned_world(SimpleNamespace(replicas=1, replica_group=None), 8, 2, 2) == 8
    with pytest.raises(
        OptionsError, match="a group of 8 ranks is not replicas 3 x tp 2 x ep 2 = 12 ranks"
    ):
        planned_world(opts, 8, 2, 2)


def test_verify_rank_with_replicas_is_refused_saying_why() -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions(checkpoint="x", replicas=2, verify="rank")
    assert "replicas= 2 with verify= rank" in str(e.value)
    assert "never sees the whole stored tensor, so it cannot hash" in str(e.value)
    LoadOptions(checkpoint="x", replicas=1, verify="rank")  # one replica: rank mode as before


@pytest.mark.parametrize(
    "verify, per_rank, files, why",
    [  # whole-file anchors are shared (by file)
        (Verify.NODE, True, None, "a pre-partitioned export"),
    ],
)
def test_what_replicas_cannot_share_yet_is_refused_before_any_read(
    verify: Verify, per_rank: bool, files: object, why: str
) -> None:
    storage = SimpleNamespace(per_rank=per_rank, file_digests=files)
    opts = SimpleNamespace(replicas=2, replica_group=None, verify=verify)

    def source() -> object:
        return open_source(
            storage,  # type: ignore[arg-type]
            opts=opts,  # type: ignore[arg-type]
            ctx=None,  # type: ignore[arg-type]
            plans={},
            planner=None,  # type: ignore[arg-type]
            layout=None,  # type: ignore[arg-type]
            kind="packed",
            whole_files=False,
            seq=1,
        )

    with pytest.raises(OptionsError, match=why):
        source()
    opts.replicas = 1
    assert type(source()) is StorageSource  # no replicas: the storage itself, as before


def test_with_whole_file_anchors_a_file_is_read_by_one_replica() -> None:
    file_of = {"a": "f1", "b": "f1", "c": "f2", "d": "f2"}
    runs = [(["a"], 100, None), (["c"], 50, None), (["b"], 10, None), (["d"], 10, None)]
    (per_tensor,) = split([runs], 2)
    assert per_tensor.by_name["b"] == 1  # per tensor, "b" goes to the lighter replica
    (per_file,) = split([runs], 2, file_of.__getitem__)
    assert per_file.reads == [
        {"a", "b"},
        {"c", "d"},
    ]  # per file, "b" follows "a": f1 is read (and hashed) once


def test_the_exchange_checks_every_receiver_against_its_senders_apart_from_the_in_band_values() -> (
    None
):
    from tpload.model.figures import RankFigures
    from tpload.sources.replicas import verdict
    from tpload.verification.node import fold

    a = [("w", ((0, 4), (0, 8)), (1, 2, 3))]
    b = [("v", ((0, 2), (0, 8)), (4, 5, 6))]
    # 2 replicas x 2 positions: rank 0 sent a to rank 2, rank 3 sent b to rank 1
    rows = [
        RankFigures(rank=0, replicas_sent=fold(a).hex()),
        RankFigures(rank=1, replicas_seen=fold(b).hex()),
        RankFigures(rank=2, replicas_seen=fold(a).hex()),
        RankFigures(rank=3, replicas_sent=fold(b).hex()),
    ]
    rows = [RankFigures.from_row(r.to_row()) for r in rows]  # through the wire form
    assert verdict(rows, 2) == [] and verdict(rows, 1) == []
    rows[2].replicas_seen = fold(
        [("w", ((0, 4), (0, 8)), (1, 2, 4))]
    ).hex()  # a window changed on the way
    assert verdict(rows, 2) == [
        (
            "rank 2 (replica 1) holds windows from rank(s) 0 that differ from what they read "
            "from storage and sent (the exchange's check of the transfers)"
        )
    ]


@pytest.mark.parametrize(
    "values, needle",
    [
        (
            {"replica_group": [[0, 2], [1, 3, 5]]},
            "replica_group= groups of unequal size (2, 3): each holds one rank per replica",
        ),
        (
            {"replica_group": [[0, 2], [2, 3]]},
            "replica_group= overlapping groups: rank 2 is in groups 0 and 1 (2 groups of 2)",
        ),
        ({"replica_group": [[0, 0]]}, "overlapping groups: rank 0 is in group 0 twice"),
        (
            {"replica_group": []},
            "replica_group= must hold one non-empty list of ranks per position",
        ),
        ({"replica_group": [[0, -1]]}, "replica_group= rank -1 in group 0 is negative"),
        ({"replica_group": [[0, "1"]]}, "replica_group=: expected a list of lists of ranks"),
        (
            {"replica_group": [[0, 2], [1, 3]], "replicas": 2},
            "replicas= 2 with replica_group= (2 groups of 2): give one of them",
        ),
        (
            {"replica_group": [[0, 2], [1, 3]], "verify": "rank"},
            "replica_group= (2 groups) with verify= rank: a receiving rank never sees",
        ),
    ],
)
def test_bad_replica_groups_are_one_line_naming_the_option_and_the_sizes(
    values: dict, needle: str
) -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values({"checkpoint": "x", **values})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_replica_groups_are_kept_as_given_and_count_the_replicas() -> None:
    from tpload.distributed.placement import count, placement

    opts = LoadOptions.from_values({"checkpoint": "x", "replica_group": [[3, 0], (1, 2)]})
    assert opts.replica_group == ((3, 0), (1, 2)) and opts.replicas == 1
    assert count(opts) == 2 and count(LoadOptions(checkpoint="x", replicas=3)) == 3
    at = placement(opts, 4)
    # position 0 is held by rank 3 (replica 0) and rank 0 (replica 1)
    assert [at.where(r) for r in range(4)] == [(1, 0), (0, 1), (1, 1), (0, 0)]
    assert at.rank(0, 0) == 3 and at.rank(1, 1) == 2
    plain = placement(LoadOptions(checkpoint="x", replicas=2), 4)
    assert plain.groups == ((0, 2), (1, 3))  # --replicas R: rank order
    assert placement(LoadOptions(checkpoint="x"), 4) is None


def test_replica_groups_that_do_not_place_the_world_are_refused_with_the_sizes() -> None:
    groups = [[0, 2], [1, 3]]
    check_world(4, 2, 2, 1, groups)
    for world, tp, ep, g, needle in (
        (6, 2, 1, groups, "a group of 6 ranks is not replicas 2 x tp 2 x ep 1 = 4 ranks"),
        (4, 1, 1, groups[:1], "a group of 4 ranks is not replicas 2 x tp 1 x ep 1 = 2 ranks"),
        (4, 2, 1, [[0, 2], [1, 5]], "rank(s) 5 outside the load's group of 4 ranks"),
        (8, 2, 2, [[0, 4], [1, 5], [2, 6]], "tp 2 x ep 2 has 4 positions, so 4 groups are needed"),
    ):
        with pytest.raises(OptionsError) as e:
            check_world(world, 2, tp, ep, g)
        assert str(e.value).startswith(f"replica_group ({len(g)} groups of 2): ") and needle in str(
            e.value
        )
    # each rank is planned as the position its group gives it
    assert [position(Placement([[3, 0], [1, 2]]), r) for r in range(4)] == [0, 1, 1, 0]
