"""How many hash threads a rank runs (sources/hashing.py ``hash_threads``, and a refresh side's:
refresh/terms.py): sized to the cores the rank owns (its CPU affinity shared among the node's
ranks, less its main thread) unless ``--hash-threads`` says; on the CPU never more than the spare
cores (the copies need the rest)."""

from __future__ import annotations

import os

import pytest

from tpload.sources import hashing


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch):
    def set_cores(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))

    return set_cores


def test_a_gpu_rank_hashes_on_the_cores_it_owns(cores) -> None:
    cores(112)  # a GPU node: 2 x 56 cores, 8 ranks
    assert hashing.hash_threads(None, 8, "cuda") == 13
    assert hashing.hash_threads(4, 8, "cuda") == 4  # the flag overrides
    assert hashing.hash_threads(32, 8, "cuda") == 32
    cores(8)  # a launcher that pinned each rank to 8 cores: the affinity is what counts
    assert hashing.hash_threads(None, 1, "cuda") == 7


def test_a_cpu_rank_never_takes_the_cores_its_copies_need(cores) -> None:
    cores(2)
    assert hashing.hash_threads(None, 1, "cpu") == 1
    assert hashing.hash_threads(None, 2, "cpu") == 0  # two ranks on two cores: hashing inline
    assert hashing.hash_threads(8, 1, "cpu") == 1


def test_a_refresh_side_sizes_its_hash_threads_like_a_load(cores, monkeypatch) -> None:
    from tpload.refresh.terms import hash_threads

    cores(112)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert hash_threads(8, "cuda") == 13  # 8 engine ranks on one node (vLLM sets no torchrun env)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 processes share this node's cores
    assert hash_threads(8, "cuda") == 27
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "junk")
    assert hash_threads(2, "cuda") == 55
    cores(2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert hash_threads(1, "cpu") == 1 and hash_threads(2, "cpu") == 0
