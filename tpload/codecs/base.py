"""What a codec is: the abstract base every stored format implements, the types it takes and
returns (a cut of a stored tensor, a fit, the value checker) and the window arithmetic the formats
share (a rank's channel window, a cut of one axis).

The abstract methods are the ones each format answers its own way (:meth:`Codec.fit`,
:meth:`Codec.cuts`, :meth:`Codec.decode`, :meth:`Codec.reference`); the rest have a default a
format overrides when it differs. An implementation keeps the base's signatures exactly
(tests/unit/codecs/test_base.py checks it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

import numpy as np
import torch

from ..model.meta import ITEMSIZE, TensorMeta
from .tables import SERVED, SERVED_SCALE

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


_T = TypeVar("_T")


def present(value: _T | None, what: str = "a scaled format's scale") -> _T:
    """``value``, which the format always has where this is asked (a scaled codec's fit pairs
    each weight with its scale; a checker's first problem is read only once it found one)."""
    if value is None:
        raise ValueError(f"{what} is missing (a bug in tpload)")
    return value


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
        span: tuple[int, int] | None = None
        if split != "replicate" and tp > 1:
            n, atom = self.channels(fit, split)
            window = channel_window(
                n,
                tp,
                rank,
                atom=atom,
                align=align,
                units=units,
                uneven=uneven,
                what=split if atom == 1 and not align and not self.scaled else "channels",
            )
            if isinstance(window, str):
                return window
            span = window
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
    nbytes: int = math.prod(shape) * dtype.itemsize
    return nbytes


def decode_rows(
    decode: Callable[..., None],
    fit: Fit,
    unfold: int,
    weight: np.ndarray | torch.Tensor,
    scale: np.ndarray | torch.Tensor | None,
    out: torch.Tensor,
    scale2: np.ndarray | None,
) -> None:
    """``decode(weight, scale, out, fit, scale2=...)`` on view rows, or, when one view row holds
    ``unfold`` rows of the decode (a stacked tensor cut on its rows: one view row per expert), on
    each view row seen as those rows (its scale row too: such formats have one scale row per
    row)."""
    if unfold == 1:
        decode(weight, scale, out, fit, scale2=scale2)
        return
    for i in range(weight.shape[0]):
        decode(
            weight[i].reshape(unfold, -1),
            scale[i].reshape(unfold, -1) if scale is not None else None,
            out[i].reshape(unfold, -1),
            fit,
            scale2=scale2,
        )
