"""Compiled (numba) CPU decodes of GGUF blocks to bf16 bits, imported on first use.

Each value is formed in fp32 in the order of the ``gguf`` package's numpy dequantisation (no fused
multiply-add: numba contracts only under fastmath, which is off) and rounded once to bf16, nearest
even, a NaN kept a NaN: bit for bit what :func:`tpload.codecs.gguf.decode_torch` gives.
"""

from __future__ import annotations

import numba
import numpy as np

F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
"""Every f16 bit pattern's value (numba has no f16 arithmetic): one table lookup per super-scale."""


@numba.njit(cache=True, inline="always")
def _bf16(bits: np.uint32) -> np.int16:
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return np.int16(np.uint16((bits >> 16) | 0x40))
    return np.int16(np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16))


@numba.njit(cache=True, nogil=True)
def _q8_0(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    rows, nbytes = src.shape
    tmp = np.empty(32, dtype=np.float32)
    bits = tmp.view(np.uint32)
    for r in range(rows):
        for b in range(nbytes // 34):
            o = b * 34
            d = f16[np.int64(src[r, o]) | (np.int64(src[r, o + 1]) << 8)]
            for i in range(32):
                q = np.int8(src[r, o + 2 + i])
                tmp[i] = np.float32(q) * d
            for i in range(32):
                out[r, b * 32 + i] = _bf16(bits[i])


@numba.njit(cache=True, nogil=True)
def _q4_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    rows, nbytes = src.shape
    tmp = np.empty(256, dtype=np.float32)
    bits = tmp.view(np.uint32)
    sc = np.empty(8, dtype=np.float32)
    mn = np.empty(8, dtype=np.float32)
    for r in range(rows):
        for b in range(nbytes // 144):
            o = b * 144
            d = f16[np.int64(src[r, o]) | (np.int64(src[r, o + 1]) << 8)]
            dmin = f16[np.int64(src[r, o + 2]) | (np.int64(src[r, o + 3]) << 8)]
            for j in range(4):
                a, m, md = np.int32(src[r, o + 4 + j]), np.int32(src[r, o + 8 + j]), np.int32(src[r, o + 12 + j])
                sc[j] = d * np.float32(a & 0x3F)
                mn[j] = dmin * np.float32(m & 0x3F)
                sc[j + 4] = d * np.float32((md & 0x0F) | ((a >> 2) & 0x30))
                mn[j + 4] = dmin * np.float32((md >> 4) | ((m >> 2) & 0x30))
            for c in range(4):
                d1, m1, d2, m2 = sc[2 * c], mn[2 * c], sc[2 * c + 1], mn[2 * c + 1]
                for i in range(32):
                    q = np.int32(src[r, o + 16 + 32 * c + i])
                    tmp[64 * c + i] = d1 * np.float32(q & 0x0F) - m1
                    tmp[64 * c + 32 + i] = d2 * np.float32(q >> 4) - m2
            for i in range(256):
                out[r, b * 256 + i] = _bf16(bits[i])


@numba.njit(cache=True, nogil=True)
def _q6_k(src: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
    rows, nbytes = src.shape
    tmp = np.empty(256, dtype=np.float32)
    bits = tmp.view(np.uint32)
    ds = np.empty(16, dtype=np.float32)
    for r in range(rows):
        for b in range(nbytes // 210):
            o = b * 210
            d = f16[np.int64(src[r, o + 208]) | (np.int64(src[r, o + 209]) << 8)]
            for j in range(16):
                ds[j] = d * np.float32(np.int8(src[r, o + 192 + j]))
            for h in range(2):
                for k in range(128):
                    low = (np.int32(src[r, o + 64 * h + (k & 63)]) >> (4 * (k >> 6))) & 0x0F
                    high = (np.int32(src[r, o + 128 + 32 * h + (k & 31)]) >> (2 * (k >> 5))) & 0x03
                    i = 128 * h + k
                    tmp[i] = ds[i >> 4] * np.float32((low | (high << 4)) - 32)
            for i in range(256):
                out[r, b * 256 + i] = _bf16(bits[i])


_KERNELS = {"Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def decode(dtype: str, src: np.ndarray, out: np.ndarray) -> None:
    """Rows of ``dtype`` blocks (uint8 ``[rows, row bytes]``) into bf16 bits (int16 ``[rows, weights]``)."""
    _KERNELS[dtype](src.reshape(src.shape[0], -1), out.reshape(out.shape[0], -1), F16_TO_F32)
