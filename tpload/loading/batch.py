"""A batch of small tensors loaded at once: one read of the span of the file that holds them, one
compiled pass that copies each window into its slot and fingerprints it, and the windows the value
checks and the hasher read from the same bytes (which items form a batch: planning/batches.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..kernels.fingerprint import word_widths
from ..kernels.lazy import kernels
from ..model.values import Box, Stored, Triple
from ..planning.batches import Piece
from ..planning.items import Item
from ..sources.base import ReadSource


class Batch:
    """One batch's bytes read, its windows copied and fingerprinted: each piece's triple
    (``pieces``: the batch's items' cuts in order), and each stored tensor's bytes for the
    hasher."""

    def __init__(
        self,
        source: ReadSource,
        items: Sequence[Item],
        pieces: list[list[Piece]],
        buffer: np.ndarray,
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
        windows = sum((r1 - r0) * (c1 - c0) for (r0, r1), (c0, c1) in self.boxes)
        source.read_run(
            Stored(label, self.path, self.start, 1, span, None),
            self.data.reshape(1, span),
            window_bytes=windows,
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
        fps = self.fingerprint_windows([k for k, _ in boxes], [box for _, box in boxes])
        return list(map(tuple, fps.tolist()))

    def fingerprint_windows(self, ks: Sequence[int], boxes: Sequence[Box]) -> np.ndarray:
        """:meth:`fingerprints_of` as columns: box ``boxes[i]`` of stored tensor ``ks[i]``, each
        fingerprint a row of the ``[n, 3]`` result."""
        src, rows, stride, width = self.windows(ks, boxes)
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
        return fps

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
