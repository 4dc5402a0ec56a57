"""OOM pre-flight: the numbers and the advice (free memory pinned), and under torchrun every
rank fails before any byte is copied when the reserve leaves too little."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tpload import preflight
from tpload.checkpoint import Checkpoint
from tpload.config import load_config
from tpload.errors import LoadError
from tpload.plan import Layout, Planner

from .helpers import error_of, tpload_cli

MIB = 1 << 20


@pytest.fixture(scope="module")
def planner(small_ckpt: Path) -> Planner:
    return Planner(Checkpoint(small_ckpt), load_config())


def test_fits_or_names_needed_free_reserve_and_what_to_change(planner: Planner, monkeypatch) -> None:
    layout = Layout(2)
    plan = planner.plan(layout, "expanded", 0)
    need = plan.arena_bytes + plan.largest_transient
    monkeypatch.setattr(preflight, "free_bytes", lambda device: need + 10 * MIB)
    cuda = torch.device("cuda", 0)  # one rank per device: the node's peers do not add up
    preflight.check(planner, layout, plan, cuda, [0, 1], reserve_bytes=10 * MIB)  # fits exactly
    with pytest.raises(LoadError) as e:
        preflight.check(planner, layout, plan, cuda, [0, 1], reserve_bytes=10 * MIB + 1)
    msg = str(e.value)
    assert f"this rank needs {need / (1 << 30):.2f} GiB on cuda:0" in msg
    assert "reserve 0.01 GiB" in msg and "more ranks" in msg and "--ep 2" in msg
    packed = planner.plan(layout, "packed", 0)
    assert f"--kind packed needs {(packed.arena_bytes + packed.largest_transient) / (1 << 30):.2f} GiB" in msg


def test_cpu_ranks_of_a_node_share_the_host(planner: Planner, monkeypatch) -> None:
    layout = Layout(2)
    plans = [planner.plan(layout, "packed", r) for r in range(2)]
    one = plans[0].arena_bytes + plans[0].largest_transient
    monkeypatch.setattr(preflight, "free_bytes", lambda device: one + 1)
    preflight.check(planner, layout, plans[0], torch.device("cpu"), [0], reserve_bytes=0)
    with pytest.raises(LoadError, match="the 2 ranks of this node need"):
        preflight.check(planner, layout, plans[0], torch.device("cpu"), [0, 1], reserve_bytes=0)


def test_every_rank_fails_before_copying(small_ckpt: Path, tmp_path: Path) -> None:
    run = tpload_cli(2, "--checkpoint", str(small_ckpt), "--kind", "expanded", "--reserve-gib", "1000000",
                     logs=tmp_path / "logs")
    assert run.rc != 0
    msgs = [error_of(run.rank_err[r], r) for r in range(2)]
    assert msgs[0] == msgs[1] and "load failed on rank 0, 1 (2 of 2 ranks); no rank returned weights" in msgs[0]
    for needle in ("out of memory before the load", "reserve 1000000.00 GiB", "--kind packed needs"):
        assert needle in msgs[0]
