"""Two nodes on one machine: two torchrun agents (--nnodes 2, c10d rendezvous) started together.
Global ranks pick the tp/ep position, LOCAL_RANK the device, and each node hashes its own copy
of the checkpoint once (in the quick tier's one two-node launch, tests/integration/conftest.py).
The SLURM example runs too (the slow tier), with srun and scontrol stand-ins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ..ckpt_tools import all_names, nbytes
from ..helpers import HERE, free_port
from ..reference import expected
from .conftest import TwoNodes

ROOT = HERE.parent
EXPERT = re.compile(r"\.experts\.(\d+)\.")


def env(**extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=str(ROOT),
        **extra,
    )


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[str]:
    """Wait for every agent; their combined output (each must exit 0)."""
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(outs)
    return outs


def agent(node: int, port: int, args: list[str], **extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"tpload-test-{port}",
        "--max-restarts",
        "0",
        *args,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(**extra)
    )


def test_two_nodes_tp4_positions_and_per_node_hashing(
    small_ckpt: Path, two_nodes_launch: TwoNodes
) -> None:
    # Node ids come from TPLOAD_NODE_ID here (two agents on one host); without it, from the host
    # name and torchrun's GROUP_RANK (unit-tested), never from rank // LOCAL_WORLD_SIZE. The launch
    # is shared with tests/integration/test_agreement.py: this is its first call, tp 4.
    docs = two_nodes_launch.outcomes["tp4"]
    assert all(d["returned"] for d in docs), [d["error"] for d in docs]
    report = docs[0]["report"]
    assert all(
        d["report"]["ranks"] == report["ranks"] for d in docs
    )  # every rank holds the same table
    assert [r["node"] for r in report["ranks"]] == [0, 0, 1, 1]
    for rank, doc in enumerate(docs):
        e = doc["env"]
        assert (int(e["RANK"]), int(e["LOCAL_RANK"]), int(e["GROUP_RANK"])) == (
            rank,
            rank % 2,
            rank // 2,
        )
        got = torch.load(two_nodes_launch.out / f"rank{rank}-call0.pt")
        want = expected(small_ckpt, 4, rank, "packed")  # the tp position is the global rank
        assert set(got) == set(want)
        for name, arr in want.items():
            assert (
                got[name].contiguous().view(torch.uint8).numpy().tobytes()
                == np.ascontiguousarray(arr).tobytes()
            )
    whole = nbytes(small_ckpt, all_names(small_ckpt))
    assert report["bytes_hashed_per_node"] == {
        "0": whole,
        "1": whole,
    }  # each node: its own copy, once


@pytest.fixture
def slurm_stubs(tmp_path: Path) -> Path:  # the SLURM example is the slow tier's
    """scontrol and srun stand-ins: two 'nodes' on this machine, started together."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # many hosts: a reader that stops after the first line would SIGPIPE this under pipefail
    (bin_dir / "scontrol").write_text(
        "#!/usr/bin/env bash\necho 127.0.0.1\nfor i in $(seq 2 5000); do echo node$i; done\n"
    )
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\nshift  # --kill-on-bad-exit=1\n"
        'SLURM_NODEID=0 "$@" & a=$!\nSLURM_NODEID=1 "$@" & b=$!\n'
        "wait $a && wait $b\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_slurm_example_runs_multi_node_script_tp2_ep2(
    small_ckpt: Path, tmp_path: Path, slurm_stubs: Path
) -> None:
    report = tmp_path / "load.json"
    e = env(
        PATH=f"{slurm_stubs}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        SLURM_NNODES="2",
        SLURM_JOB_ID=f"t{free_port()}",
        SLURM_JOB_NODELIST="stub[1-2]",
        SLURM_SUBMIT_DIR=str(ROOT),
        MASTER_PORT=str(free_port()),
        NPROC="2",
    )
    p = subprocess.run(
        [
            "bash",
            str(ROOT / "launch" / "slurm.sbatch"),
            str(small_ckpt),
            "--tp",
            "2",
            "--ep",
            "2",
            "--no-progress",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        env=e,
        timeout=240,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(report.read_text())
    assert (doc["tp"], doc["ep"]) == (2, 2) and [r["node"] for r in doc["ranks"]] == [0, 0, 1, 1]
    # ep group g is node g here: each node hashes the shared tensors and its own half of the
    # experts, once
    names = all_names(small_ckpt)
    for node in (0, 1):
        used = [n for n in names if not (m := EXPERT.search(n)) or int(m.group(1)) // 4 == node]
        assert doc["bytes_hashed_per_node"][str(node)] == nbytes(small_ckpt, used)
