"""--evict-page-cache under real torchrun: two ranks, node hashing, nothing of the checkpoint left
cached (the residency measure and ShardRelease are unit-tested)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tpload.storage.pagecache import resident_bytes
from tpload.tools.synth import SynthSpec, write_checkpoint

from ..helpers import tpload_cli


def test_two_ranks_with_node_hashing_leave_nothing_cached(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "c", SynthSpec(experts=16, vocab=4096, shards=3))
    os.sync()  # DONTNEED cannot drop dirty pages
    shards = sorted(root.glob("*.safetensors"))
    total = sum(len(p.read_bytes()) for p in shards)  # warm
    report = tmp_path / "r.json"
    run = tpload_cli(2, str(root), "--evict-page-cache", "--report", str(report))
    assert run.rc == 0, run.text
    doc = json.loads(report.read_text())
    assert doc["verify"] == "node" and doc["evict_page_cache"] is True
    # the node's first rank measures as it starts; the other does not measure (null, not -1)
    before = [r["page_cache_before"] for r in doc["ranks"]]
    assert (
        before[0] > 0.5 * total
        and before[1] is None
        and doc["ranks"][1]["page_cache_after"] is None
    )
    assert [resident_bytes(p) for p in shards] == [0] * len(
        shards
    )  # whoever finished last dropped the rest
