"""The safetensors layout: validated header parsing, and a streaming writer.

A shard is an 8-byte little-endian header length, a JSON header giving each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (relative to the data),
then the data. Every problem in a header is collected and raised at once.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import json
import math
import operator
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, raise_all
from ..text import escape_name
from .files import atomic_file, open_regular, parse_json, read_exact

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


@dataclass(frozen=True)
class TensorMeta:
    """One stored tensor as a header names it, and as the planner sees it."""

    name: str
    file: str
    """Shard file name, relative to the checkpoint directory (for messages)."""
    dtype: str
    """Stored dtype, safetensors spelling."""
    shape: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @functools.cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @functools.cached_property
    def rows(self) -> int:
        """Rows of the 2-D byte view ``[rows, row_bytes]`` (a 0-D or 1-D tensor is one row)."""
        return self.shape[0] if len(self.shape) > 1 else 1

    @functools.cached_property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows if self.rows else 0

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


@dataclass(frozen=True, eq=False)
class TensorInfo(TensorMeta):
    """A tensor and where its bytes are in its shard (equal to any TensorMeta of the same tensor)."""

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
    infos = _sound_entries(path, file, header, data_start, data_len)
    if (
        infos is None
    ):  # something is wrong: the entry by entry pass below says what, every problem at once
        infos = _checked_entries(path, file, header, data_start, data_len)
    return infos, {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def _checked_entries(
    path: Path, file: str, header: dict, data_start: int, data_len: int
) -> dict[str, TensorInfo]:
    """Every entry checked one by one, every problem raised at once (the message-making pass)."""
    problems: list[str] = []
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        info = _entry(path, file, name, entry, data_start, data_len, problems)
        if info is not None:
            infos[name] = info
    problems += overlaps(path, infos.values(), data_start)
    raise_all(CheckpointError, problems, what=f"problems in the header of {escape_name(path)}")
    return infos


_FIELDS = operator.itemgetter("dtype", "shape", "data_offsets")
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _sound_entries(
    path: Path, file: str, header: dict, data_start: int, data_len: int
) -> dict[str, TensorInfo] | None:
    """Every entry as a TensorInfo when the whole header is sound, else None (nothing said: the
    checked pass finds and words the problems).

    The same checks as :func:`_entry` and the overlap test, each run over whole columns in C
    (``map``, ``min``, ``set``) instead of entry by entry: a checkpoint has 92,000 entries."""
    names = [n for n in header if n != "__metadata__"]
    entries = list(map(header.__getitem__, names))
    if not entries:
        return {}
    if set(map(type, entries)) != {dict}:
        return None
    try:
        dtypes, shapes, offsets = zip(*map(_FIELDS, entries))
        itemsizes = list(
            map(_HEADER_ITEMSIZE.get, dtypes)
        )  # a non-string dtype gets None (or TypeError: a list)
    except (KeyError, TypeError):
        return None
    if None in itemsizes or set(map(type, dtypes)) != {str}:
        return None
    dims = list(itertools.chain.from_iterable(shapes)) if set(map(type, shapes)) == {list} else None
    if (
        dims is None
        or max(map(len, shapes)) > 8
        or not set(map(type, dims)) <= {int}
        or (dims and not (min(dims) >= 0 and max(dims) < MAX_DIM))
    ):
        return None
    if (
        set(map(type, offsets)) != {list}
        or set(map(len, offsets)) != {2}
        or set(map(type, itertools.chain.from_iterable(offsets))) != {int}
    ):
        return None
    begins, ends = list(map(_FIRST, offsets)), list(map(_SECOND, offsets))
    sizes = list(map(operator.mul, map(math.prod, shapes), itemsizes))
    if (
        min(begins) < 0
        or max(ends) > data_len
        or not all(map(operator.le, begins, ends))
        or list(map(operator.sub, ends, begins)) != sizes
    ):
        return None
    spans = sorted(
        itertools.compress(zip(begins, ends), sizes)
    )  # tensors with bytes, by first byte
    if any(map(operator.lt, map(_FIRST, spans[1:]), map(_SECOND, spans))):  # one overlaps the next
        return None
    shapes = list(map(tuple, shapes))
    rows = [
        shape[0] if len(shape) > 1 else 1 for shape in shapes
    ]  # the sizes a plan asks for, known here
    columns = {
        "name": names,
        "file": itertools.repeat(file),
        "dtype": dtypes,
        "shape": shapes,
        "path": itertools.repeat(path),
        "begin": map(operator.add, itertools.repeat(data_start), begins),
        "nbytes": sizes,
        "rows": rows,
        "row_bytes": [n // r if r else 0 for n, r in zip(sizes, rows)],
    }
    return dict(zip(names, frozen_instances(TensorInfo, columns, len(names))))


_new = object.__new__
_set = object.__setattr__


def frozen_instances(cls: type, columns: dict[str, Iterable], n: int) -> list:
    """``n`` instances of the frozen dataclass ``cls``, the i-th given the i-th value of each column
    (its fields, and cached properties already known), made in C: ``map`` over whole columns, no
    Python frame per instance (its ``__init__`` sets each frozen field through ``object.__setattr__``
    in Python: for 92,000 tensors, most of the time of opening a checkpoint)."""
    made = list(map(_new, itertools.repeat(cls, n)))
    for key, column in columns.items():
        collections.deque(map(_set, made, itertools.repeat(key), column), maxlen=0)
    return made


def _info(
    name: str, file: str, dtype: str, shape: tuple[int, ...], path: Path, begin: int, nbytes: int
) -> TensorInfo:
    """A TensorInfo of a checked entry, with the sizes a plan asks for filled in."""
    info = TensorInfo(name, file, dtype, shape, path, begin)
    rows = shape[0] if len(shape) > 1 else 1
    info.__dict__.update(nbytes=nbytes, rows=rows, row_bytes=nbytes // rows if rows else 0)
    return info


def _entry(
    path: Path,
    file: str,
    name: str,
    meta: object,
    data_start: int,
    data_len: int,
    problems: list[str],
) -> TensorInfo | None:
    """One header entry checked, as a TensorInfo with its sizes filled in; or its problem filed.
    (Run for every tensor of a checkpoint, 92,000 of them: the message is made only for a problem.)"""
    if isinstance(meta, dict):
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        itemsize = _HEADER_ITEMSIZE.get(dtype) if isinstance(dtype, str) else None
        if (
            itemsize is not None
            and type(shape) is list
            and len(shape) <= 8
            and all(type(d) is int and 0 <= d < MAX_DIM for d in shape)
            and type(offsets) is list
            and len(offsets) == 2
            and type(offsets[0]) is int
            and type(offsets[1]) is int
        ):
            begin, end = offsets
            want = math.prod(shape) * itemsize
            if 0 <= begin <= end <= data_len and end - begin == want:
                return _info(name, file, dtype, tuple(shape), path, data_start + begin, want)
    problems.append(_entry_problem(path, name, meta, data_len))
    return None


def _entry_problem(path: Path, name: str, meta: object, data_len: int) -> str:
    where = f"{escape_name(path)}: tensor {escape_name(name)}"
    if not isinstance(meta, dict):
        return f"{where}: header entry is not an object"
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _HEADER_ITEMSIZE:
        return f"{where}: dtype {escape_name(repr(dtype))[:60]} is not served (not a safetensors dtype of whole bytes)"
    if not (
        isinstance(shape, list)
        and len(shape) <= 8
        and all(type(d) is int and 0 <= d < MAX_DIM for d in shape)
    ):
        return (
            f"{where}: shape {escape_name(repr(shape))[:80]} is not a list of non-negative integers "
            "(at most 8, each below 2**48)"
        )
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and type(offsets[0]) is int
        and type(offsets[1]) is int
    ):
        return f"{where}: data_offsets {escape_name(repr(offsets))[:80]} is not [begin, end]"
    begin, end = offsets
    want = math.prod(shape) * ITEMSIZE[dtype]
    if not 0 <= begin <= end:
        return f"{where}: data_offsets {offsets} are not ordered"
    if end > data_len:
        return f"{where}: data_offsets end {end} runs past the data ({data_len} bytes)"
    return f"{where}: data_offsets span {end - begin} bytes but {dtype} x {shape} is {want}"


def write_safetensors(
    path: Path,
    tensors: list[tuple[str, str, tuple[int, ...]]],
    chunks: Callable[[str], Iterable[np.ndarray]],
    metadata: dict[str, str],
) -> dict[str, str]:
    """Write a safetensors file one chunk at a time; return {name: sha256 of its stored bytes}.

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
        for name, _, _ in tensors:
            h = hashlib.sha256()
            for chunk in chunks(name):
                data = memoryview(np.ascontiguousarray(chunk)).cast("B")
                h.update(data)
                f.write(data)
            digests[name] = h.hexdigest()
    return digests


def overlaps(path: Path, infos: Iterable[TensorInfo], data_start: int) -> list[str]:
    """Each pair of tensors whose stored bytes overlap (a crafted header: two names for one range would
    let one tensor's check vouch for another's bytes), as offsets into the data section. One rule for
    every container format (safetensors headers, GGUF headers)."""
    spans = sorted((i.begin, i.begin + i.nbytes, i.name) for i in infos if i.nbytes)
    return [
        f"{escape_name(path)}: tensors {escape_name(n0)} and {escape_name(n1)} overlap "
        f"(bytes {b0 - data_start}..{e0 - data_start} and {b1 - data_start}..)"
        for (b0, e0, n0), (b1, _, n1) in zip(spans, spans[1:])
        if b1 < e0
    ]
