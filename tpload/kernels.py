"""CPU kernels, compiled with numba: one pass over the bytes where torch ops take several.

On a CUDA device the same work is done by the torch ops in ``verify`` and
``formats``; on the CPU those ops each make their own pass over memory
(a copy, two int64 reductions, a bincount...), and with one core per rank
the passes, not the arithmetic, are what cost. Each kernel here reads its
input once, while it is in the cache, and releases the GIL.

The kernels are compiled when this module is imported (with ``cache=True``
the machine code is kept in ``__pycache__``, so only the first import on a
machine compiles), which keeps compilation out of the timed load.
Every kernel's result is defined by the torch code it replaces, and the
tests check the two agree bit for bit.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_JIT = {"nogil": True, "cache": True, "boundscheck": False}
_WORDS = (nb.int64, nb.int32, nb.int16, nb.uint8)


def _copy_fingerprint_sigs() -> list:
    return [nb.types.UniTuple(nb.int64, 2)(w[::1], nb.int64, nb.int64, nb.int64, nb.int64, w[::1], nb.int64[::1], nb.int64)
            for w in _WORDS]


@nb.njit(_copy_fingerprint_sigs(), **_JIT)
def _copy_fingerprint(src, start, stride, rows, cols, dst, col_sums, first_row):  # pragma: no cover - compiled
    """Copy ``rows`` rows of ``cols`` words (row ``r`` at ``src[start + r*stride:]``) into ``dst``
    (contiguous) and add them to a fingerprint: returns (total, row-weighted) and adds column sums
    into ``col_sums``. int64 arithmetic wraps, exactly like torch's."""
    total = np.int64(0)
    weighted = np.int64(0)
    for r in range(rows):
        base = start + r * stride
        out = r * cols
        s = np.int64(0)
        for j in range(cols):
            v = src[base + j]
            dst[out + j] = v
            s += np.int64(v)
            col_sums[j] += np.int64(v)
        total += s
        weighted += (first_row + r + 1) * s
    return total, weighted


@nb.njit(nb.int64(nb.uint8[::1], nb.uint8, nb.uint8), **_JIT)
def _count_either(x, a, b):  # pragma: no cover - compiled
    n = np.int64(0)
    for v in x:
        n += (v == a) | (v == b)
    return n


@nb.njit(nb.types.UniTuple(nb.int64, 3)(nb.int64[:, ::1], nb.int64[::1]), **_JIT)
def _bf16_fingerprint(words, col_sums):  # pragma: no cover - compiled
    """Fingerprint sums of a bf16 tensor seen as int64 words (4 elements each), and how many of its
    elements are not finite (exponent bits all ones: inf or NaN), in one read."""
    total = np.int64(0)
    weighted = np.int64(0)
    bad = np.int64(0)
    rows, cols = words.shape
    for r in range(rows):
        s = np.int64(0)
        for j in range(cols):
            v = words[r, j]
            s += v
            col_sums[j] += v
            for lane in range(4):
                bad += ((v >> (16 * lane)) & 0x7F80) == 0x7F80
        total += s
        weighted += (r + 1) * s
    return total, weighted, bad


def wrap64(x: int) -> int:
    """A Python int as the int64 it is modulo 2**64 (what torch's wrapping sums give)."""
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


class HostFingerprint:
    """:class:`tpload.verify.FingerprintSum` on the CPU, fused with the copy that makes the window.

    ``copy`` moves a block of window rows from the map into the arena and adds
    the words it moved, in the same pass; :meth:`value` is then exactly
    ``verify.fingerprint`` of the whole destination. A window whose words are
    not aligned in the map cannot use it (:meth:`fits`); the caller falls back
    to torch ops.
    """

    def __init__(self, cols: int) -> None:
        self.width = next(w for w in (8, 4, 2, 1) if cols % w == 0) if cols else 1
        self.dtype = np.dtype({8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}[self.width])
        self.col_sums = np.zeros(cols // self.width, dtype=np.int64)
        self.total = 0
        self.rows = 0

    def fits(self, stored: np.ndarray, col0: int) -> bool:
        """Whether ``stored`` (the 2-D stored bytes) can be read as words from byte column ``col0``."""
        w = self.width
        return (stored.flags.c_contiguous and stored.ctypes.data % w == 0 and col0 % w == 0
                and stored.shape[1] % w == 0)

    def copy(self, stored: np.ndarray, rows: tuple[int, int], col0: int, dst: np.ndarray, first_row: int) -> None:
        """Copy rows ``rows`` of ``stored`` from byte column ``col0`` into ``dst`` (a contiguous
        ``[rows, window bytes]`` uint8 block whose first row is window row ``first_row``)."""
        r0, r1 = rows
        if r1 <= r0 or dst.size == 0:
            return
        w = self.width
        src = stored.reshape(-1).view(self.dtype)
        stride = stored.shape[1] // w
        total, weighted = _copy_fingerprint(src, r0 * stride + col0 // w, stride, r1 - r0, dst.shape[1] // w,
                                            dst.reshape(-1).view(self.dtype), self.col_sums, first_row)
        self.total += int(total)
        self.rows += int(weighted)

    def value(self) -> tuple[int, int, int]:
        cols = int((self.col_sums * np.arange(1, self.col_sums.size + 1, dtype=np.int64)).sum())
        return wrap64(self.total), wrap64(self.rows), wrap64(cols)


def bf16_fingerprint(t: np.ndarray) -> tuple[tuple[int, int, int], int] | None:
    """(fingerprint, count of non-finite elements) of a contiguous 2-D bf16 tensor (as uint16 or
    bytes), or None when its rows are not whole int64 words (the caller uses torch ops)."""
    b = t.reshape(t.shape[0], -1).view(np.uint8)
    if not b.flags.c_contiguous or b.shape[1] % 8 or b.ctypes.data % 8:
        return None
    words = b.view(np.int64)
    col_sums = np.zeros(words.shape[1], dtype=np.int64)
    total, weighted, bad = _bf16_fingerprint(words, col_sums)
    cols = int((col_sums * np.arange(1, col_sums.size + 1, dtype=np.int64)).sum())
    return (wrap64(int(total)), wrap64(int(weighted)), wrap64(cols)), int(bad)


def count_either(x: np.ndarray, a: int, b: int) -> int:
    """How many bytes of ``x`` (any contiguous array, read as bytes) equal ``a`` or ``b``."""
    return int(_count_either(np.ascontiguousarray(x).reshape(-1).view(np.uint8), a, b))
