"""A batch of small tensors loaded at once: one read of the span of the file that holds them, one
compiled pass that copies each window into its slot and fingerprints it, and the windows the value
checks and the hasher read from the same bytes (which items form a batch: planning/batches.py)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from ..kernels.fingerprint import nonfinite_lanes, word_widths
from ..kernels.lazy import kernels
from ..model.values import Box, Stored, Triple
from ..planning.batches import PlanRuns
from ..sources.base import ReadSource

_NO_BYTES: np.ndarray = np.empty(0, np.uint8)  # no destination: the kernel fingerprints only
NO_LANES: np.ndarray = np.empty((0, 3), np.int64)  # no NaN or inf looked for
NO_FLAGS: np.ndarray = np.empty(0, np.int64)


class Batch:
    """One batch's bytes read, its windows copied and fingerprinted: each piece's triple (the
    pieces ``[p, q)`` of ``runs``: the batch's entries' cuts in order), and each stored tensor's
    bytes for the hasher, as columns."""

    def __init__(
        self, source: ReadSource, runs: PlanRuns, p: int, q: int, label: str, buffer: np.ndarray
    ) -> None:
        s = runs.spans
        self.source = source
        self.names = runs.names[p:q]
        """Each piece's stored tensor."""
        offsets = s.offset[p:q]
        self.rows, self.stride, self.box = s.rows[p:q], s.row_bytes[p:q], s.box[p:q]
        nbytes = self.rows * self.stride
        self.path = source.stored(self.names[0]).path  # a batch is in one file
        self.start = int(offsets.min())
        self.at: np.ndarray = offsets - self.start
        span = int((self.at + nbytes).max())
        self.data = buffer[:span]
        self.data_label = label
        box = self.box
        windows = int(((box[:, 1] - box[:, 0]) * (box[:, 3] - box[:, 2])).sum())
        source.read_run(
            Stored(label, self.path, self.start, 1, span, None),
            self.data.reshape(1, span),
            window_bytes=windows,
        )
        self.fingerprints: np.ndarray = np.zeros((q - p, 3), dtype=np.int64)
        self.nonfinite: np.ndarray = NO_FLAGS
        """Nonzero for each piece holding a NaN or inf, where :meth:`copy` looked."""

    def __len__(self) -> int:
        return len(self.names)

    def stored(self, ks: Sequence[int]) -> list[Stored]:
        """Pieces ``ks``' stored bytes, as the source's ``box`` gives them (seen in their views):
        made from the batch's columns when the source says what each must hash to at once (its
        spans are the stored tensors' own: one file, the batch's), asked one by one otherwise."""
        names = [self.names[k] for k in ks]
        sha = self.source.promised(names)
        rows, stride = self.rows[ks].tolist(), self.stride[ks].tolist()
        if sha is None:
            return [
                self.source.stored(n).seen_as((r, w))
                for n, r, w in zip(names, rows, stride, strict=True)
            ]
        at = (self.at[ks] + self.start).tolist()
        path = self.path
        return [
            Stored(n, path, o, r, w, h)
            for n, o, r, w, h in zip(names, at, rows, stride, sha, strict=True)
        ]

    def own(self, ks: Sequence[int] | np.ndarray) -> tuple[np.ndarray, ...]:
        """Piece ``ks[i]``'s own window: where its first byte is, its rows, stride and width."""
        k = np.asarray(ks, dtype=np.int64)
        box, stride = self.box[k], self.stride[k]
        return (
            self.at[k] + box[:, 0] * stride + box[:, 2],
            box[:, 1] - box[:, 0],
            stride,
            box[:, 3] - box[:, 2],
        )

    def windows(self, ks: Sequence[int], boxes: Sequence[Box]) -> tuple[np.ndarray, ...]:
        """Box ``boxes[i]`` of stored tensor ``ks[i]``: where its first byte is, its rows, stride
        and width."""
        return self.box_windows(np.asarray(ks, dtype=np.int64), box_columns(boxes))

    def box_windows(self, k: np.ndarray, box: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`windows` of boxes as columns (``box[i]``: rows ``r0, r1``, columns ``c0, c1``)."""
        stride = self.stride[k]
        return (
            self.at[k] + box[:, 0] * stride + box[:, 2],
            box[:, 1] - box[:, 0],
            stride,
            box[:, 3] - box[:, 2],
        )

    def copy(
        self,
        dst: np.ndarray,
        dst_offsets: np.ndarray,
        ks: np.ndarray | None = None,
        dtypes: Sequence[str] | None = None,
    ) -> None:
        """Each window (of pieces ``ks``; default: all) into ``dst`` at its offset (an empty
        ``dst``: fingerprints only), fingerprinted; with ``dtypes`` (every piece's stored dtype),
        each floating window is looked at for NaN and inf in the same pass (:attr:`nonfinite`)."""
        whole = ks is None
        k = np.arange(len(self.names)) if ks is None else ks
        src, rows, stride, width = self.own(k)
        fps = self.fingerprints if whole else np.zeros((len(k), 3), dtype=np.int64)
        words = word_widths(width)
        lanes, flags = NO_LANES, NO_FLAGS
        if dtypes is not None:
            lanes = np.array(
                [
                    nonfinite_lanes(dtypes[i], w)
                    for i, w in zip(k.tolist(), words.tolist(), strict=True)
                ],
                dtype=np.int64,
            ).reshape(-1, 3)
            flags = np.zeros(len(k), np.int64)
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
            words,
            dst,
            dst_offsets,
            fps,
            lanes,
            flags,
        )
        if not whole:
            self.fingerprints[k] = fps
        if dtypes is not None:
            if not self.nonfinite.size:
                self.nonfinite = np.zeros(len(self.names), np.int64)
            self.nonfinite[k] = flags

    def fingerprints_of(self, boxes: Sequence[tuple[int, Box]]) -> list[Triple]:
        """The fingerprint of each ``(k, box)``: a window of stored tensor ``k`` (a node peer's, of
        a tensor this rank hashes), from this batch's bytes, in one pass."""
        if not boxes:
            return []
        fps = self.fingerprint_windows([k for k, _ in boxes], [box for _, box in boxes])
        return list(map(tuple, fps.tolist()))

    def fingerprint_windows(self, ks: Sequence[int], boxes: Sequence[Box]) -> np.ndarray:
        """:meth:`fingerprints_of` as columns: box ``boxes[i]`` of stored tensor ``ks[i]``, each
        fingerprint a row of the ``[n, 3]`` result."""
        return self.fingerprint_boxes(np.asarray(ks, dtype=np.int64), box_columns(boxes))

    def fingerprint_boxes(self, k: np.ndarray, box: np.ndarray) -> np.ndarray:
        """:meth:`fingerprint_windows` of boxes as columns (:meth:`box_windows`)."""
        src, rows, stride, width = self.box_windows(k, box)
        n = len(k)
        fps: np.ndarray = np.zeros((n, 3), dtype=np.int64)
        kernels.gather_windows(
            self.data,
            src,
            rows,
            stride,
            width,
            word_widths(width),
            _NO_BYTES,
            np.zeros(n, np.int64),
            fps,
            NO_LANES,
            NO_FLAGS,
        )
        return fps

    def view(self, k: int) -> np.ndarray:
        """Piece ``k``'s window, 2-D (rows of its cut's view), for the value checks."""
        r0, r1, c0, c1 = self.box[k].tolist()
        return self.raw(k).reshape(int(self.rows[k]), int(self.stride[k]))[r0:r1, c0:c1]

    def raw(self, k: int) -> np.ndarray:
        """Stored tensor ``k``'s bytes, whole and flat (what the hasher hashes)."""
        a = int(self.at[k])
        return self.data[a : a + int(self.rows[k] * self.stride[k])]

    def raws(self, ks: Sequence[int]) -> list[np.ndarray]:
        """:meth:`raw` of each of ``ks``, sliced from columns (one Python slice a tensor)."""
        k = np.asarray(ks, dtype=np.int64)
        at = self.at[k]
        data = self.data
        return [
            data[a:e]
            for a, e in zip(at.tolist(), (at + self.rows[k] * self.stride[k]).tolist(), strict=True)
        ]


def box_columns(boxes: Sequence[Box]) -> np.ndarray:
    """Boxes ``((r0, r1), (c0, c1))`` as the rows ``r0, r1, c0, c1`` of an ``[n, 4]`` column (one
    C-level pass over their numbers)."""
    flat = chain.from_iterable(chain.from_iterable(boxes))
    columns: np.ndarray = np.fromiter(flat, np.int64, 4 * len(boxes)).reshape(len(boxes), 4)
    return columns


class BatchWindows:
    """Windows ``ks`` of a batch, as :class:`~tpload.codecs.Windows` for a codec's :meth:`clean`."""

    def __init__(self, batch: Batch, ks: Sequence[int]) -> None:
        self.batch = batch
        self.src, self.rows, self.stride, self.width = batch.own(ks)

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
        out: np.ndarray = np.empty(int(sizes.sum()), dtype=np.uint8)
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
            NO_LANES,
            NO_FLAGS,
        )
        return out
