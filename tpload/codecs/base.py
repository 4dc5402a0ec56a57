"""What a codec is: the abstract base every stored format implements (codecs/__init__.py
re-exports it, with the types it takes and returns).

The abstract methods are the ones each format answers its own way (:meth:`Codec.fit`,
:meth:`Codec.cuts`, :meth:`Codec.decode`, :meth:`Codec.reference`); the rest have a default a
format overrides when it differs. An implementation keeps the base's signatures exactly
(tests/unit/codecs/test_base.py checks it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np
import torch

from ..storage.catalogue import TensorMeta
from ..storage.safetensors import ITEMSIZE
from . import Checker, Cut, Fit, Windows, channel_window, whole
from .tables import SERVED, SERVED_SCALE


class Codec(ABC):
    """One stored format. Subclasses set the class attributes, implement the abstract methods
    (every format fits, cuts and decodes in its own way) and override what else differs."""

    role: str = ""
    """The config's name for it (``role = "fp4"``)."""
    name: str = ""
    """Its own name, for messages and docs (``fp4-e8m0``)."""
    weight_dtypes: tuple[str, ...] = ()
    scale_dtypes: tuple[str, ...] = ()
    """Empty: the format has no scale tensor."""

    @property
    def scaled(self) -> bool:
        return bool(self.scale_dtypes)

    @property
    def checked(self) -> bool:
        """Whether copies (packed kind) go through :meth:`checker` too: scaled formats, and
        formats whose blocks carry their own scales (GGUF)."""
        return self.scaled

    @abstractmethod
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
        """The weight (and scales) as this format, or why they do not fit it (``block``: a scale
        block size the rule insists on; ``split``: how the rule cuts it; ``scale2``: a global
        scale; ``stacked``: dimension 0 indexes experts)."""

    def copies(self, fit: Fit, kind: str) -> bool:
        """Whether this kind serves the stored bytes as they are (else it serves a decode)."""
        return kind == "packed"

    def row_multiple(self, fit: Fit) -> int:
        """Decoding in row blocks: each block must start on a multiple of this (a scale block's
        rows)."""
        return fit.group[0]

    def scale_rows(self, fit: Fit, r0: int, r1: int) -> tuple[int, int]:
        """The scale window's rows that weight window rows ``[r0, r1)`` use."""
        g = fit.group[0]
        return r0 // g, -(-r1 // g)

    tiled: bool = False
    """Windows must also be whole multiples of the layout's ``channel_align`` (a kernel tile)."""

    def axis(self, fit: Fit, split: str) -> int:
        """The dimension of the weight (in elements) a split cuts: after the experts of a stacked
        one."""
        return (0 if split == "rows" else 1) + int(fit.stacked)

    def channels(self, fit: Fit, split: str) -> tuple[int, int]:
        """(channels along the split, channels per scale entry along it)."""
        return fit.weight.shape[self.axis(fit, split)], 1

    @abstractmethod
    def cuts(
        self, fit: Fit, split: str, span: tuple[int, int] | None, experts: tuple[int, int] | None
    ) -> tuple[Cut, Cut | None]:
        """The weight's and the scale's cuts for channels ``span`` (None: all of them) of experts
        ``experts`` (a stacked tensor's; None: all)."""

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
        """Rank ``rank`` of ``tp``'s cuts of the weight and scale, or why tp cannot cut them
        (:func:`channel_window` says how ``align``, ``units`` and ``uneven`` share the channels)."""
        span = None
        if split != "replicate" and tp > 1:
            n, atom = self.channels(fit, split)
            span = channel_window(
                n,
                tp,
                rank,
                atom=atom,
                align=align,
                units=units,
                uneven=uneven,
                what=split if atom == 1 and not align and not self.scaled else "channels",
            )
            if isinstance(span, str):
                return span
        return self.cuts(fit, split, span, experts)

    def served(
        self, fit: Fit, weight: Cut, scale: Cut | None, kind: str
    ) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
        """(name, dtype, shape, bytes) of every tensor served for these cuts: packed, the weight and
        its scales as stored (scales keep their dtype: F16 stays F16); decoded, one bf16 tensor."""
        if kind == "packed" or not self.scaled:
            out = [
                (
                    weight.name,
                    SERVED[weight.dtype],
                    weight.shape,
                    _nbytes(weight.shape, SERVED[weight.dtype]),
                )
            ]
            for cut in (scale, whole(fit.scale2) if fit.scale2 is not None else None):
                if cut is not None:
                    out.append((cut.name, SERVED_SCALE[cut.dtype], cut.shape, cut.nbytes))
            return out
        shape = self.decoded_shape(fit, weight)
        return [(weight.name, torch.bfloat16, shape, math.prod(shape) * 2)]

    def decoded_shape(self, fit: Fit, weight: Cut) -> tuple[int, ...]:
        """The window's shape in decoded elements."""
        return weight.shape

    def decode_row_bytes(self, fit: Fit, weight: Cut) -> int:
        """Stored bytes of one row of the decode (its last dimension): a view row of the window
        holds a whole number of them (a stacked tensor's expert row holds many)."""
        return weight.shape[-1] * ITEMSIZE[weight.dtype] if weight.shape else weight.row_bytes

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return Checker()

    def clean(self, fit: Fit, scales: Windows, weights: Windows) -> bool:
        """Whether the value checks of many items of this codec, alike in ``fit``'s formats (their
        windows in one batch), would all find nothing: decided over all of them at once. False when
        not sure: then each item's :meth:`checker` runs and words what it finds."""
        return False

    @abstractmethod
    def decode(
        self,
        weight: np.ndarray | torch.Tensor,
        scale: np.ndarray | torch.Tensor | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """Decode a window (or a block of its rows, with the scale rows they use) into ``out``
        (``scale``: None for formats without one; ``scale2``: the global scale's stored bytes, for
        formats that have one). The compiled kernel for host arrays, torch ops on a device."""

    @abstractmethod
    def reference(
        self,
        weight: np.ndarray,
        scale: np.ndarray | None,
        out: torch.Tensor,
        fit: Fit,
        *,
        scale2: np.ndarray | None = None,
    ) -> None:
        """The same decode by the other implementation (torch ops on the CPU when :meth:`decode`
        runs the compiled kernel): an independent check of a sampled window."""


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
