"""NVFP4 (ModelOpt): E2M1 codes, one E4M3 scale per 16 elements, and one F32 scale per tensor.

Stored per linear (names: the weight's ``.weight`` replaced by ``.weight_scale`` and
``.weight_scale_2``): weight ``U8`` ``[N, K/2]`` (two elements per byte, even ``k`` in
the low nibble), scale ``F8_E4M3`` ``[N, K/16]`` (row-major, not swizzled), and a
global ``F32`` scale (0-D, or one element). ``input_scale`` is an activation scale:
a plain tensor, replicated.

Value: ``((E2M1[code] * f32(scale)) * scale_2)`` in fp32, in that order (the first
product is exact: 2 and 4 significant bits), then one round-to-nearest-even to bf16.
ModelOpt's own dequant multiplies the two scales first; the two orders can differ
by one bf16 step in about one element in 10^5 (docs/formats/nvfp4.md).

Windows: rows cut N (weight and scale alike); cols cut K in whole 16-element
groups (packed bytes ``[lo/2, hi/2)``, scale columns ``[lo/16, hi/16)``). The
global scale is whole on every rank.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..kernels.lazy import kernels
from ..model.meta import TensorMeta
from .base import Checker, Codec, Cut, Fit, Problem, cut_axis, present, whole
from .fp4_e8m0 import decode_torch
from .tables import E4M3_NAN, e2m1_values, e4m3_values, round_bf16

GROUP = 16  # elements sharing one E4M3 scale
BF16_LIMIT = float(
    np.array([0x7F7F8000], dtype=np.uint32).view(np.float32)[0]
)  # rounds to inf in bf16
MAX_PRODUCT = float(np.abs(e2m1_values()).max() * np.nanmax(np.abs(e4m3_values())))  # |E2M1 x E4M3|


def global_scale(raw: np.ndarray) -> float:
    """The global scale's value from its stored bytes (F32)."""
    return float(np.ascontiguousarray(raw).reshape(-1)[:4].view(np.float32)[0])


@functools.lru_cache(maxsize=64)
def _table_cpu(scale2_bits: int) -> torch.Tensor:
    """``[256 scale bytes x 256 packed bytes]`` of decoded bf16 pairs (int32, low element in the low
    half) for one global scale: numpy, in the decode's order and rounding."""
    scale2 = np.array([scale2_bits], dtype=np.uint32).view(np.float32)[0]
    codes = np.arange(256)
    e2m1, e4m3 = e2m1_values(), e4m3_values()
    with np.errstate(over="ignore", invalid="ignore"):
        lo = (e2m1[codes & 0xF][None, :] * e4m3[:, None]).astype(np.float32) * scale2
        hi = (e2m1[codes >> 4][None, :] * e4m3[:, None]).astype(np.float32) * scale2
    pairs = round_bf16(lo).astype(np.uint32) | (round_bf16(hi).astype(np.uint32) << 16)
    return torch.from_numpy(pairs.view(np.int32).reshape(-1).copy())


def decode_table(scale2: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """The decode table for this global scale, on ``device`` (built once per scale on the host)."""
    bits = int(np.array([scale2], dtype=np.float32).view(np.uint32)[0])
    table = _table_cpu(bits)
    return table if torch.device(device).type == "cpu" else table.to(device)


class _Check(Checker):
    """NaN scale codes, a global scale that is not a finite non-negative number, and (only when the
    global scale is huge) decodes that overflow bf16."""

    def __init__(self, weight: Cut, scale: Cut, scale2_name: str) -> None:
        self.weight_cut, self.scale_name, self.scale2_name = weight, scale.name, scale2_name
        self.nan_scale = self.bad_scale2 = self.overflow = 0
        self.scale2_value = 0.0
        self.scales: list[np.ndarray] = []

    def scale(self, view: np.ndarray, first_row: int) -> None:
        self.nan_scale += kernels.count_either(view, *E4M3_NAN)
        self.scales.append(np.array(view))

    def scale2(self, view: np.ndarray) -> None:
        v = global_scale(view)
        self.scale2_value = v
        self.bad_scale2 += int(not np.isfinite(v) or v < 0)

    def weight(self, view: np.ndarray, first_row: int) -> None:
        if not (
            self.scale2_value * MAX_PRODUCT >= BF16_LIMIT
        ):  # the usual case: nothing can overflow
            return
        scale = np.concatenate(self.scales)[first_row : first_row + view.shape[0]]
        b = np.ascontiguousarray(view).view(np.uint8)
        codes = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
        codes[:, 0::2], codes[:, 1::2] = b & 0x0F, b >> 4
        with np.errstate(over="ignore", invalid="ignore"):
            values = (e2m1_values()[codes] * np.repeat(e4m3_values()[scale], GROUP, axis=1)).astype(
                np.float32
            )
            values = values * np.float32(self.scale2_value)
        self.overflow += int((np.abs(values) >= BF16_LIMIT).sum())

    def problems(self) -> list[Problem]:
        return [
            (self.nan_scale, "E4M3 scale codes 0x7F/0xFF (NaN)", self.scale_name),
            (
                self.bad_scale2,
                "global scales (weight_scale_2) not a finite number >= 0",
                self.scale2_name,
            ),
            (
                self.overflow,
                "elements whose decode overflows bf16 (a huge weight_scale_2)",
                self.weight_cut.name,
            ),
        ]


class NVFP4(Codec):
    role = "nvfp4"
    name = "nvfp4"
    weight_dtypes = ("U8", "I8")
    scale_dtypes = ("F8_E4M3",)

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
            or scale2 is None
            or weight.dtype not in self.weight_dtypes
            or scale.dtype != "F8_E4M3"
            or len(weight.shape) != 2
            or len(scale.shape) != 2
            or stacked
        ):
            return (
                "nvfp4 wants a 2-D U8 weight [N, K/2], a 2-D F8_E4M3 scale [N, K/16] and an F32 "
                "global scale (not stacked)"
            )
        if scale2.dtype != "F32" or scale2.nbytes != 4:
            return (
                f"nvfp4's global scale {scale2.name} must be one F32 value, not {scale2.dtype} "
                f"{list(scale2.shape)}"
            )
        n, kb = weight.shape
        if scale.shape != (n, 2 * kb // GROUP) or (2 * kb) % GROUP:
            return (
                f"nvfp4 scales hold one E4M3 value per {GROUP} elements: scale {scale.name} is "
                f"{list(scale.shape)}, expected [{n}, {2 * kb // GROUP}]"
            )
        return Fit(weight, scale, (1, GROUP), scale2)

    def channels(self, fit: Fit, split: str) -> tuple[int, int]:
        return (fit.weight.shape[0], 1) if split == "rows" else (2 * fit.weight.shape[1], GROUP)

    def cuts(
        self, fit: Fit, split: str, span: tuple[int, int] | None, experts: tuple[int, int] | None
    ) -> tuple[Cut, Cut | None]:
        w, s = fit.weight, present(fit.scale)
        if span is None:
            return whole(w), whole(s)
        lo, hi = span
        if split == "rows":
            return cut_axis(w, 0, lo, hi), cut_axis(s, 0, lo, hi)
        return cut_axis(w, 1, lo // 2, hi // 2), cut_axis(s, 1, lo // GROUP, hi // GROUP)

    def decoded_shape(self, fit: Fit, weight: Cut) -> tuple[int, ...]:
        return weight.shape[0], weight.shape[1] * 2

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return _Check(
            weight,
            present(scale, "a scaled format's scale cut"),
            present(fit.scale2, "NVFP4's global scale").name,
        )

    def decode(
        self,
        weight: np.ndarray | torch.Tensor,
        scale: np.ndarray | torch.Tensor | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """Packed ``[n, K/2]`` with E4M3 ``[n, K/16]`` into bf16 ``out [n, K]``; ``scale2``: the
        global scale's stored bytes (host). One table lookup per packed byte, the table built for
        this global scale (the compiled kernel for host arrays, torch on a device)."""
        value = global_scale(present(scale2, "NVFP4's global scale"))
        if isinstance(weight, np.ndarray):
            kernels.decode_fp4(
                weight.view(np.uint8),
                np.asarray(scale).view(np.uint8),
                decode_table(value).numpy(),
                out.view(torch.int32).numpy(),
                group=GROUP,
            )
            return
        decode_torch(
            weight,
            present(scale).view(torch.uint8),
            out,
            table=decode_table(value, weight.device),
            group=GROUP,
        )

    def reference(
        self,
        weight: np.ndarray,
        scale: np.ndarray | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | None = None,
    ) -> None:
        """numpy, element by element: E2M1 value times the E4M3 scale's value (both from their bits)
        in fp32, times the global scale in fp32, rounded once to bf16."""
        b: np.ndarray = weight.view(np.uint8)
        codes = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
        codes[:, 0::2], codes[:, 1::2] = b & 0x0F, b >> 4
        s = np.repeat(e4m3_values()[np.ascontiguousarray(scale).view(np.uint8)], GROUP, axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            values = (e2m1_values()[codes] * s).astype(np.float32) * np.float32(
                global_scale(present(scale2, "NVFP4's global scale"))
            )
        out.view(torch.int16).copy_(torch.from_numpy(round_bf16(values).view(np.int16)))


NVFP4_CODEC = NVFP4()
