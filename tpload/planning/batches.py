"""Small tensors in batches: which items of a plan form one (one read and one compiled pass for
many; the read and the pass themselves: loading/batch.py).

A checkpoint's tens of thousands of small tensors (norms, biases, routers, a small layer's
scales, a miniature's experts) each cost loading/loop.py's per-tensor sequence (a read, a tap, a
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
from typing import Protocol

from ..model.values import Stored
from .items import Item

SMALL_BYTES = 256 << 10  # smaller tensors cost more in per-tensor calls than in bytes
BATCH_BYTES = (
    4 << 20
)  # one read and one pass at most this long (cache-friendly, and bounded memory)
GAP_BYTES = 64 << 10  # bytes of other tensors a batch may read past between two of its own

Piece = tuple[Stored, tuple[int, int], tuple[int, int]]
"""A cut's stored tensor (seen in the cut's view) and the window's rows and byte columns in it."""


class Boxes(Protocol):
    """Where a window's stored bytes lie: the one thing a batch asks of a storage (its ``box``,
    storage/base.py); nothing is read here."""

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]: ...


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
    items: Sequence[Item], kind: str, storage: Boxes, *, classes: Sequence[object] | None = None
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


def _pieces(item: Item, storage: Boxes) -> list[Piece] | None:
    """A small item's pieces, if each cut's stored tensor is small (it is read whole)."""
    pieces = []
    for c in item.cuts:
        stored, rows, cols = storage.box(c.name, c.view, c.rows, c.cols)
        if not 0 < stored.rows * stored.row_bytes <= SMALL_BYTES:
            return None
        pieces.append((stored, rows, cols))
    return pieces
