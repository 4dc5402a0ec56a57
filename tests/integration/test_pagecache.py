"""Page-cache eviction: mincore residency against util-linux fincore, the per-shard release
(only after the rank's own hash jobs on the shard), and --evict-page-cache under torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tpload.checkpoint import Checkpoint
from tpload.config import load_config
from tpload.pagecache import ShardRelease, evict, resident_bytes
from tpload.plan import Layout, Planner
from tpload.synth import SynthSpec, write_checkpoint

from .helpers import tpload_cli

FINCORE = shutil.which("fincore")


@pytest.fixture
def clean_ckpt(tmp_path: Path) -> Path:
    """A checkpoint whose pages are written back (DONTNEED cannot drop dirty pages)."""
    root = write_checkpoint(tmp_path / "c", SynthSpec(experts=16, vocab=4096, shards=3))
    os.sync()
    return root


def shards(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


def warm(root: Path) -> int:
    for p in shards(root):
        p.read_bytes()
    return sum(p.stat().st_size for p in shards(root))


def fincore(path: Path) -> int:
    out = subprocess.run([FINCORE, "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


@pytest.mark.skipif(FINCORE is None, reason="util-linux fincore not installed")
def test_resident_bytes_agrees_with_fincore_and_evict_drops(clean_ckpt: Path) -> None:
    warm(clean_ckpt)
    ckpt = Checkpoint(clean_ckpt)
    for p in shards(clean_ckpt):
        ckpt.raw(next(i.name for i in ckpt.tensors.values() if i.path == p))  # mapped by this process
        size = p.stat().st_size  # fincore counts whole pages; tpload caps at the file size
        assert resident_bytes(p) == min(fincore(p), size) == size
        evict(ckpt, p)
        assert resident_bytes(p) == fincore(p) == 0


def test_a_shard_is_released_only_after_its_own_hash_jobs(clean_ckpt: Path) -> None:
    ckpt = Checkpoint(clean_ckpt)
    plan = Planner(ckpt, load_config()).plan(Layout(1), "packed", 0)
    released: list[Path] = []
    first = shards(clean_ckpt)[0]
    hashed = next(n for n in plan.used_tensors if ckpt.info(n).path == first)
    tracker = ShardRelease(ckpt, plan.items, [hashed], lambda path, ranges: released.append(path))
    for item in plan.items:
        tracker.item_done(item)
    assert released == shards(clean_ckpt)[1:]  # every window copied, but the hash is still to come
    tracker.hash_done(hashed)
    assert released == shards(clean_ckpt)[1:] + [first]  # each shard released exactly once


def report(root: Path, tmp_path: Path, nproc: int, *flags: str) -> dict:
    path = tmp_path / f"r{nproc}{''.join(flags)}.json"
    run = tpload_cli(nproc, "--checkpoint", str(root), "--report", str(path), *flags)
    assert run.rc == 0, run.text
    assert "cache GB before>after" in run.out
    return json.loads(path.read_text())


def test_one_rank_reports_its_page_cache_before_and_after(clean_ckpt: Path, tmp_path: Path) -> None:
    # a shared machine's kernel may reclaim a few pages between warming and measuring: 99%, not all
    total = warm(clean_ckpt)
    kept = report(clean_ckpt, tmp_path, 1)["ranks"][0]
    assert kept["page_cache_before"] > 0.99 * total and kept["page_cache_after"] == -1  # "after" only when evicting
    total = warm(clean_ckpt)
    doc = report(clean_ckpt, tmp_path, 1, "--evict-page-cache")
    assert doc["evict_page_cache"] is True
    rank = doc["ranks"][0]
    assert rank["page_cache_before"] > 0.99 * total and rank["page_cache_after"] == 0
    assert sum(resident_bytes(p) for p in shards(clean_ckpt)) == 0


def test_two_ranks_with_node_hashing_leave_nothing_cached(clean_ckpt: Path, tmp_path: Path) -> None:
    total = warm(clean_ckpt)
    doc = report(clean_ckpt, tmp_path, 2, "--evict-page-cache")
    assert doc["verify"] == "node"
    # the node's first rank measures as it starts (its peer may already have dropped a first shard:
    # not all, but most is still there); the other rank does not measure
    before = [r["page_cache_before"] for r in doc["ranks"]]
    assert before[0] > 0.5 * total and before[1] == -1 and doc["ranks"][1]["page_cache_after"] == -1
    # whoever finished last dropped what the other still had mapped
    assert [resident_bytes(p) for p in shards(clean_ckpt)] == [0] * len(shards(clean_ckpt))


def test_sampled_residency_estimates_a_half_cached_file(tmp_path: Path) -> None:
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(64 << 20))
    size = f.stat().st_size
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past what is read
        os.pread(fd, 32 << 20, 0)  # the first half back in the cache
    finally:
        os.close(fd)
    exact = resident_bytes(f)
    assert 0.4 * size < exact < 0.7 * size  # half, give or take what the kernel read ahead
    assert abs(resident_bytes(f, sample=8) - exact) < 0.05 * size
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 10_000)
    assert resident_bytes(small, sample=8) == resident_bytes(small)  # too small to sample: counted whole
