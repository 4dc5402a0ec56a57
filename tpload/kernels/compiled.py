"""CPU kernels, compiled with numba: one pass over the bytes where torch ops take several.

On a CUDA device the same work is done by torch ops (``verification.fingerprint``,
the codecs' torch decoders); on the CPU those ops each make their own pass over memory
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

from collections.abc import Callable
from typing import Any  # numba's and llvmlite's objects (untyped), numpy's scalars

import llvmlite.ir
import numba as nb
import numba.extending
import numpy as np

from .calls import GGUF_RAW, PUBLIC, RAW, Kernels

_JIT = {"nogil": True, "cache": True, "boundscheck": False}
_WORDS = (nb.int64, nb.int32, nb.int16, nb.uint8)


@nb.extending.intrinsic
def _load8(typingctx: Any, arr: Any, i: Any) -> tuple[Any, Any]:  # pragma: no cover - compiled
    """Bytes ``arr[i:i + 8]`` (the caller keeps ``i + 8 <= arr.size``) as one uint64, at any
    alignment; byte ``i`` is the low byte (little-endian, as the tables already assume).
    numba has no unaligned load, and eight byte loads cost the kernels about a fifth of their
    speed."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), llvmlite.ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return nb.uint64(arr, nb.int64), codegen


def _copy_fingerprint_sigs() -> list[Any]:
    return [
        nb.types.UniTuple(nb.int64, 3)(
            w[::1],
            nb.int64,
            nb.int64,
            nb.int64,
            nb.int64,
            w[::1],
            nb.int64[::1],
            nb.int64,
            nb.int64,
            nb.int64,
            nb.int64,
            nb.int64,
            nb.int64,
        )
        for w in _WORDS
    ]


@nb.njit(nb.int64(nb.int64, nb.int64, nb.int64, nb.int64), **_JIT, inline="always")
def _nonfinite_lanes(v: int, mask: int, low: int, high: int) -> Any:  # pragma: no cover
    """Nonzero when a floating lane of word ``v`` has every exponent bit set (NaN or inf): ``mask``
    is each lane's exponent bits, ``low`` the lowest of them, ``high`` each lane's sign bit (see
    fingerprint.py's ``nonfinite_lanes``). Adding ``low`` to a lane's exponent bits carries into
    its sign bit (clear after the mask) only when they are all set, and never past it into the
    next lane: each lane is tested exactly, in three operations."""
    return ((v & mask) + low) & high


@nb.njit(_copy_fingerprint_sigs(), **_JIT)
def _copy_fingerprint(
    src: np.ndarray,
    start: int,
    stride: int,
    rows: int,
    cols: int,
    dst: np.ndarray,
    col_sums: np.ndarray,
    first_row: int,
    col0: int,
    group: int,
    mask: int,
    low: int,
    high: int,
) -> tuple[np.signedinteger[Any], np.signedinteger[Any], np.signedinteger[Any]]:  # pragma: no cover
    """Add ``rows`` rows of ``cols`` words (row ``r`` at ``src[start + r*stride:]``) to a
    fingerprint, and copy them into ``dst`` (contiguous) unless it is empty: returns (total,
    row-weighted, non-finite) and adds column sums into ``col_sums``. int64 arithmetic wraps,
    exactly like torch's.

    Rows here may be pieces of the fingerprinted tensor's rows: every ``group`` consecutive rows
    (counting from 0 at ``first_row``) are one row of it, each the next ``cols`` words along;
    ``col0`` is the first piece's word offset (a row read in pieces). ``group`` 1 and ``col0`` 0:
    plain rows.

    With ``mask`` nonzero the same pass looks for NaN and inf in the words' floating lanes
    (:func:`_nonfinite_lanes`): the third value is nonzero when a row holds one (which, and how
    many, a caller counts again on that rare path). ``mask`` 0: not looked for."""
    total = np.int64(0)
    weighted = np.int64(0)
    bad = np.int64(0)
    copy = dst.size > 0
    check = mask != 0
    for r in range(rows):
        base = start + r * stride
        out = r * cols
        row, piece = divmod(first_row + r, group)
        c = col0 + piece * cols
        s = np.int64(0)
        # one loop a case, as for the copy: the lane test in the plain loops would cost them 40%,
        # and a copy branch inside the checked loop 13%
        if check and copy:
            for j in range(cols):
                v = src[base + j]
                dst[out + j] = v
                s += np.int64(v)
                col_sums[c + j] += np.int64(v)
                bad |= _nonfinite_lanes(np.int64(v), mask, low, high)
        elif check:
            for j in range(cols):
                v = src[base + j]
                s += np.int64(v)
                col_sums[c + j] += np.int64(v)
                bad |= _nonfinite_lanes(np.int64(v), mask, low, high)
        elif copy:
            for j in range(cols):
                v = src[base + j]
                dst[out + j] = v
                s += np.int64(v)
                col_sums[c + j] += np.int64(v)
        else:
            for j in range(cols):
                v = src[base + j]
                s += np.int64(v)
                col_sums[c + j] += np.int64(v)
        total += s
        weighted += (row + 1) * s
    return total, weighted, bad


@nb.njit(nb.int64(nb.uint8[::1], nb.int64, nb.int64), **_JIT)
def _word(
    src: np.ndarray, k: int, width: int
) -> np.signedinteger[Any]:  # pragma: no cover - compiled
    """The little-endian word of ``width`` bytes at ``src[k]`` as the fingerprint reads it: signed
    for 2, 4 and 8 bytes, unsigned for 1."""
    if width == 8:
        return np.int64(_load8(src, k))  # the uint64's bits as int64
    if width == 1:
        return np.int64(src[k])
    v = np.int64(0)
    for b in range(width):
        v |= np.int64(src[k + b]) << (8 * b)
    top = np.int64(1) << (8 * width - 1)
    return v - (top << 1) if v >= top else v


@nb.njit(
    nb.void(
        nb.uint8[::1],
        nb.int64[::1],
        nb.int64[::1],
        nb.int64[::1],
        nb.int64[::1],
        nb.int64[::1],
        nb.uint8[::1],
        nb.int64[::1],
        nb.int64[:, ::1],
        nb.int64[:, ::1],
        nb.int64[::1],
    ),
    **_JIT,
)
def gather_windows(
    src: np.ndarray,
    src_off: np.ndarray,
    rows: np.ndarray,
    stride: np.ndarray,
    width: np.ndarray,
    words: np.ndarray,
    dst: np.ndarray,
    dst_off: np.ndarray,
    out: np.ndarray,
    lanes: np.ndarray,
    bad: np.ndarray,
) -> None:  # pragma: no cover
    """Many small windows in one pass: window ``i`` is ``rows[i]`` rows of ``width[i]`` bytes, the
    first at ``src[src_off[i]:]`` and each ``stride[i]`` bytes after the last (a whole tensor: its
    row length), read as words of ``words[i]`` bytes; copy it, rows one after another, to
    ``dst[dst_off[i]:]`` (unless ``dst`` is empty) and put its fingerprint (total, row-weighted,
    column-weighted) in ``out[i]``. The same triple
    :class:`~tpload.kernels.fingerprint.HostFingerprint` gives the window.

    ``lanes``: empty, or one row a window of fingerprint.py's ``nonfinite_lanes`` for its words;
    then ``bad[i]`` is nonzero when window ``i`` holds a NaN or inf (the same pass)."""
    copy = dst.size > 0
    check = lanes.shape[0] > 0
    for i in range(src_off.size):
        a, n, st, wb, w = src_off[i], rows[i], stride[i], width[i], words[i]
        total = np.int64(0)
        weighted = np.int64(0)
        cols = np.int64(0)
        flagged = np.int64(0)
        mask, low, high = (lanes[i, 0], lanes[i, 1], lanes[i, 2]) if check else (0, 0, 0)
        d = dst_off[i]
        for r in range(n if wb > 0 else 0):
            base = a + r * st
            if copy:
                dst[d : d + wb] = src[base : base + wb]
                d += wb
            s = np.int64(0)
            if w == 8:  # the common width, without _word's branches (2.5x the speed)
                for j in range(wb // 8):
                    v = np.int64(_load8(src, base + 8 * j))
                    s += v
                    cols += (j + 1) * v
                    if mask != 0:
                        flagged |= _nonfinite_lanes(v, mask, low, high)
            else:
                for j in range(wb // w):
                    v = _word(src, base + j * w, w)
                    s += v
                    cols += (j + 1) * v
                    if mask != 0:
                        flagged |= _nonfinite_lanes(v, mask, low, high)
            total += s
            weighted += (r + 1) * s
        out[i, 0] = total
        out[i, 1] = weighted
        out[i, 2] = cols
        if check:
            bad[i] = flagged


_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)


@nb.njit(nb.uint64(nb.uint64), **_JIT)
def _zero_bytes(x: np.uint64) -> Any:  # pragma: no cover - compiled
    """How many of the 8 bytes of ``x`` are zero (exact: no carry crosses a byte)."""
    nonzero = ((x & _LOW7) + _LOW7) | x  # the high bit of each nonzero byte
    zero = ~nonzero & _HIGH
    return ((zero >> np.uint64(7)) * _ONES) >> np.uint64(56)


@nb.njit(
    nb.int64(
        nb.types.Array(nb.uint8, 1, "C", readonly=True),
        nb.int64[::1],
        nb.int64[::1],
        nb.int64[::1],
        nb.int64[::1],
        nb.uint8,
        nb.uint8,
        nb.boolean,
    ),
    **_JIT,
)
def count_windows(
    src: np.ndarray,
    src_off: np.ndarray,
    rows: np.ndarray,
    stride: np.ndarray,
    width: np.ndarray,
    a: int,
    b: int,
    between: bool,
) -> np.signedinteger[Any]:  # pragma: no cover - compiled
    """How many bytes of many windows of ``src`` (laid out as in :func:`gather_windows`) are ``a``
    or ``b`` (``between``: lie in ``[a, b]``), all windows together: one call for a batch's items,
    or for one window (:func:`count_either`, :func:`count_between`). ``a`` or ``b`` go eight bytes
    at a time (one unaligned load, a zero-byte count per value), each row's tail one by one."""
    n = np.uint64(0)
    pa, pb = np.uint64(a) * _ONES, np.uint64(b) * _ONES
    for i in range(src_off.size):
        for r in range(rows[i]):
            base = src_off[i] + r * stride[i]
            j = 0
            if not between:
                while j + 8 <= width[i]:
                    w = _load8(src, base + j)
                    n += _zero_bytes(w ^ pa)
                    if a != b:
                        n += _zero_bytes(w ^ pb)
                    j += 8
            for k in range(base + j, base + width[i]):
                v = src[k]
                n += np.uint64(((v >= a) & (v <= b)) if between else ((v == a) | (v == b)))
    return np.int64(n)


@nb.njit(nb.types.UniTuple(nb.int64, 3)(nb.int64[:, ::1], nb.int64[::1]), **_JIT)
def bf16_fingerprint(
    words: np.ndarray, col_sums: np.ndarray
) -> tuple[
    np.signedinteger[Any], np.signedinteger[Any], np.signedinteger[Any]
]:  # pragma: no cover - compiled
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


@nb.njit(nb.int64(nb.int64[::1]), **_JIT)
def cols_term(col_sums: np.ndarray) -> np.signedinteger[Any]:  # pragma: no cover - compiled
    """The fingerprint's ``cols``: sum (j + 1) * col_sums[j], wrapping in int64 like torch."""
    t = np.int64(0)
    for j in range(col_sums.size):
        t += (j + 1) * col_sums[j]
    return t


# -- decode
# FP4 / FP8 -> bf16 by one lookup per packed byte or code in codecs.tables.scaled_table:
# [256 scale bytes x 256 codes] of decoded bf16 bits (int32 per FP4 byte = its two
# elements, int16 per E4M3 code). torch's index_select wants an int32 index tensor
# built first (more passes over memory); here each byte is read once and its word
# written once. What bounds these loops is memory operations per element (load the
# code, load the entry, store it), so codes are read eight at a time, and the table
# row of a scale byte (1 KiB / 512 B, in L1) is found once per run of codes sharing it.

_RO_BYTES = nb.types.Array(nb.uint8, 1, "C", readonly=True)  # also accepts writable arrays


@nb.njit(
    nb.void(
        _RO_BYTES,
        nb.int64,
        _RO_BYTES,
        nb.int64,
        nb.types.Array(nb.int32, 1, "C", readonly=True),
        nb.int32[::1],
        nb.int64,
        nb.int64,
        nb.int64,
    ),
    **_JIT,
)
def _decode_fp4(
    packed: np.ndarray,
    p_stride: int,
    scale: np.ndarray,
    s_stride: int,
    table: np.ndarray,
    out: np.ndarray,
    rows: int,
    half_k: int,
    gb: int,
) -> None:  # pragma: no cover - compiled
    """Row ``r`` of the packed window is ``packed[r*p_stride:][:half_k]``, its scale bytes
    ``scale[r*s_stride:]``; ``out`` is the contiguous int32 view of bf16 ``[rows, 2*half_k]``.
    ``half_k`` is a multiple of ``gb`` (packed bytes per scale byte: 16 for MXFP4, 8 for NVFP4),
    itself a multiple of 8."""
    for r in range(rows):
        src = packed[r * p_stride : r * p_stride + half_k]
        sc = scale[r * s_stride : r * s_stride + half_k // gb]
        dst = out[r * half_k : (r + 1) * half_k]
        for g in range(half_k // gb):
            base = np.int64(sc[g]) << 8
            t = table[base : base + 256]
            for h in range(gb * g, gb * g + gb, 8):
                w = _load8(src, h)
                for i in range(8):
                    dst[h + i] = t[(w >> np.uint64(8 * i)) & np.uint64(0xFF)]


@nb.njit(
    nb.void(
        _RO_BYTES,
        nb.int64,
        _RO_BYTES,
        nb.int64,
        nb.types.Array(nb.int16, 1, "C", readonly=True),
        nb.int16[::1],
        nb.int64,
        nb.int64,
        nb.int64,
    ),
    **_JIT,
)
def _decode_fp8(
    codes: np.ndarray,
    c_stride: int,
    scale: np.ndarray,
    s_stride: int,
    table: np.ndarray,
    out: np.ndarray,
    rows: int,
    k: int,
    block: int,
) -> None:  # pragma: no cover - compiled
    """Row ``r`` of the code window is ``codes[r*c_stride:][:k]``; scale row ``r // block`` is
    ``scale[(r // block)*s_stride:]``; ``out`` is the contiguous int16 view of bf16 ``[rows, k]``.
    The last block of a row or column may be short (ragged N, K)."""
    blocks = (k + block - 1) // block
    for r in range(rows):
        src = codes[r * c_stride : r * c_stride + k]
        s0 = (r // block) * s_stride
        sc = scale[s0 : s0 + blocks]
        dst = out[r * k : (r + 1) * k]
        if block % 8:  # a word of 8 codes can straddle two scales (no checkpoint has such a block)
            for j in range(k):
                dst[j] = table[(np.int64(sc[j // block]) << 8) + src[j]]
            continue
        # One loop over the row's words; the scale changes every block // 8 words. With B = 32 a
        # loop per block (slicing the table, the codes, the output) costs a fifth of the time.
        # Indices count up from 0 so LLVM sees them non-negative: numba wraps negative indices,
        # and an index it cannot prove non-negative costs every store that check.
        left, b, base = 0, 0, np.int64(0)
        for q in range(k // 8):
            if left == 0:
                base, b, left = np.int64(sc[b]) << 8, b + 1, block // 8
            left -= 1
            w = _load8(src, 8 * q)
            for i in range(8):
                dst[8 * q + i] = table[base + np.int64((w >> np.uint64(8 * i)) & np.uint64(0xFF))]
        for j in range(k - k % 8, k):  # the last few codes of the row
            dst[j] = table[(np.int64(sc[j // block]) << 8) + src[j]]


def _gguf(name: str) -> Callable[..., Any]:
    """GGUF's decode ``name`` (gguf.py), imported on its first call: importing gguf.py compiles all
    its decodes (about 3 s on a machine's first GGUF load, some 20 ms from numba's cache after),
    which only a GGUF load needs."""

    def call(*args: Any) -> Any:
        from . import gguf

        return gguf.RAW[name](*args)

    call.__name__ = call.__qualname__ = name
    return call


_RAW: dict[str, Any] = {
    **{f"copy_fingerprint_{w}": _copy_fingerprint for w in _WORDS},
    "gather_windows": gather_windows,
    "count_windows": count_windows,
    "bf16_fingerprint": bf16_fingerprint,
    "cols_term": cols_term,
    "decode_fp4": _decode_fp4,
    "decode_fp8": _decode_fp8,
    **{name: _gguf(name) for name in GGUF_RAW.values()},
}
"""The raw kernels by :data:`.calls.RAW`'s names (numba's dispatchers; GGUF's decodes imported on
first use)."""
assert tuple(_RAW) == RAW


def exports() -> dict[str, tuple[Callable[..., Any], Any]]:
    """Every raw kernel (:data:`.calls.RAW`) as (its Python function, its one signature): what the
    ahead-of-time build compiles (kernels/build.py), from the signatures declared here and in
    gguf.py."""
    from . import gguf

    sigs = dict(zip(_WORDS, _copy_fingerprint.nopython_signatures, strict=True))
    found: dict[str, tuple[Callable[..., Any], Any]] = {}
    for name, kernel in (_RAW | gguf.RAW).items():  # GGUF's dispatchers, not their stand-ins
        if name.startswith("copy_fingerprint_"):
            sig = sigs[getattr(nb, name.rsplit("_", 1)[1])]
        else:
            (sig,) = kernel.nopython_signatures
        found[name] = (kernel.py_func, sig)
    return found


KERNELS = Kernels(_RAW, "numba")
"""This module's kernels behind the names the load path calls (:data:`.calls.PUBLIC`), also
module attributes here."""

copy_fingerprint = KERNELS.copy_fingerprint
wrap64 = KERNELS.wrap64
count_between = KERNELS.count_between
count_either = KERNELS.count_either
decode_fp4 = KERNELS.decode_fp4
decode_fp8 = KERNELS.decode_fp8
decode_gguf = KERNELS.decode_gguf
assert all(hasattr(KERNELS, name) for name in PUBLIC)
