"""What `tpload plan` says a layout costs (sizing.py), checked against the checkpoint's own
headers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.tools.published import write_published
from tpload.tools.sizing import costs, planning


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("q") / "q", "qwen3-fp8-tiny")


def test_each_node_hashes_what_its_ranks_read_once_and_whole_files_cost_more(qwen: Path) -> None:
    layout = Layout(2, 2)
    with planning(qwen, load_config("qwen3+fp8-block"), layout) as planner:
        plans = [planner.plan(layout, "packed", r) for r in range(4)]
        ranks, nodes = costs(plans, planner.catalogue, 2)  # two nodes: one ep group each
    index = json.loads((qwen / "model.safetensors.index.json").read_text())["weight_map"]
    sizes = {}
    for shard in sorted(set(index.values())):
        with open(qwen / shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        sizes.update(
            {
                n: e["data_offsets"][1] - e["data_offsets"][0]
                for n, e in header.items()
                if n != "__metadata__"
            }
        )
    for node in nodes:
        read = {n for r in node.ranks for n in plans[r].used_tensors}
        assert node.hash_bytes == sum(sizes[n] for n in read)  # each tensor its ranks read, once
        assert sum(r.hash_bytes for r in ranks if r.node == node.node) == node.hash_bytes
        assert node.file_bytes == sum(os.path.getsize(qwen / f) for f in {index[n] for n in read})
        assert node.file_bytes > node.hash_bytes  # the other group's experts share the files
    assert [r.read_bytes for r in ranks] == [p.read_bytes for p in plans]
    assert all(
        r.device_peak == p.arena_bytes + p.largest_transient
        for r, p in zip(ranks, plans, strict=True)
    )


def test_planning_imports_neither_numba_nor_the_kernels() -> None:
    """``tpload plan`` cuts and sizes without the compiled kernels (about a second of import
    saved)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    code = (
        "import sys, tpload.planning.planner, tpload.tools.sizing, tpload.loading.pick, "
        "tpload.codecs.fp8_block, "
        "tpload.codecs.nvfp4; print(sorted(m for m in ('numba', 'tpload.kernels.compiled') if m in "
        "sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_plan_speaks_the_load_table_s_units_and_judges_a_gpu(qwen: Path) -> None:
    from tpload.tools.sizing import GIB, HostMemory, RankCost, fit_line, render_costs

    layout = Layout(2, 2)
    with planning(qwen, load_config("qwen3+fp8-block"), layout) as planner:
        plans = [planner.plan(layout, "packed", r) for r in range(4)]
        ranks, nodes = costs(plans, planner.catalogue, 2)
    text = render_costs(ranks, nodes, ["-"] * 4, HostMemory(), every_rank=True, fit="FIT")
    lines = text.splitlines()
    for r in ranks:  # memory in GiB, bytes moved in GB, each from the plan's own figures
        row = lines[1 + r.rank].split()
        assert row[3:5] == [f"{r.read_bytes / 1e9:.3f}", f"{r.hash_bytes / 1e9:.3f}"]
        assert row[5:8] == [
            f"{b / 2**30:.3f}" for b in (r.arena_bytes, r.transient_bytes, r.device_peak)
        ]
    at = next(k for k, line in enumerate(lines) if line.startswith("peak device memory"))
    assert lines[at].endswith("GiB)") and lines[at + 1] == "FIT"  # the verdict under the peak
    two = [RankCost(r, 0, 1, 0, 0, arena, GIB // 2) for r, arena in ((0, 81 * GIB), (1, 70 * GIB))]
    assert fit_line(two, 80 * GIB, "--gpu-memory 80") == (
        "does not fit a GPU of 80.00 GiB (--gpu-memory 80): 1 of 2 ranks peak above it, rank 0 at "
        "81.500 GiB, 1.500 GiB over; more ranks (a larger tp x ep) spread the bytes thinner"
    )
    assert fit_line(two, 141 * GIB, "cuda:0") == (
        "fits a GPU of 141.00 GiB (cuda:0): the highest peak, rank 0's 81.500 GiB, leaves 59.500 "
        "GiB (a load's pre-flight checks the device's free memory less --reserve-gib)"
    )
    exact = [RankCost(0, 0, 1, 0, 0, 80 * GIB - GIB // 2, GIB // 2)]  # at the size: it fits
    assert fit_line(exact, 80 * GIB, "x").startswith("fits") and "leaves 0.000 GiB" in fit_line(
        exact, 80 * GIB, "x"
    )
