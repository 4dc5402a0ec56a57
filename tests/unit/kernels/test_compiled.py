"""The compiled CPU kernels agree bit for bit with torch and numpy doing the same sums and counts.

(The decode kernels are checked against ml_dtypes in tests/unit/codecs/test_decoders.py; here only
what they accept and refuse.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from tests.reference import fp4 as ref_fp4
from tpload.codecs.tables import E4M3_NAN, E8M0_INVALID, scaled_table
from tpload.kernels.fingerprint import (
    HostFingerprint,
    host_fingerprint,
    nonfinite_lanes,
    word_widths,
)
from tpload.kernels.lazy import kernels

pytestmark = pytest.mark.usefixtures("implementation")  # numba's kernels, then ahead-of-time

WORDS = [np.int64, np.int32, np.int16, np.uint8]


def torch_sums(window: np.ndarray, first_row: int) -> tuple[int, int, np.ndarray]:
    """(total, row-weighted total, column sums) of a 2-D word window in torch's wrapping int64."""
    x = torch.from_numpy(np.ascontiguousarray(window)).to(torch.int64)
    row = x.sum(dim=1)
    weights = torch.arange(first_row + 1, first_row + x.shape[0] + 1, dtype=torch.int64)
    return int(row.sum()), int((row * weights).sum()), x.sum(dim=0).numpy()


def exact_mod64(values: list[int]) -> int:
    """A Python-int sum taken modulo 2**64 as a signed int64 (no wrapping arithmetic involved)."""
    s = sum(values) % (1 << 64)
    return s - (1 << 64) if s >= 1 << 63 else s


@pytest.mark.parametrize("dtype", WORDS)
@pytest.mark.parametrize("copy", [True, False])
def test_copy_fingerprint_matches_torch_for_every_word_width(dtype: type, copy: bool) -> None:
    # a window of 11 words in rows of 19 words, from word 5 on, with first_row 40
    rng = np.random.default_rng(np.dtype(dtype).itemsize)
    src = rng.integers(0, 256, 30 * 19 * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)
    src[::7] = np.array(-1).astype(dtype)  # all-ones words: negative when signed
    rows, cols, start, stride = 29, 11, 5, 19
    window = np.lib.stride_tricks.as_strided(
        src[start:], (rows, cols), (stride * src.itemsize, src.itemsize)
    )
    dst = np.zeros(rows * cols if copy else 0, dtype=dtype)
    col_sums = np.full(cols, 3, dtype=np.int64)  # sums are added to what is there
    total, weighted, _ = kernels.copy_fingerprint(src, start, stride, rows, cols, dst, col_sums, 40)
    want_total, want_weighted, want_cols = torch_sums(window, 40)
    assert (total, weighted) == (want_total, want_weighted)
    np.testing.assert_array_equal(col_sums, want_cols + 3)
    if copy:
        np.testing.assert_array_equal(dst.reshape(rows, cols), window)


def test_copy_fingerprint_sums_wrap_modulo_2_64() -> None:
    # int64 words of 0x7F7F...: every row sum, and the totals, overflow int64
    src = np.full(64 * 8, 0x7F7F7F7F7F7F7F7F, dtype=np.int64)
    col_sums = np.zeros(8, dtype=np.int64)
    total, weighted, _ = kernels.copy_fingerprint(
        src, 0, 8, 64, 8, np.empty(0, np.int64), col_sums, 0
    )
    v = 0x7F7F7F7F7F7F7F7F
    assert total == exact_mod64([v] * 512)
    assert weighted == exact_mod64([(r + 1) * 8 * v for r in range(64)])
    assert col_sums.tolist() == [exact_mod64([v] * 64)] * 8
    assert total == torch_sums(src.reshape(64, 8), 0)[0]


def test_wrap64() -> None:
    assert kernels.wrap64(1 << 63) == -(1 << 63)
    assert kernels.wrap64((1 << 63) - 1) == (1 << 63) - 1
    assert kernels.wrap64(-1) == -1 and kernels.wrap64(1 << 64) == 0
    assert kernels.wrap64(3 * (1 << 64) + 5) == 5


# -- count_either


def counted(x: np.ndarray, a: int, b: int) -> int:
    return int(((x == a) | (x == b)).sum())


@pytest.mark.parametrize("a, b", [E8M0_INVALID, E4M3_NAN, (7, 7)])
def test_count_either_matches_bincount(a: int, b: int) -> None:
    x = np.random.default_rng(3).integers(0, 256, 100_003, dtype=np.uint8)
    counts = torch.bincount(torch.from_numpy(x), minlength=256)
    want = int(counts[a] + (counts[b] if b != a else 0))
    assert kernels.count_either(x, a, b) == want == counted(x, a, b)


def test_count_either_reads_a_2d_window_in_place_and_nothing_around_it() -> None:
    # the bytes around the window are all matches; none of them may be counted
    buf = np.full(3 + 40 * 64, 0xFF, dtype=np.uint8)
    rows = buf[3:].reshape(40, 64)  # misaligned, wider rows
    inner = np.random.default_rng(4).integers(0, 256, (30, 20), dtype=np.uint8)
    rows[5:35, 17:37] = inner
    window = rows[5:35, 17:37]
    assert not window.flags.c_contiguous
    assert kernels.count_either(window, 0x00, 0xFF) == counted(inner, 0x00, 0xFF)
    assert kernels.count_either(window[::2], 0x00, 0xFF) == counted(
        inner[::2], 0x00, 0xFF
    )  # a row step
    assert kernels.count_either(window[:, ::3], 0x00, 0xFF) == counted(
        inner[:, ::3], 0x00, 0xFF
    )  # a column step
    assert kernels.count_either(np.ascontiguousarray(inner.T).T, 0x00, 0xFF) == counted(
        inner, 0x00, 0xFF
    )


def test_count_either_any_shape() -> None:
    x = np.random.default_rng(5).integers(0, 4, (3, 4, 5), dtype=np.uint8)
    assert kernels.count_either(x, 1, 2) == counted(x, 1, 2)
    assert kernels.count_either(x[:, 1:3, ::2], 1, 2) == counted(x[:, 1:3, ::2], 1, 2)
    assert kernels.count_either(np.uint8(1).reshape(()), 1, 9) == 1
    assert kernels.count_either(x[:0], 1, 2) == 0
    assert kernels.count_either(np.zeros((4, 0), np.uint8), 0, 0) == 0
    assert kernels.count_either(np.ones((3, 5), dtype=np.uint8), 1, 1) == 15


def test_count_either_reads_the_bytes_of_wider_elements() -> None:
    f = np.array([[0.0, np.nan], [1.0, -0.0]], dtype=np.float32)  # F32 scale rows, as bytes
    b = f.view(np.uint8)
    assert kernels.count_either(b, 0x00, 0x80) == counted(b, 0x00, 0x80) == 4 + 2 + 3 + 4


# -- bf16_fingerprint


def test_bf16_fingerprint_matches_torch_and_counts_every_non_finite_pattern() -> None:
    # all 65536 bf16 bit patterns, shuffled, in rows of 16 elements (4 int64 words)
    bits = np.random.default_rng(6).permutation(
        np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    )
    x = bits.reshape(-1, 16)
    words = x.view(np.int64)
    col_sums = np.full(4, 5, dtype=np.int64)
    total, weighted, bad = kernels.bf16_fingerprint(words, col_sums)
    want_total, want_weighted, want_cols = torch_sums(words, 0)
    assert (int(total), int(weighted)) == (want_total, want_weighted)
    np.testing.assert_array_equal(col_sums, want_cols + 5)
    values = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    assert (
        int(bad) == int((~torch.isfinite(values)).sum()) == 2 * 128
    )  # exponent all ones: 2 signs x 128 mantissas


def test_bf16_fingerprint_counts_inf_and_nan_where_they_are() -> None:
    x = torch.randn(37, 64).to(torch.bfloat16)
    x[3, 5], x[9, 0], x[36, 63], x[20, 17] = float("inf"), float("nan"), float("-inf"), 3e38
    _, _, bad = kernels.bf16_fingerprint(
        x.view(torch.int16).numpy().view(np.int64), np.zeros(16, np.int64)
    )
    assert int(bad) == 3


# -- decode kernels: what they accept and refuse


def _fp4_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    packed = rng.integers(0, 256, (9, 96), dtype=np.uint8)
    scale = rng.integers(100, 150, (9, 6), dtype=np.uint8)
    want = ref_fp4(packed, scale).astype(ml_dtypes.bfloat16).view(np.int16)
    return packed, scale, np.ascontiguousarray(want).view(np.int32)


def test_decode_fp4_kernel_reads_read_only_and_column_strided_inputs() -> None:
    packed, scale, want = _fp4_case()
    table = scaled_table("fp4").numpy()
    ro = packed.copy()
    ro.flags.writeable = False
    out = np.zeros_like(want)
    kernels.decode_fp4(ro, scale, table, out)
    np.testing.assert_array_equal(out, want)
    out[:] = 0
    kernels.decode_fp4(np.ascontiguousarray(packed.T).T, scale, table, out)  # strides (1, 9)
    np.testing.assert_array_equal(out, want)


def test_decode_kernels_refuse_a_wrong_table_or_out() -> None:
    # the kernels index without bounds checks: a table or out they could overrun is refused up front
    packed, scale, want = _fp4_case()
    table = scaled_table("fp4").numpy()
    with pytest.raises(ValueError, match="table"):
        kernels.decode_fp4(packed, scale, table[:256], np.zeros_like(want))
    with pytest.raises(ValueError, match="table"):
        kernels.decode_fp4(packed, scale, scaled_table("fp8").numpy(), np.zeros_like(want))
    with pytest.raises(ValueError, match="int32"):
        kernels.decode_fp4(packed, scale, table, np.zeros(want.shape, dtype=np.int64))
    with pytest.raises(ValueError, match="disagree"):
        kernels.decode_fp4(packed, scale[:, :5], table, np.zeros_like(want))
    with pytest.raises(ValueError, match="disagree"):
        kernels.decode_fp8(
            np.zeros((4, 40), np.uint8),
            np.ones((1, 1), np.uint8),
            scaled_table("fp8").numpy(),
            np.zeros((4, 40), dtype=np.int16),
            32,
        )
    with pytest.raises(ValueError, match="int16"):
        kernels.decode_fp8(
            np.zeros((4, 40), np.uint8),
            np.ones((1, 2), np.uint8),
            scaled_table("fp8").numpy(),
            np.zeros((40, 4), dtype=np.int16).T,
            32,
        )
    with pytest.raises(ValueError, match="2-D uint8"):
        kernels.decode_fp8(
            np.zeros((4, 40), np.int8),
            np.ones((1, 2), np.uint8),
            scaled_table("fp8").numpy(),
            np.zeros((4, 40), dtype=np.int16),
            32,
        )


FLOATING = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64}


def _floats(dtype: str, n: int, seed: int) -> np.ndarray:
    """``n`` values of ``dtype`` over its whole finite range (random bits, non-finite ones
    replaced), with the edges a lane test could get wrong: the largest finite, -0, subnormals."""
    np_dtype = np.dtype(FLOATING[dtype])
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n * np_dtype.itemsize, dtype=np.uint8).view(np_dtype)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bits
        values = np.where(np.isfinite(raw.astype(np.float64)), raw, np_dtype.type(1.5))
    values[:4] = [
        np.finfo(np_dtype).max,
        -np.finfo(np_dtype).max,
        -0.0,
        np.finfo(np_dtype).smallest_subnormal,
    ]
    return values.astype(np_dtype)


@pytest.mark.parametrize("dtype", sorted(FLOATING))
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("cols", [1, 2, 3, 4, 6, 8])  # rows of every word width the dtype allows
def test_the_fingerprint_pass_finds_nan_and_inf_exactly_where_numpy_does(
    dtype: str, bad: float | None, cols: int
) -> None:
    np_dtype = np.dtype(FLOATING[dtype])
    rows = 9
    for at in range(rows * cols):  # every position of the one bad value, or none
        values = _floats(dtype, rows * cols, seed=at)
        if bad is not None:
            values[at] = bad
        want = not np.isfinite(values.astype(np.float64)).all()  # numpy's (ml_dtypes') own reading
        window = values.view(np.uint8).reshape(rows, cols * np_dtype.itemsize)
        fp = HostFingerprint(window.shape[1], finite=dtype)
        fp.add(window, 0)
        assert fp.nonfinite == want, (dtype, bad, cols, at)
        assert fp.value() == host_fingerprint(window)  # the triple is the plain pass's
        if bad is None:
            break


@pytest.mark.parametrize("dtype", sorted(FLOATING))
def test_a_batch_pass_flags_each_window_holding_nan_or_inf(dtype: str) -> None:
    np_dtype = np.dtype(FLOATING[dtype])
    n, per = 40, 6  # 40 windows of 2 rows of `per` values, every 3rd with one inf or NaN
    values = _floats(dtype, n * 2 * per, seed=7)
    for k in range(0, n, 3):
        values[k * 2 * per + (k % (2 * per))] = np.nan if k % 2 else -np.inf
    src = values.view(np.uint8)
    row = per * np_dtype.itemsize
    width = np.full(n, row, np.int64)
    words = word_widths(width)
    lanes = np.array([nonfinite_lanes(dtype, int(w)) for w in words], np.int64)
    flags = np.zeros(n, np.int64)
    fps = np.zeros((n, 3), np.int64)
    kernels.gather_windows(
        src,
        np.arange(n, dtype=np.int64) * 2 * row,
        np.full(n, 2, np.int64),
        width,
        width,
        words,
        np.empty(0, np.uint8),
        np.zeros(n, np.int64),
        fps,
        lanes,
        flags,
    )
    want = [k % 3 == 0 for k in range(n)]
    assert (flags != 0).tolist() == want
    for k in range(n):
        assert tuple(fps[k]) == host_fingerprint(
            src[k * 2 * row : (k + 1) * 2 * row].reshape(2, row)
        )


def test_integer_and_fp8_dtypes_are_never_looked_at() -> None:
    for dtype in ("I32", "U8", "F8_E4M3", "F8_E5M2", "I64", "BOOL"):
        assert nonfinite_lanes(dtype, 8) == (0, 0, 0)
    assert nonfinite_lanes("F32", 2) == (0, 0, 0)  # words narrower than a value: never made
