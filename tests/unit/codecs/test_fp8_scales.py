"""FP8 (E4M3) 128x128 block decode with every scale dtype the codec takes
(tpload/codecs/fp8_block.py).

Scales stored as F32, BF16 and F16 values (V3's and Qwen3's ``weight_scale_inv``) or as E8M0 / U8
exponent bytes (V4's ``.scale``). Every decode path (kernel for host arrays, torch, the numpy
reference) is checked bit for bit against ml_dtypes: ``bf16_rne(f32(e4m3) * f32(scale))``, on
shapes whose last row and column blocks are short. Then the SERVED_SCALE rule: a packed load serves
F16 scales as F16 (the F16 -> BF16 rule is for weights only), checked on the codec and through
``tpload.load`` of a hand-written checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tpload.codecs.base import Fit
from tpload.codecs.fp8_block import FP8
from tpload.codecs.plain import PLAIN
from tpload.codecs.tables import SERVED, SERVED_SCALE
from tpload.model.meta import TensorMeta

B = 128
PATHS = pytest.mark.parametrize("path", ["kernel", "torch", "reference"])
SCALE_DTYPES = ["F32", "BF16", "F16", "F8_E8M0", "U8"]
ML = {
    "F32": np.float32,
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "U8": ml_dtypes.float8_e8m0fnu,
}
NUMPY_STORED = {
    "F32": np.float32,
    "BF16": np.uint16,
    "F16": np.float16,
    "F8_E8M0": np.uint8,
    "U8": np.uint8,
}


def meta(name: str, dtype: str, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(name, "model.safetensors", dtype, shape)


def fp8_fit(n: int, k: int, scale_dtype: str) -> Fit:
    scale = meta("w.weight_scale_inv", scale_dtype, (-(-n // B), -(-k // B)))
    fit = FP8.fit(meta("w.weight", "F8_E4M3", (n, k)), scale, block=B)
    assert isinstance(fit, Fit), fit
    assert fit.group == (B, B)
    return fit


def scales(dtype: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """Legal (finite, positive) scales of ``dtype``, as their stored numpy array; spanning tiny
    (subnormal F16), ordinary and large values."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype in ("F8_E8M0", "U8"):
        out = rng.integers(1, 255, n, dtype=np.uint8)
    elif dtype == "F16":
        bits = rng.integers(
            0x0001, 0x7C00, n, dtype=np.uint16
        )  # every finite positive F16, subnormals included
        out = bits.view(np.float16)
    elif dtype == "BF16":
        out = rng.integers(0x0001, 0x7F80, n, dtype=np.uint16)  # bf16 bits, finite and positive
    else:
        out = (2.0 ** rng.uniform(-30, 30, n) * rng.uniform(1, 2, n)).astype(np.float32)
    return out.reshape(shape)


def weights(shape: tuple[int, int], seed: int, nan: bool = False) -> np.ndarray:
    codes = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return codes if nan else np.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).astype(np.uint8)


def expected(codes: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """ml_dtypes: bf16 bits of e4m3 x block scale, the product in float32."""
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s = np.ascontiguousarray(scale).view(ML[dtype]).astype(np.float32)
    full = np.repeat(np.repeat(s, B, axis=0), B, axis=1)[: codes.shape[0], : codes.shape[1]]
    with np.errstate(over="ignore", invalid="ignore"):
        product = values * full
    assert product.dtype == np.float32
    return product.astype(ml_dtypes.bfloat16).view(np.uint16)


def decode(path: str, codes: np.ndarray, scale: np.ndarray, fit: Fit) -> np.ndarray:
    out = torch.empty(codes.shape, dtype=torch.bfloat16)
    raw = (
        np.ascontiguousarray(scale).view(np.uint8).reshape(scale.shape[0], -1)
    )  # the stored bytes, 2-D
    if path == "kernel":
        FP8.decode(codes, raw, out, fit)
    elif path == "torch":
        FP8.decode(
            torch.from_numpy(np.ascontiguousarray(codes)), torch.from_numpy(raw.copy()), out, fit
        )
    else:
        FP8.reference(codes, raw, out, fit)
    return out.view(torch.int16).numpy().view(np.uint16)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    nan_got, nan_want = (got & 0x7FFF) > 0x7F80, (want & 0x7FFF) > 0x7F80
    np.testing.assert_array_equal(nan_got, nan_want)
    np.testing.assert_array_equal(np.where(nan_want, 0, got), np.where(nan_want, 0, want))


# -- decode


@PATHS
@pytest.mark.parametrize("dtype", SCALE_DTYPES)
@pytest.mark.parametrize("shape", [(300, 200), (128, 256), (1, 129), (257, 1)])
def test_block_decode_with_edge_blocks_matches_ml_dtypes(
    path: str, dtype: str, shape: tuple[int, int]
) -> None:
    n, k = shape
    fit = fp8_fit(n, k, dtype)
    codes = weights(shape, n * k)
    scale = scales(dtype, (-(-n // B), -(-k // B)), n + k)
    assert_bits_equal(decode(path, codes, scale, fit), expected(codes, scale, dtype))


@PATHS
@pytest.mark.parametrize("dtype", SCALE_DTYPES)
def test_every_e4m3_code_including_nan_under_each_scale_dtype(path: str, dtype: str) -> None:
    # codes[r, c] = (r + c) % 256: every code (NaN 0x7F/0xFF too) in every full block; 3 x 3 blocks,
    # the last row and column blocks short (44)
    codes = ((np.arange(300)[:, None] + np.arange(300)[None, :]) % 256).astype(np.uint8)
    fit = fp8_fit(300, 300, dtype)
    scale = scales(dtype, (3, 3), 99)
    got = decode(path, codes, scale, fit)
    assert_bits_equal(got, expected(codes, scale, dtype))
    nan = (codes & 0x7F) == 0x7F
    assert ((got[nan] & 0x7FFF) > 0x7F80).all()


@PATHS
def test_f32_scales_that_overflow_bf16_give_infinity(path: str) -> None:
    # F32 2^120: the largest E4M3 codes (from 2^8) times 2^120 pass bf16's max; smaller ones do not
    codes = np.tile(np.arange(0x70, 0x7F, dtype=np.uint8), (2, 1))
    scale = np.array([[2.0**120]], np.float32)
    fit = fp8_fit(2, codes.shape[1], "F32")
    want = expected(codes, scale, "F32")
    assert ((want & 0x7FFF) == 0x7F80).any()
    assert_bits_equal(decode(path, codes, scale, fit), want)


@PATHS
@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_value_scales_round_the_f32_product_once_to_bf16(path: str, dtype: str) -> None:
    # scales with many significant bits: the f32 product has bits below bf16's, ties included
    codes = np.tile(np.arange(0, 0x7F, dtype=np.uint8), (4, 1))
    raw = {
        "F32": np.array([[1.0 + 2.0**-8 + 2.0**-20]], np.float32),
        "BF16": np.array([[0x3F81]], np.uint16),  # 1 + 2^-7
        "F16": np.array([[1.0 + 2.0**-9 + 2.0**-10]], np.float16),
    }[dtype]
    fit = fp8_fit(4, codes.shape[1], dtype)
    assert_bits_equal(decode(path, codes, raw, fit), expected(codes, raw, dtype))


def test_every_value_scale_dtype_decodes_alike_for_the_same_value() -> None:
    # 2^-7 exactly in every dtype: the same decode, equal to the E8M0 byte 120
    codes = weights((130, 130), 5)
    want = decode("reference", codes, np.full((2, 2), 120, np.uint8), fp8_fit(130, 130, "F8_E8M0"))
    for dtype, value in (
        ("F32", np.float32(2.0**-7)),
        ("F16", np.float16(2.0**-7)),
        ("BF16", np.array(2.0**-7, ml_dtypes.bfloat16).view(np.uint16)),
    ):
        scale = np.full((2, 2), value)
        for path in ("kernel", "torch", "reference"):
            np.testing.assert_array_equal(
                decode(path, codes, scale, fp8_fit(130, 130, dtype)), want
            )


# -- served: scales keep their dtype


def test_served_scale_table_keeps_f16_while_weights_become_bf16() -> None:
    assert SERVED["F16"] == torch.bfloat16
    assert SERVED_SCALE["F16"] == torch.float16
    assert {k: v for k, v in SERVED_SCALE.items() if k != "F16"} == {
        k: v for k, v in SERVED.items() if k != "F16"
    }


@pytest.mark.parametrize(
    "dtype, served, item",
    [("F16", torch.float16, 2), ("BF16", torch.bfloat16, 2), ("F32", torch.float32, 4)],
)
@pytest.mark.parametrize("split", ["rows", "cols"])
def test_packed_serves_value_scales_in_their_own_dtype(
    dtype: str, served: torch.dtype, item: int, split: str
) -> None:
    fit = fp8_fit(576, 1024, dtype)  # 5 x 8 blocks
    wc, sc = FP8.window(fit, "cols" if split == "cols" else "replicate", 2, 1)
    wshape, sshape = ((576, 512), (5, 4)) if split == "cols" else ((576, 1024), (5, 8))
    assert FP8.served(fit, wc, sc, "packed") == [
        ("w.weight", torch.float8_e4m3fn, wshape, wshape[0] * wshape[1]),
        ("w.weight_scale_inv", served, sshape, sshape[0] * sshape[1] * item),
    ]
    assert FP8.served(fit, wc, sc, "expanded") == [
        ("w.weight", torch.bfloat16, wshape, wshape[0] * wshape[1] * 2)
    ]


def test_an_f16_plain_weight_is_served_as_bf16_in_both_kinds() -> None:
    fit = PLAIN.fit(meta("norm.weight", "F16", (64,)), None)
    wc, _ = PLAIN.window(fit, "replicate", 1, 0)
    for kind in ("packed", "expanded"):
        assert PLAIN.served(fit, wc, None, kind) == [("norm.weight", torch.bfloat16, (64,), 128)]


@pytest.fixture(scope="module")
def f16_scaled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A Qwen3-MoE-named FP8 checkpoint written with the safetensors library: an FP8 weight with an
    F16 weight_scale_inv (edge blocks on both axes) and an F16 norm, with a manifest."""
    root = tmp_path_factory.mktemp("f16scales")
    codes = weights((300, 200), 3)
    scale = scales("F16", (3, 2), 4)
    scale = np.where(scale < 1e-3, np.float16(0.03), scale).astype(np.float16)
    norm = np.random.default_rng(5).uniform(-2, 2, 64).astype(np.float16)
    tensors = {
        "model.layers.0.mlp.gate_proj.weight": torch.from_numpy(codes).view(torch.float8_e4m3fn),
        "model.layers.0.mlp.gate_proj.weight_scale_inv": torch.from_numpy(scale),
        "model.norm.weight": torch.from_numpy(norm),
    }
    save_file(tensors, str(root / "model.safetensors"))
    dtypes = {"model.layers.0.mlp.gate_proj.weight": "F8_E4M3"}
    manifest = {
        name: {
            "file": "model.safetensors",
            "dtype": dtypes.get(name, "F16"),
            "shape": list(t.shape),
            "sha256": hashlib.sha256(
                t.contiguous().view(torch.uint8).numpy().tobytes()
            ).hexdigest(),
        }
        for name, t in tensors.items()
    }
    (root / "NATIVE_MANIFEST.json").write_text(json.dumps({"format": 1, "tensors": manifest}))
    (root / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
            }
        )
    )
    return root, {"codes": codes, "scale": scale, "norm": norm}


def test_a_packed_load_serves_f16_scales_as_f16_and_f16_weights_as_bf16(
    f16_scaled: tuple[Path, dict[str, np.ndarray]],
) -> None:
    import tpload

    root, data = f16_scaled
    sd = tpload.load(root, kind="packed", progress=False).state_dict()
    s = sd["model.layers.0.mlp.gate_proj.weight_scale_inv"]
    assert s.dtype == torch.float16 and tuple(s.shape) == (3, 2)
    np.testing.assert_array_equal(s.numpy().view(np.uint16), data["scale"].view(np.uint16))
    w = sd["model.layers.0.mlp.gate_proj.weight"]
    assert w.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(w.view(torch.uint8).numpy(), data["codes"])
    norm = sd["model.norm.weight"]
    assert norm.dtype == torch.bfloat16
    np.testing.assert_array_equal(
        norm.view(torch.int16).numpy().view(np.uint16),
        data["norm"].astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16),
    )


def test_an_expanded_load_decodes_with_f16_scales_like_ml_dtypes(
    f16_scaled: tuple[Path, dict[str, np.ndarray]],
) -> None:
    import tpload

    root, data = f16_scaled
    sd = tpload.load(root, kind="expanded", progress=False).state_dict()
    assert set(sd) == {"model.layers.0.mlp.gate_proj.weight", "model.norm.weight"}
    w = sd["model.layers.0.mlp.gate_proj.weight"]
    assert w.dtype == torch.bfloat16
    np.testing.assert_array_equal(
        w.view(torch.int16).numpy().view(np.uint16), expected(data["codes"], data["scale"], "F16")
    )
