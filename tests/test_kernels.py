"""The compiled CPU kernels agree bit for bit with the torch code they replace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpload import formats
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
    assert count_either(x, *formats.E8M0_INVALID) == int(formats.count_bad_e8m0(t))
    assert count_either(x, *formats.E4M3_NAN) == int(formats.count_bad_e4m3(t))
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
