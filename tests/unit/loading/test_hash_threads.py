"""How many hash threads a rank runs (loading/steps.py ``hash_threads``): sized to the cores the
rank owns (its CPU affinity shared among the node's ranks, less its main thread) unless
``--hash-threads`` says; on the CPU never more than the spare cores (the copies need the rest)."""

from __future__ import annotations

import os

import pytest

from tpload.loading import steps


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch):
    def set_cores(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))

    return set_cores


def test_a_gpu_rank_hashes_on_the_cores_it_owns(cores) -> None:
    cores(112)  # a GPU node: 2 x 56 cores, 8 ranks
    assert steps.hash_threads(None, 8, "cuda") == 13
    assert steps.hash_threads(4, 8, "cuda") == 4  # the flag overrides
    assert steps.hash_threads(32, 8, "cuda") == 32
    cores(8)  # a launcher that pinned each rank to 8 cores: the affinity is what counts
    assert steps.hash_threads(None, 1, "cuda") == 7


def test_a_cpu_rank_never_takes_the_cores_its_copies_need(cores) -> None:
    cores(2)
    assert steps.hash_threads(None, 1, "cpu") == 1
    assert steps.hash_threads(None, 2, "cpu") == 0  # two ranks on two cores: hashing inline
    assert steps.hash_threads(8, 1, "cpu") == 1
