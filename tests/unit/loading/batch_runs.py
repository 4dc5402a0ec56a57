"""The batching rule item by item, as it was first written: the reference the copy loop's column
form (planning/batches.py's ``PlanRuns``) is held equal to (test_batch.py,
tests/unit/distributed/test_replica_split.py, tests/workers/batched.py). No load runs it, so it
lives with the tests that compare against it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tpload.model.values import Stored
from tpload.planning import batches
from tpload.planning.batches import Boxes, _readable, fits_batch
from tpload.planning.items import Item

Piece = tuple[Stored, tuple[int, int], tuple[int, int]]
"""A cut's stored tensor (seen in the cut's view) and the window's rows and byte columns in it."""


def runs(
    items: Sequence[Item], kind: str, storage: Boxes, *, classes: Sequence[object] | None = None
) -> Iterator[tuple[int, int, list[list[Piece]]]]:
    """The rule item by item (the copy loop runs it over columns: :class:`PlanRuns`, which the
    tests hold to this). The plan in runs ``[i, j)``: a batch of small items (with each one's
    pieces, in cut order; a small item alone is a batch of one), or one item read block by block
    (no pieces). A batch
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


def _pieces(item: Item, storage: Boxes) -> list[Piece] | None:
    """A small item's pieces, if each cut's stored tensor is small (it is read whole)."""
    pieces = []
    for c in item.cuts:
        stored, rows, cols = storage.box(c.name, c.view, c.rows, c.cols)
        # the module's value read at call time (a test sets it to 0), as fits_batch reads it
        if not 0 < stored.rows * stored.row_bytes <= batches.SMALL_BYTES:
            return None
        pieces.append((stored, rows, cols))
    return pieces
