"""Small tensors in batches: which items of a plan form one (one read and one compiled pass for
many; the read and the pass themselves: loading/batch.py).

A checkpoint's tens of thousands of small tensors (norms, biases, routers, a small layer's
scales, a miniature's experts) each cost loading/loop.py's per-tensor sequence (a read, a tap, a
fingerprint, a check) far more than their bytes (docs/benchmarks.md has the figures).
Items served as stored (plain tensors; a packed weight with its scales)
whose stored tensors are small and close together in one file are loaded together instead, whole
or cut to the rank's window, wherever they are in the plan (batches are formed by where the bytes
lie: a plan whose natural order alternates between files costs what one stored file by file
does):

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
from typing import NamedTuple, Protocol

import numpy as np

from ..codecs.base import Cut
from ..model.values import Box, Stored
from .items import Item
from .planner import RankPlan

SMALL_BYTES = 256 << 10  # smaller tensors cost more in per-tensor calls than in bytes
BATCH_BYTES = (
    4 << 20
)  # one read and one pass at most this long (cache-friendly, and bounded memory)
GAP_BYTES = 64 << 10  # bytes of other tensors a batch may read past between two of its own


class Boxes(Protocol):
    """What a batch asks of a storage (storage/base.py): where a window's stored bytes lie
    (``box``), many at once when it keeps them as columns (``spans``); nothing is read here."""

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]: ...

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``box`` of many names at once, as columns, when the storage keeps them; None: ask
        ``box`` (storage/base.py's ``StorageBase``, the default)."""


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


def _readable(lo: int, hi: int, total: int) -> bool:
    """Whether one read of bytes ``[lo, hi)`` holding ``total`` bytes of a batch's own is worth it:
    within ``BATCH_BYTES``, at most twice its own bytes plus ``GAP_BYTES`` of others'."""
    return hi - lo <= BATCH_BYTES and hi - lo <= 2 * total + GAP_BYTES


class Spans(NamedTuple):
    """Where stored tensors' bytes lie, as columns (one row a piece: a cut's stored tensor)."""

    file: np.ndarray
    """Each one's file, as a number (equal numbers: one file)."""
    offset: np.ndarray
    """Its first byte in that file."""
    rows: np.ndarray
    """Rows of the stored bytes' 2-D view the window is a box of."""
    row_bytes: np.ndarray
    box: np.ndarray
    """``[n, 4]``: the window's first and end row, first and end byte column in that view."""


def spans_of(storage: Boxes, names: Sequence[str], views: np.ndarray, boxes: np.ndarray) -> Spans:
    """Each named cut's stored span (``views``: ``[n, 2]`` each cut's view, ``boxes``: ``[n, 4]``
    its box), as ``storage.box`` says: from the storage's columns when it has them (``spans``: a
    native folder's table, whose box is the stored tensor seen in the cut's view), a ``box`` a cut
    otherwise (a rank file, bytes held in memory)."""
    got = storage.spans(names)
    if got is not None:
        file, offset, nbytes = got
        if np.array_equal(views[:, 0] * views[:, 1], nbytes):  # else box raises: let it, below
            return Spans(file, offset, views[:, 0].copy(), views[:, 1].copy(), boxes)
    n = len(names)
    files: dict[object, int] = {}
    file, offset = np.empty(n, np.int64), np.empty(n, np.int64)
    rows: np.ndarray = np.empty(n, np.int64)
    row_bytes: np.ndarray = np.empty(n, np.int64)
    box: np.ndarray = np.empty((n, 4), np.int64)
    for k, (name, v, b) in enumerate(zip(names, views.tolist(), boxes.tolist(), strict=True)):
        s, (r0, r1), (c0, c1) = storage.box(name, (v[0], v[1]), (b[0], b[1]), (b[2], b[3]))
        file[k] = files.setdefault(s.path, len(files))
        offset[k], rows[k], row_bytes[k], box[k] = s.offset, s.rows, s.row_bytes, (r0, r1, c0, c1)
    return Spans(file, offset, rows, row_bytes, box)


class ClassCuts(NamedTuple):
    """What every batched entry of one class shares: its cuts in order (the name column each
    reads: 0 the weight's, 1 the scale's, 2 the second scale's), their views and boxes, where
    each cut's served tensor lies after the entry's arena offset; its first item (whose codec and
    fit stand for the class)."""

    item: Item
    column: tuple[int, ...]
    cuts: tuple[Cut, ...]
    after: tuple[int, ...]


class PlanRuns:
    """A plan in runs, in reading order (as the item-wise rule, tests/unit/loading/batch_runs.py,
    makes them from items, without them): a batch of small entries stored close together in one
    file, whatever their places in the plan (the plan's natural order may alternate between files:
    some writers deal tensors to files in turn), or one entry loaded alone (block by block, or
    decoded). Run ``(i, j, batched)`` is the entries ``order[i:j]``; a batch's pieces (each entry's
    cuts in cut order) are the rows ``[p, q)`` of the piece columns (:meth:`pieces`). Runs go in the
    order of their first entry in the plan; a batch's entries in the order of their stored bytes."""

    def __init__(self, plan: RankPlan, kind: str, storage: Boxes) -> None:
        klass, index = plan.klass, plan.index
        n = len(klass)
        size = plan.class_count
        self.classes: dict[int, ClassCuts] = {}
        """Each batchable class's cuts."""
        _, first = np.unique(klass, return_index=True)
        for t in first.tolist():
            item = plan.item(t)
            if fits_batch(item, kind):
                base, shaped = item.outputs[0].offset, plan.table[int(klass[t])]
                # cut order (planning/items.py): the scale, the second scale, then the weight
                column = (1,) * (shaped.scale is not None) + (2,) * (shaped.scale2 is not None)
                self.classes[int(klass[t])] = ClassCuts(
                    item,
                    (*column, 0),
                    tuple(item.cuts),
                    tuple(item.output(c.name).offset - base for c in item.cuts),
                )
        count: np.ndarray = np.zeros(size, np.int64)
        views: np.ndarray = np.zeros((size, 3, 2), np.int64)
        boxes: np.ndarray = np.zeros((size, 3, 4), np.int64)
        after: np.ndarray = np.zeros((size, 3), np.int64)
        col: np.ndarray = np.zeros((size, 3), np.int64)
        for c, cc in self.classes.items():
            count[c] = len(cc.cuts)
            for j, cut in enumerate(cc.cuts):
                views[c, j], boxes[c, j] = cut.view, (*cut.rows, *cut.cols)
                after[c, j], col[c, j] = cc.after[j], cc.column[j]
        # the piece columns in plan order first (each entry's pieces from its first piece)
        per = count[klass]
        first_piece = np.cumsum(per) - per
        rep: np.ndarray = np.repeat(np.arange(n), per)
        j = np.arange(len(rep)) - np.repeat(first_piece, per)
        k = klass[rep]
        rows = plan.all_entries
        cols: tuple[Sequence[str | None], ...] = (rows.names, rows.scales, rows.scales2)
        # each name column's pieces picked in one C-level pass, put in piece order by numpy
        picked: np.ndarray = np.empty(len(rep), object)
        column, entry = col[k, j], index[rep]
        for c, of in enumerate(cols):
            at = np.flatnonzero(column == c)
            if len(at):
                picked[at] = list(map(of.__getitem__, entry[at].tolist()))
        shared: list[Box | None] = [None] * (3 * size)  # class c's cut i: 3 c + i
        for c, cc in self.classes.items():
            shared[3 * c : 3 * c + len(cc.cuts)] = [cut.box for cut in cc.cuts]
        names: list[str] = picked.tolist()
        spans = spans_of(storage, names, views[k, j], boxes[k, j])
        nbytes = spans.rows * spans.row_bytes
        # an entry batches when each of its pieces' stored tensors is small (it is read whole), in
        # one file, and one read of their span is worth it
        small = ((nbytes > 0) & (nbytes <= SMALL_BYTES)).astype(np.int64)
        has = per > 0
        starts = first_piece[has]
        ok: np.ndarray = np.zeros(n, bool)
        lo: np.ndarray = np.zeros(n, np.int64)
        hi: np.ndarray = np.zeros(n, np.int64)
        total: np.ndarray = np.zeros(n, np.int64)
        file: np.ndarray = np.full(n, -1, np.int64)
        if len(rep):
            lo[has] = np.minimum.reduceat(spans.offset, starts)
            hi[has] = np.maximum.reduceat(spans.offset + nbytes, starts)
            total[has] = np.add.reduceat(nbytes, starts)
            ok[has] = (np.add.reduceat(small, starts) == per[has]) & (
                np.minimum.reduceat(spans.file, starts) == np.maximum.reduceat(spans.file, starts)
            )
            file[has] = spans.file[starts]
        ok &= (hi - lo <= BATCH_BYTES) & (hi - lo <= 2 * total + GAP_BYTES)  # _readable, columns
        self.order, ends, batched = _adjacent(ok, file, lo, hi, total)
        """Each place in reading order's entry (its index in the plan)."""
        bounds = [0, *ends]
        self.runs: list[tuple[int, int, bool]] = list(
            zip(bounds[:-1], bounds[1:], batched, strict=True)
        )
        """Each run: its first and end place in :attr:`order`, and whether it is a batch."""
        self.klass = klass[self.order]
        """Each place's class."""
        self.count = per[self.order]
        """Each place's pieces (an entry that cannot batch has none)."""
        self.first = np.cumsum(self.count) - self.count
        """Each place's first piece."""
        if not np.array_equal(self.order, np.arange(n)):  # the piece columns in reading order
            perm = np.repeat(first_piece[self.order] - self.first, self.count) + np.arange(len(rep))
            names = list(map(names.__getitem__, perm.tolist()))
            rep, j, k = rep[perm], j[perm], k[perm]
            spans = Spans(*(c[perm] for c in spans))
        self.names = names
        """Each piece's stored tensor (its cut's and its served tensor's name)."""
        # (map over list.__getitem__, whose overloads mypy cannot pick: an int each, a class's box)
        self.cut_boxes: list[Box] = list(map(shared.__getitem__, (3 * k + j).tolist()))  # type: ignore[arg-type]
        """Each piece's cut's box (one tuple a class's cut, shared)."""
        self.out = plan.offsets[rep] + after[k, j]
        """Each piece's served tensor's arena offset."""
        self.spans = spans
        """Each piece's stored span (:func:`spans_of`)."""

    def pieces(self, i: int, j: int) -> tuple[int, int]:
        """The piece rows of batched places ``[i, j)``."""
        return int(self.first[i]), int(self.first[j - 1] + self.count[j - 1])

    def __iter__(self) -> Iterator[tuple[int, int, bool]]:
        return iter(self.runs)


def _adjacent(
    ok: np.ndarray, file: np.ndarray, lo: np.ndarray, hi: np.ndarray, total: np.ndarray
) -> tuple[np.ndarray, list[int], list[bool]]:
    """The item-wise rule's grouping over each entry's columns (whether it can batch, its pieces'
    file, the span of their stored bytes and their sum): the entries that can batch taken file by
    file in the order of their first byte, each batch as many of them in a row as one read holds;
    every other entry a run of its own. (The places of the entries in reading order, each run's
    end place, whether it is a batch.)"""
    n = len(ok)
    can = np.flatnonzero(ok)
    can = can[np.lexsort((can, lo[can], file[can]))]  # by file, then first byte (then plan place)
    f, a, b, t = file[can].tolist(), lo[can].tolist(), hi[can].tolist(), total[can].tolist()
    cuts: list[int] = []  # each batch's end in ``can``
    i, m = 0, len(can)
    while i < m:
        j, fi, b0, t0 = i + 1, f[i], b[i], t[i]
        a0 = a[i]  # the batch's first byte: entries come in the order of theirs
        # this loop runs once an entry (46,000 of them for DeepSeek-V3): _readable, inlined
        while j < m and f[j] == fi:
            b2, t2 = (b0 if b0 > b[j] else b[j]), t0 + t[j]
            if b2 - a0 > BATCH_BYTES or b2 - a0 > 2 * t2 + GAP_BYTES:
                break
            b0, t0, j = b2, t2, j + 1
        cuts.append(j)
        i = j
    alone = np.flatnonzero(~ok)
    # every run: its entries, and its first entry in the plan (the runs' order)
    run_of: np.ndarray = np.empty(n, np.int64)
    sizes = np.diff(np.asarray([0, *cuts], np.int64))
    run_of[: len(can)] = np.repeat(np.arange(len(cuts)), sizes)
    run_of[len(can) :] = len(cuts) + np.arange(len(alone))
    member = np.concatenate((can, alone))
    lead = np.concatenate(
        (np.minimum.reduceat(can, np.cumsum(sizes) - sizes) if len(can) else can, alone)
    )
    place = np.lexsort((np.arange(n), lead[run_of]))  # runs by lead, each run's entries kept
    order = member[place]
    runs = run_of[place]
    ends = (np.flatnonzero(np.diff(runs)) + 1).tolist() + ([n] if n else [])
    batched = [bool(r < len(cuts)) for r in runs[[e - 1 for e in ends]].tolist()] if n else []
    return order, ends, batched
