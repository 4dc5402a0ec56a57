"""Replicas' local logic: the split of a position's runs between replicas, and the bad input refused
before any read (one line naming the option and the sizes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpload.errors import OptionsError
from tpload.modes import Verify
from tpload.options import LoadOptions
from tpload.replicas import PositionPlanner, check_world, link, split


def test_the_split_balances_bytes_and_keeps_a_tensor_with_one_reader() -> None:
    runs = [(["a"], 100), (["b"], 100), (["c"], 50), (["d"], 50), (["a.scale", "a"], 10), (["e"], 200)]
    owners = split(runs, 2)
    assert owners[:4] == [0, 1, 0, 1]  # the lightest replica, the lowest among equals
    assert owners[4] == owners[0]  # "a" was read by replica 0: it stays there (one reader, one hash)
    assert owners[5] == 1  # 150 < 160
    assert split(runs, 2) == owners  # deterministic: every rank of a position computes the same
    loads = [sum(n for (_, n), o in zip(runs, split(runs * 50, 3)) if o == q) for q in range(3)]
    assert max(loads) - min(loads) <= 200  # about 1/R each
    assert split(runs, 1) == [0] * len(runs)


def test_a_world_that_is_not_replicas_x_tp_x_ep_is_one_line_with_the_sizes() -> None:
    check_world(8, 2, 2, 2)
    with pytest.raises(OptionsError) as e:
        check_world(6, 2, 2, 1)
    assert str(e.value) == "replicas 2: a group of 6 ranks is not replicas 2 x tp 2 x ep 1 = 4 ranks"


def test_positions_plan_each_rank_as_its_place_in_its_replica() -> None:
    seen = []
    inner = SimpleNamespace(plan=lambda layout, kind, rank: rank,
                            check_layout=lambda layout, world: seen.append(world))
    planner = PositionPlanner(inner, 3)
    layout = SimpleNamespace(tp=2, ep=2, world=4)
    assert [planner.plan(layout, "packed", r) for r in range(12)] == [0, 1, 2, 3] * 3
    planner.check_layout(layout, 12)
    assert seen == [4]
    with pytest.raises(OptionsError, match="a group of 8 ranks is not replicas 3 x tp 2 x ep 2 = 12 ranks"):
        planner.check_layout(layout, 8)


def test_verify_rank_with_replicas_is_refused_saying_why() -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions(checkpoint="x", replicas=2, verify="rank")
    assert "replicas= 2 with verify= rank" in str(e.value)
    assert "never sees the whole stored tensor, so it cannot hash" in str(e.value)
    LoadOptions(checkpoint="x", replicas=1, verify="rank")  # one replica: rank mode as before


@pytest.mark.parametrize("verify, per_rank, files, why", [
    (Verify.DIGEST, False, None, "--verify digest is not shared between replicas yet"),
    (Verify.NODE, True, None, "a pre-partitioned export"),
    (Verify.NODE, False, {}, "files vouched for whole"),
])
def test_what_replicas_cannot_share_yet_is_refused_before_any_read(verify: Verify, per_rank: bool, files: object,
                                                                   why: str) -> None:
    storage = SimpleNamespace(per_rank=per_rank, file_digests=files)
    job = SimpleNamespace(opts=SimpleNamespace(replicas=2, verify=verify), ctx=None, storage=storage)
    with pytest.raises(OptionsError, match=why):
        link(SimpleNamespace(job=job))
    job.opts.replicas = 1
    assert link(SimpleNamespace(job=job)) is None  # no replicas: nothing changes
