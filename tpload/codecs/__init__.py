"""Stored formats: one small module per format, each saying how its tensors are packed, cut and decoded.

A codec answers, for one weight (and its scale, if the format has one):

* :meth:`Codec.fit` -- does this stored tensor (dtype, shape) fit the format, and with
  which scale group (elements per scale entry, along rows and columns)?
* :meth:`Codec.window` -- the weight's and the scale's cuts for one tensor-parallel
  rank, derived once from a channel window and the packing;
* :meth:`Codec.served` -- what a rank serves (stored bytes, or a bf16 decode);
* :meth:`Codec.checker` -- the value checks on the host bytes as they stream by
  (bad scale bytes, NaN codes, decodes that would overflow bf16);
* :meth:`Codec.decode` -- the decode into a slot: the compiled kernel when the
  inputs are host arrays, torch ops on a device; :meth:`Codec.reference` is the
  other of the two, an independent check of the first.

Adding a format is one new module here plus a config rule naming its role.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..storage.catalogue import TensorMeta
from .tables import SERVED

Problem = tuple[int, str, str]
"""(how many, what, the tensor they are in): a count of bad values found, what they are, where."""


@dataclass(frozen=True)
class Cut:
    """The part of one stored tensor a rank reads: a box of a 2-D byte view of it.

    The view is the tensor's bytes seen as ``[view rows, view row bytes]``: by default
    ``[shape[0], rest]`` (a 0-D or 1-D tensor is one row), or another split of the same bytes
    when the cut dimension is not the first (``[experts x rows, cols]`` for a stacked tensor cut on
    its last dimension). ``group`` says how the window's view rows make the served tensor's rows:
    every ``group`` consecutive ones form one (its fingerprint is taken in the served tensor's view).
    """

    name: str
    rows: tuple[int, int]
    """Row range of the view."""
    cols: tuple[int, int]
    """Byte range within each view row."""
    shape: tuple[int, ...]
    """The window's shape in stored elements."""
    dtype: str
    """Stored dtype (safetensors spelling)."""
    view: tuple[int, int]
    """(rows, row bytes) of the 2-D view the box is in."""
    group: int = 1

    @property
    def nbytes(self) -> int:
        return (self.rows[1] - self.rows[0]) * (self.cols[1] - self.cols[0])

    @property
    def row_bytes(self) -> int:
        return self.cols[1] - self.cols[0]

    @property
    def box(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return self.rows, self.cols


def whole(meta: TensorMeta) -> Cut:
    """The cut that is the whole stored tensor."""
    return Cut(meta.name, (0, meta.rows), (0, meta.row_bytes), meta.shape, meta.dtype, (meta.rows, meta.row_bytes))


@dataclass(frozen=True)
class Fit:
    """A weight (and its scale) a codec accepted: what the planner cuts."""

    weight: TensorMeta
    scale: TensorMeta | None
    group: tuple[int, int]
    """Elements of the weight per scale entry, along rows and columns ((1, 1): no scale)."""


class Checker:
    """Value checks on the host bytes of one item as they stream by; the scale comes first."""

    def scale(self, view: np.ndarray, first_row: int) -> None:
        """Rows ``[first_row, ...)`` of the scale window (2-D bytes)."""

    def weight(self, view: np.ndarray, first_row: int) -> None:
        """Rows ``[first_row, ...)`` of the weight window (2-D bytes), after the whole scale."""

    def problems(self) -> list[Problem]:
        return []


class Codec:
    """One stored format. Subclasses set the class attributes and override what differs."""

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

    def fit(self, weight: TensorMeta, scale: TensorMeta | None, *, block: int = 0, split: str = "replicate") -> Fit | str:
        """The weight (and scale) as this format, or why they do not fit it (``block``: a scale block
        size the rule insists on; ``split``: how the rule cuts it)."""
        raise NotImplementedError

    def copies(self, fit: Fit, kind: str) -> bool:
        """Whether this kind serves the stored bytes as they are (else it serves a decode)."""
        return kind == "packed"

    def row_multiple(self, fit: Fit) -> int:
        """Decoding in row blocks: each block must start on a multiple of this (a scale block's rows)."""
        return fit.group[0]

    def scale_rows(self, fit: Fit, r0: int, r1: int) -> tuple[int, int]:
        """The scale window's rows that weight window rows ``[r0, r1)`` use."""
        g = fit.group[0]
        return r0 // g, -(-r1 // g)

    def window(self, fit: Fit, split: str, tp: int, rank: int, *, align: int) -> tuple[Cut, Cut | None] | str:
        """Rank ``rank`` of ``tp``'s cuts of the weight and scale, or why tp cannot cut them."""
        raise NotImplementedError

    def served(self, fit: Fit, weight: Cut, scale: Cut | None, kind: str) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
        """(name, dtype, shape, bytes) of every tensor served for these cuts."""
        if kind == "packed" or not self.scaled:
            out = [(weight.name, SERVED[weight.dtype], weight.shape, _nbytes(weight.shape, SERVED[weight.dtype]))]
            if scale is not None:
                out.append((scale.name, SERVED[scale.dtype], scale.shape, scale.nbytes))
            return out
        rows, cols = self.elements(weight)
        return [(weight.name, torch.bfloat16, (rows, cols), rows * cols * 2)]

    def elements(self, weight: Cut) -> tuple[int, int]:
        """The window's shape in decoded elements."""
        return weight.shape[0], weight.shape[1]

    def checker(self, fit: Fit, weight: Cut, scale: Cut | None) -> Checker:
        return Checker()

    def decode(self, weight: np.ndarray | torch.Tensor, scale: np.ndarray | torch.Tensor, out: torch.Tensor,
               fit: Fit) -> None:
        """Decode a window (or a block of its rows, with the scale rows they use) into ``out``."""
        raise NotImplementedError(f"{self.name} has nothing to decode")

    def reference(self, weight: np.ndarray, scale: np.ndarray, out: torch.Tensor, fit: Fit) -> None:
        """The same decode by the other implementation (torch ops on the CPU when :meth:`decode`
        runs the compiled kernel): an independent check of a sampled window."""
        raise NotImplementedError(f"{self.name} has nothing to decode")


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def even_split(n: int, atom: int, tp: int, rank: int) -> tuple[int, int] | None:
    """Rank ``rank``'s share of ``n`` elements cut in whole ``atom``s (the last atom may be short),
    ``tp`` equal shares; None when the atoms do not divide evenly."""
    atoms = -(-n // atom)
    if atoms % tp:
        return None
    lo, hi = rank * atoms // tp, (rank + 1) * atoms // tp
    return lo * atom, min(n, hi * atom)


def meets(rows: np.ndarray, r0: int, r1: int) -> bool:
    """Whether the sorted ``rows`` hold one in ``[r0, r1)`` (the checkers' rows of dangerous scales)."""
    i = int(np.searchsorted(rows, r0))
    return i < rows.size and rows[i] < r1


def rows_cut(meta: TensorMeta, lo: int, hi: int) -> Cut:
    """Rows ``[lo, hi)`` of a 2-D (or N-D, on its first dimension) tensor; for a 1-D tensor,
    elements ``[lo, hi)`` of its one row."""
    view = (meta.rows, meta.row_bytes)
    if len(meta.shape) <= 1:
        item = meta.itemsize
        return Cut(meta.name, (0, 1), (lo * item, hi * item), (hi - lo,), meta.dtype, view)
    return Cut(meta.name, (lo, hi), (0, meta.row_bytes), (hi - lo,) + meta.shape[1:], meta.dtype, view)


def cols_cut(meta: TensorMeta, lo: int, hi: int, *, per_byte: int = 1) -> Cut:
    """Columns ``[lo, hi)`` of a 2-D tensor, in elements; ``per_byte`` elements share a stored byte."""
    item = meta.itemsize
    b0, b1 = lo * item // per_byte, hi * item // per_byte
    return Cut(meta.name, (0, meta.shape[0]), (b0, b1), (meta.shape[0], (b1 - b0) // item), meta.dtype,
               (meta.rows, meta.row_bytes))


@functools.cache
def _registry() -> dict[str, Codec]:
    from .fp4_e8m0 import FP4
    from .fp8_block import FP8
    from .plain import PLAIN
    return {c.role: c for c in (PLAIN, FP4, FP8)}


def for_role(role: str) -> Codec | None:
    """The codec a config role names (None for ``skip`` and ``defer``, which read nothing)."""
    return _registry().get(role)


def roles() -> tuple[str, ...]:
    return tuple(_registry())


def served_dtypes() -> tuple[str, ...]:
    """Every stored dtype some codec serves, for messages."""
    return tuple(SERVED)
