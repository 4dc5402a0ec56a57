"""The kernels' Python side, shared by their two implementations: numba's (:mod:`.compiled`,
compiled on first import and cached) and the same kernels compiled ahead into an extension module
(:mod:`.ahead`). Imports no numba.

:class:`Kernels` holds one implementation's raw kernels (:data:`RAW` names them) and gives the
names the load path calls (:data:`PUBLIC`): the raw ones, and the Python wrappers that prepare their
arguments (views of windows, the checks a kernel without bounds checks needs)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
"""ggml type -> (weights per block, bytes per block): the block layouts gguf.py's kernels decode
(the gguf codec's too: codecs/gguf.py)."""
GGUF_RAW = {ggml: "decode_" + ggml.lower() for ggml in GGUF_BLOCKS}
"""ggml type -> the name of its decode among :data:`RAW`."""

RAW = (
    "copy_fingerprint_int64",
    "copy_fingerprint_int32",
    "copy_fingerprint_int16",
    "copy_fingerprint_uint8",
    "gather_windows",
    "count_windows",
    "bf16_fingerprint",
    "cols_term",
    "decode_fp4",
    "decode_fp8",
    *GGUF_RAW.values(),
)
"""The raw kernels each implementation gives (its ``_copy_fingerprint`` once a word width; gguf.py's
decodes once a ggml type)."""

PUBLIC = (
    "copy_fingerprint",
    "gather_windows",
    "count_windows",
    "bf16_fingerprint",
    "cols_term",
    "wrap64",
    "count_between",
    "count_either",
    "decode_fp4",
    "decode_fp8",
    "decode_gguf",
)
"""The names the rest of tpload calls (through :data:`tpload.kernels.lazy.kernels`)."""

_TABLE = 256 * 256


def wrap64(x: int) -> int:
    """A Python int as the int64 it is modulo 2**64 (what torch's wrapping sums give)."""
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


class Kernels:
    """The public kernels over one implementation's raw ones (``raw``: :data:`RAW` to callables);
    ``implementation`` says which ("numba", "ahead")."""

    wrap64 = staticmethod(wrap64)

    def __init__(self, raw: Mapping[str, Callable[..., Any]], implementation: str) -> None:
        self.implementation = implementation
        self._copy = {
            np.dtype(name.rsplit("_", 1)[1]): raw[name] for name in RAW if name.startswith("copy_")
        }
        self.gather_windows = raw["gather_windows"]
        self.count_windows = raw["count_windows"]
        self.bf16_fingerprint = raw["bf16_fingerprint"]
        self.cols_term = raw["cols_term"]
        self._decode_fp4 = raw["decode_fp4"]
        self._decode_fp8 = raw["decode_fp8"]
        self._gguf = {ggml: raw[name] for ggml, name in GGUF_RAW.items()}

    def __repr__(self) -> str:
        return f"<tpload kernels: {self.implementation}>"

    def copy_fingerprint(
        self,
        src: np.ndarray,
        start: int,
        stride: int,
        rows: int,
        cols: int,
        dst: np.ndarray,
        col_sums: np.ndarray,
        first_row: int,
        col0: int = 0,
        group: int = 1,
        lanes: tuple[int, int, int] = (0, 0, 0),
    ) -> tuple[int, int, bool]:
        """compiled.py's ``_copy_fingerprint`` (``src`` and ``dst`` 1-D word arrays of one dtype;
        ``dst`` empty for a fingerprint without a copy); ``lanes``: fingerprint.py's
        ``nonfinite_lanes``, or zeros. (total, row-weighted, whether a NaN or inf was seen)."""
        kernel = self._copy.get(src.dtype)
        if kernel is None:
            raise TypeError(f"copy_fingerprint: no kernel for {src.dtype} words")
        t, w, bad = kernel(
            src, start, stride, rows, cols, dst, col_sums, first_row, col0, group, *lanes
        )
        return int(t), int(w), bool(bad)

    def count_between(self, x: np.ndarray, lo: int, hi: int) -> int:
        """How many bytes of a 2-D byte window (rows read in place) lie in ``[lo, hi]``: the scale
        bytes from which a decode can overflow, counted without a temporary."""
        b2 = x.reshape(1, -1) if x.ndim < 2 else x
        span, stride = _rows(b2.view(np.uint8), "count_between")
        return self._count_one(span, stride, b2.shape, lo, hi, between=True)

    def count_either(self, x: np.ndarray, a: int, b: int) -> int:
        """How many bytes of ``x`` equal ``a`` or ``b``: any array of 1-byte elements, or a 2-D byte
        window of wider rows (read in place, as the decoders do)."""
        b2 = (
            x.reshape(1, -1)
            if x.ndim < 2
            else x
            if x.ndim == 2
            else x.reshape(x.shape[0], math.prod(x.shape[1:]))
        )
        span, stride = _rows(b2.view(np.uint8), "count_either")
        return self._count_one(span, stride, b2.shape, a, b, between=False)

    def _count_one(
        self,
        span: np.ndarray,
        stride: int,
        shape: tuple[int, ...],
        a: int,
        b: int,
        *,
        between: bool,
    ) -> int:
        """count_windows on one window: ``shape`` rows and columns, rows ``stride`` apart in
        ``span``."""
        one: np.ndarray = np.zeros(1, dtype=np.int64)
        return int(
            self.count_windows(
                span, one, one + shape[0], one + stride, one + shape[1], a, b, between
            )
        )

    def decode_fp4(
        self,
        packed: np.ndarray,
        scale: np.ndarray,
        table: np.ndarray,
        out: np.ndarray,
        *,
        group: int = 32,
    ) -> None:
        """FP4 ``packed [N, K/2]`` bytes with one scale byte per ``group`` elements, ``scale [N,
        K/group]``, into ``out``, the contiguous int32 ``[N, K/2]`` view of a bf16 ``[N, K]`` (each
        word: two elements, low nibble in the low half): ``out[n, j] = table[scale[n, j //
        (group/2)] * 256 + packed[n, j]]``, ``table`` an int32[65536] of decoded pairs per (scale
        byte, packed byte): ``codecs.tables.scaled_table("fp4")`` for MXFP4 (group 32), NVFP4's
        table for group 16.

        ``packed`` and ``scale`` may be row windows of wider rows (a tensor-parallel column
        cut); rows are read in place. K must be a multiple of ``group``.
        """
        n, half_k = packed.shape
        gb = group // 2
        if (
            group not in (16, 32)
            or half_k % gb
            or scale.shape != (n, half_k // gb)
            or out.shape != (n, half_k)
        ):
            raise ValueError(
                f"decode_fp4: packed {packed.shape}, scale {scale.shape}, out {out.shape}, group "
                f"{group} disagree (K must be a multiple of {group}; the group is 16 or 32)"
            )
        if out.dtype != np.int32 or not out.flags.c_contiguous:
            raise ValueError(f"decode_fp4: out must be contiguous int32, got {out.dtype}")
        _check_table(table, np.int32)
        (p, p_stride), (s, s_stride) = _rows(packed, "packed"), _rows(scale, "scale")
        self._decode_fp4(p, p_stride, s, s_stride, table, out.reshape(-1), n, half_k, gb)

    def decode_fp8(
        self, codes: np.ndarray, scale: np.ndarray, table: np.ndarray, out: np.ndarray, block: int
    ) -> None:
        """E4M3 ``codes [N, K]`` with E8M0 block scale bytes ``scale [ceil(N/B), ceil(K/B)]`` into
        ``out``, the contiguous int16 ``[N, K]`` view of a bf16 ``[N, K]``:
        ``out[n, k] = table[scale[n // B, k // B] * 256 + codes[n, k]]``, ``table`` being
        ``codecs.tables.scaled_table("fp8")`` as int16[65536]. ``codes`` and ``scale`` may be
        row windows of wider rows; the last block in either direction may be short.
        """
        n, k = codes.shape
        if block < 1 or scale.shape != (-(-n // block), -(-k // block)) or out.shape != (n, k):
            raise ValueError(
                f"decode_fp8: codes {codes.shape}, scale {scale.shape}, block {block}, out "
                f"{out.shape} disagree"
            )
        if out.dtype != np.int16 or not out.flags.c_contiguous:
            raise ValueError(f"decode_fp8: out must be contiguous int16, got {out.dtype}")
        _check_table(table, np.int16)
        (c, c_stride), (s, s_stride) = _rows(codes, "codes"), _rows(scale, "scale")
        self._decode_fp8(c, c_stride, s, s_stride, table, out.reshape(-1), n, k, block)

    def decode_gguf(self, ggml: str, blocks: np.ndarray, out: np.ndarray) -> None:
        """Rows of ggml type ``ggml``'s blocks (uint8 ``[rows, ...]``, each row whole blocks) into
        bf16 bits ``out`` (16-bit words ``[rows, ...]``, C-contiguous: its rows are the decoded
        rows): gguf.py's kernels, each value formed in fp32 as the ``gguf`` package's numpy
        dequantisation does, rounded once to bf16."""
        kernel = self._gguf.get(ggml)
        if kernel is None:
            raise ValueError(f"decode_gguf: no kernel for {ggml} (only {'/'.join(GGUF_BLOCKS)})")
        # out is written in place: rows of a non-contiguous one would be a copy's
        if out.dtype.itemsize != 2 or not out.flags.c_contiguous:
            raise ValueError(f"decode_gguf: out must be contiguous 16-bit words, got {out.dtype}")
        per, size = GGUF_BLOCKS[ggml]
        src, dst = _flat_rows(blocks), _flat_rows(out)
        if src.dtype != np.uint8 or src.shape[1] % size:
            raise ValueError(
                f"decode_gguf: {ggml} rows must be uint8 bytes of whole {size}-byte blocks, got "
                f"{src.dtype}{list(blocks.shape)}"
            )
        # the kernels read and write without bounds checks: the shapes are checked here
        if dst.shape != (src.shape[0], src.shape[1] // size * per):
            raise ValueError(
                f"decode_gguf: {ggml} blocks {list(blocks.shape)} and out {list(out.shape)} "
                f"disagree ({per} weights a {size}-byte block)"
            )
        kernel(np.ascontiguousarray(src), dst.view(np.uint16), f16_to_f32())


@functools.cache
def f16_to_f32() -> np.ndarray:
    """Every f16 bit pattern's value (the kernels have no f16 arithmetic: one lookup per
    super-scale), made on the first GGUF decode."""
    table: np.ndarray = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    values: np.ndarray = table.astype(np.float32)
    values.flags.writeable = False  # shared by every decode
    return values


def _flat_rows(a: np.ndarray) -> np.ndarray:
    """``a`` as 2-D: its first dimension, the rest flattened (a view where ``a`` is contiguous)."""
    rows = a.shape[0] if a.ndim else 1
    return a.reshape(rows, math.prod(a.shape[1:]))


def _rows(a: np.ndarray, name: str) -> tuple[np.ndarray, int]:
    """A 2-D byte array whose rows may be windows of wider rows (contiguous within a row) as
    (the 1-D span from its first byte to its last, its row stride): what the kernels index.
    No copy: the span is a view of the memory the rows already lie in."""
    if a.ndim != 2 or a.dtype != np.uint8:
        raise ValueError(f"{name}: expected 2-D uint8 bytes, got {a.ndim}-D {a.dtype}")
    rows, cols = a.shape
    if cols > 1 and a.strides[1] != 1:
        a = np.ascontiguousarray(a)  # a column-strided view: the kernels read rows as runs of bytes
    stride = a.strides[0] if rows > 1 else cols
    if stride < 0:
        a, stride = np.ascontiguousarray(a), cols
    span = (rows - 1) * stride + cols if rows and cols else 0
    return np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(1,), writeable=False), stride


def _check_table(table: np.ndarray, dtype: type) -> None:
    # the kernels index it without bounds checks: a short table would be read past its end
    if table.shape != (_TABLE,) or table.dtype != dtype or not table.flags.c_contiguous:
        raise ValueError(
            f"table: expected contiguous {np.dtype(dtype)}[{_TABLE}], got "
            f"{table.dtype}{list(table.shape)}"
        )
