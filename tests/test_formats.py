"""Decoders against ml_dtypes (an independent implementation), never against themselves."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from tpload import formats

from .reference import fp4 as ref_fp4
from .reference import fp8 as ref_fp8


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def test_worked_example_of_format_md() -> None:
    # bytes 0x72 0x0F with scale 128 (2^1) decode to 2, 12, -12, 0
    packed = torch.tensor([[0x72, 0x0F] + [0] * 14], dtype=torch.uint8)
    out = torch.empty(1, 32, dtype=torch.bfloat16)
    formats.decode_fp4(packed, torch.tensor([[128]], dtype=torch.uint8), out)
    assert out[0, :4].tolist() == [2.0, 12.0, -12.0, 0.0]


def test_all_fp4_byte_pairs_and_scales_match_ml_dtypes() -> None:
    # every byte value (so every pair of the 16 codes, both nibble orders) under every legal scale
    packed = np.tile(np.arange(256, dtype=np.uint8), (254, 1))  # [254, 256] -> K = 512
    scale = np.repeat(np.arange(1, 255, dtype=np.uint8)[:, None], 512 // 32, axis=1)
    out = torch.empty(254, 512, dtype=torch.bfloat16)
    formats.decode_fp4(torch.from_numpy(packed), torch.from_numpy(scale), out)
    want = ref_fp4(packed, scale)
    finite = np.isfinite(want)
    assert finite.sum() > 0.9 * want.size  # the overflowing corner (scale 254, |v| >= 2) is not finite in fp32 either
    got = out.float().numpy()
    np.testing.assert_array_equal(got[finite], want[finite])
    np.testing.assert_array_equal(bits(out)[finite], want[finite].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert not np.isfinite(got[~finite]).any()


def test_e2m1_table_is_the_ml_dtypes_table() -> None:
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert list(ref) == list(formats.E2M1_VALUES)
    assert np.signbit(ref[8])  # code 8 is -0


def test_e8m0_range_matches_ml_dtypes() -> None:
    b = np.arange(1, 255, dtype=np.uint8)
    want = b.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    np.testing.assert_array_equal(formats.e8m0_to_f32(torch.from_numpy(b)).numpy(), want)
    np.testing.assert_array_equal(formats.e8m0_to_bf16(torch.from_numpy(b)).float().numpy(), want)


def test_every_e4m3_code_with_block_scales_matches_ml_dtypes() -> None:
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # NaN codes are refused before decode
    w = np.tile(codes, (64, 1))  # [64, 254]: rows share codes, blocks differ in scale
    scale = np.array([[120, 127], [127, 134]], dtype=np.uint8)[:, :]
    scale = np.repeat(np.repeat(scale, 1, 0), 1, 1)
    block = 32
    sc = np.tile(scale, (1, 4))[:, :8]  # [2, 8] blocks of 32 cover [64, 254]
    out = torch.empty(64, codes.size, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(sc), out, block=block)
    want = ref_fp8(w, sc, block)
    np.testing.assert_array_equal(out.float().numpy(), want)
    np.testing.assert_array_equal(bits(out), want.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_fp8_decode_with_partial_blocks() -> None:
    rng = np.random.default_rng(1)
    w = rng.integers(0, 0x7E, (70, 45), dtype=np.uint8)
    s = rng.integers(120, 135, (3, 2), dtype=np.uint8)
    out = torch.empty(70, 45, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(s), out, block=32)
    np.testing.assert_array_equal(out.float().numpy(), ref_fp8(w, s, 32))


def test_fp8_with_f32_scale_inv() -> None:
    w = np.arange(0, 0x7E, dtype=np.uint8).reshape(3, 42)
    s = np.array([[0.5, 0.25]], dtype=np.float32)
    out = torch.empty(3, 42, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(s), out, block=32)
    vals = w.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(s, 32, axis=1)[:, :42]
    np.testing.assert_array_equal(bits(out), vals.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_f16_to_bf16_rounds_to_nearest_even_like_ml_dtypes() -> None:
    h = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    out = torch.empty(h.size, dtype=torch.bfloat16)
    formats.f16_to_bf16(torch.from_numpy(h.copy()), out)
    np.testing.assert_array_equal(bits(out), h.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("bad", [0x00, 0xFF])
def test_bad_e8m0_bytes_are_counted(bad: int) -> None:
    s = torch.full((4, 4), 127, dtype=torch.uint8)
    s[2, 3] = bad
    assert int(formats.count_bad_e8m0(s)) == 1
    assert int(formats.count_bad_e8m0(s[:, :3])) == 0  # a strided window without the bad byte


def test_e4m3_nan_codes_are_counted() -> None:
    w = torch.tensor([0x7F, 0xFF, 0x7E, 0xFE, 0x00], dtype=torch.uint8)
    assert int(formats.count_bad_e4m3(w)) == 2


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_not_finite_sees_nan_and_both_infinities(value: float) -> None:
    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert int(formats.not_finite(t)) == 0
    t[17, 3] = value
    assert int(formats.not_finite(t)) == 1


def test_dtype_table_is_the_seeds() -> None:
    assert set(formats.DTYPES) == {"BF16", "F32", "F16", "F8_E4M3", "F8_E8M0", "U8", "I8", "I64"}
    assert formats.DTYPES["F16"].served == torch.bfloat16


@pytest.mark.parametrize("k", [10240, 3000])  # row steps of 6 and 21: neither divides the block of 32
def test_wide_fp8_and_fp4_decodes_in_row_steps_match_the_reference(k: int) -> None:
    rng = np.random.default_rng(k)
    w = rng.integers(0, 0x7E, (100, k), dtype=np.uint8)
    s = rng.integers(100, 150, (4, -(-k // 32)), dtype=np.uint8)
    out = torch.empty(100, k, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(s), out, block=32)
    np.testing.assert_array_equal(bits(out), ref_fp8(w, s, 32).astype(ml_dtypes.bfloat16).view(np.uint16))
    packed = rng.integers(0, 256, (50, 2048), dtype=np.uint8)
    scale = rng.integers(100, 150, (50, 128), dtype=np.uint8)
    out4 = torch.empty(50, 4096, dtype=torch.bfloat16)
    formats.decode_fp4(torch.from_numpy(packed), torch.from_numpy(scale), out4, rows_per_step=7)
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(50, 4096)
    e2m1 = np.array(formats.E2M1_VALUES, dtype=np.float32)[codes] * np.exp2(np.repeat(scale, 32, 1).astype(np.float32) - 127)
    np.testing.assert_array_equal(bits(out4), e2m1.astype(ml_dtypes.bfloat16).view(np.uint16))
