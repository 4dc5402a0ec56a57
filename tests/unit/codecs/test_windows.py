"""What a codec accepts (Codec.fit), the cuts it gives each tensor-parallel rank (Codec.window),
and what a rank serves (Codec.served), each against plain numpy slices of the whole tensor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from tests.reference import fp4 as ref_fp4
from tests.reference import fp8 as ref_fp8
from tpload.codecs.base import Codec, Cut, Fit, even_split
from tpload.codecs.fp4_e8m0 import FP4
from tpload.codecs.fp8_block import FP8
from tpload.codecs.plain import PLAIN
from tpload.codecs.registry import for_role, roles
from tpload.model.meta import TensorMeta

NP = {
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "I64": np.int64,
    "U8": np.uint8,
    "I8": np.int8,
    "F8_E8M0": np.uint8,
    "F8_E4M3": np.uint8,
}


def meta(name: str, dtype: str, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(name, "model-00001.safetensors", dtype, shape)


def fit_of(codec: Codec, weight: TensorMeta, scale: TensorMeta | None = None, **kw: object) -> Fit:
    fit = codec.fit(weight, scale, **kw)
    assert isinstance(fit, Fit), fit
    return fit


def tensor(m: TensorMeta, seed: int = 0) -> np.ndarray:
    """Random stored contents of ``m`` (as its numpy dtype, every byte random)."""
    raw = np.random.default_rng(seed).integers(0, 256, m.nbytes, dtype=np.uint8)
    return raw.view(NP[m.dtype]).reshape(m.shape)


def cut_bytes(whole: np.ndarray, cut: Cut) -> np.ndarray:
    """The cut's box of the whole tensor's 2-D byte view (a 0-D or 1-D tensor is one row)."""
    rows = whole.shape[0] if whole.ndim > 1 else 1
    b = np.ascontiguousarray(whole).view(np.uint8).reshape(rows, -1)
    return b[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]]


def assert_cut_is(cut: Cut, m: TensorMeta, whole: np.ndarray, want: np.ndarray) -> None:
    """The cut names ``m``, has the shape of ``want`` (a numpy slice of ``whole``) and holds its
    bytes."""
    assert (cut.name, cut.dtype, cut.shape) == (m.name, m.dtype, want.shape)
    got = cut_bytes(whole, cut)
    assert cut.nbytes == got.size == want.nbytes and cut.row_bytes == got.shape[1]
    np.testing.assert_array_equal(
        got.reshape(-1), np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    )


def window(
    codec: Codec, fit: Fit, split: str, tp: int, rank: int, align: int = 32
) -> tuple[Cut, Cut | None]:
    cuts = codec.window(
        fit, split, tp, rank, align=align if codec.tiled else 0
    )  # a tile binds tiled codecs
    assert not isinstance(cuts, str), cuts
    return cuts


# -- fit


def test_fp4_fit_reads_the_group_from_the_scale() -> None:
    w, s = meta("w", "I8", (256, 2048)), meta("s", "F8_E8M0", (256, 128))
    assert fit_of(FP4, w, s) == Fit(w, s, (1, 32))
    assert fit_of(FP4, meta("w", "U8", (4, 16)), meta("s", "U8", (4, 1))).group == (1, 32)


@pytest.mark.parametrize(
    "weight, scale, words",
    [
        (("I8", (256, 2048)), None, "I8/U8 weight [N, K/2]"),
        (("BF16", (256, 2048)), ("F8_E8M0", (256, 128)), "I8/U8 weight [N, K/2]"),
        (("I8", (256, 2048)), ("F32", (256, 128)), "F8_E8M0/U8 scale"),
        (("I8", (256 * 2048,)), ("F8_E8M0", (256, 128)), "[N, K/2] or [N, K/32, 16]"),
        (
            ("I8", (256, 2048)),
            ("F8_E8M0", (256, 256)),
            "scale s is [256, 256], expected [256, 128]",
        ),
        (("I8", (256, 2048)), ("F8_E8M0", (128, 128)), "expected [256, 128]"),
        (("I8", (256, 24)), ("F8_E8M0", (256, 1)), "one E8M0 byte per 32 elements"),  # K = 48
    ],
)
def test_fp4_fit_refuses(weight: tuple, scale: tuple | None, words: str) -> None:
    why = FP4.fit(meta("w", *weight), None if scale is None else meta("s", *scale))
    assert isinstance(why, str) and words in why


def test_fp8_fit_infers_the_block_with_a_ragged_last_one() -> None:
    w = meta("w", "F8_E4M3", (576, 7168))
    assert fit_of(FP8, w, meta("s", "F8_E8M0", (5, 56))).group == (128, 128)
    assert fit_of(FP8, w, meta("s", "F32", (5, 56))).group == (128, 128)
    assert fit_of(FP8, w, meta("s", "U8", (18, 224))).group == (32, 32)
    assert fit_of(FP8, w, meta("s", "F8_E8M0", (5, 56)), block=128).group == (128, 128)


@pytest.mark.parametrize(
    "weight, scale, block, words",
    [
        (("BF16", (576, 7168)), ("F8_E8M0", (5, 56)), 0, "2-D F8_E4M3 weight"),
        (("F8_E4M3", (576, 7168)), ("I8", (5, 56)), 0, "F8_E8M0/U8/F32/BF16/F16 scale"),
        (("F8_E4M3", (576, 7168)), None, 0, "scale"),
        (
            ("F8_E4M3", (576, 7168)),
            ("F8_E8M0", (5, 57)),
            0,
            "does not tile weight shape [576, 7168]",
        ),
        (("F8_E4M3", (576, 7168)), ("F8_E8M0", (5, 56)), 64, "with block 64"),
    ],
)
def test_fp8_fit_refuses(weight: tuple, scale: tuple | None, block: int, words: str) -> None:
    why = FP8.fit(meta("w", *weight), None if scale is None else meta("s", *scale), block=block)
    assert isinstance(why, str) and words in why


@pytest.mark.parametrize(
    "dtype, shape, split, words",
    [
        ("I8", (4, 4), "replicate", "BF16/F32/F16/I64"),
        ("F8_E4M3", (4, 4), "rows", "BF16/F32/F16/I64"),
        ("BF16", (16,), "cols", "split cols needs 2-D"),
        ("BF16", (2, 3, 4), "cols", "split cols needs 2-D"),
        ("F32", (), "rows", "scalar"),
    ],
)
def test_plain_fit_refuses(dtype: str, shape: tuple[int, ...], split: str, words: str) -> None:
    why = PLAIN.fit(meta("t", dtype, shape), None, split=split)
    assert isinstance(why, str) and words in why


@pytest.mark.parametrize("dtype", ["BF16", "F32", "F16", "I64"])
def test_plain_fit_takes_every_plain_dtype_without_a_scale(dtype: str) -> None:
    w = meta("t", dtype, (3, 5))
    assert fit_of(PLAIN, w, split="cols") == Fit(w, None, (1, 1))


# -- windows: fp4


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fp4_rows_window_is_the_rows_slice(tp: int) -> None:
    # w1/w3 (column parallel): rank r reads rows [r*N/tp, (r+1)*N/tp) of weight and scale
    w, s = meta("w1", "U8", (256, 256)), meta("w1.scale", "F8_E8M0", (256, 16))
    fit, pw, sw = fit_of(FP4, w, s), tensor(w, 1), tensor(s, 2)
    for r in range(tp):
        wc, sc = window(FP4, fit, "rows", tp, r)
        lo, hi = r * 256 // tp, (r + 1) * 256 // tp
        assert_cut_is(wc, w, pw, pw[lo:hi])
        assert_cut_is(sc, s, sw, sw[lo:hi])
        assert FP4.served(fit, wc, sc, "expanded") == [
            ("w1", torch.bfloat16, (hi - lo, 512), (hi - lo) * 512 * 2)
        ]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fp4_cols_window_decodes_to_the_column_slice(tp: int) -> None:
    # w2 (row parallel): the channel window on columns, packed bytes [r*K/(2tp), ...) and scale
    # groups [r*K/(32tp), ...); the cut pair decodes to the whole decode's column slice
    w, s = meta("w2", "I8", (64, 1024)), meta("w2.scale", "U8", (64, 64))
    fit, pw, sw = fit_of(FP4, w, s), tensor(w, 3).view(np.uint8), tensor(s, 4)
    sw[...] = 100 + sw % 50
    full = ref_fp4(pw, sw)
    for r in range(tp):
        wc, sc = window(FP4, fit, "cols", tp, r)
        assert_cut_is(wc, w, pw, pw[:, r * 1024 // tp : (r + 1) * 1024 // tp])
        assert_cut_is(sc, s, sw, sw[:, r * 64 // tp : (r + 1) * 64 // tp])
        got = ref_fp4(
            np.ascontiguousarray(cut_bytes(pw, wc)), np.ascontiguousarray(cut_bytes(sw, sc))
        )
        np.testing.assert_array_equal(got, full[:, r * 2048 // tp : (r + 1) * 2048 // tp])
        assert FP4.decoded_shape(fit, wc) == (64, 2048 // tp)


def test_fp4_replicate_is_the_whole_tensor() -> None:
    w, s = meta("w", "U8", (64, 16)), meta("s", "U8", (64, 1))
    wc, sc = window(FP4, fit_of(FP4, w, s), "replicate", 4, 3)
    assert (wc.rows, wc.cols, sc.rows, sc.cols) == ((0, 64), (0, 16), (0, 64), (0, 1))


@pytest.mark.parametrize(
    "split, shape, tp, align, words",
    [
        ("rows", (192, 64), 2, 64, "192 channels / tp 2 = 96, not a multiple of 64"),
        ("cols", (64, 1152), 8, 64, "2304 channels / tp 8 = 288, not a multiple of 64"),
        (
            "rows",
            (64, 64),
            4,
            1,
            "64 channels / tp 4 = 16, not a multiple of 32",
        ),  # a scale group is 32
        ("rows", (100, 64), 3, 1, "100 channels / tp 3 = 33.3333"),
    ],
)
def test_fp4_window_refuses_channels_tp_cannot_cut(
    split: str, shape: tuple[int, int], tp: int, align: int, words: str
) -> None:
    fit = fit_of(FP4, meta("w", "U8", shape), meta("s", "U8", (shape[0], shape[1] // 16)))
    why = FP4.window(fit, split, tp, 0, align=align)
    assert isinstance(why, str) and words in why


# -- windows: fp8


def fp8_case(
    shape: tuple[int, int], block: int, scale_dtype: str = "F8_E8M0"
) -> tuple[TensorMeta, TensorMeta, np.ndarray, np.ndarray]:
    n, k = shape
    w, s = (
        meta("wq", "F8_E4M3", shape),
        meta("wq.scale", scale_dtype, (-(-n // block), -(-k // block))),
    )
    codes = np.random.default_rng(n + k).integers(0, 0x7E, shape, dtype=np.uint8)
    scale = np.random.default_rng(n).integers(110, 145, s.shape, dtype=np.uint8)
    return w, s, codes, scale.astype(np.float32) / 128 if scale_dtype == "F32" else scale


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fp8_rows_window_with_a_ragged_last_block(tp: int) -> None:
    # N = 1000, B = 128: 8 block rows, the last of 104; each rank takes 8/tp whole blocks
    w, s, codes, scale = fp8_case((1000, 300), 128)
    fit = fit_of(FP8, w, s)
    full = ref_fp8(codes, scale, 128)
    per = 8 // tp * 128
    for r in range(tp):
        wc, sc = window(FP8, fit, "rows", tp, r)
        lo, hi = r * per, min(1000, (r + 1) * per)
        assert_cut_is(wc, w, codes, codes[lo:hi])
        assert_cut_is(sc, s, scale, scale[lo // 128 : -(-hi // 128)])
        got = ref_fp8(
            np.ascontiguousarray(cut_bytes(codes, wc)),
            np.ascontiguousarray(cut_bytes(scale, sc)),
            128,
        )
        np.testing.assert_array_equal(got, full[lo:hi])


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("scale_dtype", ["F8_E8M0", "F32"])
def test_fp8_cols_window_with_a_ragged_last_block(tp: int, scale_dtype: str) -> None:
    w, s, codes, scale = fp8_case((300, 1000), 128, scale_dtype)
    fit = fit_of(FP8, w, s)
    per = 8 // tp * 128
    for r in range(tp):
        wc, sc = window(FP8, fit, "cols", tp, r)
        lo, hi = r * per, min(1000, (r + 1) * per)
        assert_cut_is(wc, w, codes, codes[:, lo:hi])
        assert_cut_is(sc, s, scale, scale[:, lo // 128 : -(-hi // 128)])
        assert FP8.served(fit, wc, sc, "expanded") == [
            ("wq", torch.bfloat16, (300, hi - lo), 300 * (hi - lo) * 2)
        ]


@pytest.mark.parametrize("split", ["rows", "cols"])
@pytest.mark.parametrize("tp", [2, 4])
def test_fp8_window_refuses_blocks_tp_cannot_split(split: str, tp: int) -> None:
    # N = K = 576 with B = 128: 5 scale blocks (the last of 64) do not split into equal shares
    w, s, _, _ = fp8_case((576, 576), 128)
    why = FP8.window(fit_of(FP8, w, s), split, tp, 0)
    assert why == f"5 scale blocks of 128 / tp {tp} is not whole"
    assert not isinstance(FP8.window(fit_of(FP8, w, s), split, 1, 0), str)


def test_fp8_decoding_rows_go_in_scale_blocks() -> None:
    fit = fit_of(FP8, *fp8_case((1000, 300), 128)[:2])
    assert FP8.row_multiple(fit) == 128
    assert FP8.scale_rows(fit, 0, 1000) == (0, 8)
    assert FP8.scale_rows(fit, 256, 300) == (2, 3)
    assert FP8.scale_rows(fit, 896, 1000) == (7, 8)
    fit4 = fit_of(FP4, meta("w", "U8", (8, 16)), meta("s", "U8", (8, 1)))
    assert FP4.row_multiple(fit4) == 1 and FP4.scale_rows(fit4, 3, 7) == (3, 7)


# -- windows: plain


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_plain_1d_rows_window_is_an_element_slice(tp: int) -> None:
    m = meta("norm.weight", "BF16", (64,))
    whole = tensor(m)
    fit = fit_of(PLAIN, m, split="rows")
    for r in range(tp):
        wc, sc = window(PLAIN, fit, "rows", tp, r)
        assert sc is None and wc.rows == (0, 1)
        assert_cut_is(wc, m, whole, whole[r * 64 // tp : (r + 1) * 64 // tp])


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("split", ["rows", "cols"])
@pytest.mark.parametrize("dtype", ["BF16", "F32", "I64", "F16"])
def test_plain_2d_window_is_a_rows_or_cols_slice(tp: int, split: str, dtype: str) -> None:
    m = meta("head.weight", dtype, (16, 12))
    whole = tensor(m, tp)
    fit = fit_of(PLAIN, m, split=split)
    for r in range(tp):
        wc, _ = window(PLAIN, fit, split, tp, r)
        want = (
            whole[r * 16 // tp : (r + 1) * 16 // tp]
            if split == "rows"
            else whole[:, r * 12 // tp : (r + 1) * 12 // tp]
        )
        assert_cut_is(wc, m, whole, want)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_plain_nd_rows_window_cuts_the_first_dimension(tp: int) -> None:
    m = meta("conv.weight", "F32", (8, 3, 5))
    whole = tensor(m)
    fit = fit_of(PLAIN, m, split="rows")
    for r in range(tp):
        wc, _ = window(PLAIN, fit, "rows", tp, r)
        assert_cut_is(wc, m, whole, whole[r * 8 // tp : (r + 1) * 8 // tp])


def test_plain_replicate_is_the_whole_tensor_even_0d() -> None:
    for shape in [(), (7,), (3, 4, 5)]:
        m = meta("t", "F32", shape)
        whole = tensor(m)
        wc, _ = window(PLAIN, fit_of(PLAIN, m), "replicate", 4, 2)
        assert_cut_is(wc, m, whole, whole)


@pytest.mark.parametrize(
    "split, shape, words",
    [
        ("rows", (10, 4), "10 rows / tp 4 is not whole"),
        ("cols", (4, 6), "6 cols / tp 4 is not whole"),
        ("rows", (10,), "10 rows / tp 4 is not whole"),
    ],
)
def test_plain_window_refuses_an_uneven_split(
    split: str, shape: tuple[int, ...], words: str
) -> None:
    why = PLAIN.window(fit_of(PLAIN, meta("t", "BF16", shape), split=split), split, 4, 0)
    assert why == words


def test_even_split_cuts_whole_atoms_with_a_short_last_one() -> None:
    assert [even_split(1000, 128, 4, r) for r in range(4)] == [
        (0, 256),
        (256, 512),
        (512, 768),
        (768, 1000),
    ]
    assert even_split(576, 128, 2, 0) is None  # 5 atoms
    assert [even_split(10, 1, 2, r) for r in range(2)] == [(0, 5), (5, 10)]
    assert even_split(10, 1, 4, 0) is None


# -- served


@pytest.mark.parametrize(
    "scale_dtype, scale_served",
    [
        ("F8_E8M0", getattr(torch, "float8_e8m0fnu", torch.uint8)),
        ("U8", torch.uint8),
        ("F32", torch.float32),
    ],
)
def test_fp8_packed_serves_the_stored_windows(scale_dtype: str, scale_served: torch.dtype) -> None:
    w, s, _, _ = fp8_case((1000, 300), 128, scale_dtype)
    fit = fit_of(FP8, w, s)
    wc, sc = window(FP8, fit, "rows", 2, 1)
    item = 4 if scale_dtype == "F32" else 1
    assert FP8.served(fit, wc, sc, "packed") == [
        ("wq", torch.float8_e4m3fn, (488, 300), 488 * 300),
        ("wq.scale", scale_served, (4, 3), 4 * 3 * item),
    ]
    assert FP8.copies(fit, "packed") and not FP8.copies(fit, "expanded")


def test_fp4_packed_serves_the_stored_windows() -> None:
    w, s = meta("w2", "I8", (64, 1024)), meta("w2.scale", "F8_E8M0", (64, 64))
    fit = fit_of(FP4, w, s)
    wc, sc = window(FP4, fit, "cols", 4, 3)
    assert FP4.served(fit, wc, sc, "packed") == [
        ("w2", torch.int8, (64, 256), 64 * 256),
        ("w2.scale", getattr(torch, "float8_e8m0fnu", torch.uint8), (64, 16), 64 * 16),
    ]
    assert FP4.copies(fit, "packed") and not FP4.copies(fit, "expanded")


@pytest.mark.parametrize("kind", ["packed", "expanded"])
@pytest.mark.parametrize(
    "dtype, served",
    [
        ("BF16", torch.bfloat16),
        ("F16", torch.bfloat16),
        ("F32", torch.float32),
        ("I64", torch.int64),
    ],
)
def test_plain_serves_its_dtype_in_both_kinds_f16_as_bf16(
    kind: str, dtype: str, served: torch.dtype
) -> None:
    m = meta("head.weight", dtype, (16, 12))
    fit = fit_of(PLAIN, m, split="rows")
    wc, sc = window(PLAIN, fit, "rows", 4, 1)
    assert PLAIN.served(fit, wc, sc, kind) == [
        ("head.weight", served, (4, 12), 4 * 12 * served.itemsize)
    ]
    assert PLAIN.copies(fit, kind) == (dtype != "F16")


def test_roles_name_the_three_codecs_and_skip_reads_nothing() -> None:
    assert set(roles()) == {"plain", "fp4", "fp8", "nvfp4", "gguf"}
    assert (for_role("plain"), for_role("fp4"), for_role("fp8")) == (PLAIN, FP4, FP8)
    assert for_role("skip") is None and for_role("defer") is None
    assert [c.scaled for c in (PLAIN, FP4, FP8)] == [False, True, True]
