"""The bench's replicas arm end to end on the small checkpoint: 2 replicas x tp 2 in one launch
against 2 x tp 2 reading alone (4 processes each), every rank's digest equal to a replica alone's,
and the cluster's storage bytes one replica's reads, not 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import HERE

pytestmark = pytest.mark.slow


def test_the_replicas_arm_reads_one_replica_s_worth_from_storage(
    small_ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    env = dict(
        os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""
    )
    argv = ["bench", "--replicas", "2", "--tp", "2", "--checkpoint", str(small_ckpt)]
    p = subprocess.run(
        [sys.executable, "-m", "tpload", *argv, "--rounds", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    shared, alone = doc["shared"], doc["alone"]
    assert shared["rounds"] == alone["rounds"] == 1
    # both replicas read their share: what the ranks hold is twice what the cluster read
    assert 0 < shared["peer_bytes"] == shared["storage_bytes"]
    assert alone["storage_bytes"] == 2 * shared["storage_bytes"]
    assert shared["window_bytes"] == alone["window_bytes"] > 0  # the same windows served
    assert shared["storage_bytes"] >= shared["window_bytes"] // 2  # at least one replica's windows
    assert 2 * shared["hashed_bytes"] == alone["hashed_bytes"]  # each tensor hashed once a cluster
    assert shared["rss_peak"] > 0 and shared["wall_s"] > 0
    assert "1.00 x one replica's reads" in p.stdout
