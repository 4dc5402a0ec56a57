"""The compiled CPU kernels agree bit for bit with the torch code they replace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpload import formats, kernels
from tpload.kernels import HostFingerprint, bf16_fingerprint, count_either, wrap64
from tpload.verify import fingerprint


def _copy_in_blocks(stored: np.ndarray, rows: tuple[int, int], cols: tuple[int, int], block: int) -> tuple[np.ndarray, tuple]:
    fp = HostFingerprint(cols[1] - cols[0])
    assert fp.fits(stored, cols[0])
    out = np.full((rows[1] - rows[0], cols[1] - cols[0]), 0xAA, dtype=np.uint8)
    for b0 in range(rows[0], rows[1], block):
        b1 = min(rows[1], b0 + block)
        fp.copy(stored, (b0, b1), cols[0], out[b0 - rows[0]:b1 - rows[0]], b0 - rows[0])
    return out, fp.value()


@pytest.mark.parametrize("row_bytes, cols", [(64, (16, 48)), (36, (12, 24)), (38, (2, 8)), (7, (0, 7)), (1152, (576, 1152))])
def test_copy_fingerprint_matches_slice_and_torch_fingerprint(row_bytes: int, cols: tuple[int, int]) -> None:
    # Words of every width (8, 4, 2 and 1 bytes), values that overflow int64 sums, and row blocks.
    stored = np.random.default_rng(row_bytes).integers(0, 256, (257, row_bytes), dtype=np.uint8)
    stored[::3] = 0xFF  # all-ones words, negative as signed, push the int64 sums around
    rows = (5, 250)
    out, fp = _copy_in_blocks(stored, rows, cols, block=17)
    window = stored[rows[0]:rows[1], cols[0]:cols[1]]
    assert np.array_equal(out, window)
    assert fp == tuple(fingerprint(torch.from_numpy(np.ascontiguousarray(window))).tolist())


def test_fingerprint_sums_wrap_like_int64() -> None:
    stored = np.full((4096, 64), 0x7F, dtype=np.uint8)  # int64 words of 0x7F7F...: the sums overflow
    out, fp = _copy_in_blocks(stored, (0, 4096), (0, 64), block=4096)
    assert fp == tuple(fingerprint(torch.from_numpy(out)).tolist())
    assert wrap64(1 << 63) == -(1 << 63) and wrap64(-1) == -1


def test_misaligned_words_are_refused_not_misread() -> None:
    buf = np.zeros(64 * 9 + 3, dtype=np.uint8)
    stored = buf[3:3 + 64 * 9].reshape(9, 64)
    assert not HostFingerprint(64).fits(stored, 0)
    assert not HostFingerprint(32).fits(np.zeros((4, 64), dtype=np.uint8), 4)


def test_count_either_agrees_with_bincount() -> None:
    x = np.random.default_rng(3).integers(0, 256, 100_003, dtype=np.uint8)
    t = torch.from_numpy(x)
    counts = torch.bincount(t, minlength=256)  # the reference: a plain histogram
    assert count_either(x, *formats.E8M0_INVALID) == int(counts[0x00] + counts[0xFF]) == int(formats.count_bad_e8m0(t))
    assert count_either(x, *formats.E4M3_NAN) == int(counts[0x7F] + counts[0xFF]) == int(formats.count_bad_e4m3(t))
    assert count_either(x[:0], 0, 255) == 0
    assert count_either(np.ones((3, 5), dtype=np.uint8), 1, 1) == 15


def test_bf16_fingerprint_matches_torch_and_counts_non_finite() -> None:
    x = torch.randn(37, 64).to(torch.bfloat16)
    x[3, 5], x[9, 0], x[36, 63] = float("inf"), float("nan"), float("-inf")
    got = bf16_fingerprint(x.view(torch.uint16).numpy())
    assert got is not None
    fp, bad = got
    assert fp == tuple(fingerprint(x.view(torch.uint8)).tolist()) and bad == 3
    assert bf16_fingerprint(torch.zeros(4, 6, dtype=torch.bfloat16).view(torch.uint16).numpy()) is None  # 12-byte rows


def _fp4_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    packed = rng.integers(0, 256, (9, 96), dtype=np.uint8)
    scale = rng.integers(100, 150, (9, 6), dtype=np.uint8)
    want = torch.empty(9, 192, dtype=torch.bfloat16)
    formats.decode_fp4(torch.from_numpy(packed), torch.from_numpy(scale), want, use_kernels=False)
    return packed, scale, want.view(torch.int32).numpy()


def test_decode_kernels_read_read_only_and_column_strided_inputs() -> None:
    # a read-only map and a transposed view both decode to what the torch path gives
    packed, scale, want = _fp4_case(np.random.default_rng(5))
    table = formats._scaled_table("fp4", "cpu").numpy()
    ro = packed.copy()
    ro.flags.writeable = False
    out = np.zeros_like(want)
    kernels.decode_fp4(ro, scale, table, out)
    assert np.array_equal(out, want)
    out[:] = 0
    kernels.decode_fp4(np.ascontiguousarray(packed.T).T, scale, table, out)  # strides (1, 9)
    assert np.array_equal(out, want)


def test_decode_kernels_refuse_a_wrong_table_or_out() -> None:
    # the kernels index without bounds checks: a table or out they could overrun is refused up front
    packed, scale, want = _fp4_case(np.random.default_rng(6))
    table = formats._scaled_table("fp4", "cpu").numpy()
    with pytest.raises(ValueError, match="table"):
        kernels.decode_fp4(packed, scale, table[:256], np.zeros_like(want))
    with pytest.raises(ValueError, match="int32"):
        kernels.decode_fp4(packed, scale, table, np.zeros(want.shape, dtype=np.int64))
    with pytest.raises(ValueError, match="disagree"):
        kernels.decode_fp4(packed, scale[:, :5], table, np.zeros_like(want))
    codes = np.zeros((4, 40), dtype=np.uint8)
    with pytest.raises(ValueError, match="disagree"):
        kernels.decode_fp8(codes, np.ones((1, 1), dtype=np.uint8), formats._scaled_table("fp8", "cpu").numpy(),
                           np.zeros((4, 40), dtype=np.int16), 32)
