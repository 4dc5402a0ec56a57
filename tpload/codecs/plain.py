"""Plain tensors: norms, routers, biases, embeddings and heads, served as stored.

BF16, F32 and I64 are served byte for byte; F16 is served as BF16 (f16 -> f32
-> bf16, rounding to nearest even once: the seed weight store's rule), which
makes it the one plain dtype that is decoded rather than copied. Tensor
parallelism cuts rows (a vocabulary-parallel head; the one dimension of a 1-D
tensor) or columns of a 2-D tensor, in equal shares, or replicates.
"""

from __future__ import annotations

import numpy as np
import torch

from ..storage.catalogue import TensorMeta
from . import Codec, Cut, Fit, cut_axis
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


PLAIN = Plain()
