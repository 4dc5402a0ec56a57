"""The safetensors layout: validated header parsing, and a streaming writer.

A shard is an 8-byte little-endian header length, a JSON header giving each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (relative to the data),
then the data. Every problem in a header is collected and raised at once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ..model.columns import RowTable
from ..model.errors import CheckpointError, raise_all
from ..model.meta import ITEMSIZE, SAFETENSORS_ITEMSIZE, TensorMeta
from ..model.progress import ProgressSink
from ..model.table import TensorTable
from ..model.text import escape_name
from ..model.values import Stored
from .files import atomic_file, open_regular, read_exact
from .header_json import Twice, ignored_value_problem, lone_surrogate, parse_header_json
from .scan import scan_header

_new = object.__new__
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit (MAX_HEADER_SIZE): it reads no larger
MAX_DIM = (
    1 << 48
)  # a dimension this long is corrupt (the manifest's bound); it keeps every product printable

_HEADER_ITEMSIZE = SAFETENSORS_ITEMSIZE  # what a safetensors header may say (not GGUF's types)
# safetensors' dtypes tpload refuses (docs/format.md): complex, and the types narrower than a byte
_REFUSED_DTYPES = frozenset(("C64", "F4", "F6_E2M3", "F6_E3M2"))

_T = TypeVar("_T")


@dataclass(frozen=True, eq=False, slots=True)
class TensorInfo(TensorMeta):
    """A tensor and where its bytes are in its shard (equal to any TensorMeta of the same
    tensor)."""

    path: Path
    """Absolute path of the shard (symlinks not resolved: HF caches link blobs)."""
    begin: int
    """Absolute byte offset of the first data byte in the shard file."""


def read_header(path: Path, file: str) -> tuple[Mapping[str, TensorInfo], dict[str, str]]:
    """:func:`read_columns` as {name: TensorInfo} (each made when asked for) and the metadata."""
    columns, meta = read_columns(path, file)
    return rows_of(path, file, columns), meta


def read_columns(path: Path, file: str) -> tuple[HeaderColumns, dict[str, str]]:
    """Parse and validate one shard's header: its entries as columns, and its ``__metadata__``.

    The rules are safetensors' own (its parser in safetensors 0.8.0: the JSON as serde_json reads
    it, then ``Metadata::validate``): a header of at most :data:`MAX_HEADER_BYTES`, a
    ``__metadata__`` of strings, each entry exactly dtype x shape long, and the entries covering the
    data back to back from its first byte to the end of the file. tpload refuses besides only what
    docs/format.md lists. Every problem is collected and raised at once.
    """
    fd = open_regular(path, "shard")
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise CheckpointError(
                f"{escape_name(path)}: {size} bytes, too short for a safetensors header length"
            )
        (hlen,) = struct.unpack("<Q", read_exact(fd, 0, 8, path, "shard"))
        if hlen > MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{escape_name(path)}: header length {hlen} is more than safetensors reads "
                f"({MAX_HEADER_BYTES} bytes); refused"
            )
        if 8 + hlen > size:
            raise CheckpointError(
                f"{escape_name(path)}: header length {hlen} runs past the file ({size} bytes)"
            )
        raw = read_exact(fd, 8, hlen, path, "shard header")
    finally:
        os.close(fd)
    return parse_columns(raw, path, 8 + hlen, size - 8 - hlen)


def parse_columns(
    raw: bytes, path: Path, data_start: int, data_len: int
) -> tuple[HeaderColumns, dict[str, str]]:
    """A header's JSON (``raw``) as columns and its ``__metadata__``, or every problem raised at
    once. The one reading of a header: the usual one is scanned straight into columns
    (:func:`scanned_columns`: no object a tensor); any other is read as serde reads it
    (:func:`.header_json.parse_header_json`) and by :func:`header_columns`, which words every
    problem."""
    return scanned_columns(raw, path, data_start, data_len) or parsed_columns(
        raw, path, data_start, data_len
    )


def scanned_columns(
    raw: bytes, path: Path, data_start: int, data_len: int
) -> tuple[HeaderColumns, dict[str, str]] | None:
    """:func:`parse_columns` of a usual header (:func:`.scan.scan_header`) whose entries break no
    rule (:func:`_usual`); None for any other."""
    scan = scan_header(raw)
    if scan is None:
        return None
    dims = np.fromiter(itertools.chain.from_iterable(scan.shapes), np.int64)
    begins, stops = np.array(scan.begins, np.int64), np.array(scan.ends, np.int64)
    usual = _usual(
        path, scan.names, scan.dtypes, scan.shapes, dims, begins, stops, data_start, data_len
    )
    return None if usual is None else (usual, scan.meta)


def parsed_columns(
    raw: bytes, path: Path, data_start: int, data_len: int
) -> tuple[HeaderColumns, dict[str, str]]:
    """:func:`parse_columns` through the JSON parser: any header, every problem worded."""
    header = parse_header_json(raw, path)
    if not isinstance(header, dict):
        raise CheckpointError(f"{escape_name(path)}: header is not a JSON object")
    columns = header_columns(path, header, data_start, data_len)
    meta = header.get("__metadata__")  # header_columns() refused anything but strings
    return columns, dict(meta) if meta else {}


class HeaderColumns(NamedTuple):
    """One shard's sound entries as columns, in the header's order (no object a tensor: a
    checkpoint's table is made of these, one pass a file)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    begins: list[int]
    """Absolute offset of each tensor's first byte in the file."""
    nbytes: list[int]


_NOTHING: dict[str, Any] = {}
_DTYPE, _SHAPE, _OFFSETS = (
    operator.methodcaller("get", k) for k in ("dtype", "shape", "data_offsets")
)
_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
_MAX_BYTES = 1 << 61  # safetensors counts a tensor's bits in 64 bits (a usize)
_MAX_RUN = 1 << 63  # torch counts elements in an int64, the leading dimensions' product too


def _is(values: list[Any], kind: type) -> np.ndarray:
    """Whether each value's type is exactly ``kind`` (bool is not int), as a mask made in C."""
    if set(map(type, values)) <= {kind}:  # the usual column: one type throughout
        return np.ones(len(values), bool)
    result: np.ndarray = np.fromiter(
        map(operator.is_, map(type, values), itertools.repeat(kind)), bool, len(values)
    )
    return result


def _where(mask: np.ndarray, values: list[_T], other: _T) -> list[_T]:
    """``values`` with ``other`` wherever ``mask`` is False (so the next rule can read them all)."""
    if mask.all():
        return values
    return [v if ok else other for v, ok in zip(values, mask.tolist(), strict=True)]


def entries(
    path: Path, file: str, header: dict[str, Any], data_start: int, data_len: int
) -> Mapping[str, TensorInfo]:
    """Every entry of a parsed header as {name: TensorInfo} (each made when asked for), or every
    problem raised at once (:func:`header_columns`)."""
    return rows_of(path, file, header_columns(path, header, data_start, data_len))


def header_columns(
    path: Path, header: dict[str, Any], data_start: int, data_len: int
) -> HeaderColumns:
    """Every entry of a parsed header as columns, or every problem raised at once.

    Each rule is one pass over a column of the header (a checkpoint has 92,000 entries), and an
    entry is worded by the first rule it breaks: an object, no field named twice, a dtype of whole
    bytes, a shape of at most 8 non-negative integers below 2**48 whose element count fits,
    ``data_offsets`` [begin, end] in order, inside the data and spanning dtype x shape, and any
    other field one serde_json reads. Then the header's own rules (:func:`header_problems`), and the
    entries' offsets must cover the data back to back (:func:`coverage_problems`).

    The usual header (every entry exactly the three fields, of the usual types, in range, covering
    the data) is taken by :func:`_usual_columns` in a few passes made in C; anything else is read
    here, rule by rule, and every problem worded."""
    usual = _usual_columns(path, header, data_start, data_len)
    if usual is not None:
        return usual
    names = [n for n in header if n != "__metadata__"]
    n = len(names)
    raw = list(map(header.__getitem__, names))
    is_obj, single = _objects(raw)
    objs = _where(is_obj, raw, _NOTHING)
    dtypes = list(map(_DTYPE, objs))
    itemsize = np.array(
        list(
            map(_HEADER_ITEMSIZE.get, _where(_is(dtypes, str), dtypes, None), itertools.repeat(0))
        ),
        dtype=np.int64,
    )
    shapes = list(map(_SHAPE, objs))
    shape_ok = _is(shapes, list)
    shapes = _where(shape_ok, shapes, [])
    lens = np.fromiter(map(len, shapes), np.int64, n)
    dims_ok = _dims_ok(list(itertools.chain.from_iterable(shapes)))
    shape_ok &= (lens <= 8) & (_bad_per_row(dims_ok, lens) == 0)
    shapes = _where(shape_ok, shapes, [0])
    # Python ints until each is known to fit: a hostile header may hold any integer
    numel = list(map(math.prod, shapes))
    want = list(map(operator.mul, numel, itemsize.tolist()))
    fits = _fits(shapes, numel, want)
    offsets = list(map(_OFFSETS, objs))
    offsets_ok = _is(offsets, list)
    offsets = _where(offsets_ok, offsets, ())
    offsets_ok &= np.fromiter(map(len, offsets), np.int64, n) == 2
    offsets = _where(offsets_ok, offsets, (0, 0))
    pair = list(itertools.chain.from_iterable(offsets))
    offsets_ok &= _is(pair[0::2], int) & _is(pair[1::2], int)
    offsets = _where(offsets_ok, offsets, (0, 0))
    begins = list(map(_FIRST, offsets))
    stops = list(map(_SECOND, offsets))
    ordered = np.fromiter(map(operator.le, map(abs, begins), begins), bool, n) & np.fromiter(
        map(operator.le, begins, stops), bool, n
    )
    inside = np.fromiter(map(operator.le, stops, itertools.repeat(data_len)), bool, n)
    spans = np.fromiter(map(operator.eq, map(operator.sub, stops, begins), want), bool, n)
    ignored = _ignored_fields(objs)
    read: np.ndarray = np.ones(n, bool)
    read[list(ignored)] = False
    rules = (is_obj, single, itemsize > 0, shape_ok, fits, offsets_ok, ordered, inside, spans, read)
    sound = np.logical_and.reduce(rules) if n else np.zeros(0, bool)
    problems = header_problems(path, header, names)
    problems += [
        _problem(path, names[i], raw[i], data_len, [bool(r[i]) for r in rules], ignored.get(i))
        for i in np.flatnonzero(~sound).tolist()
    ]
    placed = np.flatnonzero(offsets_ok & ordered & inside).tolist()  # inside the data: int64s
    problems += coverage_problems(
        path,
        list(map(names.__getitem__, placed)),
        np.fromiter(map(begins.__getitem__, placed), np.int64, len(placed)),
        np.fromiter(map(stops.__getitem__, placed), np.int64, len(placed)),
        data_len,
        complete=len(placed) == n,
    )
    raise_all(CheckpointError, problems, what=f"problems in the header of {escape_name(path)}")
    return HeaderColumns(  # no problem: every entry is sound
        names,
        dtypes,
        list(map(tuple, shapes)),
        list(map(operator.add, begins, itertools.repeat(data_start))),
        want,
    )


def _usual_columns(
    path: Path, header: dict[str, Any], data_start: int, data_len: int
) -> HeaderColumns | None:
    """:func:`header_columns` of a parsed header that breaks no rule, in bulk; None for any other
    (which header_columns then reads rule by rule and words): an object of exactly ``dtype``,
    ``shape`` and ``data_offsets`` (of exact types: a Twice or a bool is not), no header problem,
    and :func:`_usual`'s rules."""
    names, raw = list(header), list(header.values())  # copied whole: no lookup a name
    if "__metadata__" in header:
        at = names.index("__metadata__")
        del names[at], raw[at]
    n = len(names)
    if not n or set(map(type, raw)) != {dict} or set(map(len, raw)) != {3}:
        return None
    # JSON values, as the rules below type them (dict.get: no call made a row)
    dtypes: list[Any] = list(map(dict.get, raw, itertools.repeat("dtype")))
    shapes: list[Any] = list(map(dict.get, raw, itertools.repeat("shape")))
    offsets: list[Any] = list(map(dict.get, raw, itertools.repeat("data_offsets")))
    if set(map(type, shapes)) != {list} or set(map(type, offsets)) != {list}:
        return None
    if set(map(type, dtypes)) != {str} or set(map(len, offsets)) != {2}:
        return None
    flat = list(itertools.chain.from_iterable(shapes))
    pair = list(itertools.chain.from_iterable(offsets))
    if not set(map(type, pair)) <= {int} or not set(map(type, flat)) <= {int}:
        return None
    if header_problems(path, header, names):
        return None
    try:  # every value an int: one beyond int64 is refused (a crafted header), rule by rule
        dims = np.array(flat, np.int64)
        ends = np.array(pair, np.int64).reshape(n, 2)
    except OverflowError:
        return None
    return _usual(path, names, dtypes, shapes, dims, ends[:, 0], ends[:, 1], data_start, data_len)


def _usual(
    path: Path,
    names: list[str],
    dtypes: list[str],
    shapes: Sequence[Sequence[int]],
    dims: np.ndarray,
    begins: np.ndarray,
    stops: np.ndarray,
    data_start: int,
    data_len: int,
) -> HeaderColumns | None:
    """A header's columns (``dims``: its shapes' values, flattened) as :class:`HeaderColumns` when
    its entries break no rule; None otherwise. Each rule below is the one :func:`header_columns`
    writes, asked of the whole column at once: a dtype of whole bytes, at most 8 dimensions each
    in 0 .. 2**48 - 1, sizes that fit (checked as floats first, so the exact int64 products cannot
    overflow), offsets [begin, end] with 0 <= begin <= end <= the data, spanning dtype x shape; the
    data covered back to back."""
    n = len(names)
    if not set(dtypes) <= _HEADER_ITEMSIZE.keys():
        return None
    lens = np.fromiter(map(len, shapes), np.int64, n)
    if int(lens.max()) > 8:
        return None
    if len(dims) and (int(dims.min()) < 0 or int(dims.max()) >= MAX_DIM):
        return None
    itemsize = np.fromiter(map(_HEADER_ITEMSIZE.__getitem__, dtypes), np.int64, n)
    padded: np.ndarray = np.ones((n, 8), np.int64)  # each shape, padded with ones to 8 dimensions
    padded[
        np.repeat(np.arange(n), lens), np.arange(len(dims)) - np.repeat(lens.cumsum() - lens, lens)
    ] = dims
    # each size as a float first: the exact int64 products only where they are well below 2**63
    if float((padded.astype(np.float64).prod(axis=1) * itemsize).max()) >= 2.0**60:
        return None  # near the limits: the rule by rule reading decides
    numel = padded.prod(axis=1)
    if not numel.all():
        return None  # a tensor of no elements: its leading dimensions are checked rule by rule
    want = numel * itemsize
    if (
        (begins < 0).any()
        or (begins > stops).any()
        or (stops > data_len).any()
        or (stops - begins != want).any()
    ):
        return None
    if coverage_problems(path, names, begins, stops, data_len, complete=True):
        return None
    return HeaderColumns(
        names, dtypes, list(map(tuple, shapes)), (begins + data_start).tolist(), want.tolist()
    )


def _objects(raw: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Which entries are objects, and which of those name none of their fields twice (serde
    refuses a struct's field given twice; a field it ignores may be, the last kept)."""
    is_obj = _is(raw, dict)
    single: np.ndarray = np.ones(len(raw), bool)
    for i in np.flatnonzero(~is_obj).tolist():  # a Twice, from a header read with the hook
        if type(raw[i]) is Twice:
            is_obj[i], single[i] = True, not _FIELDS.intersection(raw[i].twice)
    return is_obj, single


def _fits(shapes: list[Any], numel: list[int], nbytes: list[int]) -> np.ndarray:
    """Whether each shape's size is one safetensors computes without overflow (its bytes' bits
    below 2**64, each product checked as it goes) and torch can hold (the product of the
    dimensions before a zero below 2**63): ``[2**40, 2**40, 0]`` overflows both,
    ``[0, 2**40, 2**40]`` neither."""
    n = len(shapes)
    if not n or (min(numel) > 0 and max(nbytes) < _MAX_BYTES):  # the usual column: no empty one
        return np.ones(n, bool)
    result: np.ndarray = np.fromiter(map(_fits_one, shapes, numel, nbytes), bool, n)
    return result


def _fits_one(shape: list[int], numel: int, nbytes: int) -> bool:
    if numel:  # every running product is at most numel, below 2**61
        return nbytes < _MAX_BYTES
    return math.prod(shape[: shape.index(0)]) < _MAX_RUN  # the products grow up to the zero


def _ignored_fields(objs: list[Any]) -> dict[int, str]:
    """{entry: why} for each entry with a field safetensors ignores but serde_json refuses to read
    (nested past its depth, a number beyond a double, a lone surrogate); only entries with more
    than the three fields can have one that matters."""
    out = {}
    for i in np.flatnonzero(np.fromiter(map(len, objs), np.int64, len(objs)) > 3).tolist():
        for key, value in objs[i].items():
            if key in _FIELDS:
                continue
            why = (
                "is not Unicode (a lone surrogate escape)"
                if lone_surrogate(key)
                else ignored_value_problem(value, 2)  # inside the header and the entry
            )
            if why:
                out[i] = f"field {escape_name(repr(key))[:60]} {why}"
                break
    return out


def header_problems(path: Path, header: dict[str, Any], names: list[str]) -> list[str]:
    """The header's rules beyond its entries: no name given twice (safetensors keeps the last;
    tpload refuses a name that two readers could take for different tensors), ``__metadata__``
    absent, null or a map of strings to strings (once), and every name and string Unicode."""
    where = escape_name(path)
    problems = []
    for key in header.twice if type(header) is Twice else ():
        problems.append(
            f"{where}: __metadata__ is given twice"
            if key == "__metadata__"
            else f"{where}: tensor {escape_name(key)}: the name is given twice in the header "
            "(safetensors keeps the last; refused: two readers could take different tensors)"
        )
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and set(map(type, meta.values())) <= {str}):
        problems.append(
            f"{where}: __metadata__ {escape_name(repr(meta))[:60]} is not a map of strings to "
            "strings"
        )
    elif meta and any(map(lone_surrogate, itertools.chain(meta, meta.values()))):
        problems.append(f"{where}: __metadata__ holds a lone surrogate escape (not Unicode)")
    if lone_surrogate("".join(names)):
        problems += [
            f"{where}: tensor {escape_name(name)}: the name holds a lone surrogate escape "
            "(not Unicode)"
            for name in names
            if lone_surrogate(name)
        ]
    return problems


def coverage_problems(
    path: Path,
    names: list[str],
    begins: np.ndarray,
    ends: np.ndarray,
    data_len: int,
    *,
    complete: bool,
) -> list[str]:
    """safetensors' rule for the data section (offsets relative to it): the tensors, in order of
    (first byte, end), cover it back to back from its first byte to the end of the file. Each
    tensor starts where the ones before it end: earlier is an overlap (a zero-byte tensor inside
    another's range included), later a gap; and the last ends at the end of the file (a header
    length a byte short leaves the data a byte longer). Each problem is worded against the tensor
    that reaches furthest before it; gaps and the end only when every entry's offsets are here
    (``complete``): a refused entry may fill them."""
    order = np.lexsort((ends, begins))
    starts = np.concatenate(([0], ends[order][:-1]))
    last = int(ends.max()) if len(ends) else 0
    if (begins[order] == starts).all() and (last == data_len or not complete):
        return []  # the usual header
    where = escape_name(path)
    spans = sorted(zip(begins.tolist(), ends.tolist(), names, strict=True))  # ties: by name
    problems, reach = [], (0, 0, "")  # the span that ends last so far
    for b, e, name in spans:
        b0, e0, n0 = reach
        if b < e0:
            problems.append(
                f"{where}: tensors {escape_name(n0)} and {escape_name(name)} overlap "
                f"(bytes {b0}..{e0} and {b}..)"
            )
        elif b > e0 and complete:
            after = f"after tensor {escape_name(n0)}" if n0 else "before the first tensor"
            problems.append(
                f"{where}: bytes {e0}..{b} of the data belong to no tensor ({after}): safetensors "
                "requires the tensors to cover the data back to back"
            )
        if e > e0 or not n0:
            reach = (b, e, name)
    if complete and last < data_len:
        after = f"after the last, {escape_name(reach[2])}" if names else "the header has none"
        problems.append(
            f"{where}: bytes {last}..{data_len} of the data belong to no tensor ({after}): the "
            f"file runs {_bytes(data_len - last)} past its tensors, or its header length is short"
        )
    return problems


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def _dims_ok(dims: list[Any]) -> np.ndarray:
    """Whether each value of a flattened column of shapes is a dimension: an int (not a bool) in
    0 .. 2**48 - 1."""
    dims = _where(_is(dims, int), dims, -1)
    if not dims or (min(dims) >= 0 and max(dims) < MAX_DIM):  # the usual column: all of them
        return np.ones(len(dims), bool)
    result: np.ndarray = np.fromiter(map(_dim_ok, dims), bool, len(dims))
    return result


def _bad_per_row(ok: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """How many of each row's values fail, for a flattened column (``lens``: each row's length)."""
    failed = np.concatenate(([0], np.cumsum(~ok)))
    ends = np.cumsum(lens)
    result: np.ndarray = failed[ends] - failed[ends - lens]
    return result


def _dim_ok(d: int) -> bool:
    return 0 <= d < MAX_DIM


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _problem(
    path: Path, name: str, meta: Any, data_len: int, passed: list[bool], ignored: str | None
) -> str:
    """The words for an entry's first broken rule (``passed``: each rule of :func:`entries`, in
    order; ``ignored``: why a field safetensors ignores cannot be read)."""
    where = f"{escape_name(path)}: tensor {escape_name(name)}"
    is_obj, single, dtype_ok, shape_ok, fits, offsets_ok, ordered, inside, spans, _ = passed
    if not is_obj:
        return f"{where}: header entry is not an object"
    if not single:
        twice = ", ".join(sorted(_FIELDS.intersection(meta.twice)))
        return f"{where}: field {twice} is given twice in the entry"
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not dtype_ok:
        why = (
            "a safetensors dtype tpload refuses: complex, or narrower than a byte"
            if isinstance(dtype, str) and dtype in _REFUSED_DTYPES
            else "not a safetensors dtype of whole bytes"
        )
        return f"{where}: dtype {escape_name(repr(dtype))[:60]} is not served ({why})"
    if not shape_ok:
        return (
            f"{where}: shape {escape_name(repr(shape))[:80]} is not a list of non-negative "
            "integers (at most 8, each below 2**48)"
        )
    if not fits:
        return (
            f"{where}: shape {shape} overflows: its bytes' bits reach 2**64, or the dimensions "
            "before a zero multiply to 2**63 or more"
        )
    if not offsets_ok:
        return f"{where}: data_offsets {escape_name(repr(offsets))[:80]} is not [begin, end]"
    begin, end = offsets
    if not ordered:
        return f"{where}: data_offsets {offsets} are not ordered"
    if not inside:
        return f"{where}: data_offsets end {end} runs past the data ({data_len} bytes)"
    if not spans:
        want = math.prod(shape) * ITEMSIZE[dtype]
        return f"{where}: data_offsets span {end - begin} bytes but {dtype} x {shape} is {want}"
    return f"{where}: {ignored}"


_FIELD_SET = {
    f: c.__dict__[f].__set__
    for c, fields in (
        (TensorMeta, ("name", "file", "dtype", "shape", "nbytes", "rows", "row_bytes")),
        (TensorInfo, ("path", "begin")),
    )
    for f in fields
}
"""Each slot's own setter: a row's TensorInfo made without the frozen class's ``__setattr__`` (a
Python frame a field: half the cost of a record)."""
(
    _SET_NAME,
    _SET_FILE,
    _SET_DTYPE,
    _SET_SHAPE,
    _SET_PATH,
    _SET_BEGIN,
    _SET_NBYTES,
    _SET_ROWS,
    _SET_ROW_BYTES,
) = map(
    _FIELD_SET.__getitem__,
    ("name", "file", "dtype", "shape", "path", "begin", "nbytes", "rows", "row_bytes"),
)


def table_of(files: Sequence[str], columns: Sequence[HeaderColumns]) -> TensorTable:
    """The shards' columns (``columns[i]`` of ``files[i]``) joined into one table, file by file in
    header order (no name -> object dict: the table's index is the names')."""
    names = list(itertools.chain.from_iterable(c.names for c in columns))
    n = len(names)
    counts = [len(c.names) for c in columns]
    dtypes = list(itertools.chain.from_iterable(c.dtypes for c in columns))
    vocab = {d: k for k, d in enumerate(dict.fromkeys(dtypes))}
    shapes = list(itertools.chain.from_iterable(c.shapes for c in columns))
    ndim = np.fromiter(map(len, shapes), np.int64, n)
    flat = np.fromiter(itertools.chain.from_iterable(shapes), np.int64, int(ndim.sum()))
    shape: np.ndarray = np.zeros((n, 8), np.int64)
    starts: np.ndarray = np.repeat(np.cumsum(ndim) - ndim, ndim)  # each value's row's first value
    shape[np.repeat(np.arange(n), ndim), np.arange(len(flat)) - starts] = flat
    return TensorTable(
        names,
        files=list(files),
        file_id=np.repeat(np.arange(len(files), dtype=np.int32), counts),
        dtypes=list(vocab),
        dtype_code=np.fromiter(map(vocab.__getitem__, dtypes), np.int16, n),
        shape=shape,
        ndim=ndim.astype(np.int8),
        begin=np.fromiter(itertools.chain.from_iterable(c.begins for c in columns), np.int64, n),
        nbytes=np.fromiter(itertools.chain.from_iterable(c.nbytes for c in columns), np.int64, n),
        shapes=shapes,
    )


class TableRows(RowTable[TensorInfo]):
    """A table's rows as {name: TensorInfo}, each made when asked for and kept by nobody (a
    catalogue of 92,000 tensors holds the table's columns, not 92,000 objects); the columns the
    records are made from as Python lists, read once from the table."""

    def __init__(self, table: TensorTable, paths: Sequence[Path]) -> None:
        super().__init__()
        self._row, self.table = table.row, table
        self._paths: list[Path] = list(paths)
        """Each file's absolute path, by file id."""
        self._fid: list[int] = table.file_id.tolist()
        self._dtype: list[str] = list(map(table.dtypes.__getitem__, table.dtype_code.tolist()))
        self._shape = table.shapes
        self._begin: list[int] = table.begin.tolist()
        self._nbytes: list[int] = table.nbytes.tolist()

    def _record(self, name: str, k: int) -> TensorInfo:
        row = _new(TableRow)
        _SET_VIEW(row, self)
        _SET_K(row, k)
        return row

    def view_of(self, k: int) -> tuple[int, int]:
        """Row ``k``'s 2-D byte view (rows, row bytes): a 0-D or 1-D tensor is one row (from the
        shape and byte count, not a column of their own: less for a load to hold)."""
        shape, nbytes = self._shape[k], self._nbytes[k]
        rows = shape[0] if len(shape) > 1 else 1
        return rows, nbytes // rows if rows else 0

    def stored(self, name: str, sha256: str | None) -> Stored:
        """Where ``name``'s bytes are (a tuple made in C), read from the columns."""
        k = self._row[name]
        return Stored(name, self._paths[self._fid[k]], self._begin[k], *self.view_of(k), sha256)

    def paths(self) -> list[Path]:
        """The files that hold a tensor, sorted."""
        return sorted({self._paths[i] for i in np.unique(self.table.file_id).tolist()})

    def in_file(self, path: Path) -> list[TensorInfo]:
        """The tensors of one file, in order of their first byte."""
        ids = [i for i, p in enumerate(self._paths) if p == path]
        rows = np.flatnonzero(np.isin(self.table.file_id, ids))
        rows = rows[np.argsort(self.table.begin[rows], kind="stable")]
        names = self.table.names
        return [self._record(names[k], k) for k in rows.tolist()]


class TableRow(TensorInfo):
    """One row of a :class:`TableRows` as a TensorInfo: two slots (the view and the row), each
    field read from the view's columns when asked for (made in a third of a full record's time:
    a load asks for ~3 a tensor, most of them for one field). Equal to, and hashed as, the
    TensorInfo of the same fields."""

    __slots__ = ("_view", "_k")
    _view: TableRows
    _k: int

    @property
    def name(self) -> str:
        return self._view.table.names[self._k]

    @property
    def file(self) -> str:
        v = self._view
        return v.table.files[v._fid[self._k]]

    @property
    def dtype(self) -> str:
        return self._view._dtype[self._k]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._view._shape[self._k]

    @property
    def path(self) -> Path:
        v = self._view
        return v._paths[v._fid[self._k]]

    @property
    def begin(self) -> int:
        return self._view._begin[self._k]

    @property
    def nbytes(self) -> int:
        return self._view._nbytes[self._k]

    @property
    def rows(self) -> int:
        return self._view.view_of(self._k)[0]

    @property
    def row_bytes(self) -> int:
        return self._view.view_of(self._k)[1]

    def _fields(self) -> TensorInfo:
        return TensorInfo(self.name, self.file, self.dtype, self.shape, self.path, self.begin)

    def __repr__(self) -> str:
        return repr(self._fields())

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled as the plain TensorInfo of its fields (the view stays behind)."""
        return self._fields().__reduce__()


_SET_VIEW, _SET_K = TableRow.__dict__["_view"].__set__, TableRow.__dict__["_k"].__set__


def rows_of(path: Path, file: str, columns: HeaderColumns) -> TableRows:
    """One shard's columns as {name: TensorInfo}."""
    return TableRows(table_of([file], [columns]), [path])


def write_safetensors(
    path: Path,
    tensors: list[tuple[str, str, tuple[int, ...]]],
    chunks: Callable[[str], Iterable[np.ndarray]],
    metadata: dict[str, str],
    progress: ProgressSink | None = None,
) -> dict[str, str]:
    """Write a safetensors file one chunk at a time; return {name: sha256 of its stored bytes}.
    ``progress`` is told of each tensor once written (a command's; the caller closes it).

    ``tensors`` gives (name, dtype, shape) in file order and ``chunks(name)`` the
    tensor's stored bytes in order, so memory stays bounded whatever the sizes
    (the safetensors library wants every tensor whole in memory at once). The
    file appears under its name only once complete (written beside it, renamed).
    """
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-aligned, as safetensors writes it
    digests = {}
    with atomic_file(path) as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, dtype, shape in tensors:
            h = hashlib.sha256()
            for chunk in chunks(name):
                data = memoryview(np.ascontiguousarray(chunk)).cast("B")
                h.update(data)
                f.write(data)
            digests[name] = h.hexdigest()
            if progress is not None:
                progress.update(math.prod(shape) * ITEMSIZE[dtype])
    return digests


def overlaps(path: Path, infos: Iterable[TensorInfo], data_start: int) -> list[str]:
    """:func:`overlap_problems` of tensors as TensorInfos (a GGUF header's)."""
    infos = list(infos)
    return overlap_problems(
        path,
        [i.name for i in infos],
        np.fromiter((i.begin for i in infos), np.int64, len(infos)),
        np.fromiter((i.nbytes for i in infos), np.int64, len(infos)),
        data_start,
    )


def overlap_problems(
    path: Path, names: list[str], begins: np.ndarray, sizes: np.ndarray, data_start: int
) -> list[str]:
    """Each pair of tensors whose stored bytes overlap (a crafted header: two names for one range
    would let one tensor's check vouch for another's bytes), as offsets into the data section:
    tensors with bytes in order of (first byte, end, name), each against the next. One rule for
    every container format (safetensors headers, GGUF headers); the columns are sorted in C, names
    only to word a pair found."""
    ends = begins + sizes
    keep = np.flatnonzero(sizes > 0)
    order = keep[np.lexsort((ends[keep], begins[keep]))]
    if not (begins[order[1:]] < ends[order[:-1]]).any():
        return []
    spans = sorted((int(begins[i]), int(ends[i]), names[i]) for i in keep.tolist())
    return [
        f"{escape_name(path)}: tensors {escape_name(n0)} and {escape_name(n1)} overlap "
        f"(bytes {b0 - data_start}..{e0 - data_start} and {b1 - data_start}..)"
        for (b0, e0, n0), (b1, _, n1) in zip(spans, spans[1:], strict=False)
        if b1 < e0
    ]
