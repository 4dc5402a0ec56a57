"""Plain tensors: norms, routers, biases, embeddings and heads, served as stored.

BF16, F32 and I64 are served byte for byte; F16 is served as BF16 (f16 -> f32
-> bf16, rounding to nearest even once: the seed weight store's rule), which
makes it the one plain dtype that is decoded rather than copied. Tensor
parallelism cuts rows (a vocabulary-parallel head; the one dimension of a 1-D
tensor) or columns of a 2-D tensor, in equal shares, or replicates.

A KV-cache scale (selection/kvscales.py's census names them) is served plain too, with one value
check: each value must be finite and > 0 (an engine divides by it; NaN, 0, a negative or an infinity
would be served silently into every attention layer that reads it).
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.meta import TensorMeta
from .base import Checker, Codec, Cut, Fit, Problem, cut_axis
from .tables import round_bf16

DTYPES = ("BF16", "F32", "F16", "I64")


class Plain(Codec):
    role = "plain"
    name = "plain"
    weight_dtypes = DTYPES

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
        if weight.dtype not in DTYPES:
            return f"plain tensors must be {'/'.join(DTYPES)}, and these are not"
        base = len(weight.shape) - int(stacked)
        if stacked and not weight.shape:
            return "a stacked tensor needs a dimension of experts (this one is a scalar)"
        if split == "cols" and base != 2:
            return "split cols needs 2-D tensors" + (" after the experts" if stacked else "")
        if split == "rows" and base < 1:
            return "split rows needs a tensor with at least one dimension" + (
                " after the experts" if stacked else " (this one is a scalar)"
            )
        return Fit(weight, None, (1, 1), stacked=stacked)

    def cuts(
        self, fit: Fit, split: str, span: tuple[int, int] | None, experts: tuple[int, int] | None
    ) -> tuple[Cut, Cut | None]:
        if span is None:
            return cut_axis(fit.weight, None, experts=experts), None
        return cut_axis(fit.weight, self.axis(fit, split), *span, experts=experts), None

    def copies(self, fit: Fit, kind: str) -> bool:
        """Whether the served bytes are the stored bytes (all but F16, in either kind)."""
        return fit.weight.dtype != "F16"

    def decode(
        self,
        weight: np.ndarray | torch.Tensor,
        scale: np.ndarray | torch.Tensor | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """F16 rows -> BF16 ``out`` rows (``out``: the slot's rows as 2-D bf16)."""
        src = torch.from_numpy(weight) if isinstance(weight, np.ndarray) else weight
        out.copy_(src.view(torch.float16).reshape(out.shape).to(torch.float32))

    def reference(
        self,
        weight: np.ndarray,
        scale: np.ndarray | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | None = None,
    ) -> None:
        values = np.ascontiguousarray(weight).view(np.float16).astype(np.float32)
        rounded = round_bf16(
            values
        )  # round to nearest even; a NaN stays a NaN (plain rounding made some inf)
        out.view(torch.int16).copy_(torch.from_numpy(rounded.view(np.int16)).reshape(out.shape))


class KVScale(Plain):
    """A KV-cache scale: served as :class:`Plain` serves it, its values checked on the way."""

    @property
    def checked(self) -> bool:
        return True

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return _PositiveValues(weight)


class _PositiveValues(Checker):
    """Counts the values that are not finite and > 0, keeping the first."""

    def __init__(self, cut: Cut) -> None:
        self.cut, self.bad, self.first = cut, 0, 0.0

    def weight(self, view: np.ndarray, first_row: int) -> None:
        values = _values(view, self.cut.dtype)
        bad = ~np.isfinite(values) | (values <= 0)
        if bad.any():
            if not self.bad:
                self.first = float(values[bad][0])
            self.bad += int(bad.sum())

    def problems(self) -> list[Problem]:
        if not self.bad:
            return []
        return [
            (
                self.bad,
                f"KV-cache scale value(s) not finite and > 0 (first: {self.first:g}; an engine "
                "divides by it: a scale must be a finite number > 0)",
                self.cut.name,
            )
        ]


def _values(view: np.ndarray, dtype: str) -> np.ndarray:
    """Stored bytes (2-D) of a plain dtype as numbers (BF16 and F16 widened exactly to fp32)."""
    raw = np.ascontiguousarray(view)
    if dtype == "I64":
        result: np.ndarray = raw.view(np.int64)
        return result
    if dtype == "F32":
        result = raw.view(np.float32)
        return result
    if dtype == "F16":
        result = raw.view(np.float16).astype(np.float32)
        return result
    result = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # BF16: fp32's top half
    return result


PLAIN = Plain()
KV_SCALE = KVScale()
