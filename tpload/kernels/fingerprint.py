"""The fingerprint of a served tensor (the rank digest built from them: verification/digest.py).

Fingerprint of a tensor seen as bytes ``[R, C]`` (a 0-D or 1-D tensor is one
row; an N-D one ``[shape[0], rest]``): take words of ``w`` bytes, ``w`` the
largest of 8, 4, 2, 1 dividing ``C`` (:func:`word_width`), as little-endian
integers ``x[r, j]`` (signed, except 1-byte words: unsigned); then, in int64
arithmetic that wraps modulo 2**64::

    total = sum x[r, j]
    rows  = sum (r + 1) * sum_j x[r, j]
    cols  = sum (j + 1) * sum_r x[r, j]

Integer sums are exact and order-free, so the triple is identical on any
device, in any reduction order, and summed row block by row block; a changed
byte changes ``total``, a moved word ``rows`` or ``cols``. It is a checksum,
not a cryptographic hash: it catches corruption and misplaced bytes, not a
forgery built to keep the three sums.

One definition, two implementations: :class:`HostFingerprint` (compiled CPU
kernels, fused with the copy that makes the bytes) and :class:`DeviceFingerprint`
(torch integer reductions, on any device, without a host sync).
:func:`fingerprint` picks by device.
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.values import Triple
from .lazy import kernels

_NP_WORDS = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}
_TORCH_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def word_width(row_bytes: int) -> int:
    """The fingerprint's word size for rows of ``row_bytes``: the largest of 8, 4, 2, 1 dividing
    it."""
    return next(w for w in (8, 4, 2, 1) if row_bytes % w == 0) if row_bytes else 1


def word_widths(row_bytes: np.ndarray) -> np.ndarray:
    """:func:`word_width` of many row lengths at once (a batch of small tensors)."""
    widths: np.ndarray = np.where(
        row_bytes % 8 == 0, 8, np.where(row_bytes % 4 == 0, 4, np.where(row_bytes % 2 == 0, 2, 1))
    )
    widths[row_bytes == 0] = 1
    return widths.astype(np.int64)


_EXPONENTS = {2: (0x7F80, 0x0080), 4: (0x7F800000, 0x00800000), 8: (0x7FF0000000000000, 1 << 52)}
"""A floating lane's exponent bits and the lowest of them, by its bytes (bf16's; f16 below)."""


def nonfinite_lanes(dtype: str, word: int) -> tuple[int, int, int]:
    """What the compiled passes read to find NaN and inf in ``word``-byte words of a tensor of
    safetensors dtype ``dtype`` (``_nonfinite_lanes`` in kernels/compiled.py): each lane's exponent
    bits, the lowest exponent bit and the sign bit, repeated over the word's lanes (as int64 bit
    patterns); zeros for a dtype with no inf (integers, and FP8/FP4, whose NaN codes are the
    codecs' value checks)."""
    size = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}.get(dtype)
    if size is None or word % size:
        return (0, 0, 0)
    mask, low = (0x7C00, 0x0400) if dtype == "F16" else _EXPONENTS[size]
    sign = 1 << (8 * size - 1)
    m = lo = hi = 0
    for lane in range(word // size):
        shift = 8 * size * lane
        m, lo, hi = m | mask << shift, lo | low << shift, hi | sign << shift
    return _signed(m), _signed(lo), _signed(hi)


def _signed(v: int) -> int:
    """A 64-bit pattern as the int64 the kernels take."""
    return v - (1 << 64) if v >= 1 << 63 else v


_EXPONENT = {  # a floating dtype's exponent bits: all set is inf or NaN
    "BF16": (np.dtype("<u2"), 0x7F80),
    "F16": (np.dtype("<u2"), 0x7C00),
    "F32": (np.dtype("<u4"), 0x7F800000),
    "F64": (np.dtype("<u8"), 0x7FF0000000000000),
}
_SLICE = 1 << 20


def count_nonfinite(raw: np.ndarray, dtype: str) -> tuple[int, int] | None:
    """(how many, the first's index) of the NaN and inf values in ``raw`` (a window's bytes of a
    tensor of safetensors dtype ``dtype``), or None: none, or not a floating dtype with inf (FP8's
    NaN codes are the codecs' check). By slices: a window is never copied whole. The exact count
    behind the fingerprint pass's flag (:class:`HostFingerprint`'s ``finite``), read only where it
    was raised."""
    spec = _EXPONENT.get(dtype)
    if spec is None or raw.size % spec[0].itemsize:
        return None
    words, mask = raw.view(spec[0]), spec[0].type(spec[1])
    scratch: np.ndarray = np.empty(min(_SLICE, words.size), dtype=spec[0])
    count, first = 0, -1
    for at in range(0, words.size, _SLICE):
        part = words[at : at + _SLICE]
        masked = np.bitwise_and(part, mask, out=scratch[: part.size])
        if masked.max(initial=0) != mask:  # the usual case: one pass and a max, no bool array
            continue
        hit = masked == mask
        first = at + int(np.argmax(hit)) if first < 0 else first
        count += int(np.count_nonzero(hit))
    return (count, first) if count else None


def as_bytes2d(t: torch.Tensor) -> torch.Tensor:
    """A served tensor as the 2-D uint8 view the fingerprint reads, ``[rows, row_bytes]``."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() == 1:
        t = t.reshape(1, -1)
    elif t.dim() > 2:  # no rows: nothing to infer the row's width from ([0, 4, 5] is [0, 0])
        t = t.reshape(t.shape[0], -1 if t.shape[0] else 0)
    return t.view(torch.uint8)


def _cols_term(col_sums: np.ndarray) -> int:
    return int(kernels.cols_term(col_sums))


class HostFingerprint:
    """The fingerprint of a 2-D byte window built on the CPU, row block by row block, by the
    compiled pass that also copies the block (or only reads it, with no destination).

    Blocks are 2-D uint8 arrays whose rows may be windows of wider rows (a staging buffer of whole
    stored rows); a block whose words cannot be read in place falls back to a gathered copy.
    With ``group`` > 1 the blocks' rows are pieces: every ``group`` of them, in order, make one row
    of the fingerprinted tensor (a window read as ``[experts x rows, cols]`` but served as
    ``[experts, rows x cols]``); :meth:`fits` says whether words then stay whole.
    """

    def __init__(self, row_bytes: int, *, group: int = 1, finite: str = "") -> None:
        self.group = group
        self.width = word_width(row_bytes * group)
        if row_bytes % self.width:
            raise ValueError(
                f"{group} pieces of {row_bytes} bytes split {self.width}-byte words: see fits()"
            )
        self.lanes = nonfinite_lanes(finite, self.width) if finite else (0, 0, 0)
        """With ``finite`` (a floating dtype), the same pass looks for NaN and inf."""
        self.nonfinite = False
        """Whether a block added held a NaN or inf (looked for only with ``finite``)."""
        self.dtype = np.dtype(_NP_WORDS[self.width])
        self.cols = row_bytes * group // self.width
        self.col_sums: np.ndarray = np.zeros(self.cols, dtype=np.int64)
        self.total = 0
        self.rows = 0
        self._empty: np.ndarray = np.empty(0, dtype=self.dtype)
        self._value: Triple | None = None

    @staticmethod
    def fits(row_bytes: int, group: int) -> bool:
        """Whether rows of ``row_bytes`` grouped by ``group`` keep the fingerprint's words whole."""
        return row_bytes % word_width(row_bytes * group) == 0

    def add(
        self, block: np.ndarray, first_row: int, dst: np.ndarray | None = None, first_col: int = 0
    ) -> None:
        """Add the block at window row ``first_row`` and byte column ``first_col`` (a row piece, for
        rows wider than a buffer); copy it into ``dst`` (contiguous uint8 of the block's shape) if
        given, in the same pass."""
        rows, width = block.shape
        w = self.width
        if rows == 0 or width == 0:
            return
        if width % w or first_col % w or (dst is not None and not dst.flags.c_contiguous):
            raise ValueError(
                f"a block of {width} bytes at column {first_col} does not hold whole {w}-byte words"
            )
        base = block.__array_interface__["data"][0]
        if (
            block.flags.c_contiguous and base % w == 0
        ):  # the common case: the block's words as they lie
            words, stride = block.reshape(-1).view(self.dtype), width
        else:
            stride = block.strides[0] if rows > 1 else width
            if block.strides[1] != 1 or base % w or stride % w or stride < 0:
                # words not in place (an odd or negative row stride, a misaligned start): gather
                # first, into a new buffer (np.ascontiguousarray would hand back a contiguous block
                # as it is, misaligned)
                block = block.copy(order="C")
                stride = width
            words = np.lib.stride_tricks.as_strided(
                block, shape=((rows - 1) * stride + width,), strides=(1,)
            ).view(self.dtype)
        out = self._empty if dst is None else dst.reshape(-1).view(self.dtype)
        total, weighted, nonfinite = kernels.copy_fingerprint(
            words,
            0,
            stride // w,
            rows,
            width // w,
            out,
            self.col_sums,
            first_row,
            first_col // w,
            self.group,
            self.lanes,
        )
        self.nonfinite |= nonfinite
        self.total += total
        self.rows += weighted
        self._value = None

    def value(self) -> Triple:
        if self._value is None:
            self._value = (
                kernels.wrap64(self.total),
                kernels.wrap64(self.rows),
                _cols_term(self.col_sums),
            )
        return self._value


def host_fingerprint(window: np.ndarray) -> Triple:
    """The triple of a host byte window (2-D uint8, rows possibly windows of wider rows)."""
    fp = HostFingerprint(window.shape[1])
    fp.add(window, 0)
    return fp.value()


class DeviceFingerprint:
    """The same triple summed by torch integer ops on the tensor's device, row block by row block.

    Every state is a device tensor: nothing syncs until the caller reads :meth:`value`.
    """

    def __init__(self, row_bytes: int, device: torch.device) -> None:
        self.width = word_width(row_bytes)
        self.device = device
        cols = row_bytes // self.width
        self.col_index = torch.arange(1, cols + 1, dtype=torch.int64, device=device)
        self.col_sums = torch.zeros(cols, dtype=torch.int64, device=device)
        self.total = torch.zeros((), dtype=torch.int64, device=device)
        self.rows = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, block: torch.Tensor, first_row: int) -> None:
        """Add rows ``[first_row, first_row + len(block))`` (a 2-D uint8 block of the tensor)."""
        r, c = block.shape
        if r == 0 or c == 0:
            return
        words = block if self.width == 1 else _word_view(block, self.width)
        if self.width != 8:
            words = words.to(torch.int64)
        row_sums = words.sum(dim=1)
        ri = torch.arange(first_row + 1, first_row + r + 1, dtype=torch.int64, device=self.device)
        self.total += row_sums.sum()
        self.rows += (row_sums * ri).sum()
        self.col_sums += words.sum(dim=0)

    def value(self) -> torch.Tensor:
        """The int64 triple ``(total, rows, cols)`` (a device tensor)."""
        return torch.stack([self.total, self.rows, (self.col_sums * self.col_index).sum()])


def _word_view(t: torch.Tensor, w: int) -> torch.Tensor:
    try:
        return t.view(_TORCH_WORDS[w])
    except RuntimeError:  # a misaligned or strided block: words need their own buffer
        return t.contiguous().view(_TORCH_WORDS[w])


def fingerprint(t: torch.Tensor, *, block_bytes: int = 4 << 20) -> Triple | torch.Tensor:
    """The fingerprint of a served tensor where it lives: a tuple on the CPU (the compiled pass),
    an int64 device tensor elsewhere (read it later, with every other check, in one sync)."""
    b = as_bytes2d(t)
    if b.device.type == "cpu":
        return host_fingerprint(b.numpy())
    fp = DeviceFingerprint(b.shape[1], b.device)
    step = max(1, block_bytes // max(b.shape[1], 1))
    for r0 in range(0, b.shape[0], step):
        fp.add(b[r0 : r0 + step], r0)
    return fp.value()


def decoded_fingerprint(slot: torch.Tensor) -> tuple[Triple | torch.Tensor, int | torch.Tensor]:
    """(fingerprint, count of non-finite elements or a 0/1 flag) of a decoded bf16 slot: one
    compiled read on the CPU when its rows are whole int64 words, torch ops otherwise (a device
    scalar)."""
    b = as_bytes2d(slot)
    if (
        b.device.type == "cpu"
        and b.shape[1] % 8 == 0
        and b.is_contiguous()
        and b.data_ptr() % 8 == 0
    ):
        words = b.numpy().view(np.int64)
        col_sums = np.zeros(words.shape[1], dtype=np.int64)
        total, weighted, bad = kernels.bf16_fingerprint(words, col_sums)
        return (
            kernels.wrap64(int(total)),
            kernels.wrap64(int(weighted)),
            _cols_term(col_sums),
        ), int(bad)
    return fingerprint(slot), not_finite(slot)


def not_finite(t: torch.Tensor) -> torch.Tensor:
    """1 if ``t`` holds a NaN or an infinity, else 0 (a device scalar): ``aminmax`` propagates NaN,
    keeps infinities, and runs at memory speed."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    lo, hi = torch.aminmax(t.reshape(-1))
    return (~(torch.isfinite(lo) & torch.isfinite(hi))).to(torch.int64)
