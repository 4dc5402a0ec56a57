"""MXFP4: E2M1 codes with one E8M0 scale byte per 32 elements (DeepSeek-V4's experts, gpt-oss's).

Stored, two layouts of the same bytes (two elements per byte, element ``k`` in
byte ``k // 2``, even ``k`` in the low nibble):

* rows: weight ``I8``/``U8`` ``[N, K/2]``, scale ``F8_E8M0``/``U8`` ``[N, K/32]`` (DeepSeek-V4);
* blocks: weight ``U8`` ``[N, K/32, 16]``, scale ``U8`` ``[N, K/32]`` (gpt-oss's ``*_blocks``
  and ``*_scales``), usually with every expert stacked in front: ``[E, N, K/32, 16]``.

Value: ``E2M1[code] * 2**(scale - 127)``, exact in fp32, rounded once to bf16.

Windows: ``split = "rows"`` cuts N (weight and scale alike); ``split = "cols"``
cuts K in whole 32-element groups: packed bytes ``[lo/2, hi/2)`` (rows layout)
or blocks ``[lo/32, hi/32)``, and scale groups ``[lo/32, hi/32)``. The
config's ``channel_align`` (a kernel tile) applies to every share.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels.lazy import kernels
from ..model.meta import TensorMeta
from .base import Checker, Codec, Cut, Fit, Problem, cut_axis, present
from .tables import (
    DECODE_CHUNK,
    E8M0_INVALID,
    e2m1_values,
    e8m0_values,
    lookup,
    round_bf16,
    scaled_table,
)

GROUP = 32  # elements sharing one E8M0 scale byte
E2M1_MAX = float(np.abs(e2m1_values()).max())  # 6: the largest E2M1 magnitude
# An E8M0 byte e scales by 2**(e - 127): some code overflows bf16 iff E2M1_MAX >= 2**(255 - e).
OVERFLOW_FROM = 255 - math.floor(math.log2(E2M1_MAX))  # 253


def danger_scales(scale: np.ndarray) -> np.ndarray:
    """Where an E8M0 byte could take some E2M1 code past bf16 (only there are the codes looked at);
    0xFF is not one (it is refused on its own)."""
    result: np.ndarray = (scale >= OVERFLOW_FROM) & (scale != E8M0_INVALID[1])
    return result


def overflow_groups(
    packed: np.ndarray, scale: np.ndarray
) -> tuple[int, tuple[int, int, int] | None]:
    """How many 32-element groups decode to a value that overflows bf16, and the first (row, group,
    scale byte). ``value * 2**(e - 127)`` is exact in fp32 and overflows once it reaches 2**128,
    so a group overflows iff some ``|code| >= 2**(255 - e)``: at e = 254 the codes 2, 3, 4, 6; at
    e = 253 the codes 4 and 6; never below. Only groups with such a scale are looked at."""
    rows, groups = np.nonzero(danger_scales(scale))
    if rows.size == 0:
        return 0, None
    cols = groups[:, None] * (GROUP // 2) + np.arange(GROUP // 2)
    b = packed[rows[:, None], cols]
    magnitude = np.abs(e2m1_values())[np.concatenate([b & 0x0F, b >> 4], axis=1)]
    limit = 2.0 ** (255 - scale[rows, groups].astype(np.int32))
    bad = (magnitude >= limit[:, None]).any(axis=1)
    if not bad.any():
        return 0, None
    first = int(np.argmax(bad))
    return int(bad.sum()), (
        int(rows[first]),
        int(groups[first]),
        int(scale[rows[first], groups[first]]),
    )


class _Check(Checker):
    """Bad scale bytes, and groups whose decode overflows bf16. Scale rows are kept (copied) only
    where a scale byte could overflow: almost never, and then only those rows' weights are looked
    at."""

    def __init__(self, weight: Cut, scale: Cut) -> None:
        self.weight_cut, self.scale_name = weight, scale.name
        self.danger: list[tuple[int, np.ndarray]] = []
        self.bad_scale = self.overflow = 0
        self.first: tuple[int, int, int] | None = None

    def scale(self, view: np.ndarray, first_row: int) -> None:
        self.bad_scale += kernels.count_either(view, *E8M0_INVALID)
        if danger_scales(view).any():
            self.danger.append((first_row, np.array(view)))

    def weight(self, view: np.ndarray, first_row: int) -> None:
        last = first_row + view.shape[0]
        for r0, scale in self.danger:
            a, b = max(r0, first_row), min(r0 + scale.shape[0], last)
            if a >= b:
                continue
            n, first = overflow_groups(view[a - first_row : b - first_row], scale[a - r0 : b - r0])
            self.overflow += n
            if first is not None and (self.first is None or first[0] + a < self.first[0]):
                self.first = (first[0] + a, first[1], first[2])

    def problems(self) -> list[Problem]:
        out = [
            (
                self.bad_scale,
                "E8M0 scale bytes 0x00/0xFF (expected 1..254: the serving kernels assume it)",
                self.scale_name,
            )
        ]
        if self.overflow:
            r, g, e = present(self.first, "its first problem")
            row = self.weight_cut.rows[0] + r
            col = self.weight_cut.cols[0] * 2 + g * GROUP
            out.append(
                (
                    self.overflow,
                    f"32-element groups whose decode overflows bf16 (|value| x 2^(scale-127) >= "
                    f"2^128; first: row {row}, elements {col}..{col + GROUP - 1}, scale byte {e})",
                    self.weight_cut.name,
                )
            )
        return out


class FP4E8M0(Codec):
    role = "fp4"
    name = "fp4-e8m0"
    weight_dtypes = ("I8", "U8")
    scale_dtypes = ("F8_E8M0", "U8")
    tiled = True

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
        base = len(weight.shape) - int(stacked)
        want = ("[E, ] " if stacked else "") + "[N, K/2] or [N, K/32, 16]"
        if (
            scale is None
            or weight.dtype not in self.weight_dtypes
            or scale.dtype not in self.scale_dtypes
            or base not in (2, 3)
            or len(scale.shape) != 2 + int(stacked)
        ):
            return (
                f"fp4 wants a {'/'.join(self.weight_dtypes)} weight {want} and a "
                f"{'/'.join(self.scale_dtypes)} scale with one byte per 32 elements"
            )
        blocks = base == 3
        if blocks and weight.shape[-1] != GROUP // 2:
            return f"fp4 blocks hold {GROUP // 2} bytes each (32 elements), not {weight.shape[-1]}"
        k = weight.shape[-2] * GROUP if blocks else 2 * weight.shape[-1]
        expected = weight.shape[:-1] if blocks else weight.shape[:-1] + (k // GROUP,)
        if scale.shape != expected or k % GROUP:
            return (
                f"fp4 scales hold one E8M0 byte per {GROUP} elements: scale {scale.name} is "
                f"{list(scale.shape)}, expected {list(expected)}"
            )
        return Fit(weight, scale, (1, GROUP), stacked=stacked)

    def _blocks(self, fit: Fit) -> bool:
        return len(fit.weight.shape) - int(fit.stacked) == 3

    def channels(self, fit: Fit, split: str) -> tuple[int, int]:
        w = fit.weight
        if (
            split == "rows"
        ):  # whole 32s both ways (docs/format.md): a rank's rows are another matrix's columns
            return w.shape[int(fit.stacked)], GROUP
        return (w.shape[-2] * GROUP if self._blocks(fit) else 2 * w.shape[-1]), GROUP

    def cuts(
        self, fit: Fit, split: str, span: tuple[int, int] | None, experts: tuple[int, int] | None
    ) -> tuple[Cut, Cut | None]:
        w, s = fit.weight, present(fit.scale)
        if span is None:
            return cut_axis(w, None, experts=experts), cut_axis(s, None, experts=experts)
        lo, hi = span
        ax = self.axis(fit, split)
        if split == "rows":
            return cut_axis(w, ax, lo, hi, experts=experts), cut_axis(
                s, ax, lo, hi, experts=experts
            )
        per = GROUP if self._blocks(fit) else 2  # elements per stored index along the cut dimension
        return (
            cut_axis(w, ax, lo // per, hi // per, experts=experts),
            cut_axis(s, ax, lo // GROUP, hi // GROUP, experts=experts),
        )

    def decoded_shape(self, fit: Fit, weight: Cut) -> tuple[int, ...]:
        if self._blocks(fit):
            return weight.shape[:-2] + (weight.shape[-2] * GROUP,)
        return weight.shape[:-1] + (weight.shape[-1] * 2,)

    def decode_row_bytes(self, fit: Fit, weight: Cut) -> int:
        return weight.shape[-2] * weight.shape[-1] if self._blocks(fit) else weight.shape[-1]

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return _Check(weight, present(scale, "a scaled format's scale cut"))

    def decode(
        self,
        weight: np.ndarray | torch.Tensor,
        scale: np.ndarray | torch.Tensor | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """Packed ``[n, K/2]`` with E8M0 ``[n, K/32]`` into bf16 ``out [n, K]`` (contiguous): host
        arrays by the compiled kernel (rows read in place), device tensors by torch lookups."""
        if isinstance(weight, np.ndarray):
            table = scaled_table("fp4").numpy()
            kernels.decode_fp4(
                weight.view(np.uint8),
                np.asarray(scale).view(np.uint8),
                table,
                out.view(torch.int32).numpy(),
            )
            return
        decode_torch(weight, scale, out)

    def reference(
        self,
        weight: np.ndarray,
        scale: np.ndarray | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | None = None,
    ) -> None:
        """numpy: the E2M1 table times the E8M0 power of two in fp32, rounded once to bf16."""
        b: np.ndarray = weight.view(np.uint8)
        codes = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
        codes[:, 0::2], codes[:, 1::2] = b & 0x0F, b >> 4
        with np.errstate(over="ignore"):
            values = e2m1_values()[codes] * np.repeat(
                e8m0_values(present(scale).view(np.uint8)), GROUP, axis=1
            )
        out.view(torch.int16).copy_(torch.from_numpy(round_bf16(values).view(np.int16)))


def decode_torch(
    packed: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    *,
    table: torch.Tensor | None = None,
    group: int = GROUP,
) -> torch.Tensor:
    """The torch decode (any device): one table lookup per packed byte, in row blocks so the int32
    indices stay a few hundred KiB whatever N is (``table``: decoded pairs per (scale byte, packed
    byte), MXFP4's by default; ``group``: elements per scale byte)."""
    n, half_k = packed.shape
    k = half_k * 2
    if (
        not out.is_contiguous()
        or out.shape != (n, k)
        or scale.shape != (n, k // group)
        or k % group
    ):
        raise ValueError(
            f"decode_fp4: packed {tuple(packed.shape)}, scale {tuple(scale.shape)}, out "
            f"{tuple(out.shape)} disagree (out contiguous, K a multiple of {group})"
        )
    table = scaled_table("fp4", packed.device) if table is None else table
    groups, per = k // group, group // 2  # packed bytes sharing one scale byte
    words = out.view(torch.int32).view(n, groups, per)
    src = packed.view(torch.uint8).reshape(n, groups, per)
    shift = scale.view(torch.uint8)
    step = max(1, DECODE_CHUNK // max(half_k, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        lookup(table, src[r0:r1], (shift[r0:r1].to(torch.int32) << 8).unsqueeze(-1), words[r0:r1])
    return out


FP4 = FP4E8M0()
