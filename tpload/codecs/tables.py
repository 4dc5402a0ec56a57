"""The bit-level tables every codec shares: served dtypes, E2M1 and E8M0 values, decode lookups.

The rules follow docs/format.md bit for bit:

* FP4 (E2M1) packs two elements per byte, element ``k`` in byte ``k // 2``,
  even ``k`` in the **low** nibble; codes 0..15 are
  ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` and their negatives (code 8 is -0).
* E8M0 byte ``e`` is ``2**(e - 127)``; 0x00 and 0xFF are refused (the serving
  kernels assume 1..254), so every legal scale is an exact power of two.
* E4M3 is the ``fn`` variant: bias 7, max 448, codes 0x7F/0xFF are NaN.

A decode is exact in fp32 and rounded once to bf16, so an expanded shard is a
deterministic function of the stored bytes on any device.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
E8M0_INVALID = (0x00, 0xFF)
E4M3_NAN = (0x7F, 0xFF)

FLOAT8_E4M3 = getattr(torch, "float8_e4m3fn", None)
FLOAT8_E8M0 = getattr(torch, "float8_e8m0fnu", None)

# How a stored dtype is served when kept as stored (F16 becomes BF16: the seed weight store's rule).
SERVED: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F16": torch.bfloat16,
    "F8_E4M3": FLOAT8_E4M3 or torch.uint8,
    "F8_E8M0": FLOAT8_E8M0 or torch.uint8,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I64": torch.int64,
    **{
        t: torch.uint8 for t in ("Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
    },  # GGUF blocks, packed
}
# Scales are served exactly as stored (the F16 -> BF16 rule is for weights).
SERVED_SCALE: dict[str, torch.dtype] = {**SERVED, "F16": torch.float16}


def e8m0_to_f32(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (1..254) -> exact fp32 powers of two (the byte placed in fp32's exponent
    field)."""
    return (scale.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)


def e8m0_to_bf16(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (1..254) -> exact bf16 powers of two."""
    return (scale.view(torch.uint8).to(torch.int16) << 7).view(torch.bfloat16)


@functools.cache
def _scaled_table_cpu(kind: str) -> torch.Tensor:
    scale = e8m0_to_f32(torch.arange(256, dtype=torch.int32).to(torch.uint8)).unsqueeze(
        1
    )  # [256, 1]
    if kind == "fp4":
        codes = torch.arange(256)
        e2m1 = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        lo = (e2m1[codes & 0xF] * scale).to(torch.bfloat16).view(torch.int16).to(
            torch.int32
        ) & 0xFFFF
        hi = (e2m1[codes >> 4] * scale).to(torch.bfloat16).view(torch.int16).to(torch.int32)
        return (lo | (hi << 16)).reshape(-1)
    e4m3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FLOAT8_E4M3).to(torch.float32)
    return (e4m3 * scale).to(torch.bfloat16).view(torch.int16).reshape(-1)


@functools.cache
def _scaled_table_on(kind: str, device: str) -> torch.Tensor:
    return _scaled_table_cpu(kind).to(device)


def scaled_table(kind: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[256 scale bytes x 256 codes]`` of decoded bf16 bits (flat), built once per device.

    fp4: int32 per packed byte (its two elements, low nibble in the low half);
    fp8: int16 per E4M3 code. Each entry is the code's exact value times
    ``2**(scale - 127)`` in fp32, rounded once to bf16: bit for bit what decoding
    and then multiplying by the E8M0 scale gives, in one lookup.
    """
    device = torch.device(device)
    return _scaled_table_cpu(kind) if device.type == "cpu" else _scaled_table_on(kind, str(device))


DECODE_CHUNK = (
    1 << 16
)  # torch path: packed bytes (fp4) or codes (fp8) per step, so the int32 indices stay in L2


def lookup(
    table: torch.Tensor, codes: torch.Tensor, scale_shift: torch.Tensor, out: torch.Tensor
) -> None:
    """``out = table[scale * 256 + code]`` for a ``[rows, groups, per]`` block of codes whose scale
    bytes (already shifted left by 8, as int32) are ``[rows, groups, 1]`` (torch ops, any
    device)."""
    idx = codes.to(torch.int32)
    idx += scale_shift
    torch.index_select(table, 0, idx.reshape(-1), out=out.reshape(-1))


def round_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounding to nearest even: the reference rounding, in numpy."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    out[nan] = (bits[nan] >> 16).astype(np.uint16) | 0x40  # keep NaN a NaN
    result: np.ndarray = out
    return result


def e4m3_values() -> np.ndarray:
    """The 256 E4M3 (fn) code values as float32, from their bits (NaN for 0x7F/0xFF): numpy only."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = (sign * value).astype(np.float32)
    value[(codes & 0x7F) == 0x7F] = np.nan
    result: np.ndarray = value
    return result


def e2m1_values() -> np.ndarray:
    result: np.ndarray = np.array(E2M1_VALUES, dtype=np.float32)
    return result


def e8m0_values(scale: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 powers of two, from the bits: numpy only."""
    result: np.ndarray = (scale.astype(np.uint32) << 23).view(np.float32)
    return result
