"""The tensor table: every stored tensor of a checkpoint as columns, one row a tensor.

A checkpoint of 92,000 tensors held as one Python object a tensor per stage is ~15 objects a tensor
for the collector to walk and a dozen Python passes; held as columns it is one names list, one
name -> row dict (strings and ints, which the collector does not track) and a few numpy arrays.
Storage fills it (the headers, one pass a file), planning and the gate read it; a record a row is
made only where a single-item path asks for one.

The names' templates (each digit run replaced by a parameter: DeepSeek-V3's 91,991 names are 43
templates) and their natural order (model/templates.py's :func:`natural_key`, exactly: digests
depend on it) are computed once over the names' bytes, not once a name.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .templates import natural_key, natural_sorted

MAX_DIMS = 8
"""Dimensions a shape column holds (safetensors' and the manifest's bound)."""
_RUN = 0xFF
"""A digit run's mark in a template's bytes (no UTF-8 byte is it)."""
_MAX_RUNS = 16
_MAX_RUN_DIGITS = 18
"""A run's digits without its leading zeros that an int64 holds whole; longer: natural_sorted."""
_MAX_RUN_BYTES = 64
"""A run this long (leading zeros included) goes to natural_sorted (the digits are read one place
a pass)."""


@dataclass(frozen=True, eq=False)
class Templates:
    """Each name's template and the digit runs that fill it, as columns.

    ``x.layers.3.experts.17.w1`` is the template ``x.layers.#.experts.#.w#`` with the parameters
    3, 17, 1. Every name has one: a name the byte pass cannot read exactly (a newline, a surrogate
    or a digit other than 0-9 in it, a run of more than 18 significant digits, more than 16 runs)
    is a literal template of its own, its whole name with no runs (:attr:`literal`)."""

    ids: np.ndarray
    """Each name's template (an index into :attr:`texts`), int32."""
    texts: list[tuple[str, ...]]
    """Each template's text parts, around its runs (one more than it has runs; empty ones kept)."""
    values: np.ndarray
    """[n, runs] int64: each name's digit runs as numbers, in order; -1 past its last run."""
    zeros: np.ndarray
    """[n, runs] int64: each run's leading zeros (``07`` is 7 with one), 0 past the last run."""
    literal: np.ndarray
    """Per template: whether it is a name read whole (its digits, if any, are text)."""

    @property
    def runs(self) -> int:
        return int(self.values.shape[1])

    @property
    def whole(self) -> bool:
        """Whether every name was read (no literal template)."""
        return not self.literal.any()

    def run_counts(self) -> np.ndarray:
        """How many runs each template has."""
        counts: np.ndarray = np.fromiter(map(len, self.texts), np.int64, len(self.texts))
        return counts - 1


_ODD = re.compile(r"[\ud800-\udfff]|(?![0-9])\d")
"""What the byte pass cannot read in a name but the joint: what UTF-8 cannot encode, a digit
``\\d`` reads that is not 0-9 (natural_key's runs would hold it)."""


def templates(names: Sequence[str]) -> Templates:
    """The names' templates and parameters, read in numpy over the names' joined UTF-8 bytes (no
    byte of a multi-byte character is a digit or the run mark); each name the pass cannot read a
    literal template (see :class:`Templates`)."""
    n = len(names)
    joined = "\n".join(names)
    odd: list[int] = []
    lines = joined.count("\n") != max(n - 1, 0)
    if lines or not joined.isascii():
        odd = [
            k
            for k, x in enumerate(names)
            if (lines and "\n" in x) or (not x.isascii() and _ODD.search(x))
        ]
    read = _read(names, odd)
    if isinstance(read, Templates):
        return read
    # names whose runs the columns cannot hold: read whole too
    got = _read(names, sorted({*odd, *read.tolist()}))
    assert isinstance(got, Templates)  # (the rest have no such run)
    return got


def _read(names: Sequence[str], odd: list[int]) -> Templates | np.ndarray:
    """:func:`templates` with the names at ``odd`` read whole; the names with a run the columns
    cannot hold instead, where there are some."""
    n = len(names)
    keep: np.ndarray = np.ones(n, bool)
    keep[odd] = False
    readable = names if not odd else [x for k, x in enumerate(names) if keep[k]]
    m = len(readable)
    a = np.frombuffer("\n".join(readable).encode("utf-8"), np.uint8)
    digit = (a >= 48) & (a <= 57)
    before = np.concatenate(([False], digit[:-1]))
    after = np.concatenate((digit[1:], [False]))
    starts = np.flatnonzero(digit & ~before)
    stops: np.ndarray = np.flatnonzero(digit & ~after) + 1
    lengths = stops - starts
    joints = np.flatnonzero(a == 10)
    name_of: np.ndarray = np.searchsorted(joints, starts).astype(np.int64)  # each run's name
    per_name = np.bincount(name_of, minlength=m) if m else np.zeros(0, np.int64)
    # each run's value and leading zeros, one digit place a pass (a run is a few digits)
    long = lengths > _MAX_RUN_BYTES
    values: np.ndarray = np.zeros(len(starts), np.int64)
    zeros: np.ndarray = np.zeros(len(starts), np.int64)
    leading: np.ndarray = np.ones(len(starts), bool)
    significant: np.ndarray = np.zeros(len(starts), np.int64)
    for k in range(min(int(lengths.max()), _MAX_RUN_BYTES) if len(lengths) else 0):
        live = k < lengths
        d = np.where(live, a[np.minimum(starts + k, len(a) - 1)].astype(np.int64) - 48, 0)
        leading &= live & (d == 0)
        zeros += leading
        significant += live & ~leading
        values = np.where(live, values * 10 + d, values)
    bad: np.ndarray = np.zeros(m, bool)
    bad[name_of[long | (significant > _MAX_RUN_DIGITS)]] = True
    bad |= per_name > _MAX_RUNS
    if bad.any():
        got: np.ndarray = np.flatnonzero(keep)[bad]
        return got
    width = int(per_name.max()) if len(per_name) and len(starts) else 0
    first = np.concatenate(([0], np.cumsum(per_name)[:-1])) if m else np.zeros(0, np.int64)
    place = np.arange(len(starts)) - first[name_of]
    value_cols: np.ndarray = np.full((n, width), -1, np.int64)
    zero_cols: np.ndarray = np.zeros((n, width), np.int64)
    at = np.flatnonzero(keep)[name_of]
    value_cols[at, place] = values
    zero_cols[at, place] = zeros
    # the templates: each run's first byte its mark, its other digits dropped
    marked = a.copy()
    marked[starts] = _RUN
    shapes = marked[~(digit & before)].tobytes().split(b"\n") if m else []
    every: list[bytes | str] = list(shapes)
    if odd:  # a literal template: the name itself (a str, which no bytes equal)
        every = list(names)
        for k, s in zip(np.flatnonzero(keep).tolist(), shapes, strict=True):
            every[k] = s
    known = {s: k for k, s in enumerate(dict.fromkeys(every))}  # first seen, first numbered
    ids = np.fromiter(map(known.__getitem__, every), np.int32, n)
    texts = [
        (s,) if isinstance(s, str) else tuple(t.decode("utf-8") for t in s.split(bytes((_RUN,))))
        for s in known
    ]
    literal = np.fromiter((isinstance(s, str) for s in known), bool, len(known))
    return Templates(ids, texts, value_cols, zero_cols, literal)


def natural_order(names: Sequence[str], tpl: Templates | None = None) -> np.ndarray:
    """The permutation that puts ``names`` in natural order: ``[names[i] for i in
    natural_order(names)] == natural_sorted(names)``, exactly (digests list their tensors in it).

    :func:`natural_key` alternates text parts and digit runs, so a name's key is a row of integers:
    each text part's rank among every text part (in str order, as natural_key compares them), each
    run's value and its tie-break (equal values: ``"02"`` before ``"2"``, but ``"0"`` before
    ``"00"``, as run_key's text compares them), and -1 past the name's end (a key that is a prefix
    of another sorts first). One lexsort of those columns; the names read whole
    (:attr:`Templates.literal`) sorted by natural_key and put in place by bisection."""
    tpl = templates(names) if tpl is None else tpl
    n = len(names)
    if n == 0:
        return np.zeros(0, np.int64)
    parts = sorted({p for t in tpl.texts for p in t})
    part_rank = {p: k for k, p in enumerate(parts)}
    width = tpl.runs
    text_cols: np.ndarray = np.full((len(tpl.texts), width + 1), -1, np.int64)
    for t, text in enumerate(tpl.texts):
        text_cols[t, : len(text)] = [part_rank[p] for p in text]
    text_of = text_cols[tpl.ids]
    # run_key's order among equal values: more leading zeros first, but for zero itself fewer
    tie = np.where(tpl.values > 0, -tpl.zeros, tpl.zeros)
    keys = [text_of[:, 0]]
    for k in range(width):
        keys += [tpl.values[:, k], tie[:, k], text_of[:, k + 1]]
    order: np.ndarray = np.lexsort(keys[::-1]).astype(np.int64)
    if tpl.whole:
        return order
    whole = tpl.literal[tpl.ids]
    order = order[~whole[order]]
    seq = list(map(names.__getitem__, order.tolist()))
    odd = sorted(np.flatnonzero(whole).tolist(), key=lambda k: natural_key(names[k]))
    at = [bisect.bisect_left(seq, natural_key(names[k]), key=natural_key) for k in odd]
    placed: np.ndarray = np.insert(order, at, odd)
    return placed


def check_order(names: Sequence[str], order: np.ndarray) -> bool:
    """Whether ``order`` puts ``names`` in natural order (each neighbour pair compared by
    :func:`natural_key`): a test's and a debugging aid, not the load's."""
    seq = [names[i] for i in order.tolist()]
    return all(natural_key(x) < natural_key(y) for x, y in zip(seq, seq[1:], strict=False))


class TensorTable:
    """Every stored tensor of a checkpoint as columns (one row a tensor, in the order the headers
    list them): names and a name -> row index, each row's file (an id into :attr:`files`), dtype (a
    code into :attr:`dtypes`), shape ([n, 8] int64, zero-padded, with :attr:`ndim`), first byte in
    its file and byte count. The templates, the natural order and the 2-D byte views are computed
    when first asked for, once."""

    def __init__(
        self,
        names: list[str],
        *,
        files: list[str],
        file_id: np.ndarray,
        dtypes: list[str],
        dtype_code: np.ndarray,
        shape: np.ndarray,
        ndim: np.ndarray,
        begin: np.ndarray,
        nbytes: np.ndarray,
        shapes: list[tuple[int, ...]] | None = None,
    ) -> None:
        """``shapes``: each row's shape as a tuple, when the caller has them (the records a row
        view makes share them); made from the shape column otherwise."""
        self.names = names
        self.row: dict[str, int] = dict(zip(names, range(len(names)), strict=True))
        self.files, self.file_id = files, file_id
        self.dtypes, self.dtype_code = dtypes, dtype_code
        self.shape, self.ndim = shape, ndim
        self.begin, self.nbytes = begin, nbytes
        self.shapes = (
            shapes
            if shapes is not None
            else list(map(tuple, map(list.__getitem__, shape.tolist(), map(slice, ndim.tolist()))))
        )

    def __len__(self) -> int:
        return len(self.names)

    def take(self, rows: np.ndarray) -> TensorTable:
        """The table with its rows in the order ``rows`` gives (a permutation of them)."""
        picked = rows.tolist()
        return TensorTable(
            list(map(self.names.__getitem__, picked)),
            files=self.files,
            file_id=self.file_id[rows],
            dtypes=self.dtypes,
            dtype_code=self.dtype_code[rows],
            shape=self.shape[rows],
            ndim=self.ndim[rows],
            begin=self.begin[rows],
            nbytes=self.nbytes[rows],
            shapes=list(map(self.shapes.__getitem__, picked)),
        )

    @functools.cached_property
    def rows(self) -> np.ndarray:
        """Rows of each tensor's 2-D byte view (a 0-D or 1-D tensor is one row)."""
        rows: np.ndarray = np.where(self.ndim > 1, self.shape[:, 0], 1)
        return rows

    @functools.cached_property
    def row_bytes(self) -> np.ndarray:
        rows = self.rows
        out: np.ndarray = np.where(rows > 0, self.nbytes // np.maximum(rows, 1), 0)
        return out

    @functools.cached_property
    def dtype_names(self) -> list[str]:
        """Each row's dtype, spelt (the vocabulary's strings, shared)."""
        return list(map(self.dtypes.__getitem__, self.dtype_code.tolist()))

    @functools.cached_property
    def signatures(self) -> list[int]:
        """Each row's dtype and shape as one number: equal exactly when both are."""
        pairs = list(zip(self.dtype_code.tolist(), self.shapes, strict=True))
        known = {p: k for k, p in enumerate(dict.fromkeys(pairs))}  # hashed in C, no sort
        return list(map(known.__getitem__, pairs))

    def shape_of(self, k: int) -> tuple[int, ...]:
        return self.shapes[k]

    def dtype_of(self, k: int) -> str:
        return self.dtypes[int(self.dtype_code[k])]

    def file_of(self, k: int) -> str:
        return self.files[int(self.file_id[k])]

    @functools.cached_property
    def templates(self) -> Templates:
        return templates(self.names)

    @functools.cached_property
    def order(self) -> np.ndarray:
        """The rows in natural order of their names (:func:`natural_order`)."""
        return natural_order(self.names, self.templates)

    @functools.cached_property
    def place(self) -> np.ndarray:
        """Each row's place in natural order (the inverse of :attr:`order`)."""
        place: np.ndarray = np.empty(len(self.names), np.int64)
        place[self.order] = np.arange(len(self.names))
        return place

    def natural_names(self) -> list[str]:
        """Every name in natural order."""
        return list(map(self.names.__getitem__, self.order.tolist()))


def natural_subset(names: Sequence[str], place: dict[str, int] | None) -> list[str]:
    """``natural_sorted(names)``, by the places a table's natural order gives its names when
    ``place`` has every one (a sort of ints); natural_sorted otherwise."""
    if place is None:
        return natural_sorted(names)
    try:
        return sorted(names, key=place.__getitem__)
    except KeyError:
        return natural_sorted(names)
