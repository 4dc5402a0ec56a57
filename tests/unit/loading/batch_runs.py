"""The batching rule item by item: the reference the copy loop's column
form (planning/batches.py's ``PlanRuns``) is held equal to (test_batch.py,
tests/unit/distributed/test_replica_split.py, tests/workers/batched.py). No load runs it, so it
lives with the tests that compare against it."""

from __future__ import annotations

from collections.abc import Sequence

from tpload.model.values import Stored
from tpload.planning import batches
from tpload.planning.batches import Boxes, _readable, fits_batch
from tpload.planning.items import Item

Piece = tuple[Stored, tuple[int, int], tuple[int, int]]
"""A cut's stored tensor (seen in the cut's view) and the window's rows and byte columns in it."""


def runs(
    items: Sequence[Item], kind: str, storage: Boxes, *, classes: Sequence[object] | None = None
) -> list[tuple[list[int], list[list[Piece]]]]:
    """The rule item by item (the copy loop runs it over columns: :class:`PlanRuns`, which the
    tests hold to this). The plan in runs, each its items (their places in ``items``) and, for a
    batch of small items (a small item alone is a batch of one), each one's pieces, in cut order;
    no pieces: one item read block by block. The small items are taken file by file in the order
    of their first stored byte (whatever their places in the plan), a batch as many of them in a
    row as one read holds: it stays in one file, within ``BATCH_BYTES``, and reads at most its
    stored tensors' bytes twice over plus ``GAP_BYTES`` of others'. Runs go in the order of their
    first item in the plan.
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

    out: list[tuple[list[int], list[list[Piece]]]] = []
    by_file: dict[object, list[tuple[int, int, int, int, list[Piece]]]] = {}
    for k in range(len(items)):
        pieces = batchable(k)
        if pieces is not None:
            path = pieces[0][0].path
            lo = min(s.offset for s, _, _ in pieces)
            hi = max(s.offset + s.nbytes for s, _, _ in pieces)
            total = sum(s.nbytes for s, _, _ in pieces)
            if all(s.path == path for s, _, _ in pieces) and _readable(lo, hi, total):
                by_file.setdefault(path, []).append((lo, k, hi, total, pieces))
                continue
        out.append(([k], []))  # large, or its own pieces too far apart for one read
    for small_items in by_file.values():
        small_items.sort(key=lambda x: (x[0], x[1]))  # by first byte (then place in the plan)
        batch: list[tuple[int, int, int, int, list[Piece]]] = []
        lo = hi = total = 0
        for entry in small_items:
            if batch:
                hi2, total2 = max(hi, entry[2]), total + entry[3]
                if _readable(lo, hi2, total2):
                    batch.append(entry)
                    hi, total = hi2, total2
                    continue
                out.append(([e[1] for e in batch], [e[4] for e in batch]))
            batch = [entry]
            lo, hi, total = entry[0], entry[2], entry[3]
        if batch:
            out.append(([e[1] for e in batch], [e[4] for e in batch]))
    out.sort(key=lambda run: min(run[0]))
    return out


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
