"""The page cache a load leaves: mincore residency (against util-linux fincore), dropping ranges,
the sampled estimate, and ShardRelease releasing a shard only after its last expected job."""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from tpload.loading.planner import planner_of
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.storage.pagecache import ShardRelease, checkpoint_resident, drop_ranges, resident_bytes
from tpload.storage.sharded import ShardedStorage

from .shards import write_tensors

FINCORE = shutil.which("fincore")
PAGE = mmap.PAGESIZE
needs_fincore = pytest.mark.skipif(FINCORE is None, reason="util-linux fincore not installed")


def fincore(path: Path) -> int:
    out = subprocess.run(
        [FINCORE, "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


def clean_file(path: Path, size: int) -> Path:
    """A file of ``size`` random bytes, written back and dropped from the cache."""
    path.write_bytes(os.urandom(size))
    return written_back(path)


def written_back(path: Path) -> Path:
    """``path`` written back (DONTNEED cannot drop dirty pages) and dropped from the cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past what a test reads
    finally:
        os.close(fd)
    return path


def warm(path: Path, offset: int = 0, length: int | None = None) -> None:
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        f.read(os.path.getsize(path) - offset if length is None else length)


@needs_fincore
def test_resident_bytes_agree_with_fincore(tmp_path: Path) -> None:
    f = clean_file(tmp_path / "f.bin", 4 << 20)
    assert resident_bytes(f) == fincore(f) == 0
    warm(f)
    assert resident_bytes(f) == fincore(f) == 4 << 20


@needs_fincore
def test_resident_bytes_cap_a_partial_last_page_at_the_file_size(tmp_path: Path) -> None:
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * (3 * PAGE + 100))
    warm(f)
    assert (
        fincore(f) == 4 * PAGE and resident_bytes(f) == 3 * PAGE + 100
    )  # fincore counts whole pages


def test_drop_ranges_drops_the_whole_file(tmp_path: Path) -> None:
    f = clean_file(tmp_path / "f.bin", 4 << 20)
    warm(f)
    assert resident_bytes(f) == 4 << 20
    drop_ranges(f)
    assert resident_bytes(f) == 0


@needs_fincore
def test_drop_ranges_drops_the_ranges_and_the_header_only(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    write_tensors(
        path, {"a": np.ones((256, 4096), dtype=np.uint8), "b": np.ones((256, 4096), dtype=np.uint8)}
    )
    written_back(path)
    warm(path)
    size = os.path.getsize(path)
    assert resident_bytes(path) == size
    with open(path, "rb") as f:
        data = 8 + int.from_bytes(f.read(8), "little")  # "a" starts here, "b" 1 MiB later
    drop_ranges(path, [(data + 4096 * 10 + 1, 5000)])  # a range inside "a", not page aligned
    first, last = (data + 4096 * 10 + 1) // PAGE, (data + 4096 * 10 + 5000) // PAGE
    dropped = {
        *range(0, -(-data // PAGE)),
        *range(first, last + 1),
    }  # the header's pages and the range's
    assert resident_bytes(path) == fincore(path) == (-(-size // PAGE) - len(dropped)) * PAGE


def test_drop_ranges_survives_a_header_length_rewritten_to_garbage(tmp_path: Path) -> None:
    f = tmp_path / "m.safetensors"
    f.write_bytes(b"\xff" * 8 + os.urandom(1 << 20))  # a header "length" of 2**64 - 1
    written_back(f)
    warm(f)
    drop_ranges(
        f, [(10 * PAGE, 2 * PAGE)]
    )  # advice only: never raises; the "header" is the whole file
    assert resident_bytes(f) == 0


def test_sampled_residency_estimates_a_half_cached_file(tmp_path: Path) -> None:
    f = clean_file(tmp_path / "big.bin", 64 << 20)
    warm(f, 0, 32 << 20)  # the first half back in the cache
    size = 64 << 20
    exact = resident_bytes(f)
    assert 0.4 * size < exact < 0.7 * size  # half, give or take what the kernel read ahead
    assert abs(resident_bytes(f, sample=8) - exact) < 0.05 * size
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 10_000)
    assert resident_bytes(small, sample=8) == resident_bytes(
        small
    )  # too small to sample: counted whole


def test_residency_of_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert resident_bytes(tmp_path / "empty") == 0
    assert checkpoint_resident([tmp_path / "empty"]) == 0
    assert (
        checkpoint_resident([tmp_path / "empty", tmp_path / "missing"]) is None
    )  # a figure, never a failure


def test_a_shard_is_released_when_its_last_job_is_done() -> None:
    released: list[tuple[Path, list]] = []
    release = ShardRelease(lambda path, ranges: released.append((path, ranges)))
    a, b = Path("a.safetensors"), Path("b.safetensors")
    release.expect(a, 100, 10)
    release.expect(b, 0, 5)
    release.expect(a, 200, 20)
    release.done(a)
    assert released == []  # one job on a still to come
    release.done(b)
    release.done(a)
    assert released == [(b, [(0, 5)]), (a, [(100, 10), (200, 20)])]


def test_jobs_done_on_many_threads_release_each_shard_once() -> None:
    released: list[Path] = []
    release = ShardRelease(lambda path, ranges: released.append(path))
    paths = [Path(f"s{i}") for i in range(4)]
    for p in paths:
        for j in range(500):
            release.expect(p, j, 1)
    threads = [
        threading.Thread(target=lambda: [release.done(p) for p in paths for _ in range(125)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(released) == paths


def test_a_shard_is_released_only_after_its_own_hash_jobs(small_ckpt: Path) -> None:
    storage = ShardedStorage(small_ckpt)
    try:
        plan = planner_of(storage.catalogue, load_config()).plan(Layout(1), "packed", 0)
        shards = storage.paths()
        released: list[Path] = []
        release = ShardRelease(lambda path, ranges: released.append(path))
        hashed = next(n for n in plan.used_tensors if storage.stored(n).path == shards[0])
        for (
            item
        ) in plan.items:  # as a load expects them: every window it copies, then its own hashes
            for cut in item.cuts:
                s = storage.stored(cut.name)
                release.expect(s.path, s.offset, s.nbytes)
        s = storage.stored(hashed)
        release.expect(s.path, s.offset, s.nbytes)
        for item in plan.items:
            for cut in item.cuts:
                release.done(storage.stored(cut.name).path)
        assert (
            released == shards[1:]
        )  # every window copied, but the hash on the first shard is still to come
        release.done(storage.stored(hashed).path)
        assert released == shards[1:] + shards[:1]  # each shard released exactly once
    finally:
        storage.close()
