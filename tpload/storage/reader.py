"""Streaming a window of a stored tensor through private staging buffers.

:meth:`Reader.blocks` reads the stored rows that hold a window with ``pread``,
a staging buffer at a time, and yields each block twice over: whole (to a
``tap``, the verification's sha256 of the whole tensor, when this rank hashes
it) and cut to the window (to the copy, the decode and the value checks).
Everything a rank checks and everything it serves comes from the same private
bytes, which no other process can change after they were read.

Buffers form a small ring: a tap may hash a block on a worker thread while
the next one is read, and a buffer is reused only after its tap is done.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..model.values import Stored
from .base import Storage

CHUNK_BYTES = (
    2 << 20
)  # cache-sized: a block is copied, checked and hashed while it is still in the L2/L3 cache
RING = 4
PAGE = mmap.PAGESIZE


def _aligned(nbytes: int) -> np.ndarray:
    """A page-aligned buffer (an anonymous map) with a page to spare: reads land at the same offset
    within a page as they have in the file: the kernel copies several times faster that way than
    into a buffer a few bytes off the file's page offset."""
    result: np.ndarray = np.frombuffer(mmap.mmap(-1, nbytes + PAGE), dtype=np.uint8)
    return result


@dataclass(frozen=True)
class Block:
    """Stored bytes read into a staging buffer: rows ``rows`` and byte columns ``cols`` of the
    stored tensor's 2-D view (whole rows, or a piece of one row wider than a buffer)."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    data: np.ndarray
    """``[rows, cols]`` uint8, a view of the buffer."""


class Tap(Protocol):
    """Sees every block of a stored tensor, in order (the hashing rank's sha256 and peer
    fingerprints)."""

    def feed(self, block: Block) -> Future[None] | None:
        """Take ``block``; a future if its bytes are still being read on another thread."""

    def close(self) -> None:
        """Every block was fed."""


class Reader:
    """Reads windows of one storage through a ring of private staging buffers."""

    def __init__(self, storage: Storage, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.storage = storage
        self.chunk_bytes = chunk_bytes
        self._ring: list[np.ndarray] = [_aligned(chunk_bytes) for _ in range(RING)]
        self._busy: list[Future[None] | None] = [None] * RING
        self._turn = 0

    def _buffer(self, nbytes: int, offset: int) -> tuple[int, np.ndarray]:
        """The next ring buffer, as ``nbytes`` starting at the file ``offset``'s place within a
        page."""
        i = self._turn = (self._turn + 1) % RING
        busy = self._busy[i]
        if busy is not None:
            busy.result()  # the tap that read this buffer on another thread is done with it
            self._busy[i] = None
        if self._ring[i].size < nbytes + PAGE:
            self._ring[i] = _aligned(nbytes)
        shift = offset % PAGE
        return i, self._ring[i][shift : shift + nbytes]

    def blocks(
        self,
        stored: Stored,
        rows: tuple[int, int],
        cols: tuple[int, int],
        *,
        tap: Tap | None = None,
        row_multiple: int = 1,
        split_rows: bool = True,
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """The window ``rows`` x ``cols`` (byte columns) of ``stored``, as ``(first window row,
        first window byte column, view)`` pieces in order; with a ``tap``, every stored row is read
        and fed to it whole, in order. Blocks start on multiples of ``row_multiple`` rows (a scale
        block); ``split_rows``: a row wider than a buffer may be read in pieces (not for
        decodes)."""
        r0, r1 = (0, stored.rows) if tap is not None else rows
        width = stored.row_bytes
        if width == 0 or r1 <= r0:
            if tap is not None:
                tap.close()
            return
        if width > self.chunk_bytes and split_rows:
            yield from self._wide(stored, (r0, r1), rows, cols, tap)
        else:
            step = max(1, self.chunk_bytes // width)
            step = max(row_multiple, step // row_multiple * row_multiple)
            for a in range(r0, r1, step):
                b = min(r1, a + step)
                i, buf = self._buffer((b - a) * width, stored.offset + a * width)
                data = buf.reshape(b - a, width)
                self.storage.read(stored, a, b, data)
                if tap is not None:
                    self._busy[i] = tap.feed(Block((a, b), (0, width), data))
                lo, hi = max(a, rows[0]), min(b, rows[1])
                if lo < hi:
                    yield lo - rows[0], 0, data[lo - a : hi - a, cols[0] : cols[1]]
        if tap is not None:
            tap.close()

    def _wide(
        self,
        stored: Stored,
        span: tuple[int, int],
        rows: tuple[int, int],
        cols: tuple[int, int],
        tap: Tap | None,
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """Rows wider than a buffer: each row in pieces of whole 4 KiB (so pieces keep every word
        and scale group whole)."""
        width, piece = stored.row_bytes, max(4096, self.chunk_bytes // 4096 * 4096)
        for r in range(*span):
            inside = rows[0] <= r < rows[1]
            lo_col, hi_col = (0, width) if tap is not None else cols
            for c in range(lo_col, hi_col, piece):
                d = min(hi_col, c + piece)
                i, buf = self._buffer(d - c, stored.offset + r * width + c)
                data = buf.reshape(1, d - c)
                _read_piece(self.storage, stored, r, c, data)
                if tap is not None:
                    self._busy[i] = tap.feed(Block((r, r + 1), (c, d), data))
                a, b = max(c, cols[0]), min(d, cols[1])
                if inside and a < b:
                    yield r - rows[0], a - cols[0], data[:, a - c : b - c]

    def drain(self) -> None:
        """Wait for every tap still reading a buffer."""
        for i, busy in enumerate(self._busy):
            if busy is not None:
                busy.result()
                self._busy[i] = None


def _read_piece(storage: Storage, stored: Stored, row: int, col: int, out: np.ndarray) -> None:
    """Bytes ``[col, col + len)`` of one stored row (a row too wide for one buffer)."""
    piece = Stored(
        stored.name,
        stored.path,
        stored.offset + row * stored.row_bytes + col,
        1,
        out.shape[1],
        stored.sha256,
    )
    storage.read(piece, 0, 1, out)
