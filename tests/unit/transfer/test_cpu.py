"""The CPU arena (tpload/transfer/cpu.py): its pages populated beside the first copies."""

from __future__ import annotations

import os
import sys

import numpy as np
import psutil
import pytest
import torch

from tpload.transfer.cpu import CpuTransfer, new_arena

NBYTES = 64 << 20


@pytest.mark.parametrize("in_background", [False, True])
def test_the_arena_is_zeroed_and_keeps_what_is_written_while_it_populates(
    in_background: bool,
) -> None:
    arena, worker = new_arena(NBYTES, in_background=in_background)
    assert arena.dtype == torch.uint8 and arena.numel() == NBYTES
    host = arena.numpy()
    assert not host[:: 1 << 20].any()  # fresh anonymous memory reads as zeros
    pattern = np.arange(4096, dtype=np.uint8)
    host[-4096:] = pattern  # written while the populate may still run: a populate never zeroes
    host[:4096] = pattern[::-1]
    if worker is not None:
        worker.join(timeout=60)
        assert not worker.is_alive()
    else:
        assert not in_background or sys.platform != "linux"
    assert (host[-4096:] == pattern).all() and (host[:4096] == pattern[::-1]).all()
    assert not host[4096 : -4096 : (1 << 20)].any()


def test_the_transfer_waits_for_its_populate_before_the_load_ends() -> None:
    transfer = CpuTransfer(torch.device("cpu"))
    arena = transfer.arena(NBYTES)
    with transfer:
        arena.numpy()[:8] = 7
    assert transfer._populating is None  # joined on the way out
    assert int(arena[0]) == 7


def test_an_empty_arena_starts_no_thread() -> None:
    arena, worker = new_arena(0, in_background=True)
    assert arena.numel() == 0 and worker is None


def _populate_supported() -> bool:
    """MADV_POPULATE_WRITE came with Linux 5.14."""
    if sys.platform != "linux":
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 14)


@pytest.mark.skipif(not _populate_supported(), reason="needs Linux >= 5.14 (MADV_POPULATE_WRITE)")
def test_the_background_populate_makes_the_pages_resident() -> None:
    rss = psutil.Process().memory_info().rss
    arena, worker = new_arena(NBYTES, in_background=True)
    worker.join(timeout=60)
    grown = psutil.Process().memory_info().rss - rss
    assert grown >= 0.9 * NBYTES, grown  # resident without a byte written
    del arena
