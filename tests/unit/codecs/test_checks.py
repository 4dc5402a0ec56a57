"""The value checks on the host bytes as they stream by (Codec.checker), and the bf16-overflow rule.

A decode overflows bf16 iff ``|value| * 2**(e - 127) >= 2**128``: FP4 at scale byte 254 for codes
of magnitude >= 2, at 253 for 4 and 6, never below; FP8 E4M3 (max 448) from e = 247; F32 scales
through the fp32 product rounded to bf16. tpload's counts are checked against an independent
computation: decode in float32 with ml_dtypes, cast to bfloat16, look for infinities.
"""

from __future__ import annotations

from itertools import pairwise

import ml_dtypes
import numpy as np
import pytest

from tests.reference import fp4 as ref_fp4
from tpload.codecs.base import Codec, Cut, Fit, Problem
from tpload.codecs.fp4_e8m0 import FP4, overflow_groups
from tpload.codecs.fp8_block import FP8, overflow_blocks
from tpload.codecs.plain import PLAIN
from tpload.model.meta import TensorMeta

BF16_MAX_HALFWAY = np.array([0x7F7F8000], dtype=np.uint32).view(np.float32)[
    0
]  # rounds to inf (ties to even)
E8M0_BAD = "E8M0 scale bytes 0x00/0xFF"


def meta(name: str, dtype: str, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(name, "model.safetensors", dtype, shape)


def as_rows(a: np.ndarray) -> np.ndarray:
    """A 2-D array as its 2-D byte view (what the reader hands a checker)."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(a.shape[0], -1)


def check(
    codec: Codec,
    fit: Fit,
    cuts: tuple[Cut, Cut | None],
    weight: np.ndarray,
    scale: np.ndarray | None,
    splits: list[int] | None = None,
) -> list[Problem]:
    """Feed the cuts' boxes of the whole tensors (2-D bytes) to a checker, the scale whole and the
    weight in row blocks starting at ``splits`` (window rows), and return its problems."""
    wc, sc = cuts
    checker = codec.checker(fit, wc, sc)
    if sc is not None and scale is not None:
        checker.scale(as_rows(scale)[sc.rows[0] : sc.rows[1], sc.cols[0] : sc.cols[1]], 0)
    box = as_rows(weight)[wc.rows[0] : wc.rows[1], wc.cols[0] : wc.cols[1]]
    edges = (splits or [0]) + [box.shape[0]]
    for a, b in pairwise(edges):
        checker.weight(box[a:b], a)
    return checker.problems()


def fp4_case(n: int, k: int) -> tuple[Fit, TensorMeta, TensorMeta]:
    w, s = meta("w2", "U8", (n, k // 2)), meta("w2.scale", "F8_E8M0", (n, k // 32))
    fit = FP4.fit(w, s)
    assert isinstance(fit, Fit)
    return fit, w, s


def fp8_case(
    n: int, k: int, block: int, scale_dtype: str = "F8_E8M0"
) -> tuple[Fit, TensorMeta, TensorMeta]:
    w, s = (
        meta("wq", "F8_E4M3", (n, k)),
        meta("wq.scale", scale_dtype, (-(-n // block), -(-k // block))),
    )
    fit = FP8.fit(w, s, block=block)
    assert isinstance(fit, Fit)
    return fit, w, s


def whole_cuts(codec: Codec, fit: Fit) -> tuple[Cut, Cut | None]:
    cuts = codec.window(fit, "replicate", 1, 0, align=32)
    assert not isinstance(cuts, str)
    return cuts


# -- the independent overflow computation (ml_dtypes)


def bf16_inf(values: np.ndarray) -> np.ndarray:
    return np.isinf(values.astype(ml_dtypes.bfloat16).astype(np.float32))


def fp4_overflow_ref(
    packed: np.ndarray, scale: np.ndarray
) -> tuple[int, tuple[int, int, int] | None]:
    groups = bf16_inf(ref_fp4(packed, scale)).reshape(packed.shape[0], -1, 32).any(axis=2)
    if not groups.any():
        return 0, None
    r, g = np.argwhere(groups)[0]
    return int(groups.sum()), (int(r), int(g), int(scale[r, g]))


def fp8_values(codes: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    s = (
        scale
        if scale.dtype == np.float32
        else scale.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    )
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[: codes.shape[0], : codes.shape[1]]
    with np.errstate(over="ignore", invalid="ignore"):
        return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * full


def fp8_overflow_ref(
    codes: np.ndarray, scale: np.ndarray, block: int
) -> tuple[int, tuple[int, int] | None]:
    """(rows of blocks with an infinity, the first (row, block column) in row-major order)."""
    inf = bf16_inf(fp8_values(codes, scale, block))
    n, k = inf.shape
    pad = np.zeros((n, -(-k // block) * block), dtype=bool)
    pad[:, :k] = inf
    rows = pad.reshape(n, -1, block).any(axis=2)
    if not rows.any():
        return 0, None
    r, c = np.argwhere(rows)[0]
    return int(rows.sum()), (int(r), int(c))


# -- FP4 overflow


def one_code_per_group(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row ``i`` has scale byte ``scales[i]`` and 16 groups, group ``c`` all E2M1 code ``c``."""
    packed = np.tile(np.repeat(np.arange(16, dtype=np.uint8) * 0x11, 16)[None, :], (scales.size, 1))
    return packed, np.repeat(scales.astype(np.uint8)[:, None], 16, axis=1)


def test_fp4_overflow_rule_scale_by_scale_and_code_by_code() -> None:
    magnitude = np.abs(
        np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    )
    for e in range(256):  # 0x00 and 0xFF too: refused on their own, never counted as overflows
        packed, scale = one_code_per_group(np.array([e]))
        for c in range(16):
            got, _ = overflow_groups(packed[:, c * 16 : (c + 1) * 16], scale[:, c : c + 1])
            rule = (e == 254 and magnitude[c] >= 2) or (e == 253 and magnitude[c] >= 4)
            assert (
                got
                == int(rule)
                == fp4_overflow_ref(packed[:, c * 16 : (c + 1) * 16], scale[:, c : c + 1])[0]
            ), (e, c)


def test_fp4_overflow_of_every_code_under_every_scale_matches_ml_dtypes() -> None:
    packed, scale = one_code_per_group(np.arange(256))  # (ml_dtypes reads 0xFF as NaN: no infinity)
    got = overflow_groups(packed, scale)
    assert got == fp4_overflow_ref(packed, scale)
    assert got == (
        4 + 8,
        (253, 6, 253),
    )  # at 253: 4, 6, -4, -6 (code 6 is 4.0); at 254: 2, 3, 4, 6 and their negatives


@pytest.mark.parametrize("seed", range(8))
def test_fp4_overflow_count_and_first_group_on_random_data(seed: int) -> None:
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, (40, 128), dtype=np.uint8)
    packed[rng.random(packed.shape) < 0.9] &= (
        0x11  # mostly codes 0 and 1 (0.5): few groups overflow
    )
    scale = rng.choice(
        np.array([127, 200, 252, 253, 254], dtype=np.uint8), (40, 8), p=[0.4, 0.3, 0.1, 0.1, 0.1]
    )
    want = fp4_overflow_ref(packed, scale)
    assert want[0] > 0
    assert overflow_groups(packed, scale) == want


def test_fp4_no_dangerous_scale_no_overflow() -> None:
    packed = np.full((4, 32), 0x77, dtype=np.uint8)  # all 6.0
    assert overflow_groups(packed, np.full((4, 2), 252, dtype=np.uint8)) == (0, None)


def test_fp4_checker_counts_bad_scale_bytes_and_names_the_scale() -> None:
    fit, w, s = fp4_case(6, 64)
    scale = np.full((6, 2), 127, dtype=np.uint8)
    scale[1, 0], scale[4, 1], scale[5, 1] = 0x00, 0xFF, 0x00
    problems = check(FP4, fit, whole_cuts(FP4, fit), np.zeros((6, 32), np.uint8), scale)
    assert problems == [(3, problems[0][1], "w2.scale")] and problems[0][1].startswith(E8M0_BAD)


@pytest.mark.parametrize("splits", [[0], [0, 1, 2, 3], [0, 7], [0, 5, 6, 20]])
def test_fp4_checker_overflow_in_row_blocks_of_a_column_window(splits: list[int]) -> None:
    # rank 1 of a tp 2 column cut: the first overflow is named in whole-tensor rows and elements
    rng = np.random.default_rng(11)
    fit, w, s = fp4_case(24, 256)
    packed = rng.integers(0, 256, (24, 128), dtype=np.uint8) & 0x11
    scale = rng.choice(np.array([120, 254], dtype=np.uint8), (24, 8), p=[0.8, 0.2])
    packed[3, 70], packed[9, 100], packed[9, 10], packed[17, 127] = (
        0x40,
        0x04,
        0x70,
        0x60,
    )  # 2.0, 2.0, 6.0, 4.0
    scale[3, 4] = scale[9, 6] = scale[9, 0] = scale[17, 7] = 254
    scale[0, 0], scale[2, 5] = 0xFF, 0x00  # a bad byte outside the window, one inside
    cuts = FP4.window(fit, "cols", 2, 1, align=32)
    assert not isinstance(cuts, str)
    problems = check(FP4, fit, cuts, packed, scale, splits)
    count, first = fp4_overflow_ref(packed[:, 64:], scale[:, 4:])
    assert count == 3 and first == (3, 0, 254)  # rows 3, 9, 17 of the window's right half
    assert problems[0][0] == 1 and problems[0][2] == "w2.scale"
    assert problems[1] == (
        3,
        "32-element groups whose decode overflows bf16 (|value| x 2^(scale-127) >= 2^128; "
        "first: row 3, elements 128..159, scale byte 254)",
        "w2",
    )


# -- FP8 overflow


def one_code_per_block_row(scales: np.ndarray, block: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Scale block ``i`` (``block`` rows) has byte ``scales[i]``; in it, row ``j`` of block column
    ``c`` is all code ``c * block + j`` (every code, NaN ones too, once per scale)."""
    codes = (
        np.arange(256 // block)[None, :, None] * block + np.arange(block)[:, None, None]
    ).astype(np.uint8)
    codes = np.broadcast_to(codes, (block, 256 // block, block)).reshape(block, 256)
    return np.tile(codes, (scales.size, 1)), np.repeat(scales[:, None], 256 // block, axis=1)


def test_fp8_overflow_of_every_code_under_every_e8m0_scale_matches_ml_dtypes() -> None:
    codes, scale = one_code_per_block_row(
        np.arange(256).astype(np.uint8)
    )  # 0xFF: NaN, not an overflow
    got = overflow_blocks(codes, scale, 16)
    assert got == fp8_overflow_ref(codes, scale, 16)
    assert (
        got[0] > 0 and got[1][0] // 16 == 247
    )  # nothing overflows below scale byte 247 (448 < 2^9)
    for e in (246, 247, 254):
        rows = slice(e * 16, (e + 1) * 16)
        want = fp8_overflow_ref(codes[rows], scale[e : e + 1], 16)[0]
        assert overflow_blocks(codes[rows], scale[e : e + 1], 16)[0] == want
        assert (want == 0) == (e == 246)


def f32_scales(rng: np.random.Generator) -> np.ndarray:
    """Scales on both sides of where some E4M3 code reaches bf16's halfway-to-infinity point."""
    values = np.unique(
        np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    )
    values = values[np.isfinite(values) & (values > 0)][-24:]
    edge = (BF16_MAX_HALFWAY / values).astype(np.float32)
    near = np.concatenate(
        [edge, np.nextafter(edge, np.float32(0)), np.nextafter(edge, np.float32(np.inf))]
    )
    spread = (np.float32(2.0**127 / 448) * rng.uniform(0.5, 4.0, 40)).astype(np.float32)
    odd = np.array([np.inf, -np.inf, np.nan, 0.0, -3e38, 2.0**120, 1.0], dtype=np.float32)
    return np.concatenate([near, -near[:10], spread, odd]).astype(np.float32)


def test_fp8_overflow_with_f32_scales_matches_ml_dtypes_at_the_rounding_edge() -> None:
    scales = f32_scales(np.random.default_rng(0))
    codes, scale = one_code_per_block_row(scales)
    got = overflow_blocks(codes, scale, 16)
    assert got == fp8_overflow_ref(codes, scale, 16)
    # exactly halfway to 2^128 rounds to infinity (ties to even); a step below does not
    one = np.full((1, 1), 0x38, dtype=np.uint8)  # 1.0
    assert overflow_blocks(one, np.array([[BF16_MAX_HALFWAY]], np.float32), 16)[0] == 1
    assert (
        overflow_blocks(
            one, np.nextafter(np.array([[BF16_MAX_HALFWAY]], np.float32), np.float32(0)), 16
        )[0]
        == 0
    )


def test_fp8_nan_codes_are_not_overflows_under_any_scale() -> None:
    codes = np.array([[0x7F, 0xFF]], dtype=np.uint8)
    assert overflow_blocks(codes, np.array([[254]], np.uint8), 16) == (0, None)
    assert overflow_blocks(codes, np.array([[3e38]], np.float32), 16) == (0, None)
    assert overflow_blocks(codes, np.array([[np.inf]], np.float32), 16) == (0, None)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scale_dtype", ["F8_E8M0", "F32"])
def test_fp8_overflow_count_and_first_block_on_random_data(seed: int, scale_dtype: str) -> None:
    rng = np.random.default_rng(seed)
    n, k, block = 70, 90, 32  # ragged in both directions
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    codes[rng.random(codes.shape) < 0.97] &= 0xB7  # mostly small codes: few rows of blocks overflow
    sb = rng.choice(np.array([127, 240, 247, 250, 254], dtype=np.uint8), (3, 3))
    scale = sb.view(ml_dtypes.float8_e8m0fnu).astype(np.float32) if scale_dtype == "F32" else sb
    want = fp8_overflow_ref(codes, scale, block)
    assert overflow_blocks(codes, scale, block) == want
    for a in (1, 31, 33, 50):  # rows from any window row, with the scale rows they use
        count, first = overflow_blocks(codes[a:], scale[a // block :], block, a)
        later = codes.copy()
        later[:a] = 0  # only the rows from a can overflow
        want_count, want_first = fp8_overflow_ref(later, scale, block)
        assert count == want_count
        assert (None if first is None else (first[0] + a, first[1])) == want_first


def test_fp8_first_overflow_is_the_first_in_row_major_order() -> None:
    # block (0, 0) overflows at row 5, block (0, 1) at row 2: the first is row 2
    codes = np.zeros((16, 32), dtype=np.uint8)
    codes[5, 3], codes[2, 20] = 0x7E, 0x7E  # 448
    assert overflow_blocks(codes, np.full((1, 2), 254, np.uint8), 16) == (2, (2, 1))


def test_fp8_checker_counts_bad_scales_and_nan_codes() -> None:
    fit, w, s = fp8_case(40, 70, 32)
    codes = np.zeros((40, 70), dtype=np.uint8)
    codes[0, 0], codes[39, 69], codes[20, 33] = 0x7F, 0xFF, 0x7F
    codes[5, 5] = 0x7E  # 448, not NaN
    scale = np.array([[127, 0x00, 127], [0xFF, 1, 254]], dtype=np.uint8)
    problems = check(FP8, fit, whole_cuts(FP8, fit), codes, scale)
    assert (
        problems[0][0] == 2 and problems[0][1].startswith(E8M0_BAD) and problems[0][2] == "wq.scale"
    )
    assert problems[1] == (3, "E4M3 NaN codes 0x7F/0xFF", "wq")
    assert len(problems) == 2  # the NaN code 0xFF under scale 254 is not an overflow


def test_fp8_checker_counts_f32_scales_not_finite_and_positive() -> None:
    fit, w, s = fp8_case(64, 192, 32, "F32")
    scale = np.full((2, 6), 0.5, dtype=np.float32)
    scale[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    scale[1, :2] = [-1.5, 1e-45]  # a negative is bad; a tiny positive is fine
    problems = check(FP8, fit, whole_cuts(FP8, fit), np.zeros((64, 192), np.uint8), scale)
    assert problems[0] == (6, "F32 scale values not finite and positive", "wq.scale")
    assert problems[1][0] == 0
    assert len(problems) == 2


@pytest.mark.parametrize("splits", [[0], [0, 128], [0, 1, 100, 129, 200], [0, 77]])
@pytest.mark.parametrize("scale_dtype", ["F8_E8M0", "F32"])
def test_fp8_checker_overflow_in_row_blocks_of_a_row_window(
    splits: list[int], scale_dtype: str
) -> None:
    # rank 1 of tp 2 over N = 512 rows, K = 200 (ragged last column block of 72); the blocks of
    # rows need not start on a scale block (a copy streams rows as the buffer fits them)
    fit, w, s = fp8_case(512, 200, 128, scale_dtype)
    codes = np.full((512, 200), 0x30, dtype=np.uint8)  # 0.5
    sb = np.full((4, 2), 127, dtype=np.uint8)
    sb[2, 1] = sb[3, 0] = 254
    codes[256 + 10, 150] = codes[256 + 100, 199] = codes[256 + 200, 5] = codes[256 + 210, 150] = (
        0x48  # 4.0
    )
    codes[256 + 220, 0] = 0xC8  # -4.0 (block (3, 1) has scale 127: row 210 is fine)
    scale = sb.view(ml_dtypes.float8_e8m0fnu).astype(np.float32) if scale_dtype == "F32" else sb
    cuts = FP8.window(fit, "rows", 2, 1)
    assert not isinstance(cuts, str)
    problems = check(FP8, fit, cuts, codes, scale, splits)
    assert fp8_overflow_ref(codes[256:], scale[2:], 128) == (4, (10, 1))
    assert problems[2] == (
        4,
        "block rows whose decode overflows bf16 (first: row 266, elements 128..199)",
        "wq",
    )
    assert problems[:2] == check(FP8, fit, cuts, codes, scale)[:2]


def test_checkers_report_no_overflow_when_there_is_none() -> None:
    fit, w, s = fp8_case(8, 8, 128)
    assert (
        len(
            check(
                FP8,
                fit,
                whole_cuts(FP8, fit),
                np.full((8, 8), 0x7E, np.uint8),
                np.full((1, 1), 246, np.uint8),
            )
        )
        == 2
    )
    fit4, _, _ = fp4_case(2, 32)
    assert (
        len(
            check(
                FP4,
                fit4,
                whole_cuts(FP4, fit4),
                np.full((2, 16), 0x77, np.uint8),
                np.full((2, 1), 252, np.uint8),
            )
        )
        == 1
    )


def test_plain_tensors_have_nothing_to_check() -> None:
    m = meta("norm", "BF16", (4, 4))
    fit = PLAIN.fit(m, None)
    assert isinstance(fit, Fit)
    checker = PLAIN.checker(fit, whole_cuts(PLAIN, fit)[0], None)
    checker.weight(np.full((4, 8), 0xFF, np.uint8), 0)
    assert checker.problems() == []
