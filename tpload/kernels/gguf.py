"""Compiled (numba) CPU decodes of GGUF blocks to bf16 bits: called through :mod:`.calls`
(``Kernels.decode_gguf``, which checks their arguments), numba's imported on a GGUF load's first
decode (compiled.py), or compiled ahead with the other kernels (kernels/build.py).

Each value is formed in fp32 in the order of the ``gguf`` package's numpy dequantisation (no fused
multiply-add: numba contracts only under fastmath, which is off) and rounded once to bf16, nearest
even, a NaN kept a NaN: bit for bit what :func:`tpload.codecs.gguf.decode_torch` gives.

Each kernel declares its one signature (the ahead-of-time build compiles it): rows of whole blocks
(C-contiguous uint8 ``[rows, row bytes]``), the rows of bf16 bits they decode to (uint16 ``[rows,
weights]``), and every f16 bit pattern's value (``calls.f16_to_f32``: numba has no f16
arithmetic). So importing this module compiles (or loads from numba's cache) all of them.
"""

from __future__ import annotations

import numba
import numpy as np

from .calls import GGUF_RAW

_SIG = numba.void(
    numba.types.Array(numba.uint8, 2, "C", readonly=True),  # also accepts writable arrays
    numba.uint16[:, ::1],
    numba.types.Array(numba.float32, 1, "C", readonly=True),
)
_JIT = {"cache": True, "nogil": True, "boundscheck": False}


_NAN_MASK, _INF, _HALF, _QUIET = (
    np.uint32(0x7FFFFFFF),
    np.uint32(0x7F800000),
    np.uint32(0x7FFF),
    np.uint32(0x40),
)


@numba.njit(cache=True, nogil=True, inline="always")
def _round(tmp: np.ndarray, out: np.ndarray, at: int) -> None:
    """``tmp``'s fp32 values into ``out[at:]`` as bf16 bits: round to nearest even, a NaN kept a NaN
    (a select, not a branch, so the loop vectorises)."""
    bits: np.ndarray = tmp.view(np.uint32)
    for i in range(tmp.shape[0]):
        x = bits[i]
        rounded = (x + _HALF + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        quiet = (x >> np.uint32(16)) | _QUIET
        out[at + i] = np.uint16(quiet if (x & _NAN_MASK) > _INF else rounded)


@numba.njit(cache=True, nogil=True, inline="always")
def _f16(row: np.ndarray, at: int, f16: np.ndarray) -> np.float32:
    value: np.float32 = f16[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]
    return value


@numba.njit(_SIG, **_JIT)
def _q8_0(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    tmp: np.ndarray = np.empty(32, dtype=np.float32)
    for r in range(src.shape[0]):
        row, dst = src[r], out[r]
        for b in range(src.shape[1] // 34):
            o = b * 34
            d = _f16(row, o, f16)
            for i in range(32):
                tmp[i] = np.float32(np.int8(row[o + 2 + i])) * d
            _round(tmp, dst, b * 32)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _k_quant(src: np.ndarray, out: np.ndarray, f16: np.ndarray, size: int, fifth: bool) -> None:
    """Q4_K (144-byte blocks) and Q5_K (176: 32 bytes of fifth bits before the nibbles)."""
    tmp: np.ndarray = np.empty(256, dtype=np.float32)
    sc: np.ndarray = np.empty(8, dtype=np.float32)
    mn: np.ndarray = np.empty(8, dtype=np.float32)
    for r in range(src.shape[0]):
        row, dst = src[r], out[r]
        for b in range(src.shape[1] // size):
            o = b * size
            d, dmin = _f16(row, o, f16), _f16(row, o + 2, f16)
            for j in range(4):
                a, m, md = (
                    np.int32(row[o + 4 + j]),
                    np.int32(row[o + 8 + j]),
                    np.int32(row[o + 12 + j]),
                )
                sc[j] = d * np.float32(a & 0x3F)
                mn[j] = dmin * np.float32(m & 0x3F)
                sc[j + 4] = d * np.float32((md & 0x0F) | ((a >> 2) & 0x30))
                mn[j + 4] = dmin * np.float32((md >> 4) | ((m >> 2) & 0x30))
            for c in range(4):
                d1, m1, d2, m2 = sc[2 * c], mn[2 * c], sc[2 * c + 1], mn[2 * c + 1]
                q0 = o + (48 if fifth else 16) + 32 * c
                for i in range(32):
                    q = np.int32(row[q0 + i])
                    lo, hi = q & 0x0F, q >> 4
                    if fifth:  # sub-block j's fifth bit: bit j of qh[i]
                        h = np.int32(row[o + 16 + i])
                        lo |= ((h >> (2 * c)) & 1) << 4
                        hi |= ((h >> (2 * c + 1)) & 1) << 4
                    tmp[64 * c + i] = d1 * np.float32(lo) - m1
                    tmp[64 * c + 32 + i] = d2 * np.float32(hi) - m2
            _round(tmp, dst, b * 256)


# (after _k_quant: a declared signature compiles where it is declared)
@numba.njit(_SIG, **_JIT)
def _q4_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    _k_quant(src, out, f16, 144, False)


@numba.njit(_SIG, **_JIT)
def _q5_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    _k_quant(src, out, f16, 176, True)


@numba.njit(_SIG, **_JIT)
def _q6_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    tmp: np.ndarray = np.empty(256, dtype=np.float32)
    ds: np.ndarray = np.empty(16, dtype=np.float32)
    for r in range(src.shape[0]):
        row, dst = src[r], out[r]
        for b in range(src.shape[1] // 210):
            o = b * 210
            d = _f16(row, o + 208, f16)
            for j in range(16):
                ds[j] = d * np.float32(np.int8(row[o + 192 + j]))
            for h in range(2):
                for k in range(128):
                    low = (np.int32(row[o + 64 * h + (k & 63)]) >> (4 * (k >> 6))) & 0x0F
                    high = (np.int32(row[o + 128 + 32 * h + (k & 31)]) >> (2 * (k >> 5))) & 0x03
                    i = 128 * h + k
                    tmp[i] = ds[i >> 4] * np.float32((low | (high << 4)) - 32)
            _round(tmp, dst, b * 256)


@numba.njit(_SIG, **_JIT)
def _q2_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    """84-byte blocks: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit quants
    (byte ``32h + l`` holds weight ``128h + 32s + l`` at bits ``2s``), f16 ``d``, ``dmin``. The
    16-weight sub-blocks are walked in pairs, a select picking the scale, so the loop vectorises."""
    tmp: np.ndarray = np.empty(256, dtype=np.float32)
    dl: np.ndarray = np.empty(16, dtype=np.float32)
    ml: np.ndarray = np.empty(16, dtype=np.float32)
    for r in range(src.shape[0]):
        row, dst = src[r], out[r]
        for b in range(src.shape[1] // 84):
            o = b * 84
            d, dmin = _f16(row, o + 80, f16), _f16(row, o + 82, f16)
            for j in range(16):
                s = np.int32(row[o + j])
                dl[j] = d * np.float32(s & 0x0F)
                ml[j] = dmin * np.float32(s >> 4)
            for c in range(8):  # 32 weights from 32 bytes at one shift: sub-blocks 2c, 2c + 1
                shift, q0 = 2 * (c & 3), o + 16 + 32 * (c >> 2)
                da, db, ma, mb = dl[2 * c], dl[2 * c + 1], ml[2 * c], ml[2 * c + 1]
                for i in range(32):
                    q = np.float32((np.int32(row[q0 + i]) >> shift) & 3)
                    tmp[32 * c + i] = (da if i < 16 else db) * q - (ma if i < 16 else mb)
            _round(tmp, dst, b * 256)


@numba.njit(_SIG, **_JIT)
def _q3_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    """110-byte blocks: 32 bytes of high-bit mask (bit ``i >> 5`` of byte ``i & 31``; a clear bit
    subtracts 4), 64 bytes of low 2 bits (as Q2_K), 12 bytes of 6-bit scales (biased by 32), f16
    ``d``."""
    tmp: np.ndarray = np.empty(256, dtype=np.float32)
    dl: np.ndarray = np.empty(16, dtype=np.float32)
    for r in range(src.shape[0]):
        row, dst = src[r], out[r]
        for b in range(src.shape[1] // 110):
            o = b * 110
            d = _f16(row, o + 108, f16)
            for j in range(16):
                lo = (np.int32(row[o + 96 + (j & 7)]) >> (4 * (j >> 3))) & 0x0F
                hi = (np.int32(row[o + 104 + (j & 3)]) >> (2 * (j >> 2))) & 0x03
                dl[j] = d * np.float32((lo | (hi << 4)) - 32)
            for c in range(
                8
            ):  # 32 weights at one shift and mask bit: sub-blocks 2c, 2c + 1 (vectorises)
                shift, q0 = 2 * (c & 3), o + 32 + 32 * (c >> 2)
                da, db = dl[2 * c], dl[2 * c + 1]
                for i in range(32):
                    low = (np.int32(row[q0 + i]) >> shift) & 3
                    high = ((np.int32(row[o + i]) >> c) & 1) ^ 1
                    tmp[32 * c + i] = (da if i < 16 else db) * np.float32(low - (high << 2))
            _round(tmp, dst, b * 256)


RAW = {
    GGUF_RAW[ggml]: kernel
    for ggml, kernel in {
        "Q8_0": _q8_0,
        "Q2_K": _q2_k,
        "Q3_K": _q3_k,
        "Q4_K": _q4_k,
        "Q5_K": _q5_k,
        "Q6_K": _q6_k,
    }.items()
}
"""The decodes by their names among :data:`.calls.RAW` (numba's dispatchers)."""
