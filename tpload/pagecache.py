"""The page cache a load leaves behind: measure it, and drop it shard by shard.

On unified-memory machines (GB200, GH200, GB10) the page cache and the GPU
share one pool, so the checkpoint's pages that linger after their bytes were
copied to the device take memory from the KV cache. With eviction on, a rank
that is done with a shard (its last window copied, its own hash jobs on it
finished) closes its map of the file and advises the kernel to drop the
file's pages (``posix_fadvise(DONTNEED)``). The kernel skips pages that are
still mapped, which is why the map goes first; pages another rank still maps
stay until that rank is done too.

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

import numpy as np

from .checkpoint import Checkpoint
from .plan import Item

log = logging.getLogger("tpload")
_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


SAMPLE_RUN_PAGES = 64  # a sampled residency asks about runs of this many pages (256 KiB)


def resident_bytes(path: Path, *, sample: int = 1) -> int:
    """Bytes of ``path`` now in the page cache (whole pages, capped at the file size).

    ``sample`` > 1 asks about one run of :data:`SAMPLE_RUN_PAGES` pages in every
    ``sample`` runs and scales up: an estimate at ``1/sample`` of the cost (the
    kernel looks each page up: ~0.1 s a GB). Files too small to sample are counted whole.
    """
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc, page = _libc(), mmap.PAGESIZE
    pages = -(-size // page)
    run = SAMPLE_RUN_PAGES if sample > 1 and pages >= 4 * sample * SAMPLE_RUN_PAGES else pages
    stride = run * sample if run < pages else pages
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap for mincore failed: {path}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            asked = 0
            for first in range(0, pages, stride):
                n = min(run, pages - first)
                if libc.mincore(addr + first * page, min(n * page, size - first * page), ctypes.byref(vec, asked)) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore failed: {path}")
                asked += n
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    hits = int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8)[:asked] & 1))
    return min(size, hits * page * pages // max(asked, 1))


def checkpoint_resident(paths: Iterable[Path], *, sample: int = 1) -> int:
    """Page-cache bytes of all these files (estimated if ``sample`` > 1); 0 where the platform cannot tell (logged)."""
    try:
        return sum(resident_bytes(p, sample=sample) for p in paths)
    except (OSError, AttributeError) as e:  # no mincore (not Linux) or an odd filesystem
        log.debug("cannot measure page-cache residency: %s", e)
        return 0


def _spans(ranges: Iterable[tuple[int, int]], page: int) -> list[tuple[int, int]]:
    """(offset, length) ranges widened to whole pages and merged (fadvise keeps partial pages)."""
    out: list[list[int]] = []
    for begin, end in sorted((b // page * page, -(-(b + n) // page) * page) for b, n in ranges):
        if out and begin <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([begin, end])
    return [(b, e - b) for b, e in out]


def evict(ckpt: Checkpoint, path: Path, ranges: Iterable[tuple[int, int]] | None = None) -> None:
    """Close this rank's map of ``path``, then advise the kernel to drop its cached pages:
    of the (offset, length) ``ranges`` this rank touched plus the header, or of the whole file.

    Ranges spare the pages of tensors only other ranks read (another ep group's experts),
    which they would otherwise read again from disk.
    """
    if not ckpt.unmap(path):
        log.debug("%s: a view of the map is still alive; its pages stay until it dies", path)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            if ranges is None:
                spans = [(0, 0)]  # length 0: to the end of the file
            else:
                header = 8 + int.from_bytes(os.pread(fd, 8, 0), "little")  # every rank read it
                spans = _spans([(0, header), *ranges], mmap.PAGESIZE)
            for offset, length in spans:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError) as e:  # advice only: a load never fails for it
        log.warning("%s: could not drop its page cache: %s", path, e)


class ShardRelease:
    """Counts what a rank still has to do on each shard; the moment a shard's count
    reaches zero (last window copied, last of its own hashes done) it is released.

    Hashes may finish on worker threads, so the count is guarded by a lock and the
    release may run there.
    """

    def __init__(self, ckpt: Checkpoint, items: Iterable[Item], hashed: Iterable[str],
                 release: Callable[[Path, list[tuple[int, int]]], None] | None = None) -> None:
        self.ckpt = ckpt
        self.release = release or functools.partial(evict, ckpt)
        self._lock = threading.Lock()
        self._pending: dict[Path, int] = {}
        self._touched: dict[Path, list[tuple[int, int]]] = {}
        for item in items:
            for cut in item.cuts:
                self._count(cut.name)
        for name in hashed:
            self._count(name)

    def _count(self, name: str) -> None:
        """One more thing to do on ``name``'s shard; its bytes are among those touched there."""
        info = self.ckpt.info(name)
        self._pending[info.path] = self._pending.get(info.path, 0) + 1
        self._touched.setdefault(info.path, []).append((info.begin, info.nbytes))

    def hash_done(self, name: str) -> None:
        """This rank's sha256 of ``name`` is done (called once per hashed name, from any thread)."""
        self._done(self.ckpt.info(name).path)

    def item_done(self, item: Item) -> None:
        """The windows of ``item`` are on the device: its shards need one thing less."""
        for cut in item.cuts:
            self._done(self.ckpt.info(cut.name).path)

    def _done(self, path: Path) -> None:
        with self._lock:
            self._pending[path] -= 1
            last = self._pending[path] == 0
        if last:
            self.release(path, self._touched[path])
