"""The page cache a load leaves behind: measure it, and drop it shard by shard.

On unified-memory machines (GB200, GH200, GB10) the page cache and the GPU
share one pool, so the checkpoint's pages that linger after their bytes were
copied to the device take memory from the KV cache. With eviction on, a rank
that is done with a shard (its last window copied, its own hash jobs on it
finished) advises the kernel to drop the byte ranges it touched
(``posix_fadvise(DONTNEED)``); ranges rather than the whole file, so the ranks
of another expert-parallel group do not read their experts from disk again.
tpload reads with ``pread``, never maps, so no map of its own pins the pages.

Residency is measured with ``mincore(2)`` on a fresh read-only map of each
file (through ctypes: Python's mmap has no mincore), which asks the page
cache without touching a page.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from ..model.text import escape_name
from .base import Storage
from .files import open_regular

log = logging.getLogger("tpload")
_MAP_FAILED = ctypes.c_void_p(-1).value
SAMPLE_RUN_PAGES = 64  # a sampled residency asks about runs of this many pages (256 KiB)
MAX_SAMPLED_PAGES = 1 << 16  # per file: the estimate's cost is bounded however big the file


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_bytes(path: Path, *, sample: int = 1) -> int:
    """Bytes of ``path`` now in the page cache (whole pages, capped at the file size).

    ``sample`` > 1 asks about one run of :data:`SAMPLE_RUN_PAGES` pages in every
    ``sample`` runs (and never more than :data:`MAX_SAMPLED_PAGES` pages of one file) and scales up:
    an estimate at a fraction of the cost (the kernel looks each page up, so a 700 GB
    checkpoint walked whole would take over a minute). Files too small to sample are counted whole.
    """
    fd = open_regular(path, "shard")
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        libc, page = _libc(), mmap.PAGESIZE
        pages = -(-size // page)
        run = SAMPLE_RUN_PAGES if sample > 1 and pages >= 4 * sample * SAMPLE_RUN_PAGES else pages
        stride = run * max(sample, -(-pages // MAX_SAMPLED_PAGES)) if run < pages else pages
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap for mincore failed: {path}")
        try:
            vec = (ctypes.c_ubyte * (-(-pages // stride) * run))()
            asked = 0
            for first in range(0, pages, stride):
                n = min(run, pages - first)
                if (
                    libc.mincore(
                        addr + first * page,
                        min(n * page, size - first * page),
                        ctypes.byref(vec, asked),
                    )
                    != 0
                ):
                    raise OSError(ctypes.get_errno(), f"mincore failed: {path}")
                asked += n
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    hits = int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8)[:asked] & 1))
    return min(size, hits * page * pages // max(asked, 1))


REPORT_SAMPLE = 8
"""The report's page-cache figures look at one page run in 8 (an estimate, at 1/8 of the cost)."""


def checkpoint_resident(paths: Iterable[Path], *, sample: int = 1) -> int | None:
    """Page-cache bytes of all these files (estimated if ``sample`` > 1); None where the platform
    cannot tell."""
    try:
        return sum(resident_bytes(p, sample=sample) for p in paths)
    except (
        Exception
    ) as e:  # no mincore (not Linux), an odd filesystem, a file gone: a figure, never a failure
        log.debug("cannot measure page-cache residency: %s", e)
        return None


def _spans(ranges: Iterable[tuple[int, int]], page: int) -> list[tuple[int, int]]:
    """(offset, length) ranges widened to whole pages and merged (fadvise keeps partial pages)."""
    out: list[list[int]] = []
    for begin, end in sorted((b // page * page, -(-(b + n) // page) * page) for b, n in ranges):
        if out and begin <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([begin, end])
    return [(b, e - b) for b, e in out]


def drop_ranges(path: Path, ranges: Iterable[tuple[int, int]] | None = None) -> None:
    """Advise the kernel to drop the cached pages of these (offset, length) ranges of ``path``
    plus its header (every rank read it), or of the whole file when ``ranges`` is None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if ranges is None:
                spans = [(0, 0)]  # length 0: to the end of the file
            else:
                # capped at the file's size: a header length rewritten since it was checked is any
                # 64-bit value
                header = min(8 + int.from_bytes(os.pread(fd, 8, 0), "little"), os.fstat(fd).st_size)
                spans = _spans([(0, header), *ranges], mmap.PAGESIZE)
            for offset, length in spans:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError) as e:  # advice only: a load never fails for it
        log.warning("%s: could not drop its page cache: %s", escape_name(path), e)


class Cuts(Protocol):
    """What a release reads of the plan (planning/planner.py's RankPlan)."""

    def cut_names(self) -> list[str]: ...


class ShardRelease:
    """Counts what a rank still has to do on each shard; the moment a shard's count reaches
    zero (last window copied, last of its own hashes done) its touched ranges are released.

    Hashes may finish on worker threads, so the count is guarded by a lock and the
    release may run there.
    """

    def __init__(self, release: Callable[[Path, list[tuple[int, int]]], None]) -> None:
        self.release = release
        self._lock = threading.Lock()
        self._pending: dict[Path, int] = {}
        self._touched: dict[Path, list[tuple[int, int]]] = {}

    @classmethod
    def expecting(cls, storage: Storage, plan: Cuts, hashed: Iterable[str]) -> ShardRelease:
        """A release that expects every range the plan reads and every tensor this rank hashes."""
        out = cls(storage.evict)
        for name in plan.cut_names() + sorted(hashed):  # the plan's cuts, from its columns
            s = storage.stored(name)
            out.expect(s.path, s.offset, s.nbytes)
        return out

    def expect(self, path: Path, offset: int, nbytes: int) -> None:
        """One more thing to do on ``path``; the range is among those touched there."""
        self._pending[path] = self._pending.get(path, 0) + 1
        self._touched.setdefault(path, []).append((offset, nbytes))

    def done(self, path: Path, things: int = 1) -> None:
        """``things`` on ``path`` are done (from any thread)."""
        with self._lock:
            self._pending[path] -= things
            last = self._pending[path] == 0
        if last:
            self.release(path, self._touched[path])
