"""NVFP4 (ModelOpt) expanded decode, windows, served tensors and value checks
(tpload/codecs/nvfp4.py).

Stored: weight U8 ``[out, in/2]`` (low nibble = even element), ``weight_scale`` F8_E4M3
``[out, in/16]``, ``weight_scale_2`` one F32. Every decode path (the compiled kernel for host
arrays, torch ops for tensors, the numpy reference) is checked bit for bit against an independent
decode written with ml_dtypes:

    bf16_rne( (f32(e2m1 code) * f32(e4m3 scale)) * f32(scale_2) )

in exactly that order, for every packed byte under every scale byte (zero, subnormal, normal,
448, negative and NaN scales) and several global scales (1, tiny, subnormal, huge, zero, and one
whose result depends on the order of the two products).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from tpload.codecs.base import Codec, Cut, Fit
from tpload.codecs.nvfp4 import NVFP4_CODEC as NVFP4
from tpload.model.meta import TensorMeta
from tpload.selection.config import load_config
from tpload.tools.offline import verify_checkpoint
from tpload.tools.published import write_published

PATHS = pytest.mark.parametrize("path", ["kernel", "torch", "reference"])
GROUP = 16
ORDER_SENSITIVE = np.array([1004059182], dtype=np.uint32).view(np.float32)[0]
"""A global scale (about 0.00661) for which (code x scale) x scale_2 and code x (scale x scale_2)
round to different bf16 values for some (code, scale) pairs: it pins the order of the products."""
SCALE2 = {
    "one": np.float32(1.0),
    "tiny": np.float32(1e-30),
    "subnormal": np.float32(2.0**-140),
    "huge": np.float32(1e36),
    "power": np.float32(2.0**100),
    "zero": np.float32(0.0),
    "odd": np.float32(0.0123456),
    "order": ORDER_SENSITIVE,
}


def meta(name: str, dtype: str, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(name, "model-00001.safetensors", dtype, shape)


def nvfp4_fit(n: int, k: int, weight_dtype: str = "U8", scale2_shape: tuple[int, ...] = ()) -> Fit:
    fit = NVFP4.fit(
        meta("w.weight", weight_dtype, (n, k // 2)),
        meta("w.weight_scale", "F8_E4M3", (n, k // GROUP)),
        scale2=meta("w.weight_scale_2", "F32", scale2_shape),
    )
    assert isinstance(fit, Fit), fit
    return fit


def f32_bytes(v: float) -> np.ndarray:
    """The global scale as stored: four bytes of one F32."""
    return np.array([v], dtype=np.float32).view(np.uint8)


def expected(packed: np.ndarray, scale: np.ndarray, scale2: np.float32) -> np.ndarray:
    """ml_dtypes: bf16 bits of (E2M1 x E4M3) x scale_2, each product in float32."""
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed & 0x0F, packed >> 4
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    scales = np.repeat(
        np.ascontiguousarray(scale).view(ml_dtypes.float8_e4m3fn).astype(np.float32), GROUP, axis=1
    )
    with np.errstate(over="ignore", invalid="ignore"):
        product = (values * scales).astype(np.float32) * np.float32(scale2)
    assert product.dtype == np.float32
    return product.astype(ml_dtypes.bfloat16).view(np.uint16)


def decode(
    path: str,
    packed: np.ndarray,
    scale: np.ndarray,
    scale2: np.float32,
    fit: Fit,
    codec: Codec = NVFP4,
) -> np.ndarray:
    """bf16 bits of one decode path's output."""
    out = torch.empty((packed.shape[0], packed.shape[1] * 2), dtype=torch.bfloat16)
    raw2 = f32_bytes(scale2)
    if path == "kernel":
        codec.decode(packed, scale, out, fit, scale2=raw2)
    elif path == "torch":
        codec.decode(
            torch.from_numpy(np.ascontiguousarray(packed)),
            torch.from_numpy(np.ascontiguousarray(scale)),
            out,
            fit,
            scale2=raw2,
        )
    else:
        codec.reference(packed, scale, out, fit, scale2=raw2)
    return out.view(torch.int16).numpy().view(np.uint16)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-equal bf16, except that a NaN need only be a NaN (its payload and sign are free)."""
    nan_got = (got & 0x7FFF) > 0x7F80
    nan_want = (want & 0x7FFF) > 0x7F80
    np.testing.assert_array_equal(nan_got, nan_want)
    np.testing.assert_array_equal(np.where(nan_want, 0, got), np.where(nan_want, 0, want))


def every_byte_under_every_scale() -> tuple[np.ndarray, np.ndarray]:
    """Row ``s`` holds all 256 packed bytes (512 elements: every E2M1 pair) under scale byte
    ``s``."""
    packed = np.tile(np.arange(256, dtype=np.uint8), (256, 1))
    scale = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 512 // GROUP, axis=1)
    return packed, scale


# -- the decode


def test_the_reference_formula_reads_e2m1_and_e4m3_as_documented() -> None:
    # the independent side itself: E2M1 codes 0..15 and E4M3 scale classes
    codes = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert codes.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    e4m3 = np.array([0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0xB8, 0xFE], np.uint8).view(
        ml_dtypes.float8_e4m3fn
    )
    assert e4m3.astype(np.float32).tolist() == [
        0.0,
        2.0**-9,
        7 * 2.0**-9,
        2.0**-6,
        1.0,
        448.0,
        -1.0,
        -448.0,
    ]


@PATHS
@pytest.mark.parametrize("scale2", list(SCALE2), ids=list(SCALE2))
def test_every_packed_byte_under_every_scale_byte_matches_ml_dtypes(path: str, scale2: str) -> None:
    packed, scale = every_byte_under_every_scale()
    fit = nvfp4_fit(256, 512)
    got = decode(path, packed, scale, SCALE2[scale2], fit)
    assert_bits_equal(got, expected(packed, scale, SCALE2[scale2]))


def test_the_order_sensitive_global_scale_does_tell_the_two_orders_apart() -> None:
    # guard for the test above: with this scale_2 the other order gives other bf16 values
    packed, scale = every_byte_under_every_scale()
    codes = np.empty((256, 512), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed & 0x0F, packed >> 4
    v = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    s = np.repeat(scale.view(ml_dtypes.float8_e4m3fn).astype(np.float32), GROUP, axis=1)
    other = (v * (s * ORDER_SENSITIVE)).astype(ml_dtypes.bfloat16).view(np.uint16)
    want = expected(packed, scale, ORDER_SENSITIVE)
    finite = (want & 0x7FFF) <= 0x7F80
    assert (other[finite] != want[finite]).sum() > 0


@PATHS
@pytest.mark.parametrize(
    "scale_byte, name",
    [
        (0x00, "zero"),
        (0x80, "negative zero"),
        (0x01, "smallest subnormal"),
        (0x05, "subnormal"),
        (0x08, "smallest normal"),
        (0x38, "one"),
        (0x7E, "448"),
        (0xFE, "-448"),
        (0xB3, "negative normal"),
        (0x83, "negative subnormal"),
    ],
)
def test_each_scale_class_times_all_16_codes(path: str, scale_byte: int, name: str) -> None:
    # one row: the 16 codes in order (packed pairs 0x10, 0x32, ...), one scale byte
    packed = np.array([[c | (c + 1) << 4 for c in range(0, 16, 2)]], dtype=np.uint8)
    scale = np.array([[scale_byte]], dtype=np.uint8)
    for s2 in (np.float32(1.0), np.float32(0.37)):
        got = decode(path, packed, scale, s2, nvfp4_fit(1, 16))
        np.testing.assert_array_equal(got, expected(packed, scale, s2), err_msg=name)
    if scale_byte == 0x7E:  # 448 x the 16 codes, times 1: exact in bf16
        got = decode(path, packed, scale, np.float32(1.0), nvfp4_fit(1, 16))
        values = (got.astype(np.uint32) << 16).view(np.float32)[0]
        assert values.tolist() == [
            448 * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6)
        ]


@PATHS
def test_nan_scale_bytes_decode_to_nan(path: str) -> None:
    packed = np.full((2, 8), 0x21, dtype=np.uint8)
    scale = np.array([[0x7F], [0xFF]], dtype=np.uint8)
    got = decode(path, packed, scale, np.float32(1.0), nvfp4_fit(2, 16))
    assert ((got & 0x7FFF) > 0x7F80).all()


@PATHS
def test_random_rows_with_i8_weights_and_a_one_element_global_scale(path: str) -> None:
    rng = np.random.default_rng(7)
    packed = rng.integers(0, 256, (33, 64), dtype=np.uint8)
    scale = rng.integers(0, 0x7F, (33, 8), dtype=np.uint8) | (
        rng.integers(0, 2, (33, 8), dtype=np.uint8) << 7
    )
    fit = nvfp4_fit(33, 128, weight_dtype="I8", scale2_shape=(1,))
    s2 = np.float32(0.0029)
    got = decode(path, packed.view(np.int8).view(np.uint8), scale, s2, fit)
    assert_bits_equal(got, expected(packed, scale, s2))


# -- fit


@pytest.mark.parametrize(
    "weight, scale, scale2, words",
    [
        (("U8", (4, 8)), ("F8_E4M3", (4, 1)), ("BF16", ()), "must be one F32 value, not BF16"),
        (("U8", (4, 8)), ("F8_E4M3", (4, 1)), ("F32", (2,)), "must be one F32 value, not F32 [2]"),
        (("U8", (4, 8)), ("F8_E4M3", (4, 2)), ("F32", ()), "expected [4, 1]"),
        (("U8", (4, 8)), ("F8_E8M0", (4, 1)), ("F32", ()), "F8_E4M3 scale"),
        (("F8_E4M3", (4, 8)), ("F8_E4M3", (4, 1)), ("F32", ()), "2-D U8 weight"),
        (("U8", (4, 8)), ("F8_E4M3", (4, 1)), None, "F32 global scale"),
    ],
)
def test_fit_refuses(weight: tuple, scale: tuple, scale2: tuple | None, words: str) -> None:
    why = NVFP4.fit(
        meta("w.weight", *weight),
        meta("w.weight_scale", *scale),
        scale2=None if scale2 is None else meta("w.weight_scale_2", *scale2),
    )
    assert isinstance(why, str) and words in why


def test_fit_refuses_a_stacked_weight() -> None:
    why = NVFP4.fit(
        meta("w", "U8", (4, 8)),
        meta("s", "F8_E4M3", (4, 1)),
        scale2=meta("s2", "F32", ()),
        stacked=True,
    )
    assert isinstance(why, str) and "not stacked" in why


# -- windows


def box(whole: np.ndarray, cut: Cut) -> np.ndarray:
    return whole.reshape(cut.view)[cut.rows[0] : cut.rows[1], cut.cols[0] : cut.cols[1]]


@pytest.mark.parametrize("path", ["kernel", "torch"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_windows_cut_whole_16_groups_and_decode_to_the_column_slice(
    path: str, tp: int
) -> None:
    n, k = 24, 256
    rng = np.random.default_rng(tp)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scale = rng.integers(0x10, 0x60, (n, k // GROUP), dtype=np.uint8)
    fit = nvfp4_fit(n, k)
    s2 = np.float32(0.0071)
    full = expected(packed, scale, s2)
    per = k // tp
    for r in range(tp):
        cuts = NVFP4.window(fit, "cols", tp, r)
        assert not isinstance(cuts, str), cuts
        wc, sc = cuts
        lo, hi = r * per, (r + 1) * per
        assert (wc.rows, wc.cols, wc.shape) == ((0, n), (lo // 2, hi // 2), (n, per // 2))
        assert (sc.rows, sc.cols, sc.shape) == (
            (0, n),
            (lo // GROUP, hi // GROUP),
            (n, per // GROUP),
        )
        pw, ps = box(packed, wc), box(scale, sc)  # strided rows of the whole tensors, read in place
        np.testing.assert_array_equal(pw, packed[:, lo // 2 : hi // 2])
        np.testing.assert_array_equal(ps, scale[:, lo // GROUP : hi // GROUP])
        got = decode(path, pw, ps, s2, fit)
        np.testing.assert_array_equal(got, full[:, lo:hi])
        assert NVFP4.decoded_shape(fit, wc) == (n, per)


@pytest.mark.parametrize("tp", [2, 4])
def test_row_windows_cut_weight_and_scale_alike(tp: int) -> None:
    fit = nvfp4_fit(64, 32)
    for r in range(tp):
        wc, sc = NVFP4.window(fit, "rows", tp, r)
        rows = (r * 64 // tp, (r + 1) * 64 // tp)
        assert (wc.rows, wc.cols, sc.rows, sc.cols) == (rows, (0, 16), rows, (0, 2))


def test_column_window_not_whole_16_groups_is_refused() -> None:
    fit = nvfp4_fit(4, 48)  # 3 groups of 16
    why = NVFP4.window(fit, "cols", 2, 0)
    assert why == "3 scale blocks of 16 / tp 2 is not whole"


def test_served_packed_keeps_the_stored_dtypes_and_the_whole_global_scale() -> None:
    fit = nvfp4_fit(64, 256)
    wc, sc = NVFP4.window(fit, "cols", 4, 1)
    assert NVFP4.served(fit, wc, sc, "packed") == [
        ("w.weight", torch.uint8, (64, 32), 64 * 32),
        ("w.weight_scale", torch.float8_e4m3fn, (64, 4), 64 * 4),
        ("w.weight_scale_2", torch.float32, (), 4),
    ]
    assert NVFP4.served(fit, wc, sc, "expanded") == [
        ("w.weight", torch.bfloat16, (64, 64), 64 * 64 * 2)
    ]
    assert NVFP4.copies(fit, "packed") and not NVFP4.copies(fit, "expanded")


# -- value checks


def run_checker(packed: np.ndarray, scale: np.ndarray, scale2: float) -> dict[str, int]:
    fit = nvfp4_fit(packed.shape[0], packed.shape[1] * 2)
    wc, sc = NVFP4.window(fit, "replicate", 1, 0)
    checker = NVFP4.checker(fit, wc, sc)
    checker.scale(scale, 0)
    checker.scale2(f32_bytes(scale2))
    checker.weight(packed, 0)
    return {what: count for count, what, _ in checker.problems()}


def _count(problems: dict[str, int], word: str) -> int:
    return sum(v for k, v in problems.items() if word in k)


def test_checker_counts_nan_scale_bytes_and_accepts_negative_ones() -> None:
    packed, scale = every_byte_under_every_scale()
    problems = run_checker(packed, scale, 1.0)
    assert _count(problems, "NaN") == 2 * scale.shape[1]  # rows 0x7F and 0xFF
    assert _count(problems, "global") == 0 and _count(problems, "overflow") == 0
    negative = np.full((1, 1), 0xB8, np.uint8)  # -1.0: legal, decodes negative
    assert sum(run_checker(np.full((1, 8), 0x77, np.uint8), negative, 1.0).values()) == 0


@pytest.mark.parametrize(
    "scale2, bad", [(-1.0, 1), (float("inf"), 1), (float("nan"), 1), (0.0, 0), (3e-3, 0)]
)
def test_checker_refuses_a_global_scale_not_finite_and_non_negative(
    scale2: float, bad: int
) -> None:
    problems = run_checker(np.zeros((1, 8), np.uint8), np.full((1, 1), 0x38, np.uint8), scale2)
    assert _count(problems, "global") == bad


@pytest.mark.parametrize(
    "scale2, overflows", [(1e36, True), (2.0**117, True), (2.0**115, False), (1.0, False)]
)
def test_checker_counts_exactly_the_decodes_that_overflow_bf16(
    scale2: float, overflows: bool
) -> None:
    # 2^117: only the largest |code x scale| (from 2^11) reach bf16's limit; 2^115: none does
    packed, scale = every_byte_under_every_scale()
    want = expected(packed, scale, np.float32(scale2))
    overflow = int(((want & 0x7FFF) == 0x7F80).sum())  # +-inf in the ml_dtypes decode
    assert _count(run_checker(packed, scale, scale2), "overflow") == overflow
    assert (overflow > 0) == overflows


# -- verification at rest (tpload verify) against a load


def _set_tensor_bytes(root: Path, name: str, data: bytes) -> None:
    """Overwrite one tensor's bytes in its shard and its sha256 in the manifest (a consistent
    checkpoint)."""
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    path = root / index[name]
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    assert end - begin == len(data)
    raw[8 + n + begin : 8 + n + end] = data
    path.write_bytes(bytes(raw))
    manifest = json.loads((root / "NATIVE_MANIFEST.json").read_text())
    manifest["tensors"][name]["sha256"] = hashlib.sha256(data).hexdigest()
    (root / "NATIVE_MANIFEST.json").write_text(json.dumps(manifest))


BAD_SCALE2 = "model.layers.1.mlp.shared_experts.down_proj.weight_scale_2"
BAD = {
    -1.0: r"weight_scale_2.*global scales \(weight_scale_2\) not a finite number >= 0",
    1e36: r"down_proj.weight.*elements whose decode overflows bf16",
}


@pytest.fixture(scope="module", params=list(BAD), ids=["negative", "huge"])
def bad_global_scale(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, float]:
    """nvfp4-tiny with one weight_scale_2 set to -1.0, or to 1e36 (its decode overflows bf16); the
    manifest updated to match."""
    root = write_published(tmp_path_factory.mktemp("nvfp4") / "ckpt", "nvfp4-tiny")
    _set_tensor_bytes(root, BAD_SCALE2, np.array([request.param], np.float32).tobytes())
    return root, request.param


def test_load_refuses_a_bad_global_scale(bad_global_scale: tuple[Path, float]) -> None:
    import tpload

    root, value = bad_global_scale
    with pytest.raises(tpload.LoadError, match=BAD[value]):
        tpload.load(root, kind="packed", progress=False)


def test_verify_at_rest_reports_a_bad_global_scale(bad_global_scale: tuple[Path, float]) -> None:
    root, _ = bad_global_scale
    problems = verify_checkpoint(root, load_config("deepseek-v3+nvfp4"))
    assert any("weight_scale_2" in p or "overflows bf16" in p for p in problems), problems
