"""The launch scripts (slow tier): single-node.sh under a real torchrun."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]


def test_single_node_launch_script(small_ckpt: Path, tmp_path: Path) -> None:
    env = dict(
        os.environ, NPROC="2", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES=""
    )
    p = subprocess.run(
        [
            "bash",
            str(ROOT / "launch" / "single-node.sh"),
            str(small_ckpt),
            "--no-progress",
            "--report",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    assert len(json.loads((tmp_path / "r.json").read_text())["ranks"]) == 2
