"""Stored formats: one small module per format, each saying how its tensors are packed, cut and
decoded (the abstract base they implement: base.py).

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
from typing import NamedTuple, Protocol

import numpy as np

from ..storage.catalogue import TensorMeta
from ..storage.safetensors import ITEMSIZE
from .tables import SERVED

Problem = tuple[int, str, str]
"""(how many, what, the tensor they are in): a count of bad values found, what they are, where."""


class Cut(NamedTuple):
    """The part of one stored tensor a rank reads: a box of a 2-D byte view of it.

    The view is the tensor's bytes seen as ``[view rows, view row bytes]``: by default
    ``[shape[0], rest]`` (a 0-D or 1-D tensor is one row), or another split of the same bytes
    when the cut dimension is not the first (``[experts x rows, cols]`` for a stacked tensor cut on
    its last dimension). ``group`` says how the window's view rows make the served tensor's rows:
    every ``group`` consecutive ones form one (its fingerprint is taken in the served tensor's
    view).
    A named tuple: a plan of a 92,000-tensor checkpoint makes hundreds of thousands of them.
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
    return Cut(
        meta.name,
        (0, meta.rows),
        (0, meta.row_bytes),
        meta.shape,
        meta.dtype,
        (meta.rows, meta.row_bytes),
    )


class Fit(NamedTuple):
    """A weight (and its scales) a codec accepted: what the planner cuts (a named tuple, like Cut:
    the planner makes one per weight, 46,000 of them for DeepSeek-V3)."""

    weight: TensorMeta
    scale: TensorMeta | None
    group: tuple[int, int]
    """Elements of the weight per scale entry, along rows and columns ((1, 1): no scale)."""
    scale2: TensorMeta | None = None
    """A second, global scale (NVFP4's ``weight_scale_2``), whole on every rank."""
    stacked: bool = False
    """Dimension 0 indexes experts (all of them stacked in one tensor); splits refer to the
    dimensions after it."""


class Windows(Protocol):
    """Many windows of one read (a batch's scales, or its weights), for :meth:`Codec.clean`."""

    def count_either(self, a: int, b: int) -> int:
        """How many of their bytes are ``a`` or ``b``."""

    def count_between(self, lo: int, hi: int) -> int:
        """How many of their bytes lie in ``[lo, hi]``."""

    def gathered(self) -> np.ndarray:
        """Their bytes, window after window, row after row (a new contiguous uint8 array)."""


class Checker:
    """Value checks on the host bytes of one item as they stream by; the scale comes first."""

    def scale(self, view: np.ndarray, first_row: int) -> None:
        """Rows ``[first_row, ...)`` of the scale window (2-D bytes)."""

    def weight(self, view: np.ndarray, first_row: int) -> None:
        """Rows ``[first_row, ...)`` of the weight window (2-D bytes), after the whole scale."""

    def scale2(self, view: np.ndarray) -> None:
        """The global scale's stored bytes (formats with one)."""

    def problems(self) -> list[Problem]:
        return []


def channel_window(
    n: int,
    tp: int,
    rank: int,
    *,
    atom: int = 1,
    align: int = 0,
    units: int = 0,
    uneven: bool = False,
    what: str = "channels",
) -> tuple[int, int] | str:
    """Rank ``rank`` of ``tp``'s channels ``[lo, hi)`` of ``n``, or why tp cannot cut them.

    ``atom``: channels per scale entry along the split (a window starts on one; the last may be
    short, as a 576-row FP8 matrix ends in half a block); ``align``: a kernel tile every share must
    be a multiple of. Three ways to share:

    * even (the default): ``tp`` equal shares of whole atoms (and tiles);
    * ``units`` (attention heads): whole heads per rank; with fewer heads than ranks, each head is
      replicated on ``tp / units`` consecutive ranks, rank ``r`` taking head ``r // (tp / units)``
      (vLLM's rule for kv heads);
    * ``uneven`` (vLLM's gpt-oss experts): each rank takes the even share rounded up to whole
      ``step``s, the last rank what is left.
    """
    step = math.lcm(atom, align) if align else atom
    if units:
        return _heads(n, tp, rank, units, step, what)
    if uneven:
        steps = -(-n // step)
        per = -(-steps // tp) * step
        if (tp - 1) * per >= n:
            return (
                f"{n} {what} in shares of {per} (the even share rounded up to {step}) leave "
                f"rank {tp - 1} of tp {tp} nothing"
            )
        return rank * per, min(n, (rank + 1) * per)
    if align:
        per = n // tp
        if n % tp or per % step:
            return f"{n} {what} / tp {tp} = {n / tp:g}, not a multiple of {step}"
        return rank * per, (rank + 1) * per
    atoms = -(-n // atom)
    if atoms % tp:
        return (
            f"{atoms} scale blocks of {atom} / tp {tp} is not whole"
            if atom > 1
            else f"{n} {what} / tp {tp} is not whole"
        )
    lo, hi = rank * atoms // tp, (rank + 1) * atoms // tp
    return lo * atom, min(n, hi * atom)


def _heads(n: int, tp: int, rank: int, units: int, step: int, what: str) -> tuple[int, int] | str:
    """Whole heads per rank (see :func:`channel_window`); every window edge inside ``n`` on a
    ``step``."""
    if n % units:
        return f"{n} {what} are not {units} equal heads"
    size = n // units
    if units >= tp:
        if units % tp:
            return f"{units} heads / tp {tp} is not whole"
        per = size * (units // tp)
        lo, edge = rank * per, per if tp > 1 else 0
    else:
        if tp % units:
            return f"tp {tp} is neither a divisor nor a multiple of the {units} heads"
        per = size
        lo, edge = rank // (tp // units) * size, size if units > 1 else 0
    if edge % step:
        return (
            f"{units} heads of {size} {what}: a window of {edge} {what} does not start and end on "
            f"whole {step}-channel blocks"
        )
    return lo, lo + per


def even_split(n: int, atom: int, tp: int, rank: int) -> tuple[int, int] | None:
    """Rank ``rank``'s share of ``n`` elements cut in whole ``atom``s (the last atom may be short),
    ``tp`` equal shares; None when the atoms do not divide evenly."""
    span = channel_window(n, tp, rank, atom=atom)
    return None if isinstance(span, str) else span


def meets(rows: np.ndarray, r0: int, r1: int) -> bool:
    """Whether the sorted ``rows`` hold one in ``[r0, r1)`` (the checkers' rows of dangerous
    scales)."""
    i = int(np.searchsorted(rows, r0))
    return i < rows.size and rows[i] < r1


def cut_axis(
    meta: TensorMeta,
    axis: int | None,
    lo: int = 0,
    hi: int = 0,
    *,
    experts: tuple[int, int] | None = None,
) -> Cut:
    """Indices ``[lo, hi)`` of dimension ``axis`` of a stored tensor (``axis`` None: all of them)
    and, for a stacked tensor (``experts`` given), only experts ``[e0, e1)`` of dimension 0: a box
    of a 2-D view.

    The view splits the bytes before ``axis`` (rows) from the rest, so the box is rows x a byte
    range; a 1-D tensor is one row. For ``axis`` >= 2, every ``prod(shape[1:axis])`` view rows
    make one row of the served tensor (``Cut.group``).
    """
    shape, item, name, dtype = meta.shape, ITEMSIZE[meta.dtype], meta.name, meta.dtype
    if axis is None:
        if experts is None:
            return whole(meta)
        if len(shape) == 1:  # a stacked 1-D tensor: one value per expert
            return Cut(
                name,
                (0, 1),
                (experts[0] * item, experts[1] * item),
                (experts[1] - experts[0],),
                dtype,
                (1, meta.nbytes),
            )
        axis, lo, hi = 1, 0, shape[1]
    if axis == 0:
        if experts is not None:
            raise ValueError(
                f"{name}: a stacked tensor's experts are dimension 0; its split is after them"
            )
        if len(shape) == 1:
            return Cut(name, (0, 1), (lo * item, hi * item), (hi - lo,), dtype, (1, meta.nbytes))
        return Cut(
            name,
            (lo, hi),
            (0, meta.row_bytes),
            (hi - lo,) + shape[1:],
            dtype,
            (shape[0], meta.row_bytes),
        )
    rows = math.prod(shape[:axis])
    inner = math.prod(shape[axis + 1 :]) * item
    group = rows // shape[0] if shape[0] else 1
    out = shape[:axis] + (hi - lo,) + shape[axis + 1 :]
    if experts is None:
        r = (0, rows)
    else:
        r = (experts[0] * group, experts[1] * group)
        out = (experts[1] - experts[0],) + out[1:]
    return Cut(name, r, (lo * inner, hi * inner), out, dtype, (rows, shape[axis] * inner), group)


from .base import Codec  # noqa: E402  base.py builds on the types above


@functools.cache
def _registry() -> dict[str, Codec]:
    from .fp4_e8m0 import FP4
    from .fp8_block import FP8
    from .gguf import GGUF_CODEC
    from .nvfp4 import NVFP4_CODEC
    from .plain import PLAIN

    return {c.role: c for c in (PLAIN, FP4, FP8, NVFP4_CODEC, GGUF_CODEC)}


def for_role(role: str) -> Codec | None:
    """The codec a config role names (None for ``skip`` and ``defer``, which read nothing)."""
    return _registry().get(role)


@functools.cache
def roles() -> tuple[str, ...]:
    return tuple(_registry())


def served_dtypes() -> tuple[str, ...]:
    """Every stored dtype some codec serves, for messages."""
    return tuple(SERVED)
