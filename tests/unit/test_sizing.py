"""What `tpload plan` says a layout costs (sizing.py), checked against the checkpoint's own
headers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpload.config import load_config
from tpload.plan import Layout
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

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, tpload.plan, tpload.tools.sizing, tpload.pick, tpload.codecs.fp8_block, "
        "tpload.codecs.nvfp4; print(sorted(m for m in ('numba', 'tpload.kernels') if m in "
        "sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
