"""Small tensors in batches: one read and one compiled pass for many.

A checkpoint's tens of thousands of small tensors (norms, biases, routers, a small layer's
scales, a miniature's experts) each cost loop.py's per-tensor sequence (a read, a tap, a
fingerprint, a check) far more than their bytes (docs/benchmarks.md has the figures).
Consecutive items served as stored (plain tensors; a packed weight with
its scales) whose stored tensors are small and close together in one file are loaded together
instead, whole or cut to the rank's window:

* one ``pread`` of the span of the file that holds their stored tensors, whole (gaps between
  them bounded; a window's rows of a small tensor are not worth a read of their own);
* one kernel copies each window into its slot and takes its fingerprint: the same triple the
  per-tensor path takes, so digests and stored predictions are unchanged;
* each stored tensor this rank hashes is hashed whole from the same bytes, on the spot, and the
  windows its node peers read of it are fingerprinted from them too (the node cross-check); a
  packed weight's value checks (its scales first) read its window there;
* on a device the batch's slots are one arena range, built on the host as an image: one
  upload, whose device fingerprint must equal the image's (as a single window's must).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .codecs._lazy import kernels
from .plan import Item
from .storage import Storage, Stored
from .verification.fingerprint import Triple, word_widths
from .verification.policy import Box

SMALL_BYTES = 256 << 10  # smaller tensors cost more in per-tensor calls than in bytes
BATCH_BYTES = (
    4 << 20
)  # one read and one pass at most this long (cache-friendly, and bounded memory)
GAP_BYTES = 64 << 10  # bytes of other tensors a batch may read past between two of its own

Piece = tuple[Stored, tuple[int, int], tuple[int, int]]
"""A cut's stored tensor (seen in the cut's view) and the window's rows and byte columns in it."""


def fits_batch(item: Item, kind: str) -> bool:
    """Served as stored, every cut small and served as one plain window (a plain tensor, or a packed
    weight with its scales, whole or cut): what a batch can take."""
    if not item.codec.copies(item.fit, kind) or len(item.outputs) != len(item.cuts):
        return False
    for c in item.cuts:
        if not (
            c.group == 1
            and c.nbytes > 0
            and c.view[0] * c.view[1] <= SMALL_BYTES
            and item.output(c.name).nbytes == c.nbytes
        ):
            return False
    return True


def runs(
    items: Sequence[Item], kind: str, storage: Storage, *, classes: Sequence[object] | None = None
) -> Iterator[tuple[int, int, list[list[Piece]]]]:
    """The plan in runs ``[i, j)``: a batch of small items (with each one's pieces, in cut order;
    a small item alone is a batch of one), or one item read block by block (no pieces). A batch
    stays in one file, within ``BATCH_BYTES``, and reads at most its stored tensors' bytes twice
    over plus ``GAP_BYTES`` of others'.
    ``classes``: one token per item, equal for items cut alike (the plan's shared shapes), so
    whether a class can batch is worked out once, not per tensor."""
    small: dict[int, bool] = {}

    def batchable(k: int) -> list[Piece] | None:
        item = items[k]
        if classes is None:
            ok = fits_batch(item, kind)
        else:
            token = id(classes[k])
            ok = small.get(token)
            if ok is None:
                ok = small[token] = fits_batch(item, kind)
        return _pieces(item, storage) if ok else None

    i, n = 0, len(items)
    nxt = batchable(0) if n else None
    while i < n:
        j, batch = i + 1, [nxt] if nxt is not None else []
        nxt = batchable(j) if j < n else None
        if batch:
            first = [s for s, _, _ in batch[0]]
            path = first[0].path
            lo = min(s.offset for s in first)
            hi = max(s.offset + s.nbytes for s in first)
            total = sum(s.nbytes for s in first)
            if any(s.path != path for s in first) or not _readable(lo, hi, total):
                batch = []  # its own pieces are too far apart for one read
        if batch:
            while nxt is not None:
                lo2, hi2, total2 = lo, hi, total
                for s, _, _ in nxt:
                    if s.path is not path and s.path != path:  # one Path object per shard, mostly
                        break
                    lo2, hi2, total2 = (
                        min(lo2, s.offset),
                        max(hi2, s.offset + s.nbytes),
                        total2 + s.nbytes,
                    )
                else:
                    if _readable(lo2, hi2, total2):
                        batch.append(nxt)
                        lo, hi, total, j = lo2, hi2, total2, j + 1
                        nxt = batchable(j) if j < n else None
                        continue
                break
        yield i, j, batch
        i = j


def _readable(lo: int, hi: int, total: int) -> bool:
    """Whether one read of bytes ``[lo, hi)`` holding ``total`` bytes of a batch's own is worth it:
    within ``BATCH_BYTES``, at most twice its own bytes plus ``GAP_BYTES`` of others'."""
    return hi - lo <= BATCH_BYTES and hi - lo <= 2 * total + GAP_BYTES


def _pieces(item: Item, storage: Storage) -> list[Piece] | None:
    """A small item's pieces, if each cut's stored tensor is small (it is read whole)."""
    pieces = []
    for c in item.cuts:
        stored, rows, cols = storage.box(c.name, c.view, c.rows, c.cols)
        if not 0 < stored.rows * stored.row_bytes <= SMALL_BYTES:
            return None
        pieces.append((stored, rows, cols))
    return pieces


class Batch:
    """One batch's bytes read, its windows copied and fingerprinted: each piece's triple
    (``pieces``: the batch's items' cuts in order), and each stored tensor's bytes for the
    hasher."""

    def __init__(
        self, storage: Storage, items: Sequence[Item], pieces: list[list[Piece]], buffer: np.ndarray
    ) -> None:
        flat = [p for per_item in pieces for p in per_item]
        self.stored = [s for s, _, _ in flat]
        self.boxes: list[Box] = [(rows, cols) for _, rows, cols in flat]
        self.path = self.stored[0].path
        n = len(flat)
        offsets = np.fromiter((s.offset for s in self.stored), np.int64, n)
        self.stride = np.fromiter((s.row_bytes for s in self.stored), np.int64, n)
        nbytes = np.fromiter((s.rows for s in self.stored), np.int64, n) * self.stride
        self.start = int(offsets.min())
        self.at = offsets - self.start
        span = int((self.at + nbytes).max())
        self.data = buffer[:span]
        self.data_label = label = f"{items[0].name} .. {items[-1].name} ({len(items)} tensors)"
        storage.read(
            Stored(label, self.path, self.start, 1, span, None), 0, 1, self.data.reshape(1, span)
        )
        self.fingerprints = np.zeros((n, 3), dtype=np.int64)

    def windows(self, ks: Sequence[int], boxes: Sequence[Box]) -> tuple[np.ndarray, ...]:
        """Box ``boxes[i]`` of stored tensor ``ks[i]``: where its first byte is, its rows, stride
        and width."""
        k = np.asarray(ks, dtype=np.int64)
        r0 = np.fromiter((b[0][0] for b in boxes), np.int64, len(boxes))
        rows = np.fromiter((b[0][1] - b[0][0] for b in boxes), np.int64, len(boxes))
        c0 = np.fromiter((b[1][0] for b in boxes), np.int64, len(boxes))
        width = np.fromiter((b[1][1] - b[1][0] for b in boxes), np.int64, len(boxes))
        stride = self.stride[k]
        return self.at[k] + r0 * stride + c0, rows, stride, width

    def copy(self, dst: np.ndarray, dst_offsets: np.ndarray) -> None:
        """Each window into ``dst`` at its offset (an empty ``dst``: fingerprints only),
        fingerprinted."""
        src, rows, stride, width = self.windows(range(len(self.stored)), self.boxes)
        # the kernel does not check bounds: every window lies in the span read (the storage's box is
        # inside its stored tensor), and every destination in dst (fits_batch holds each slot to its
        # window)
        if dst.size and int((dst_offsets + rows * width).max()) > dst.size:
            raise RuntimeError("a batch's slots run past its destination (a planner bug)")
        kernels.gather_windows(
            self.data,
            src,
            rows,
            stride,
            width,
            word_widths(width),
            dst,
            dst_offsets,
            self.fingerprints,
        )

    def fingerprints_of(self, boxes: Sequence[tuple[int, Box]]) -> list[Triple]:
        """The fingerprint of each ``(k, box)``: a window of stored tensor ``k`` (a node peer's, of
        a tensor this rank hashes), from this batch's bytes, in one pass."""
        if not boxes:
            return []
        src, rows, stride, width = self.windows([k for k, _ in boxes], [box for _, box in boxes])
        fps = np.zeros((len(boxes), 3), dtype=np.int64)
        kernels.gather_windows(
            self.data,
            src,
            rows,
            stride,
            width,
            word_widths(width),
            np.empty(0, np.uint8),
            np.zeros(len(boxes), np.int64),
            fps,
        )
        return list(map(tuple, fps.tolist()))

    def view(self, k: int) -> np.ndarray:
        """Piece ``k``'s window, 2-D (rows of its cut's view), for the value checks."""
        (r0, r1), (c0, c1) = self.boxes[k]
        s = self.stored[k]
        return self.raw(k).reshape(s.rows, s.row_bytes)[r0:r1, c0:c1]

    def raw(self, k: int) -> np.ndarray:
        """Stored tensor ``k``'s bytes, whole and flat (what the hasher hashes)."""
        s = self.stored[k]
        a = s.offset - self.start
        return self.data[a : a + s.rows * s.row_bytes]


class BatchWindows:
    """Windows ``ks`` of a batch, as :class:`~tpload.codecs.Windows` for a codec's :meth:`clean`."""

    def __init__(self, batch: Batch, ks: Sequence[int]) -> None:
        self.batch = batch
        self.src, self.rows, self.stride, self.width = batch.windows(
            ks, [batch.boxes[k] for k in ks]
        )

    def count_either(self, a: int, b: int) -> int:
        return int(
            kernels.count_windows(
                self.batch.data, self.src, self.rows, self.stride, self.width, a, b, False
            )
        )

    def count_between(self, lo: int, hi: int) -> int:
        return int(
            kernels.count_windows(
                self.batch.data, self.src, self.rows, self.stride, self.width, lo, hi, True
            )
        )

    def gathered(self) -> np.ndarray:
        sizes = self.rows * self.width
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        at = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        kernels.gather_windows(
            self.batch.data,
            self.src,
            self.rows,
            self.stride,
            self.width,
            word_widths(self.width),
            out,
            at,
            np.zeros((len(sizes), 3), dtype=np.int64),
        )
        return out
