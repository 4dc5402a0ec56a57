"""GGUF block-quantised weights (llama.cpp): Q8_0 and the K-quants, kept packed or decoded to bf16.

Stored (storage/gguf.py): a tensor of ggml type ``T`` is its bytes, shape ``[..., rows, row bytes]``
in torch order, each row whole blocks along the innermost dimension (32 weights in 34 bytes for
Q8_0; 256 weights in 84/110/144/176/210 bytes for Q2_K/Q3_K/Q4_K/Q5_K/Q6_K). Every block carries its
own scales, so there is no scale tensor.

Windows: rows (outer dimensions) cut anywhere; the innermost dimension only on block boundaries
(each rank's share a whole number of blocks), so a rank reads exactly its blocks. A stacked expert
tensor (``[E, rows, cols]``) is cut after its expert dimension, which ``--ep`` shares.

Kinds: packed serves the blocks as stored (uint8); expanded decodes to bf16, each value formed in
fp32 in the order of the ``gguf`` package's numpy dequantisation (``gguf.quants``), then rounded
once to bf16 (so it equals that dequantisation rounded to bf16). Every type decodes (the compiled
kernel for host arrays, torch ops on a device).
Value check: a block whose f16 ``d`` (or ``dmin``) is NaN or infinite is refused, naming the block.
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels.calls import GGUF_BLOCKS
from ..kernels.lazy import kernels
from ..model.meta import TensorMeta
from .base import Checker, Codec, Cut, Fit, Problem, cut_axis, present

BLOCKS = GGUF_BLOCKS
"""ggml type -> (weights per block, bytes per block): the layouts the kernels decode."""
SCALE_OFFSETS: dict[str, tuple[int, ...]] = {
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
"""Byte offsets of each block's f16 super-scales (``d``, and ``dmin`` where the type has one)."""
DECODED = tuple(BLOCKS)
"""Types the expanded kind decodes: all of them."""


def _innermost(fit: Fit, axis: int) -> bool:
    return axis == len(fit.weight.shape) - 1


class _Check(Checker):
    """Blocks whose f16 super-scales are NaN or infinite (every value of such a block is
    garbage)."""

    def __init__(self, weight: Cut) -> None:
        self.cut = weight
        self.per, self.size = BLOCKS[weight.dtype]
        self.bad = 0
        self.first: tuple[int, int] | None = None

    def weight(self, view: np.ndarray, first_row: int) -> None:
        blocks = np.ascontiguousarray(view).reshape(view.shape[0], -1, self.size)
        bad = np.zeros(blocks.shape[:2], dtype=bool)
        for off in SCALE_OFFSETS[self.cut.dtype]:
            bits = blocks[:, :, off].astype(np.uint16) | (
                blocks[:, :, off + 1].astype(np.uint16) << 8
            )
            bad |= (bits & 0x7C00) == 0x7C00  # exponent all ones: inf or NaN
        n = int(bad.sum())
        if n:
            self.bad += n
            if self.first is None:
                r, b = np.argwhere(bad)[0]
                self.first = (first_row + int(r), int(b))

    def problems(self) -> list[Problem]:
        if not self.bad:
            return []
        r, b = present(self.first, "its first problem")
        row = self.cut.rows[0] + r
        block = self.cut.cols[0] // self.size + b
        return [
            (
                self.bad,
                f"{self.cut.dtype} blocks whose f16 scale (d/dmin) is NaN or infinite (first: "
                f"view row {row}, block {block} of the row)",
                self.cut.name,
            )
        ]


class GGUF(Codec):
    role = "gguf"
    name = "gguf"
    weight_dtypes = tuple(BLOCKS)
    checked = True  # the super-scales are checked in every kind

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
        if weight.dtype not in BLOCKS:
            return (
                f"gguf takes GGUF block-quantised tensors ({'/'.join(BLOCKS)}), and these are not"
            )
        base = len(weight.shape) - int(stacked)
        if base < 1 or (split == "cols" and base != 2):
            return (
                "gguf split cols needs 2-D tensors" if split == "cols" else "gguf needs a dimension"
            ) + (" after the experts" if stacked else "")
        return Fit(weight, None, (1, 1), stacked=stacked)

    def channels(self, fit: Fit, split: str) -> tuple[int, int]:
        axis = self.axis(fit, split)
        per, size = BLOCKS[fit.weight.dtype]
        if _innermost(fit, axis):
            return fit.weight.shape[axis] // size * per, per
        return fit.weight.shape[axis], 1

    def window(
        self,
        fit: Fit,
        split: str,
        tp: int,
        rank: int,
        *,
        align: int = 0,
        units: int = 0,
        uneven: bool = False,
        experts: tuple[int, int] | None = None,
    ) -> tuple[Cut, Cut | None] | str:
        got = super().window(
            fit, split, tp, rank, align=align, units=units, uneven=uneven, experts=experts
        )
        if (
            isinstance(got, str)
            and split != "replicate"
            and not units
            and _innermost(fit, self.axis(fit, split))
        ):
            n, per = self.channels(fit, split)
            works = [t for t in range(1, min(n // per, 64) + 1) if (n // per) % t == 0]
            return (
                f"{got}: {fit.weight.dtype} is cut along its innermost dimension only on "
                f"{per}-weight block boundaries ({n} weights = {n // per} blocks; "
                f"tp {', '.join(map(str, works))} work)"
            )
        return got

    def cuts(
        self, fit: Fit, split: str, span: tuple[int, int] | None, experts: tuple[int, int] | None
    ) -> tuple[Cut, Cut | None]:
        if span is None:
            return cut_axis(fit.weight, None, experts=experts), None
        axis = self.axis(fit, split)
        lo, hi = span
        if _innermost(fit, axis):
            per, size = BLOCKS[fit.weight.dtype]
            lo, hi = lo // per * size, hi // per * size
        return cut_axis(fit.weight, axis, lo, hi, experts=experts), None

    def served(
        self, fit: Fit, weight: Cut, scale: Cut | None, kind: str
    ) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
        if kind == "packed":
            return super().served(fit, weight, scale, kind)
        shape = self.decoded_shape(fit, weight)
        return [(weight.name, torch.bfloat16, shape, int(np.prod(shape)) * 2)]

    def decoded_shape(self, fit: Fit, weight: Cut) -> tuple[int, ...]:
        per, size = BLOCKS[weight.dtype]
        return weight.shape[:-1] + (weight.shape[-1] // size * per,)

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return _Check(weight)

    def decode(
        self,
        weight: np.ndarray | torch.Tensor,
        scale: np.ndarray | torch.Tensor | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """Rows of blocks into bf16 ``out`` rows: the compiled kernel for host arrays, torch ops
        else."""
        dtype = fit.weight.dtype
        if isinstance(weight, np.ndarray):
            kernels.decode_gguf(
                dtype, np.ascontiguousarray(weight).view(np.uint8), out.view(torch.int16).numpy()
            )
            return
        decode_torch(dtype, weight, out)

    def reference(
        self,
        weight: np.ndarray,
        scale: np.ndarray | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | None = None,
    ) -> None:
        """torch ops on the CPU: the other implementation of the compiled kernel."""
        decode_torch(fit.weight.dtype, torch.from_numpy(np.ascontiguousarray(weight)), out)


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """Each block's f16 at ``offset`` as float32, ``[blocks, 1]``."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def decode_torch(dtype: str, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Rows of ``dtype`` blocks (uint8 ``[rows, row bytes]``, any device) into bf16 ``out [rows,
    weights]``: the ``gguf`` package's numpy dequantisation, op for op in fp32, then one rounding to
    bf16."""
    per, size = BLOCKS[dtype]
    rows = weight.shape[0]
    blocks = weight.reshape(-1, size)
    if dtype == "Q8_0":
        values = blocks[:, 2:].view(torch.int8).to(torch.float32) * _f16(blocks, 0)
    elif dtype in ("Q2_K", "Q3_K"):
        # both: byte 32h + l of the 2-bit quants holds weight 128h + 32s + l at bits 2s
        two = torch.tensor([0, 2, 4, 6], device=weight.device, dtype=torch.int32)
        q0 = 16 if dtype == "Q2_K" else 32
        q = (
            blocks[:, q0 : q0 + 64].to(torch.int32).reshape(-1, 2, 1, 32) >> two.reshape(1, 1, 4, 1)
        ) & 3
        q = q.reshape(-1, 16, 16)
        if dtype == "Q2_K":
            s = blocks[:, :16].to(torch.int32)
            dl = (_f16(blocks, 80) * (s & 0x0F).to(torch.float32)).unsqueeze(2)  # [n, 16, 1]
            ml = (_f16(blocks, 82) * (s >> 4).to(torch.float32)).unsqueeze(2)
            values = dl * q.to(torch.float32) - ml
        else:  # 6-bit scales: low nibbles in bytes 96-103, high 2 bits in 104-107; biased by 32
            s = blocks[:, 96:108].to(torch.int32)
            lo = (
                (
                    s[:, :8].reshape(-1, 1, 8)
                    >> torch.tensor([0, 4], device=weight.device, dtype=torch.int32).reshape(
                        1, 2, 1
                    )
                )
                & 0x0F
            ).reshape(-1, 16)
            hi = ((s[:, 8:].reshape(-1, 1, 4) >> two.reshape(1, 4, 1)) & 0x03).reshape(-1, 16)
            dl = (_f16(blocks, 108) * ((lo | (hi << 4)) - 32).to(torch.float32)).unsqueeze(2)
            bit = torch.arange(8, device=weight.device, dtype=torch.int32).reshape(1, 1, 8, 1)
            high = (
                ((blocks[:, :32].to(torch.int32).reshape(-1, 1, 1, 32) >> bit) & 1) ^ 1
            ).reshape(-1, 16, 16)
            values = dl * (q - (high << 2)).to(torch.float32)  # a clear mask bit subtracts 4
    elif dtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        s = blocks[:, 4:16].to(torch.int32).reshape(-1, 3, 4)
        a, m, md = s[:, 0], s[:, 1], s[:, 2]
        sc = torch.cat([a & 0x3F, (md & 0x0F) | ((a >> 2) & 0x30)], dim=1).to(torch.float32)
        mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1).to(torch.float32)
        dd = (d * sc).unsqueeze(2)  # [n, 8, 1]
        dm = (dmin * mn).unsqueeze(2)
        start = 16 if dtype == "Q4_K" else 48  # Q5_K: 32 bytes of fifth bits come first
        qs = blocks[:, start:].to(torch.int32).reshape(-1, 4, 1, 32)
        q = ((qs >> torch.tensor([0, 4], device=weight.device).reshape(1, 1, 2, 1)) & 0x0F).reshape(
            -1, 8, 32
        )
        if dtype == "Q5_K":  # sub-block j's fifth bit is bit j of qh[l]
            qh = blocks[:, 16:48].to(torch.int32).reshape(-1, 1, 32)
            q = q | (
                (
                    (
                        qh
                        >> torch.arange(8, device=weight.device, dtype=torch.int32).reshape(1, 8, 1)
                    )
                    & 1
                )
                << 4
            )
        values = dd * q.to(torch.float32) - dm
    elif dtype == "Q6_K":
        ql = blocks[:, :128].to(torch.int32).reshape(-1, 2, 1, 64)
        qh = blocks[:, 128:192].to(torch.int32).reshape(-1, 2, 1, 32)
        scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
        d = (_f16(blocks, 208) * scales).reshape(-1, 16, 1)
        low = (
            (ql >> torch.tensor([0, 4], device=weight.device).reshape(1, 1, 2, 1)) & 0x0F
        ).reshape(-1, 8, 32)
        high = (
            (qh >> torch.tensor([0, 2, 4, 6], device=weight.device).reshape(1, 1, 4, 1)) & 0x03
        ).reshape(-1, 8, 32)
        q = ((low | (high << 4)) - 32).reshape(-1, 16, 16).to(torch.float32)
        values = d * q
    else:
        raise ValueError(f"gguf: no decode for {dtype}")
    out.copy_(values.reshape(rows, -1).to(torch.bfloat16))
    return out


GGUF_CODEC = GGUF()
