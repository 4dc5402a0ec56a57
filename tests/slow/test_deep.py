"""The tensor count of the real DeepSeek-V3 on a small machine (slow tier): deepseek-v3-deep has
every tensor of the published checkpoint (61 layers + MTP, 256 experts, the same names, dtypes and
128-block rules) with the smallest dimensions the rules allow, and loads on 8 CPU ranks at
tp 2 x ep 4, packed, with node verification."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tpload.tools.published import write_published

from ..helpers import tpload_cli

pytestmark = pytest.mark.slow
EXPERT = re.compile(r"\.experts\.(\d+)\.")


def headers(root: Path) -> dict[str, dict]:
    """Every tensor's header entry, read without tpload."""
    out = {}
    for shard in sorted(root.glob("*.safetensors")):
        with open(shard, "rb") as f:
            doc = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        out.update({k: v for k, v in doc.items() if k != "__metadata__"})
    return out


def test_deepseek_v3_deep_loads_at_tp2_ep4_on_8_ranks(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = write_published(tmp_path_factory.mktemp("deep") / "v3", "deepseek-v3-deep")
    tensors = headers(root)
    assert len(tensors) == 91_991
    report = root.parent / "report.json"
    run = tpload_cli(
        8, "--checkpoint", str(root), "--tp", "2", "--ep", "4", "--report", str(report), timeout=900
    )
    assert run.rc == 0, run.text[-3000:]
    doc = json.loads(report.read_text())
    ranks = doc["ranks"]
    assert len(ranks) == 8 and all(r["failed"] == 0 for r in ranks)
    # every tensor is read by some rank of this one node, so the node hashes each one exactly once
    total = sum(e - b for b, e in (t["data_offsets"] for t in tensors.values()))
    assert sum(r["bytes_hashed"] for r in ranks) == total
    assert sum(r["hashed"] for r in ranks) == len(tensors)
    # each ep group serves its 64 of the 256 experts, and every other tensor
    experts = [n for n in tensors if EXPERT.search(n)]
    assert {r["tensors"] for r in ranks} == {len(tensors) - len(experts) + len(experts) // 4}
    print(
        f"deepseek-v3-deep tp2xep4: {doc['seconds']:.1f} s, {ranks[0]['tensors']} tensors a rank, "
        f"{doc['seconds'] / ranks[0]['tensors'] * 1e6:.0f} us per tensor per rank (8 ranks on "
        "this machine's cores)"
    )
