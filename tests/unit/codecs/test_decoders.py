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


# Every decode test runs both CPU paths: the compiled kernels (what a CPU load runs) and the torch
# ops (what a CUDA load runs); each is checked against ml_dtypes, never against the other.
PATHS = pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "torch"])


def in_map(a: np.ndarray, skew: int = 3) -> np.ndarray:
    """A copy of ``a`` placed ``skew`` bytes into a buffer, as a tensor lies at any offset in a shard map."""
    buf = np.zeros(a.nbytes + skew, dtype=np.uint8)
    out = buf[skew:].reshape(a.shape)
    out[...] = a
    return out


@PATHS
def test_worked_example_of_format_md(use_kernels: bool) -> None:
    # bytes 0x72 0x0F with scale 128 (2^1) decode to 2, 12, -12, 0
    packed = torch.tensor([[0x72, 0x0F] + [0] * 14], dtype=torch.uint8)
    out = torch.empty(1, 32, dtype=torch.bfloat16)
    formats.decode_fp4(packed, torch.tensor([[128]], dtype=torch.uint8), out, use_kernels=use_kernels)
    assert out[0, :4].tolist() == [2.0, 12.0, -12.0, 0.0]
    assert not torch.signbit(out[0, 3]) and out[0, 4:].eq(0).all()  # code 0 is +0; the zero bytes stay zero


@PATHS
def test_all_fp4_byte_pairs_and_scales_match_ml_dtypes(use_kernels: bool) -> None:
    # every byte value (so every pair of the 16 codes, both nibble orders) under every legal scale
    packed = np.tile(np.arange(256, dtype=np.uint8), (254, 1))  # [254, 256] -> K = 512
    scale = np.repeat(np.arange(1, 255, dtype=np.uint8)[:, None], 512 // 32, axis=1)
    out = torch.empty(254, 512, dtype=torch.bfloat16)
    formats.decode_fp4(torch.from_numpy(packed), torch.from_numpy(scale), out, use_kernels=use_kernels)
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


@PATHS
def test_every_e4m3_code_with_block_scales_matches_ml_dtypes(use_kernels: bool) -> None:
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # NaN codes are refused before decode
    w = np.tile(codes, (64, 1))  # [64, 254]: rows share codes, blocks differ in scale
    scale = np.array([[120, 127], [127, 134]], dtype=np.uint8)[:, :]
    scale = np.repeat(np.repeat(scale, 1, 0), 1, 1)
    block = 32
    sc = np.tile(scale, (1, 4))[:, :8]  # [2, 8] blocks of 32 cover [64, 254]
    out = torch.empty(64, codes.size, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(sc), out, block=block, use_kernels=use_kernels)
    want = ref_fp8(w, sc, block)
    np.testing.assert_array_equal(out.float().numpy(), want)
    np.testing.assert_array_equal(bits(out), want.astype(ml_dtypes.bfloat16).view(np.uint16))


@PATHS
def test_every_e4m3_code_under_every_scale_matches_ml_dtypes(use_kernels: bool) -> None:
    # all 254 non-NaN codes (K = 254: 7 full blocks of 32 and a ragged one of 30) under all
    # scales 1..254, one per row block; the top scales overflow bf16 to +-inf in both
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]
    w = np.tile(codes, (254 * 32, 1))
    sc = np.repeat(np.arange(1, 255, dtype=np.uint8)[:, None], 8, axis=1)
    out = torch.empty(w.shape, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(sc), out, block=32, use_kernels=use_kernels)
    with np.errstate(over="ignore"):
        want = ref_fp8(w, sc, 32).astype(ml_dtypes.bfloat16)
    assert np.isinf(want.astype(np.float32)).any() and np.isfinite(want.astype(np.float32)).mean() > 0.9
    np.testing.assert_array_equal(bits(out), want.view(np.uint16))


@PATHS
@pytest.mark.parametrize("block, n, k", [(32, 70, 45), (128, 300, 200), (128, 129, 1), (128, 128, 256), (32, 33, 71),
                                         (12, 30, 50)])  # (12: words straddle blocks)
def test_fp8_decode_with_partial_blocks(use_kernels: bool, block: int, n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    w = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    w[:, ::5] |= 0x80  # negative codes too
    s = rng.integers(110, 145, (-(-n // block), -(-k // block)), dtype=np.uint8)
    out = torch.empty(n, k, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(s), out, block=block, use_kernels=use_kernels)
    np.testing.assert_array_equal(bits(out), ref_fp8(w, s, block).astype(ml_dtypes.bfloat16).view(np.uint16))


@PATHS
@pytest.mark.parametrize("tp", [2, 4])
def test_fp4_w2_column_windows_decode_in_place(use_kernels: bool, tp: int) -> None:
    # format.md's w2 cut: packed bytes [r*I/(2tp), (r+1)*I/(2tp)) and scale groups [r*I/(32tp), ...)
    # of every row, read where they lie in a (misaligned) map: strided rows, no copy first
    rng = np.random.default_rng(tp)
    n, inter = 24, 2304
    packed = in_map(rng.integers(0, 256, (n, inter // 2), dtype=np.uint8))
    scale = in_map(rng.integers(110, 145, (n, inter // 32), dtype=np.uint8), skew=5)
    for r in range(tp):
        pw = packed[:, r * inter // (2 * tp):(r + 1) * inter // (2 * tp)]
        sw = scale[:, r * inter // (32 * tp):(r + 1) * inter // (32 * tp)]
        tw = torch.from_numpy(pw)
        assert not tw.is_contiguous()
        out = torch.empty(n, inter // tp, dtype=torch.bfloat16)
        formats.decode_fp4(tw, torch.from_numpy(sw), out, use_kernels=use_kernels)
        want = ref_fp4(np.ascontiguousarray(pw), np.ascontiguousarray(sw))
        np.testing.assert_array_equal(bits(out), want.astype(ml_dtypes.bfloat16).view(np.uint16))


@PATHS
@pytest.mark.parametrize("block", [32, 128])
def test_fp8_row_and_column_windows_decode_in_place(use_kernels: bool, block: int) -> None:
    # dense FP8 cuts on whole scale blocks; the last column block of the tensor is ragged
    rng = np.random.default_rng(block)
    n, k = 3 * block + 5, 4 * block + 17
    w = in_map(rng.integers(0, 0x7E, (n, k), dtype=np.uint8) | (rng.integers(0, 2, (n, k), dtype=np.uint8) << 7))
    s = in_map(rng.integers(110, 145, (-(-n // block), -(-k // block)), dtype=np.uint8), skew=1)
    cuts = [((0, n), (block, 3 * block)), ((0, n), (2 * block, k)), ((block, 2 * block), (0, k)), ((2 * block, n), (0, k))]
    for (r0, r1), (c0, c1) in cuts:
        ww, sw = w[r0:r1, c0:c1], s[r0 // block:-(-r1 // block), c0 // block:-(-c1 // block)]
        out = torch.empty(r1 - r0, c1 - c0, dtype=torch.bfloat16)
        formats.decode_fp8(torch.from_numpy(ww), torch.from_numpy(sw), out, block=block, use_kernels=use_kernels)
        want = ref_fp8(np.ascontiguousarray(ww), np.ascontiguousarray(sw), block)
        np.testing.assert_array_equal(bits(out), want.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_cpu_decodes_run_the_kernels_unless_the_scale_is_f32(monkeypatch: pytest.MonkeyPatch) -> None:
    # the path a CPU load takes (use_kernels left to choose) is the compiled one; F32 scales are not
    calls: list[str] = []
    for name in ("decode_fp4", "decode_fp8"):
        real = getattr(formats.kernels, name)
        monkeypatch.setattr(formats.kernels, name, lambda *a, _real=real, _name=name: (calls.append(_name), _real(*a))[1])
    out4, out8 = torch.empty(2, 32, dtype=torch.bfloat16), torch.empty(2, 3, dtype=torch.bfloat16)
    formats.decode_fp4(torch.full((2, 16), 0x22, dtype=torch.uint8), torch.full((2, 1), 127, dtype=torch.uint8), out4)
    formats.decode_fp8(torch.full((2, 3), 0x38, dtype=torch.uint8), torch.full((1, 1), 128, dtype=torch.uint8), out8, block=32)
    assert calls == ["decode_fp4", "decode_fp8"]
    assert out4.eq(1.0).all() and out8.eq(2.0).all()  # E2M1 code 2 = 1.0; E4M3 0x38 = 1.0, times 2^1
    formats.decode_fp8(torch.full((2, 3), 0x38, dtype=torch.uint8), torch.full((1, 1), 0.25), out8, block=32)
    assert calls == ["decode_fp4", "decode_fp8"] and out8.eq(0.25).all()


def test_kernel_path_refuses_what_it_cannot_decode() -> None:
    w, out = torch.zeros(2, 3, dtype=torch.uint8), torch.empty(2, 3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="E8M0"):
        formats.decode_fp8(w, torch.ones(1, 1), out, block=32, use_kernels=True)
    with pytest.raises(ValueError, match="multiple of 32"):
        formats.decode_fp4(torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2, 0, dtype=torch.uint8),
                           torch.empty(2, 16, dtype=torch.bfloat16))


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


@PATHS
@pytest.mark.parametrize("k", [10240, 3000])  # row steps of 6 and 21: neither divides the block of 32
def test_wide_fp8_and_fp4_decodes_in_row_steps_match_the_reference(use_kernels: bool, k: int) -> None:
    rng = np.random.default_rng(k)
    w = rng.integers(0, 0x7E, (100, k), dtype=np.uint8)
    s = rng.integers(100, 150, (4, -(-k // 32)), dtype=np.uint8)
    out = torch.empty(100, k, dtype=torch.bfloat16)
    formats.decode_fp8(torch.from_numpy(w), torch.from_numpy(s), out, block=32, use_kernels=use_kernels)
    np.testing.assert_array_equal(bits(out), ref_fp8(w, s, 32).astype(ml_dtypes.bfloat16).view(np.uint16))
    packed = rng.integers(0, 256, (50, 2048), dtype=np.uint8)
    scale = rng.integers(100, 150, (50, 128), dtype=np.uint8)
    out4 = torch.empty(50, 4096, dtype=torch.bfloat16)
    formats.decode_fp4(torch.from_numpy(packed), torch.from_numpy(scale), out4, rows_per_step=7, use_kernels=use_kernels)
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(50, 4096)
    e2m1 = np.array(formats.E2M1_VALUES, dtype=np.float32)[codes] * np.exp2(np.repeat(scale, 32, 1).astype(np.float32) - 127)
    np.testing.assert_array_equal(bits(out4), e2m1.astype(ml_dtypes.bfloat16).view(np.uint16))
