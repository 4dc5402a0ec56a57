"""OOM pre-flight: the numbers and the advice (free memory pinned), and a load refused before any
byte is copied when the reserve leaves too little."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tpload
from tpload.distributed.placement import RING, wire_device_bytes
from tpload.loading import preflight
from tpload.loading.planner import planner_of
from tpload.model.errors import LoadError
from tpload.planning.layout import Layout
from tpload.planning.planner import Planner
from tpload.selection.config import load_config
from tpload.storage.catalogue import read_native
from tpload.storage.reader import CHUNK_BYTES
from tpload.transfer.base import CUDA_CHUNK_BYTES

MIB = 1 << 20


@pytest.fixture(scope="module")
def planner(small_ckpt: Path) -> Planner:
    return planner_of(read_native(small_ckpt)[0], load_config())


def test_fits_or_names_needed_free_reserve_and_what_to_change(
    planner: Planner, monkeypatch
) -> None:
    layout = Layout(2)
    plan = planner.plan(layout, "expanded", 0)
    need = plan.arena_bytes + plan.largest_transient
    monkeypatch.setattr(preflight, "free_bytes", lambda device: need + 10 * MIB)
    cuda = torch.device("cuda", 0)  # one rank per device: the node's peers do not add up
    preflight.check(planner, layout, plan, cuda, [plan], reserve_bytes=10 * MIB)  # fits exactly
    with pytest.raises(LoadError) as e:
        preflight.check(planner, layout, plan, cuda, [plan], reserve_bytes=10 * MIB + 1)
    msg = str(e.value)
    assert f"this rank needs {need / (1 << 30):.2f} GiB on cuda:0" in msg
    assert "reserve 0.01 GiB" in msg and "more ranks" in msg and "--ep 2" in msg
    packed = planner.plan(layout, "packed", 0)
    assert (
        f"--kind packed needs {(packed.arena_bytes + packed.largest_transient) / (1 << 30):.2f} GiB"
        in msg
    )


def test_ranks_sharing_memory_add_up(planner: Planner, monkeypatch) -> None:
    layout = Layout(2)
    plans = [planner.plan(layout, "packed", r) for r in range(2)]
    one = plans[0].arena_bytes + plans[0].largest_transient
    monkeypatch.setattr(preflight, "free_bytes", lambda device: one + 1)
    preflight.check(planner, layout, plans[0], torch.device("cpu"), plans[:1], reserve_bytes=0)
    with pytest.raises(LoadError, match="the 2 ranks of this node need"):
        preflight.check(planner, layout, plans[0], torch.device("cpu"), plans, reserve_bytes=0)


def test_replicas_count_their_device_ring_on_a_gpu_only(planner: Planner, monkeypatch) -> None:
    layout = Layout(2)
    plan = planner.plan(layout, "packed", 0)
    need = plan.arena_bytes + plan.largest_transient
    ring = wire_device_bytes(torch.device("cuda", 0))
    assert ring == 2 * RING * max(CUDA_CHUNK_BYTES, CHUNK_BYTES)
    assert wire_device_bytes(torch.device("cpu")) == 0
    monkeypatch.setattr(preflight, "free_bytes", lambda device: need + ring)
    cuda = torch.device("cuda", 0)
    preflight.check(planner, layout, plan, cuda, [plan], reserve_bytes=0, beyond=ring)  # its ring
    preflight.check(planner, layout, plan, cuda, [plan], reserve_bytes=ring)  # no replicas: no ring
    with pytest.raises(LoadError, match="on cuda:0"):
        preflight.check(planner, layout, plan, cuda, [plan], reserve_bytes=1, beyond=ring)
    monkeypatch.setattr(preflight, "free_bytes", lambda device: need)
    cpu = torch.device("cpu")  # no ring on the CPU
    preflight.check(planner, layout, plan, cpu, [plan], 0, beyond=wire_device_bytes(cpu))


def test_a_load_that_cannot_fit_is_refused_before_copying(small_ckpt: Path) -> None:
    with pytest.raises(LoadError) as e:
        tpload.load(small_ckpt, kind="expanded", reserve_gib=1_000_000.0, progress=False)
    msg = str(e.value)
    assert "load failed on rank 0 (1 of 1 ranks); no rank returned weights" in msg
    for needle in (
        "out of memory before the load",
        "reserve 1000000.00 GiB",
        "--kind packed needs",
    ):
        assert needle in msg
