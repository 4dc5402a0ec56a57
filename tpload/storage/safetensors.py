"""The safetensors layout: validated header parsing, and a streaming writer.

A shard is an 8-byte little-endian header length, a JSON header giving each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (relative to the data),
then the data. Every problem in a header is collected and raised at once.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import math
import operator
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CheckpointError, raise_all
from ..text import escape_name
from .files import atomic_file, open_regular, parse_json, read_exact

if TYPE_CHECKING:  # annotations only: the storage layer imports nothing of the report's
    from ..report.progress import ProgressSink

_new = object.__new__
_set = object.__setattr__
MAX_HEADER_BYTES = 256 << 20  # a header larger than this is corrupt, not big
MAX_DIM = (
    1 << 48
)  # a dimension this long is corrupt (the manifest's bound); it keeps every product printable

# Every safetensors dtype of whole bytes, with its size. Whether tpload *serves* a dtype is the
# codecs' business: an unserved tensor can still be skipped or deferred by a rule.
ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_HEADER_ITEMSIZE = dict(ITEMSIZE)  # what a safetensors header may say (GGUF's types below are not)
# GGUF's block-quantised types, seen as bytes: a tensor of them has the shape [..., rows, row bytes]
# (storage/gguf.py); the dtype keeps the type, so manifests and plans tell Q4_K from Q6_K.
ITEMSIZE.update({t: 1 for t in ("Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")})


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """One stored tensor as a header names it, and as the planner sees it.

    Slotted: a catalogue holds one a tensor for the whole load, and an instance without a
    ``__dict__`` is one object for the collector to walk, not two."""

    name: str
    file: str
    """Shard file name, relative to the checkpoint directory (for messages)."""
    dtype: str
    """Stored dtype, safetensors spelling."""
    shape: tuple[int, ...]
    nbytes: int = field(init=False, repr=False, compare=False)
    rows: int = field(init=False, repr=False, compare=False)
    """Rows of the 2-D byte view ``[rows, row_bytes]`` (a 0-D or 1-D tensor is one row)."""
    row_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nbytes = math.prod(self.shape) * ITEMSIZE[self.dtype]
        rows = self.shape[0] if len(self.shape) > 1 else 1
        _set(self, "nbytes", nbytes)
        _set(self, "rows", rows)
        _set(self, "row_bytes", nbytes // rows if rows else 0)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def __eq__(self, other: object) -> bool:
        """The same tensor as the planner sees it: a TensorInfo equals the TensorMeta of its four
        fields (the catalogue holds TensorInfos; a pre-partitioned export's holds TensorMetas)."""
        if not isinstance(other, TensorMeta):
            return NotImplemented
        return (self.name, self.file, self.dtype, self.shape) == (
            other.name,
            other.file,
            other.dtype,
            other.shape,
        )

    def describe(self) -> str:
        return (
            f"{escape_name(self.name)} ({escape_name(self.file)}, {self.dtype} {list(self.shape)})"
        )


@dataclass(frozen=True, eq=False, slots=True)
class TensorInfo(TensorMeta):
    """A tensor and where its bytes are in its shard (equal to any TensorMeta of the same
    tensor)."""

    path: Path
    """Absolute path of the shard (symlinks not resolved: HF caches link blobs)."""
    begin: int
    """Absolute byte offset of the first data byte in the shard file."""


def read_header(path: Path, file: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate one shard's header: ({name: TensorInfo}, its ``__metadata__``).

    Every problem is collected and raised at once: bad JSON, a length past the
    file, unknown dtypes, offsets that overlap, run past the end or disagree
    with dtype x shape.
    """
    fd = open_regular(path, "shard")
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise CheckpointError(
                f"{escape_name(path)}: {size} bytes, too short for a safetensors header length"
            )
        (hlen,) = struct.unpack("<Q", read_exact(fd, 0, 8, path, "shard"))
        if hlen > MAX_HEADER_BYTES or 8 + hlen > size:
            raise CheckpointError(
                f"{escape_name(path)}: header length {hlen} runs past the file ({size} bytes)"
            )
        raw = read_exact(fd, 8, hlen, path, "shard header")
    finally:
        os.close(fd)
    header = parse_json(raw, path, "header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{escape_name(path)}: header is not a JSON object")
    data_start, data_len = 8 + hlen, size - 8 - hlen
    meta = header.get("__metadata__", {})
    infos = entries(path, file, header, data_start, data_len)
    return infos, {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


_NOTHING: dict = {}
_DTYPE, _SHAPE, _OFFSETS = (
    operator.methodcaller("get", k) for k in ("dtype", "shape", "data_offsets")
)


def _is(values: list, kind: type) -> np.ndarray:
    """Whether each value's type is exactly ``kind`` (bool is not int), as a mask made in C."""
    if set(map(type, values)) <= {kind}:  # the usual column: one type throughout
        return np.ones(len(values), bool)
    return np.fromiter(
        map(operator.is_, map(type, values), itertools.repeat(kind)), bool, len(values)
    )


def _where(mask: np.ndarray, values: list, other: object) -> list:
    """``values`` with ``other`` wherever ``mask`` is False (so the next rule can read them all)."""
    if mask.all():
        return values
    return [v if ok else other for v, ok in zip(values, mask.tolist(), strict=True)]


def entries(
    path: Path, file: str, header: dict, data_start: int, data_len: int
) -> dict[str, TensorInfo]:
    """Every entry of a parsed header as a TensorInfo (sizes filled in), or every problem raised
    at once.

    Each rule is one pass over a column of the header (a checkpoint has 92,000 entries), and an
    entry is worded by the first rule it breaks: an object, a dtype of whole bytes, a shape of at
    most 8 non-negative integers below 2**48, ``data_offsets`` [begin, end] in order, inside the
    data and spanning dtype x shape; then no two tensors' bytes overlap."""
    names = [n for n in header if n != "__metadata__"]
    n = len(names)
    raw = list(map(header.__getitem__, names))
    is_obj = _is(raw, dict)
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
    # Python ints until each is known to fit: a hostile header may hold any integer
    want = list(map(operator.mul, map(math.prod, _where(shape_ok, shapes, [0])), itemsize.tolist()))
    ordered = np.fromiter(map(operator.le, map(abs, begins), begins), bool, n) & np.fromiter(
        map(operator.le, begins, stops), bool, n
    )
    inside = np.fromiter(map(operator.le, stops, itertools.repeat(data_len)), bool, n)
    spans = np.fromiter(map(operator.eq, map(operator.sub, stops, begins), want), bool, n)
    rules = (is_obj, itemsize > 0, shape_ok, offsets_ok, ordered, inside, spans)
    sound = np.logical_and.reduce(rules) if n else np.zeros(0, bool)
    problems = [
        _problem(path, names[i], raw[i], data_len, [bool(r[i]) for r in rules])
        for i in np.flatnonzero(~sound).tolist()
    ]
    good = np.flatnonzero(sound).tolist()  # their offsets and sizes are inside the data: int64s
    at = np.fromiter(map(begins.__getitem__, good), np.int64, len(good))
    size = np.fromiter(map(want.__getitem__, good), np.int64, len(good))
    good_names = list(map(names.__getitem__, good))
    problems += overlap_problems(path, good_names, at, size, 0)
    raise_all(CheckpointError, problems, what=f"problems in the header of {escape_name(path)}")
    good_shapes = list(map(tuple, map(shapes.__getitem__, good)))
    rows = [s[0] if len(s) > 1 else 1 for s in good_shapes]  # the sizes a plan asks for, known here
    sizes = size.tolist()
    columns = {
        "name": good_names,
        "file": itertools.repeat(file),
        "dtype": list(map(dtypes.__getitem__, good)),
        "shape": good_shapes,
        "path": itertools.repeat(path),
        "begin": (at + data_start).tolist(),
        "nbytes": sizes,
        "rows": rows,
        "row_bytes": [b // r if r else 0 for b, r in zip(sizes, rows, strict=True)],
    }
    return dict(
        zip(good_names, frozen_instances(TensorInfo, columns, len(good_names)), strict=True)
    )


def _dims_ok(dims: list) -> np.ndarray:
    """Whether each value of a flattened column of shapes is a dimension: an int (not a bool) in
    0 .. 2**48 - 1."""
    dims = _where(_is(dims, int), dims, -1)
    if not dims or (min(dims) >= 0 and max(dims) < MAX_DIM):  # the usual column: all of them
        return np.ones(len(dims), bool)
    return np.fromiter(map(_dim_ok, dims), bool, len(dims))


def _bad_per_row(ok: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """How many of each row's values fail, for a flattened column (``lens``: each row's length)."""
    failed = np.concatenate(([0], np.cumsum(~ok)))
    ends = np.cumsum(lens)
    return failed[ends] - failed[ends - lens]


def _dim_ok(d: int) -> bool:
    return 0 <= d < MAX_DIM


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def frozen_instances(cls: type, columns: dict[str, Iterable], n: int) -> list:
    """``n`` instances of the frozen dataclass ``cls``, the i-th given the i-th value of each
    column (its fields, and cached properties already known), made in C: ``map`` over whole
    columns, no Python frame per instance (its ``__init__`` sets each frozen field through
    ``object.__setattr__`` in Python: for 92,000 tensors, most of the time of opening a
    checkpoint)."""
    made = list(map(_new, itertools.repeat(cls, n)))
    for key, column in columns.items():
        collections.deque(map(_set, made, itertools.repeat(key), column), maxlen=0)
    return made


def _problem(path: Path, name: str, meta: object, data_len: int, passed: list[bool]) -> str:
    """The words for an entry's first broken rule (``passed``: each rule of :func:`entries`, in
    order)."""
    where = f"{escape_name(path)}: tensor {escape_name(name)}"
    is_obj, dtype_ok, shape_ok, offsets_ok, ordered, inside, _ = passed
    if not is_obj:
        return f"{where}: header entry is not an object"
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not dtype_ok:
        return (
            f"{where}: dtype {escape_name(repr(dtype))[:60]} is not served (not a safetensors "
            "dtype of whole bytes)"
        )
    if not shape_ok:
        return (
            f"{where}: shape {escape_name(repr(shape))[:80]} is not a list of non-negative "
            "integers (at most 8, each below 2**48)"
        )
    if not offsets_ok:
        return f"{where}: data_offsets {escape_name(repr(offsets))[:80]} is not [begin, end]"
    begin, end = offsets
    if not ordered:
        return f"{where}: data_offsets {offsets} are not ordered"
    if not inside:
        return f"{where}: data_offsets end {end} runs past the data ({data_len} bytes)"
    want = math.prod(shape) * ITEMSIZE[dtype]
    return f"{where}: data_offsets span {end - begin} bytes but {dtype} x {shape} is {want}"


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
