"""Small whole tensors in batches: one read and one compiled pass for many.

A checkpoint's tens of thousands of small tensors (norms, biases, routers, a small layer's
scales) each cost loop.py's per-tensor sequence (a read, a tap, a fingerprint, a check) far
more than their bytes: about 0.3 ms a tensor, DeepSeek-V3's 92,000 tensors half a minute a
rank. Consecutive small plain tensors, whole on this rank and in order in one file, are loaded
together instead:

* one ``pread`` of the span of the file that holds them (gaps between them bounded);
* one kernel copies each into its slot and takes its fingerprint: the same triple the
  per-tensor path takes, so digests and stored predictions are unchanged;
* each one this rank hashes is hashed from the same bytes, on the spot;
* on a device the batch's slots are one arena range, built on the host as an image: one
  upload, whose device fingerprint must equal the image's (as a single window's must).

A tensor a node peer reads only part of, and that this rank hashes, takes the per-tensor path
(its peer's window needs its own fingerprint).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

from . import kernels
from .plan import Item
from .storage import Storage, Stored
from .verification.fingerprint import word_width
from .verification.hashing import Hasher

SMALL_BYTES = 64 << 10  # smaller tensors cost more in per-tensor calls than in bytes
BATCH_BYTES = 4 << 20  # one read and one pass at most this long (cache-friendly, and bounded memory)
GAP_BYTES = 64 << 10  # bytes of other tensors a batch may read past between two of its own


def _whole_small(item: Item, kind: str) -> bool:
    """Served as stored, whole, plain and small: what a batch can take."""
    w = item.weight
    return (not item.scales and w.group == 1 and 0 < w.nbytes <= SMALL_BYTES and w.rows == (0, w.view[0])
            and w.cols == (0, w.view[1]) and item.codec.copies(item.fit, kind) and len(item.outputs) == 1
            and item.outputs[0].nbytes == w.nbytes)


def runs(items: Sequence[Item], kind: str, storage: Storage,
         hasher: Hasher) -> Iterator[tuple[int, int, list[Stored]]]:
    """The plan in runs ``[i, j)``: a batch of small tensors (with their stored bytes) when ``j - i > 1``,
    one item otherwise."""
    i, n = 0, len(items)
    s = _batchable(items[0], kind, storage, hasher) if n else None
    while i < n:
        j, batch = i + 1, [s] if s is not None else []
        s = _batchable(items[j], kind, storage, hasher) if j < n else None
        if batch:
            path, start, end = batch[0].path, batch[0].offset, batch[0].offset + batch[0].nbytes
            while s is not None and s.path == path and end <= s.offset <= end + GAP_BYTES \
                    and s.offset + s.nbytes - start <= BATCH_BYTES:
                batch.append(s)
                end = s.offset + s.nbytes
                j += 1
                s = _batchable(items[j], kind, storage, hasher) if j < n else None
        yield i, j, batch
        i = j


def _batchable(item: Item, kind: str, storage: Storage, hasher: Hasher) -> Stored | None:
    if not _whole_small(item, kind):
        return None
    stored = storage.stored(item.weight.name)
    return stored if stored.nbytes == item.weight.nbytes and hasher.whole_only(stored) else None


class Batch:
    """One batch's bytes read, copied and fingerprinted: each tensor's triple, and its sha256 when
    this rank hashes it."""

    def __init__(self, storage: Storage, items: Sequence[Item], stored: list[Stored], buffer: np.ndarray) -> None:
        self.items = items
        self.stored = stored
        first, last = self.stored[0], self.stored[-1]
        self.path = first.path
        self.start = first.offset
        span = last.offset + last.nbytes - self.start
        self.data = buffer[:span]
        self.data_label = label = f"{items[0].name} .. {items[-1].name} ({len(items)} tensors)"
        storage.read(Stored(label, self.path, self.start, 1, span, None), 0, 1, self.data.reshape(1, span))
        self.fingerprints = np.zeros((len(items), 3), dtype=np.int64)

    def copy(self, dst: np.ndarray, dst_offsets: np.ndarray) -> None:
        """Each tensor into ``dst`` at its offset (an empty ``dst``: fingerprints only), fingerprinted."""
        src_off = np.fromiter((s.offset - self.start for s in self.stored), np.int64, len(self.stored))
        nbytes = np.fromiter((s.nbytes for s in self.stored), np.int64, len(self.stored))
        row_bytes = np.fromiter((s.row_bytes for s in self.stored), np.int64, len(self.stored))
        widths = np.fromiter((word_width(int(r)) for r in row_bytes), np.int64, len(self.stored))
        # the kernel does not check bounds: every source range lies in the span read, and every
        # destination in dst (the plan's slots: _whole_small holds each slot to its tensor's size)
        if dst.size and int((dst_offsets + nbytes).max()) > dst.size:
            raise RuntimeError("a batch's slots run past its destination (a planner bug)")
        kernels.gather_fingerprints(self.data, src_off, nbytes, row_bytes, widths, dst, dst_offsets,
                                    self.fingerprints)

    def sha256(self, k: int) -> str:
        s = self.stored[k]
        a = s.offset - self.start
        return hashlib.sha256(memoryview(self.data[a:a + s.nbytes])).hexdigest()
