"""FP8 (E4M3) dense matrices with one scale per B x B block (DeepSeek-V3 and V4 style).

Stored: weight ``F8_E4M3`` ``[N, K]``; scale ``[ceil(N/B), ceil(K/B)]`` as
``F8_E8M0`` (or ``U8``) bytes, or ``F32``, ``BF16`` or ``F16`` values (V3's and
Qwen3's ``weight_scale_inv``, multiplied despite its name).
Value: ``e4m3(w[n, k]) * scale[n // B, k // B]``, formed in fp32 and rounded
once to bf16. B is read from the scale's shape (the rule may insist on one).

Windows: whole scale blocks per rank, rows or columns; the block count must
divide by tp, and the last rank's window may end in a short block.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels.lazy import kernels
from ..model.meta import TensorMeta
from .base import Checker, Codec, Cut, Fit, Problem, Windows, cut_axis, meets, present, whole
from .tables import (
    DECODE_CHUNK,
    E4M3_NAN,
    E8M0_INVALID,
    FLOAT8_E4M3,
    e4m3_values,
    e8m0_values,
    lookup,
    round_bf16,
    scaled_table,
)

BF16_OVERFLOW = 0x7F7F8000  # float32 bits from which bf16 rounding (to nearest even) gives infinity
E4M3_MAX = float(np.nanmax(e4m3_values()))  # 448: the largest E4M3 (fn) magnitude
DANGER_F32 = 2.0**127 / E4M3_MAX  # a value scale below this takes no E4M3 code to bf16's limit
# An E8M0 byte e scales by 2**(e - 127): some code overflows iff E4M3_MAX >= 2**(255 - e).
DANGER_E8M0 = 255 - math.floor(math.log2(E4M3_MAX))  # 247
VALUE_SCALES = ("F32", "BF16", "F16")  # scales stored as values (else E8M0 exponent bytes)


def scale_values(view: np.ndarray, dtype: str) -> np.ndarray:
    """Stored scale bytes (2-D) of a value dtype as float32 (exact: BF16 and F16 widen
    losslessly)."""
    raw = np.ascontiguousarray(view)
    if dtype == "F32":
        result: np.ndarray = raw.view(np.float32)
        return result
    if dtype == "F16":
        result = raw.view(np.float16).astype(np.float32)
        return result
    result = (raw.view(np.uint16).astype(np.uint32) << 16).view(
        np.float32
    )  # BF16: the top half of an fp32
    return result


def scale_torch(scale: torch.Tensor, dtype: str) -> torch.Tensor:
    """Stored scale bytes as float32 values (value dtypes) or as E8M0 bytes, on their device."""
    if dtype == "F32":
        return scale.view(torch.float32)
    if dtype in ("BF16", "F16"):
        return scale.view(torch.bfloat16 if dtype == "BF16" else torch.float16).to(torch.float32)
    return scale.view(torch.uint8)


def as_scale(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored scale bytes as the value rules read them: float32 values, or E8M0 exponent bytes."""
    if dtype in VALUE_SCALES:
        return scale_values(raw, dtype)
    result: np.ndarray = np.asarray(raw).view(np.uint8)
    return result


def bad_scales(scale: np.ndarray) -> np.ndarray:
    """Where a scale is refused: a value not finite and positive, or an E8M0 byte 0x00/0xFF (the
    serving kernels assume 1..254)."""
    if scale.dtype == np.float32:
        result: np.ndarray = ~np.isfinite(scale) | (scale <= 0)
        return result
    result = (scale == E8M0_INVALID[0]) | (scale == E8M0_INVALID[1])
    return result


def danger_scales(scale: np.ndarray) -> np.ndarray:
    """Where a scale could take some E4M3 code past bf16 (only there are the codes looked at); a
    refused scale is not one (it is counted on its own)."""
    if scale.dtype == np.float32:
        result: np.ndarray = np.abs(scale) >= DANGER_F32
        return result
    result = (scale >= DANGER_E8M0) & (scale != E8M0_INVALID[1])
    return result


def infer_block(w: TensorMeta, s: TensorMeta, insist: int = 0) -> int | str:
    """The block size that maps the weight's shape onto the scale's, or why none does."""
    (n, k), (sn, sk) = w.shape, s.shape
    candidates = (
        [insist]
        if insist
        else sorted(
            {
                1 << max(0, math.ceil(n / max(sn, 1)) - 1).bit_length(),
                1 << max(0, math.ceil(k / max(sk, 1)) - 1).bit_length(),
            }
        )
    )
    for b in candidates:
        if (-(-n // b), -(-k // b)) == (sn, sk):
            return b
    want = f"block {insist}" if insist else "any power-of-two block"
    return f"scale shape {list(s.shape)} does not tile weight shape {list(w.shape)} with {want}"


def overflow_blocks(
    codes: np.ndarray, scale: np.ndarray, block: int, first_row: int = 0
) -> tuple[int, tuple[int, int] | None]:
    """How many rows of blocks (a row of a block: up to B codes sharing a scale) decode to a value
    that overflows bf16, and the first (row, block column) in row-major order. ``codes`` are window
    rows from window row ``first_row`` (any row: a block of rows need not start on a scale block);
    ``scale`` the scale rows they use, from scale row ``first_row // block``. E8M0: ``|v| * 2**(e -
    127)`` is exact in fp32, so it overflows iff ``|v| >= 2**(255 - e)`` (only from DANGER_E8M0).
    F32: the product is rounded in fp32, then to bf16; only scales from 2**127/448 can get there. A
    NaN (a NaN code, counted on its own) is not an overflow."""
    f32 = scale.dtype == np.float32
    brow, bcol = np.nonzero(danger_scales(scale))
    if brow.size == 0:
        return 0, None
    magnitude = np.abs(e4m3_values())
    skip = first_row % block  # rows of the first scale block that come before codes[0]
    bad_rows = 0
    first = None
    # rare: only blocks whose scale is dangerous
    for br, bc in zip(brow.tolist(), bcol.tolist(), strict=True):
        r0 = max(0, br * block - skip)
        box = codes[r0 : (br + 1) * block - skip, bc * block : (bc + 1) * block]
        if box.size == 0:
            continue
        if f32:
            with np.errstate(over="ignore", invalid="ignore"):
                prod = (e4m3_values()[box] * scale[br, bc]).astype(np.float32)
            a = prod.view(np.uint32) & 0x7FFFFFFF
            over = (a >= BF16_OVERFLOW) & (a <= 0x7F800000)
        else:
            over = magnitude[box] >= 2.0 ** (255 - int(scale[br, bc]))
        rows = over.any(axis=1)
        bad_rows += int(rows.sum())
        if rows.any():
            here = (r0 + int(np.argmax(rows)), bc)
            first = here if first is None else min(first, here)
    return bad_rows, first


class _Check(Checker):
    def __init__(self, weight: Cut, scale: Cut, block: int) -> None:
        self.weight_cut, self.scale_cut, self.block = weight, scale, block
        self.f32, self.dtype = scale.dtype in VALUE_SCALES, scale.dtype
        self.scale_rows: list[np.ndarray] = []
        self.bad_scale = self.nan = self.overflow = 0
        self.first: tuple[int, int] | None = None
        self._scale: np.ndarray | None = None

    def scale(self, view: np.ndarray, first_row: int) -> None:
        values = as_scale(view, self.dtype)
        self.bad_scale += int(bad_scales(values).sum())
        self.scale_rows.append(np.array(values))

    def weight(self, view: np.ndarray, first_row: int) -> None:
        self.nan += kernels.count_either(view, *E4M3_NAN)
        if self._scale is None:
            self._scale = (
                np.concatenate(self.scale_rows) if self.scale_rows else np.zeros((0, 0), np.uint8)
            )
            s = self._scale
            self._danger = (
                np.flatnonzero(danger_scales(s).any(axis=1)) if s.size else np.zeros(0, np.int64)
            )
        b = self.block
        if not self._danger.size or not meets(
            self._danger, first_row // b, -(-(first_row + view.shape[0]) // b)
        ):
            return
        n, first = overflow_blocks(
            view, self._scale[first_row // b : -(-(first_row + view.shape[0]) // b)], b, first_row
        )
        self.overflow += n
        if first is not None and self.first is None:
            self.first = (first[0] + first_row, first[1])

    def problems(self) -> list[Problem]:
        what = (
            f"{self.dtype} scale values not finite and positive"
            if self.f32
            else "E8M0 scale bytes 0x00/0xFF (expected 1..254: the serving kernels assume it)"
        )
        out = [
            (self.bad_scale, what, self.scale_cut.name),
            (self.nan, "E4M3 NaN codes 0x7F/0xFF", self.weight_cut.name),
        ]
        if self.overflow:
            r, c = present(self.first, "its first problem")
            row, col = self.weight_cut.rows[0] + r, self.weight_cut.cols[0] + c * self.block
            end = min(
                col + self.block, self.weight_cut.cols[1]
            )  # the last block of a row may be short
            out.append(
                (
                    self.overflow,
                    f"block rows whose decode overflows bf16 (first: row {row}, elements "
                    f"{col}..{end - 1})",
                    self.weight_cut.name,
                )
            )
        return out


class FP8Block(Codec):
    role = "fp8"
    name = "fp8-block"
    weight_dtypes = ("F8_E4M3",)
    scale_dtypes = ("F8_E8M0", "U8", "F32", "BF16", "F16")

    def fit(
        self,
        weight: TensorMeta,
        scale: TensorMeta | None,
        *,
        block: int = 0,
        split: str = "replicate",
        scale2: TensorMeta | None = None,
        stacked: bool = False,
    ) -> Fit | str:
        if (
            scale is None
            or weight.dtype not in self.weight_dtypes
            or scale.dtype not in self.scale_dtypes
            or len(weight.shape) != 2
            or len(scale.shape) != 2
            or stacked
        ):
            return (
                f"fp8 wants a 2-D {'/'.join(self.weight_dtypes)} weight and a 2-D "
                f"{'/'.join(self.scale_dtypes)} scale (not stacked)"
            )
        b = infer_block(weight, scale, block)
        if isinstance(b, str):
            return f"fp8 scale shape does not fit: {b}"
        return Fit(weight, scale, (b, b))

    def channels(self, fit: Fit, split: str) -> tuple[int, int]:
        return fit.weight.shape[self.axis(fit, split)], fit.group[0]

    def cuts(
        self, fit: Fit, split: str, span: tuple[int, int] | None, experts: tuple[int, int] | None
    ) -> tuple[Cut, Cut | None]:
        w, s, b = fit.weight, present(fit.scale), fit.group[0]
        if span is None:
            return whole(w), whole(s)
        lo, hi = span
        ax = self.axis(fit, split)
        return cut_axis(w, ax, lo, hi), cut_axis(s, ax, lo // b, -(-hi // b))

    def clean(self, fit: Fit, scales: Windows, weights: Windows) -> bool:
        """No refused scale, no scale that could take a code past bf16 (the overflow check's
        trigger), no NaN code, in any of the windows: _Check's rules, over all windows at once."""
        scale = as_scale(scales.gathered(), present(fit.scale).dtype)
        if bad_scales(scale).any() or danger_scales(scale).any():
            return False
        return weights.count_either(*E4M3_NAN) == 0

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return _Check(weight, present(scale, "a scaled format's scale cut"), fit.group[0])

    def decode(
        self,
        weight: np.ndarray | torch.Tensor,
        scale: np.ndarray | torch.Tensor | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """E4M3 rows (starting on a block boundary) with the scale rows they use into bf16 ``out``:
        host arrays with E8M0 scales by the compiled kernel, everything else by torch ops."""
        block = fit.group[0]
        if isinstance(weight, np.ndarray):
            if present(fit.scale).dtype not in VALUE_SCALES:
                table = scaled_table("fp8").numpy()
                kernels.decode_fp8(
                    weight.view(np.uint8),
                    np.asarray(scale).view(np.uint8),
                    table,
                    out.view(torch.int16).numpy(),
                    block,
                )
                return
            weight, scale = (
                torch.from_numpy(np.ascontiguousarray(weight)),
                torch.from_numpy(np.ascontiguousarray(scale)),
            )
        decode_torch(weight, scale_torch(scale, present(fit.scale).dtype), out, block=block)

    def reference(
        self,
        weight: np.ndarray,
        scale: np.ndarray | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | None = None,
    ) -> None:
        """numpy: E4M3 values from their bits times the block scale in fp32, rounded once to
        bf16."""
        b = fit.group[0]
        n, k = weight.shape
        s = (
            scale_values(present(scale), present(fit.scale).dtype)
            if present(fit.scale).dtype in VALUE_SCALES
            else e8m0_values(np.ascontiguousarray(scale).view(np.uint8))
        )
        full = np.repeat(np.repeat(s, b, axis=0), b, axis=1)[:n, :k]
        with np.errstate(over="ignore", invalid="ignore"):
            values = (e4m3_values()[weight.view(np.uint8)] * full).astype(np.float32)
        out.view(torch.int16).copy_(torch.from_numpy(round_bf16(values).view(np.int16)))


def decode_torch(
    weight: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, *, block: int
) -> torch.Tensor:
    """The torch decode (any device). E8M0 bytes: one table lookup per code; F32 values: the product
    formed in fp32 and rounded once to bf16, one block row at a time."""
    n, k = weight.shape
    nb_r, nb_c = -(-n // block), -(-k // block)
    if scale.shape != (nb_r, nb_c) or out.shape != (n, k):
        raise ValueError(
            f"decode_fp8: weight {tuple(weight.shape)}, scale {tuple(scale.shape)}, block {block}, "
            f"out {tuple(out.shape)} disagree"
        )
    if FLOAT8_E4M3 is None:
        raise RuntimeError("this torch has no float8_e4m3fn; FP8 decode needs torch >= 2.1")
    codes = weight.view(torch.uint8)
    if scale.dtype != torch.float32 and out.is_contiguous():
        table = scaled_table("fp8", weight.device)
        shift = (scale.view(torch.uint8).to(torch.int32) << 8).repeat_interleave(block, dim=1)[
            :, :k
        ]  # [nb_r, K]
        bits = out.view(torch.int16)
        step, r0 = max(1, DECODE_CHUNK // max(k, 1)), 0
        while r0 < n:
            r1 = min(n, r0 + step, (r0 // block + 1) * block)  # never straddle a scale block
            lookup(table, codes[r0:r1].unsqueeze(1), shift[r0 // block].view(1, 1, k), bits[r0:r1])
            r0 = r1
        return out
    values = codes.view(FLOAT8_E4M3)
    f32 = (
        scale
        if scale.dtype == torch.float32
        else (scale.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    )
    col_scale = f32.repeat_interleave(block, dim=1)[:, :k]
    for i in range(nb_r):
        r0, r1 = i * block, min(n, (i + 1) * block)
        out[r0:r1].copy_(values[r0:r1].to(torch.float32).mul_(col_scale[i]))
    return out


FP8 = FP8Block()
