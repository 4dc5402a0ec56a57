"""Decoders against ml_dtypes (an independent implementation), never against themselves.

Every decode runs by each of a codec's three implementations: ``decode`` with host arrays (the
compiled kernel a CPU load runs), ``decode`` with torch tensors (``decode_torch``, what a device
load runs) and ``reference`` (the numpy decode a sampled check compares with). Each is checked
against tests/reference.py (ml_dtypes), so a sampled check compares two independent decoders.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from tests.reference import fp4 as ref_fp4
from tests.reference import fp8 as ref_fp8
from tpload.codecs import tables
from tpload.codecs.base import Codec, Fit
from tpload.codecs.fp4_e8m0 import FP4
from tpload.codecs.fp4_e8m0 import decode_torch as fp4_decode_torch
from tpload.codecs.fp8_block import FP8
from tpload.codecs.fp8_block import decode_torch as fp8_decode_torch
from tpload.codecs.plain import PLAIN
from tpload.kernels import compiled as kernels
from tpload.kernels.calls import Kernels
from tpload.model.meta import TensorMeta

PATHS = pytest.mark.parametrize("path", ["kernel", "torch", "reference"])
LEGAL_E8M0 = np.arange(1, 255, dtype=np.uint8)
NON_NAN_E4M3 = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)


def meta(name: str, dtype: str, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(name, "model.safetensors", dtype, shape)


def fp4_fit(n: int, k: int) -> Fit:
    fit = FP4.fit(meta("w", "U8", (n, k // 2)), meta("s", "F8_E8M0", (n, k // 32)))
    assert isinstance(fit, Fit)
    return fit


def fp8_fit(n: int, k: int, block: int, scale_dtype: str = "F8_E8M0") -> Fit:
    fit = FP8.fit(
        meta("w", "F8_E4M3", (n, k)),
        meta("s", scale_dtype, (-(-n // block), -(-k // block))),
        block=block,
    )
    assert isinstance(fit, Fit)
    return fit


def decode(
    codec: Codec,
    path: str,
    weight: np.ndarray,
    scale: np.ndarray | None,
    shape: tuple[int, int],
    fit: Fit,
) -> np.ndarray:
    """The bf16 bits (uint16) of ``weight`` decoded by one of the codec's three implementations."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    if path == "kernel":
        codec.decode(weight, scale, out, fit)
    elif path == "torch":
        codec.decode(
            torch.from_numpy(weight), None if scale is None else torch.from_numpy(scale), out, fit
        )
    else:
        codec.reference(weight, scale, out, fit)
    return out.view(torch.int16).numpy().view(np.uint16)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """ml_dtypes' float32 -> bf16 (round to nearest even), as bits."""
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def in_map(a: np.ndarray, skew: int = 3) -> np.ndarray:
    """A copy of ``a`` placed ``skew`` bytes into a buffer, as a tensor lies at any offset in a
    shard map."""
    buf = np.zeros(a.nbytes + skew, dtype=np.uint8)
    out = buf[skew:].reshape(a.shape)
    out[...] = a
    return out


# -- the tables


def test_e2m1_table_is_the_ml_dtypes_table() -> None:
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert list(ref) == list(tables.E2M1_VALUES)
    np.testing.assert_array_equal(tables.e2m1_values(), ref)
    assert np.signbit(ref[8]) and np.signbit(tables.e2m1_values()[8])  # code 8 is -0


def test_e8m0_conversions_match_ml_dtypes_on_every_legal_byte() -> None:
    want = LEGAL_E8M0.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    np.testing.assert_array_equal(tables.e8m0_to_f32(torch.from_numpy(LEGAL_E8M0)).numpy(), want)
    np.testing.assert_array_equal(
        tables.e8m0_to_bf16(torch.from_numpy(LEGAL_E8M0)).float().numpy(), want
    )
    np.testing.assert_array_equal(tables.e8m0_values(LEGAL_E8M0), want)


def test_e4m3_values_match_ml_dtypes_on_every_code() -> None:
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = tables.e4m3_values()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[[0x7F, 0xFF]]).all() and np.isnan(got).sum() == 2
    np.testing.assert_array_equal(
        got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)]
    )


def test_round_bf16_matches_ml_dtypes_and_keeps_nan() -> None:
    x = (
        np.random.default_rng(0)
        .integers(0, 1 << 32, 200_000, dtype=np.uint64)
        .astype(np.uint32)
        .view(np.float32)
    )
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(tables.round_bf16(x)[finite], bf16_bits(x[finite]))
    assert np.isnan(tables.round_bf16(x[~finite]).view(ml_dtypes.bfloat16).astype(np.float32)).all()


# -- FP4 (E2M1 with E8M0 scales)


@PATHS
def test_fp4_worked_example_of_format_md(path: str) -> None:
    # bytes 0x72 0x0F with scale 128 (2^1) decode to 2, 12, -12, 0
    packed = np.array([[0x72, 0x0F] + [0] * 14], dtype=np.uint8)
    bits = decode(FP4, path, packed, np.array([[128]], dtype=np.uint8), (1, 32), fp4_fit(1, 32))
    values = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    assert values[0, :4].tolist() == [2.0, 12.0, -12.0, 0.0]
    assert bits[0, 3] == 0 and (bits[0, 4:] == 0).all()  # code 0 is +0; the zero bytes stay +0


@PATHS
def test_every_fp4_byte_under_every_scale_matches_ml_dtypes(path: str) -> None:
    # every byte value (every pair of the 16 codes, both nibble orders) under every legal scale,
    # including the corner that overflows to +-inf (scale 254, |v| >= 2): bit for bit
    packed = np.tile(np.arange(256, dtype=np.uint8), (254, 1))  # [254, 256] -> K = 512
    scale = np.repeat(LEGAL_E8M0[:, None], 512 // 32, axis=1)
    got = decode(FP4, path, packed, scale, (254, 512), fp4_fit(254, 512))
    want = ref_fp4(packed, scale)
    assert np.isinf(want).any() and np.isfinite(want).mean() > 0.9
    np.testing.assert_array_equal(got, bf16_bits(want))


@PATHS
@pytest.mark.parametrize("tp", [2, 4])
def test_fp4_column_windows_decode_in_place(path: str, tp: int) -> None:
    # format.md's w2 cut: packed bytes [r*I/(2tp), (r+1)*I/(2tp)) and scale groups [r*I/(32tp), ...)
    # of every row, read where they lie in a misaligned map: strided rows, no copy first
    rng = np.random.default_rng(tp)
    n, inter = 24, 2304
    packed = in_map(rng.integers(0, 256, (n, inter // 2), dtype=np.uint8))
    scale = in_map(rng.integers(110, 145, (n, inter // 32), dtype=np.uint8), skew=5)
    for r in range(tp):
        pw = packed[:, r * inter // (2 * tp) : (r + 1) * inter // (2 * tp)]
        sw = scale[:, r * inter // (32 * tp) : (r + 1) * inter // (32 * tp)]
        assert not pw.flags.c_contiguous and not sw.flags.c_contiguous
        got = decode(FP4, path, pw, sw, (n, inter // tp), fp4_fit(n, inter // tp))
        np.testing.assert_array_equal(
            got, bf16_bits(ref_fp4(np.ascontiguousarray(pw), np.ascontiguousarray(sw)))
        )


@PATHS
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_fp4_read_only_and_column_strided_inputs(path: str) -> None:
    rng = np.random.default_rng(5)
    packed = rng.integers(0, 256, (9, 96), dtype=np.uint8)
    scale = rng.integers(100, 150, (9, 6), dtype=np.uint8)
    want = bf16_bits(ref_fp4(packed, scale))
    ro = packed.copy()
    ro.flags.writeable = False  # a read-only map
    np.testing.assert_array_equal(decode(FP4, path, ro, scale, (9, 192), fp4_fit(9, 192)), want)
    transposed = np.ascontiguousarray(packed.T).T  # strides (1, 9): columns are not runs of bytes
    np.testing.assert_array_equal(
        decode(FP4, path, transposed, scale, (9, 192), fp4_fit(9, 192)), want
    )


@PATHS
def test_fp4_decoded_in_row_blocks_like_the_loader(path: str) -> None:
    # the loader decodes a window in blocks of rows, each with the scale rows scale_rows() names
    rng = np.random.default_rng(7)
    n, k = 50, 4096
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scale = rng.integers(100, 150, (n, k // 32), dtype=np.uint8)
    fit = fp4_fit(n, k)
    step = FP4.row_multiple(fit) * 7
    got = np.concatenate(
        [
            decode(
                FP4,
                path,
                packed[r : r + step],
                scale[slice(*FP4.scale_rows(fit, r, min(n, r + step)))],
                (min(n, r + step) - r, k),
                fit,
            )
            for r in range(0, n, step)
        ]
    )
    np.testing.assert_array_equal(got, bf16_bits(ref_fp4(packed, scale)))


def test_fp4_decode_torch_works_in_row_chunks_of_wide_rows() -> None:
    # DECODE_CHUNK bounds the torch path's indices: 3 rows per step of a [10, 40960] window
    rng = np.random.default_rng(8)
    packed = rng.integers(0, 256, (10, 20480), dtype=np.uint8)
    assert tables.DECODE_CHUNK // 20480 == 3
    scale = rng.integers(100, 150, (10, 40960 // 32), dtype=np.uint8)
    out = torch.empty(10, 40960, dtype=torch.bfloat16)
    fp4_decode_torch(torch.from_numpy(packed), torch.from_numpy(scale), out)
    np.testing.assert_array_equal(
        out.view(torch.int16).numpy().view(np.uint16), bf16_bits(ref_fp4(packed, scale))
    )


def test_fp4_decoders_refuse_k_not_a_multiple_of_32() -> None:
    out = torch.empty(2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 32"):
        FP4.decode(
            np.zeros((2, 8), dtype=np.uint8), np.ones((2, 0), dtype=np.uint8), out, fp4_fit(2, 32)
        )
    with pytest.raises(ValueError, match="multiple of 32"):
        fp4_decode_torch(
            torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2, 0, dtype=torch.uint8), out
        )


# -- FP8 (E4M3 with block scales)


@PATHS
def test_every_e4m3_code_under_every_scale_matches_ml_dtypes(path: str) -> None:
    # all 254 non-NaN codes (K = 254: 7 full blocks of 32 and a ragged one of 30) under all
    # scales 1..254, one per row block; the top scales overflow bf16 to +-inf in both
    w = np.tile(NON_NAN_E4M3, (254 * 32, 1))
    sc = np.repeat(LEGAL_E8M0[:, None], 8, axis=1)
    got = decode(FP8, path, w, sc, w.shape, fp8_fit(*w.shape, 32))
    with np.errstate(over="ignore"):
        want = ref_fp8(w, sc, 32)
    assert np.isinf(bf16_bits(want).view(ml_dtypes.bfloat16).astype(np.float32)).any()
    np.testing.assert_array_equal(got, bf16_bits(want))


@PATHS
def test_e4m3_nan_codes_decode_to_nan(path: str) -> None:
    w = np.array([[0x7F, 0xFF, 0x38, 0xB8]], dtype=np.uint8)
    got = decode(FP8, path, w, np.array([[127]], dtype=np.uint8), (1, 4), fp8_fit(1, 4, 32))
    values = got.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.isnan(values[0, :2]).all() and values[0, 2:].tolist() == [1.0, -1.0]


@PATHS
@pytest.mark.parametrize(
    "block, n, k",
    [(32, 70, 45), (128, 300, 200), (128, 129, 1), (128, 128, 256), (32, 33, 71), (128, 576, 7168)],
)
def test_fp8_ragged_blocks_match_ml_dtypes(path: str, block: int, n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    w = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    w[:, ::5] |= 0x80  # negative codes too
    s = rng.integers(110, 145, (-(-n // block), -(-k // block)), dtype=np.uint8)
    np.testing.assert_array_equal(
        decode(FP8, path, w, s, (n, k), fp8_fit(n, k, block)), bf16_bits(ref_fp8(w, s, block))
    )


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_fp8_block_whose_words_straddle_two_scales(path: str) -> None:
    # a block of 4 (not a multiple of 8): the kernel's word loop cannot be used; the result is the
    # same
    rng = np.random.default_rng(12)
    w = rng.integers(0, 0x7E, (30, 50), dtype=np.uint8)
    s = rng.integers(110, 145, (8, 13), dtype=np.uint8)
    out = torch.empty(30, 50, dtype=torch.bfloat16)
    if path == "kernel":
        kernels.decode_fp8(
            w, s, tables.scaled_table("fp8").numpy(), out.view(torch.int16).numpy(), 4
        )
    else:
        fp8_decode_torch(torch.from_numpy(w), torch.from_numpy(s), out, block=4)
    np.testing.assert_array_equal(
        out.view(torch.int16).numpy().view(np.uint16), bf16_bits(ref_fp8(w, s, 4))
    )


@PATHS
@pytest.mark.parametrize("block", [32, 128])
def test_fp8_row_and_column_windows_decode_in_place(path: str, block: int) -> None:
    # dense FP8 cuts on whole scale blocks, read where they lie in a misaligned map; the last
    # column block of the tensor is ragged
    rng = np.random.default_rng(block)
    n, k = 3 * block + 5, 4 * block + 17
    w = in_map(
        rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
        | (rng.integers(0, 2, (n, k), dtype=np.uint8) << 7)
    )
    s = in_map(rng.integers(110, 145, (-(-n // block), -(-k // block)), dtype=np.uint8), skew=1)
    cuts = [
        ((0, n), (block, 3 * block)),
        ((0, n), (2 * block, k)),
        ((block, 2 * block), (0, k)),
        ((2 * block, n), (0, k)),
    ]
    for (r0, r1), (c0, c1) in cuts:
        ww, sw = w[r0:r1, c0:c1], s[r0 // block : -(-r1 // block), c0 // block : -(-c1 // block)]
        got = decode(FP8, path, ww, sw, ww.shape, fp8_fit(*ww.shape, block))
        want = ref_fp8(np.ascontiguousarray(ww), np.ascontiguousarray(sw), block)
        np.testing.assert_array_equal(got, bf16_bits(want))


@PATHS
@pytest.mark.parametrize(
    "k", [10240, 3000]
)  # torch row steps of 6 and 21: neither divides the block of 32
def test_wide_fp8_rows_match_ml_dtypes(path: str, k: int) -> None:
    rng = np.random.default_rng(k)
    w = rng.integers(0, 0x7E, (100, k), dtype=np.uint8)
    s = rng.integers(100, 150, (4, -(-k // 32)), dtype=np.uint8)
    np.testing.assert_array_equal(
        decode(FP8, path, w, s, (100, k), fp8_fit(100, k, 32)), bf16_bits(ref_fp8(w, s, 32))
    )


@PATHS
def test_fp8_decoded_in_row_blocks_like_the_loader(path: str) -> None:
    rng = np.random.default_rng(9)
    n, k, block = 300, 200, 128
    w = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    s = rng.integers(110, 145, (3, 2), dtype=np.uint8)
    fit = fp8_fit(n, k, block)
    step = FP8.row_multiple(fit)
    assert step == block
    got = np.concatenate(
        [
            decode(
                FP8,
                path,
                w[r : r + step],
                s[slice(*FP8.scale_rows(fit, r, min(n, r + step)))],
                (min(n, r + step) - r, k),
                fit,
            )
            for r in range(0, n, step)
        ]
    )
    np.testing.assert_array_equal(got, bf16_bits(ref_fp8(w, s, block)))


@PATHS
def test_fp8_with_f32_scale_inv_matches_ml_dtypes(path: str) -> None:
    # V3's weight_scale_inv: any fp32 value, the product rounded in fp32 and then once to bf16;
    # scales that are not powers of two make that rounding matter, huge ones overflow
    rng = np.random.default_rng(3)
    n, k, block = 150, 70, 64
    w = rng.integers(0, 256, (n, k), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0x38
    s = (rng.random((3, 2)) * 3e-3 + 1e-4).astype(np.float32)
    s[2, 1] = np.float32(1.9e36)  # 448 * 1.9e36 > bf16's max: inf
    s[1, 0] = np.float32(-0.3)
    got = decode(FP8, path, w, s, (n, k), fp8_fit(n, k, block, "F32"))
    with np.errstate(over="ignore"):
        want = (
            w.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            * np.repeat(np.repeat(s, block, 0), block, 1)[:n, :k]
        )
    assert np.isinf(bf16_bits(want).view(ml_dtypes.bfloat16).astype(np.float32)).any()
    np.testing.assert_array_equal(got, bf16_bits(want))


def test_numpy_inputs_run_the_kernels_except_for_f32_scales(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a pass-through spy: the CPU path decodes host arrays by the compiled kernel, tensors by torch
    # ops (numba's kernels or the ones compiled ahead: the spy is on their shared Python side)
    calls: list[str] = []
    for name in ("decode_fp4", "decode_fp8"):
        real = getattr(Kernels, name)
        monkeypatch.setattr(
            Kernels,
            name,
            lambda self, *a, _real=real, _name=name, **k: (
                calls.append(_name),
                _real(self, *a, **k),
            )[1],
        )
    out4, out8 = torch.empty(2, 32, dtype=torch.bfloat16), torch.empty(2, 3, dtype=torch.bfloat16)
    FP4.decode(
        np.full((2, 16), 0x22, dtype=np.uint8),
        np.full((2, 1), 127, dtype=np.uint8),
        out4,
        fp4_fit(2, 32),
    )
    FP8.decode(
        np.full((2, 3), 0x38, dtype=np.uint8),
        np.full((1, 1), 128, dtype=np.uint8),
        out8,
        fp8_fit(2, 3, 32),
    )
    assert calls == ["decode_fp4", "decode_fp8"]
    assert (
        out4.eq(1.0).all() and out8.eq(2.0).all()
    )  # E2M1 code 2 = 1.0; E4M3 0x38 = 1.0, times 2^1
    FP8.decode(
        np.full((2, 3), 0x38, dtype=np.uint8),
        np.full((1, 1), 0.25, dtype=np.float32),
        out8,
        fp8_fit(2, 3, 32, "F32"),
    )
    FP4.decode(
        torch.full((2, 16), 0x44, dtype=torch.uint8),
        torch.full((2, 1), 127, dtype=torch.uint8),
        out4,
        fp4_fit(2, 32),
    )
    assert calls == ["decode_fp4", "decode_fp8"]
    assert out8.eq(0.25).all() and out4.eq(2.0).all()


def test_fp8_decode_torch_refuses_shapes_that_disagree() -> None:
    with pytest.raises(ValueError, match="disagree"):
        fp8_decode_torch(
            torch.zeros(4, 40, dtype=torch.uint8),
            torch.ones(1, 1, dtype=torch.uint8),
            torch.empty(4, 40, dtype=torch.bfloat16),
            block=32,
        )


# -- plain: F16 served as BF16


def f16_bytes(h: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(h).view(np.uint8).reshape(1, -1)


@pytest.mark.parametrize(
    "path", ["kernel", "torch", "reference"]
)  # "kernel": decode() of a host array
def test_f16_to_bf16_rounds_to_nearest_even_like_ml_dtypes(path: str) -> None:
    h = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16)
    h = h[~np.isnan(h)]  # every finite value and both infinities
    fit = PLAIN.fit(meta("norm", "F16", (h.size,)), None)
    assert isinstance(fit, Fit)
    got = decode(PLAIN, path, f16_bytes(h), None, (1, h.size), fit)[0]
    np.testing.assert_array_equal(got, bf16_bits(h.astype(np.float32)))
    # a tie: the fp32 bits dropped are exactly 0x8000; it rounds to the even neighbour, up or down
    f32 = h.astype(np.float32).view(np.uint32)
    ties = (f32 & 0xFFFF) == 0x8000
    kept = (f32[ties] >> 16).astype(np.uint16)
    assert ties.sum() > 1000
    assert (got[ties] == kept).any() and (got[ties] == kept + 1).any()
    assert ((got[ties] & 1) == 0).all()


@pytest.mark.parametrize("path", ["kernel", "torch", "reference"])
def test_f16_nan_stays_nan_in_bf16(path: str) -> None:
    # every f16 NaN, quiet or signalling, either sign: a NaN in bf16 too (never an infinity)
    h = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isnan(h)]
    fit = PLAIN.fit(meta("norm", "F16", (h.size,)), None)
    assert isinstance(fit, Fit)
    got = decode(PLAIN, path, f16_bytes(h), None, (1, h.size), fit)
    assert np.isnan(got.view(ml_dtypes.bfloat16).astype(np.float32)).all()


@pytest.mark.parametrize("path", ["kernel", "torch", "reference"])
def test_f16_column_window_of_wider_rows(path: str) -> None:
    # a tp column cut of an F16 matrix: strided rows of bytes
    h = np.random.default_rng(2).standard_normal((6, 40)).astype(np.float16)
    window = h.view(np.uint8)[:, 20:60]  # elements 10..30 of each row
    fit = PLAIN.fit(meta("w", "F16", (6, 40)), None, split="cols")
    assert isinstance(fit, Fit)
    got = decode(PLAIN, path, window, None, (6, 20), fit)
    np.testing.assert_array_equal(got, bf16_bits(h[:, 10:30].astype(np.float32)))
