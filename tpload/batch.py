"""Small whole tensors in batches: one read and one compiled pass for many.

A checkpoint's tens of thousands of small tensors (norms, biases, routers, a small layer's
scales) each cost loop.py's per-tensor sequence (a read, a tap, a fingerprint, a check) far
more than their bytes: about 0.3 ms a tensor, DeepSeek-V3's 92,000 tensors half a minute a
rank. Consecutive small items served whole as stored (plain tensors; a packed weight with its scales),
close together in one file, are loaded together instead:

* one ``pread`` of the span of the file that holds them (gaps between them bounded);
* one kernel copies each into its slot and takes its fingerprint: the same triple the
  per-tensor path takes, so digests and stored predictions are unchanged;
* each one this rank hashes is hashed from the same bytes, on the spot, and a packed weight's
  value checks (its scales first) read them there too;
* on a device the batch's slots are one arena range, built on the host as an image: one
  upload, whose device fingerprint must equal the image's (as a single window's must).

A tensor a node peer reads only part of, and that this rank hashes, takes the per-tensor path
(its peer's window needs its own fingerprint).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from . import kernels
from .plan import Item
from .storage import Storage, Stored
from .verification.fingerprint import word_widths
from .verification.hashing import Hasher

SMALL_BYTES = 64 << 10  # smaller tensors cost more in per-tensor calls than in bytes
BATCH_BYTES = 4 << 20  # one read and one pass at most this long (cache-friendly, and bounded memory)
GAP_BYTES = 64 << 10  # bytes of other tensors a batch may read past between two of its own


def _whole_small(item: Item, kind: str) -> bool:
    """Served as stored, every cut whole and small (a plain tensor, or a packed weight with its
    scales): what a batch can take."""
    if not item.codec.copies(item.fit, kind) or len(item.outputs) != len(item.cuts):
        return False
    for c in item.cuts:
        if not (c.group == 1 and 0 < c.nbytes <= SMALL_BYTES and c.rows == (0, c.view[0])
                and c.cols == (0, c.view[1]) and item.output(c.name).nbytes == c.nbytes):
            return False
    return True


def runs(items: Sequence[Item], kind: str, storage: Storage, hasher: Hasher, *,
         classes: Sequence[object] | None = None) -> Iterator[tuple[int, int, list[list[Stored]]]]:
    """The plan in runs ``[i, j)``: a batch of small whole items (with each one's stored tensors, in
    cut order) when ``j - i > 1``, one item otherwise. A batch stays in one file, within
    ``BATCH_BYTES``, and reads at most its own bytes twice over plus ``GAP_BYTES`` of others'.
    ``classes``: one token per item, equal for items cut alike (the plan's shared shapes), so
    whether a class can batch is worked out once, not per tensor."""
    small: dict[int, bool] = {}

    def batchable(k: int) -> list[Stored] | None:
        item = items[k]
        if classes is None:
            whole = _whole_small(item, kind)
        else:
            token = id(classes[k])
            whole = small.get(token)
            if whole is None:
                whole = small[token] = _whole_small(item, kind)
        return _stored_whole(item, storage, hasher) if whole else None

    i, n = 0, len(items)
    nxt = batchable(0) if n else None
    while i < n:
        j, batch = i + 1, [nxt] if nxt is not None else []
        nxt = batchable(j) if j < n else None
        if batch:
            first = batch[0]
            path = first[0].path
            lo = min(s.offset for s in first)
            hi = max(s.offset + s.nbytes for s in first)
            total = sum(s.nbytes for s in first)
            while nxt is not None:
                lo2, hi2, total2 = lo, hi, total
                for s in nxt:
                    if s.path is not path and s.path != path:  # one Path object per shard, mostly
                        break
                    lo2, hi2, total2 = min(lo2, s.offset), max(hi2, s.offset + s.nbytes), total2 + s.nbytes
                else:
                    if hi2 - lo2 <= BATCH_BYTES and hi2 - lo2 <= 2 * total2 + GAP_BYTES:
                        batch.append(nxt)
                        lo, hi, total, j = lo2, hi2, total2, j + 1
                        nxt = batchable(j) if j < n else None
                        continue
                break
        yield i, j, batch
        i = j


def _stored_whole(item: Item, storage: Storage, hasher: Hasher) -> list[Stored] | None:
    """A small whole item's stored tensors, if each is exactly its cut and may be hashed whole."""
    stored = []
    for c in item.cuts:
        s = storage.stored(c.name)
        if s.rows * s.row_bytes != c.nbytes or not hasher.whole_only(s):
            return None
        stored.append(s)
    return stored


class Batch:
    """One batch's bytes read, copied and fingerprinted: each stored tensor's triple (``pieces``: the
    batch's items' cuts in order), and its bytes for the hasher when this rank hashes it."""

    def __init__(self, storage: Storage, items: Sequence[Item], stored: list[list[Stored]],
                 buffer: np.ndarray) -> None:
        self.items = items
        self.stored = [s for per_item in stored for s in per_item]
        self.path = self.stored[0].path
        n = len(self.stored)
        offsets = np.fromiter((s.offset for s in self.stored), np.int64, n)
        self.row_bytes = np.fromiter((s.row_bytes for s in self.stored), np.int64, n)
        self.nbytes = np.fromiter((s.rows for s in self.stored), np.int64, n) * self.row_bytes
        self.start = int(offsets.min())
        self.src = offsets - self.start
        span = int((self.src + self.nbytes).max())
        self.data = buffer[:span]
        self.data_label = label = f"{items[0].name} .. {items[-1].name} ({len(items)} tensors)"
        storage.read(Stored(label, self.path, self.start, 1, span, None), 0, 1, self.data.reshape(1, span))
        self.fingerprints = np.zeros((n, 3), dtype=np.int64)

    def copy(self, dst: np.ndarray, dst_offsets: np.ndarray) -> None:
        """Each stored tensor into ``dst`` at its offset (an empty ``dst``: fingerprints only), fingerprinted."""
        # the kernel does not check bounds: every source range lies in the span read, and every
        # destination in dst (the plan's slots: _whole_small holds each slot to its tensor's size)
        if dst.size and int((dst_offsets + self.nbytes).max()) > dst.size:
            raise RuntimeError("a batch's slots run past its destination (a planner bug)")
        kernels.gather_fingerprints(self.data, self.src, self.nbytes, self.row_bytes, word_widths(self.row_bytes),
                                    dst, dst_offsets, self.fingerprints)

    def view(self, k: int, shape: tuple[int, int]) -> np.ndarray:
        """Stored tensor ``k``'s bytes as ``shape`` (its cut's 2-D view), for the value checks."""
        return self.raw(k).reshape(shape)

    def raw(self, k: int) -> np.ndarray:
        """Stored tensor ``k``'s bytes, flat (what the hasher hashes)."""
        s = self.stored[k]
        a = s.offset - self.start
        return self.data[a:a + s.rows * s.row_bytes]
