"""Stored dtypes and the exact decoders, in plain torch ops (any device).

The tables follow ../shared/docs/format.md bit for bit:

* FP4 (E2M1) packs two elements per byte, element ``k`` in byte ``k // 2``,
  even ``k`` in the **low** nibble; each group of 32 elements along K shares
  one E8M0 scale byte ``e`` worth ``2**(e - 127)``.
* FP8 (E4M3, the ``fn`` variant) dense matrices share one scale per B x B
  block; the scale is E8M0 bytes (V4) or F32 values (V3's
  ``weight_scale_inv``).
* E8M0 bytes 0x00 and 0xFF and E4M3 codes 0x7F / 0xFF are rejected by the
  callers (see :func:`count_bad_e8m0`, :func:`count_bad_e4m3`) before any
  decode: the serving kernels assume they never occur.

Every decode here is exact in fp32, and in bf16 unless it overflows, so an
expanded shard is a deterministic function of the stored bytes on any device.

On the CPU the E8M0 decodes run the compiled table lookups of :mod:`tpload.kernels`
(the same table, the same bits, several times the speed of the torch ops); the
torch path serves CUDA, F32 scales, and tests that compare the two
(``use_kernels=False``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import kernels

FP4_GROUP = 32  # elements sharing one E8M0 scale byte

# E2M1 codes 0..15 (sign bit 3, exponent bits 1-2, mantissa bit 0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_FLOAT8_E8M0 = getattr(torch, "float8_e8m0fnu", None)
_FLOAT8_E4M3 = getattr(torch, "float8_e4m3fn", None)


@dataclass(frozen=True)
class StoredDType:
    """One safetensors dtype as tpload understands it."""

    name: str
    """The spelling in the safetensors header (``"BF16"``, ``"F8_E4M3"``...)."""
    itemsize: int
    """Bytes per stored element."""
    served: torch.dtype
    """The torch dtype a tensor of this kind is served as when kept as stored."""


# The seed weight store's table, exactly: anything else is refused by name.
# F16 is served as BF16 (f16 -> f32 -> bf16, round to nearest even).
DTYPES: dict[str, StoredDType] = {
    d.name: d
    for d in (
        StoredDType("BF16", 2, torch.bfloat16),
        StoredDType("F32", 4, torch.float32),
        StoredDType("F16", 2, torch.bfloat16),
        StoredDType("F8_E4M3", 1, _FLOAT8_E4M3 or torch.uint8),
        StoredDType("F8_E8M0", 1, _FLOAT8_E8M0 or torch.uint8),
        StoredDType("U8", 1, torch.uint8),
        StoredDType("I8", 1, torch.int8),
        StoredDType("I64", 8, torch.int64),
    )
}

# Per role, which stored dtypes are acceptable.
FP4_WEIGHT_DTYPES = ("I8", "U8")
E8M0_SCALE_DTYPES = ("F8_E8M0", "U8")
FP8_WEIGHT_DTYPES = ("F8_E4M3",)
FP8_SCALE_DTYPES = ("F8_E8M0", "U8", "F32")
PLAIN_DTYPES = ("BF16", "F32", "F16", "I64")


def _fp4_pair_table(device: torch.device) -> torch.Tensor:
    """int32[256]: byte -> its two decoded bf16 elements as one 32-bit word.

    Little-endian: the low 16 bits hold element ``2j`` (the low nibble), so an
    int32 view of a bf16 ``[N, K]`` row is filled one packed byte per word.
    """
    values = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    byte = torch.arange(256, dtype=torch.int32)
    table = values[byte & 0xF] | (values[byte >> 4] << 16)
    return table.to(device)


_PAIR_TABLES: dict[torch.device, torch.Tensor] = {}


def fp4_pair_table(device: torch.device) -> torch.Tensor:
    """The cached :func:`_fp4_pair_table` for ``device`` (built on first use)."""
    device = torch.device(device)
    table = _PAIR_TABLES.get(device)
    if table is None:
        table = _PAIR_TABLES[device] = _fp4_pair_table(device)
    return table


def e8m0_to_bf16(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (1..254) -> exact bf16 powers of two, by placing the byte in
    bf16's exponent field (no float math, so no rounding can creep in)."""
    return (scale.view(torch.uint8).to(torch.int16) << 7).view(torch.bfloat16)


def e8m0_to_f32(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (1..254) -> exact fp32 powers of two."""
    return (scale.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)


def byte_counts(t: torch.Tensor) -> torch.Tensor:
    """How often each byte value occurs in ``t`` (int64[256], on its device).

    One bincount pass is several times faster on CPU than comparisons
    reduced with ``sum``/``any`` (torch's bool reductions are slow there).
    """
    return torch.bincount(t.view(torch.uint8).reshape(-1), minlength=256)


E8M0_INVALID = (0x00, 0xFF)  # refused scale bytes (see module doc)
E4M3_NAN = (0x7F, 0xFF)  # the ``fn`` variant's NaN codes; it has no infinities


def _count_either(t: torch.Tensor, codes: tuple[int, int]) -> torch.Tensor:
    """How many bytes of ``t`` are one of ``codes``, as a scalar on its device: one compiled
    pass on the CPU (:func:`kernels.count_either`), a bincount elsewhere."""
    if t.device.type == "cpu":  # the uint8 view: float8 tensors have no numpy view
        return torch.tensor(kernels.count_either(t.view(torch.uint8).numpy(), *codes), dtype=torch.int64)
    c = byte_counts(t)
    return c[codes[0]] + c[codes[1]]


def count_bad_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """How many scale bytes are 0x00 or 0xFF (both refused; see module doc), as a device scalar."""
    return _count_either(scale, E8M0_INVALID)


def count_bad_e4m3(weight: torch.Tensor) -> torch.Tensor:
    """How many E4M3 codes are NaN (0x7F, 0xFF; the ``fn`` variant has no inf), as a device scalar."""
    return _count_either(weight, E4M3_NAN)


def not_finite(t: torch.Tensor) -> torch.Tensor:
    """1 if ``t`` holds a NaN or an infinity, else 0 (a device scalar).

    ``aminmax`` propagates NaN and keeps infinities, and runs at memory speed.
    """
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    lo, hi = torch.aminmax(t.reshape(-1))
    return (~(torch.isfinite(lo) & torch.isfinite(hi))).to(torch.int64)


_SCALED_TABLES: dict[tuple[str, torch.device], torch.Tensor] = {}
DECODE_CHUNK = 1 << 16  # packed bytes (fp4) or codes (fp8) per step: the int32 indices stay in L2


def _scaled_table(kind: str, device: torch.device) -> torch.Tensor:
    """``[256 scale bytes x 256 codes]`` of decoded bf16 bits, built once per device.

    fp4: int32 per packed byte (its two elements, low nibble in the low half);
    fp8: int16 per E4M3 code. Each entry is the code's exact value times
    ``2**(scale - 127)`` in fp32, rounded once to bf16: bit for bit what
    decoding and then multiplying by the E8M0 scale gives, in one lookup.
    """
    device = torch.device(device)
    table = _SCALED_TABLES.get((kind, device))
    if table is None:
        scale = e8m0_to_f32(torch.arange(256, dtype=torch.int32).to(torch.uint8)).unsqueeze(1)  # [256, 1]
        if kind == "fp4":
            codes = torch.arange(256)
            e2m1 = torch.tensor(E2M1_VALUES, dtype=torch.float32)
            lo = (e2m1[codes & 0xF] * scale).to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
            hi = (e2m1[codes >> 4] * scale).to(torch.bfloat16).view(torch.int16).to(torch.int32)
            table = lo | (hi << 16)
        else:
            e4m3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(_FLOAT8_E4M3).to(torch.float32)
            table = (e4m3 * scale).to(torch.bfloat16).view(torch.int16)
        table = _SCALED_TABLES[(kind, device)] = table.reshape(-1).to(device)
    return table


def _lookup(table: torch.Tensor, codes: torch.Tensor, scale_shift: torch.Tensor, out: torch.Tensor) -> None:
    """``out = table[scale * 256 + code]`` for a ``[rows, groups, per]`` block of codes whose scale
    bytes (already shifted left by 8, as int32) are ``[rows, groups, 1]``."""
    idx = codes.to(torch.int32)
    idx += scale_shift
    torch.index_select(table, 0, idx.reshape(-1), out=out.reshape(-1))


def _on_kernels(use_kernels: bool | None, what: str, *tensors: torch.Tensor) -> bool:
    """Whether a decode runs the compiled CPU kernel: ``None`` = when every tensor is on the CPU."""
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    if use_kernels and not on_cpu:
        raise ValueError(f"{what}: use_kernels=True needs every tensor on the CPU")
    return on_cpu if use_kernels is None else use_kernels


def _host_bytes(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor of 1-byte elements as 2-D uint8 numpy, rows read in place (a window stays a view)."""
    b = t.view(torch.uint8)
    return (b if b.stride(-1) == 1 else b.contiguous()).numpy()


def decode_fp4(packed: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, *, rows_per_step: int | None = None,
               use_kernels: bool | None = None) -> torch.Tensor:
    """Decode packed FP4 ``[N, K/2]`` with E8M0 ``[N, K/32]`` into bf16 ``out [N, K]``.

    One table lookup per packed byte (:func:`_scaled_table`). On the CPU
    (``use_kernels`` None: when every tensor is there) :func:`kernels.decode_fp4`
    does it in one pass, reading window rows in place. Otherwise torch ops,
    in row chunks so the int32 indices stay a few hundred KiB whatever N is.
    """
    n, half_k = packed.shape
    k = half_k * 2
    if not out.is_contiguous():
        raise ValueError("decode_fp4: out must be contiguous (it is a preallocated slot)")
    if out.shape != (n, k) or scale.shape != (n, k // FP4_GROUP) or k % FP4_GROUP:
        raise ValueError(f"decode_fp4: packed {tuple(packed.shape)}, scale {tuple(scale.shape)}, out {tuple(out.shape)} disagree "
                         f"(K must be a multiple of {FP4_GROUP})")
    if _on_kernels(use_kernels, "decode_fp4", packed, scale, out):
        table = _scaled_table("fp4", torch.device("cpu")).numpy()
        kernels.decode_fp4(_host_bytes(packed), _host_bytes(scale), table, out.view(torch.int32).numpy())
        return out
    table = _scaled_table("fp4", packed.device)
    groups, per = k // FP4_GROUP, FP4_GROUP // 2  # 16 packed bytes share one scale byte
    words = out.view(torch.int32).view(n, groups, per)
    src = packed.view(torch.uint8).view(n, groups, per) if packed.is_contiguous() else packed.view(torch.uint8).reshape(n, groups, per)
    shift = scale.view(torch.uint8)
    step = rows_per_step or max(1, DECODE_CHUNK // max(half_k, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        _lookup(table, src[r0:r1], (shift[r0:r1].to(torch.int32) << 8).unsqueeze(-1), words[r0:r1])
    return out


def _block_scale_f32(scale: torch.Tensor) -> torch.Tensor:
    """A dense scale as fp32 values: E8M0 bytes or F32 as stored."""
    if scale.dtype == torch.float32:
        return scale
    return e8m0_to_f32(scale)


def decode_fp8(weight: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, *, block: int,
               use_kernels: bool | None = None) -> torch.Tensor:
    """Decode E4M3 ``[N, K]`` with a ``[ceil(N/B), ceil(K/B)]`` block scale into bf16 ``out``.

    E8M0 scales: one table lookup per code (:func:`_scaled_table`), on the CPU
    by :func:`kernels.decode_fp8` (``use_kernels`` None: when every tensor is
    there and ``out`` is contiguous). F32 scales (V3's ``weight_scale_inv``):
    the product is formed in fp32 and rounded once to bf16, one row block at a
    time so the fp32 temporary is B rows.
    """
    n, k = weight.shape
    nb_r, nb_c = -(-n // block), -(-k // block)
    if scale.shape != (nb_r, nb_c) or out.shape != (n, k):
        raise ValueError(f"decode_fp8: weight {tuple(weight.shape)}, scale {tuple(scale.shape)}, block {block}, out {tuple(out.shape)} disagree")
    if _FLOAT8_E4M3 is None:
        raise RuntimeError("this torch has no float8_e4m3fn; FP8 decode needs torch >= 2.1")
    codes = weight.view(torch.uint8)
    lookup = scale.dtype != torch.float32 and out.is_contiguous()  # E8M0 bytes, and out takes int16 words
    if use_kernels and not lookup:
        raise ValueError("decode_fp8: use_kernels=True needs E8M0 scale bytes and a contiguous out")
    if lookup and _on_kernels(use_kernels, "decode_fp8", weight, scale, out):
        table = _scaled_table("fp8", torch.device("cpu")).numpy()
        kernels.decode_fp8(_host_bytes(codes), _host_bytes(scale), table, out.view(torch.int16).numpy(), block)
        return out
    if lookup:
        table = _scaled_table("fp8", weight.device)
        shift = (scale.view(torch.uint8).to(torch.int32) << 8).repeat_interleave(block, dim=1)[:, :k]  # [nb_r, K]
        bits = out.view(torch.int16)
        step, r0 = max(1, DECODE_CHUNK // max(k, 1)), 0
        while r0 < n:
            r1 = min(n, r0 + step, (r0 // block + 1) * block)  # never straddle a scale block
            _lookup(table, codes[r0:r1].unsqueeze(1), shift[r0 // block].view(1, 1, k), bits[r0:r1])
            r0 = r1
        return out
    values = codes.view(_FLOAT8_E4M3)
    col_scale = _block_scale_f32(scale).repeat_interleave(block, dim=1)[:, :k]  # [nb_r, K]
    for i in range(nb_r):
        r0, r1 = i * block, min(n, (i + 1) * block)
        out[r0:r1].copy_(values[r0:r1].to(torch.float32).mul_(col_scale[i]))
    return out


def f16_to_bf16(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """F16 -> BF16 via exact f32, rounding to nearest even once (the seed's rule)."""
    return out.copy_(values.view(torch.float16).to(torch.float32))
