"""GGUF (llama.cpp's format): tpload's own bounded header reader, and finding a file or split set.

A GGUF file is ``GGUF``, a uint32 version (2 or 3 read here), uint64 tensor and key-value counts,
the key-value pairs (typed values: scalars, strings, arrays), one entry per tensor (name, dims
listed **innermost first**, ggml type, offset into the data), padding to ``general.alignment``
(default 32), then the data. Every count, string, array and the header itself is bounded before
anything is allocated for it, and every problem is one line naming the file and the field: the
file is untrusted input, the ``gguf`` package is used only as the independent reference in tests.

How tensors appear to the planner: dims in torch order (outermost first, the reverse of GGUF's
listing); F32/F16/BF16 as those dtypes; a block-quantised type as its own dtype (``Q4_K``, one
byte per element) over its bytes, shape ``[..., rows, row bytes]`` (blocks run along the innermost
dimension, so a row is whole blocks), its shape in weights beside it
(:attr:`GGUFTensorInfo.elements`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..model.errors import CheckpointError, raise_all
from ..model.meta import HeaderFields
from ..model.text import escape_name
from .files import folder_of, open_regular
from .safetensors import TensorInfo, overlaps

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_TENSORS = 1 << 20  # DeepSeek-V3 has about 1,900; a million is corrupt
MAX_KVS = 1 << 16
MAX_STRING = 1 << 24  # chat templates run to tens of KB; 16 MiB is corrupt
MAX_NAME = 1 << 12  # a key or tensor name (llama.cpp's GGML_MAX_NAME is 64)
MAX_ARRAY = 1 << 24  # tokenizer arrays hold ~150,000 entries
MAX_DEPTH = 2  # an array may hold arrays, those may not
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_HEADER = (
    256 << 20
)  # key-values and tensor entries together (a tokenizer of 150,000 tokens: ~10 MB)
MAX_ALIGNMENT = 1 << 16
DEFAULT_ALIGNMENT = 32
KEPT_ARRAY = 4096  # longer arrays are walked (bounded) but kept only as their length
CHUNK = 1 << 20

# ggml types served: (name, weights per block, bytes per block, the planner's dtype).
TYPES: dict[int, tuple[str, int, int, str]] = {
    0: ("F32", 1, 4, "F32"),
    1: ("F16", 1, 2, "F16"),
    30: ("BF16", 1, 2, "BF16"),
    8: ("Q8_0", 32, 34, "Q8_0"),
    10: ("Q2_K", 256, 84, "Q2_K"),
    11: ("Q3_K", 256, 110, "Q3_K"),
    12: ("Q4_K", 256, 144, "Q4_K"),
    13: ("Q5_K", 256, 176, "Q5_K"),
    14: ("Q6_K", 256, 210, "Q6_K"),
}
BLOCK = {name: (per, size) for name, per, size, _ in TYPES.values()}
"""ggml type name -> (weights per block, bytes per block)."""
# Names of the other ggml types, for messages (llama.cpp's ggml.h).
OTHER_TYPES = {
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    9: "Q8_1",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}

# Key-value types: id -> struct format of a scalar (strings 8, arrays 9 apart).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9

HEADERS_ONLY_KEY = "tpload.headers_only"
"""Key of a ``synth --headers-only`` GGUF set: real headers, holes for data (only ``plan`` reads
it)."""

SPLIT_NAME = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")


@dataclass(frozen=True, eq=False, slots=True)
class GGUFTensorInfo(TensorInfo):
    """A GGUF tensor: a TensorInfo (bytes, torch-order shape) plus what the format says of it."""

    ggml_type: str = "F32"
    """ggml type name (``Q4_K``)."""
    elements: tuple[int, ...] = ()
    """Shape in weights, torch order (for quantised types the innermost is ``row bytes / block bytes
    x block weights``)."""


@dataclass
class GGUFHeader:
    """One file's header as read: its version, key-values and tensors."""

    path: Path
    version: int
    alignment: int
    data_start: int
    kv: dict[str, object] = field(default_factory=dict)
    kv_sha256: str = ""
    """The sha256 of the file's bytes from its start through its last key-value pair, as read (what
    the manifest pins: storage/pins.py)."""
    kv_bytes: int = 0
    """How many bytes that is."""
    tensors: dict[str, GGUFTensorInfo] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    """Tensor names in header order."""


class _Cursor:
    """Bounded sequential reads of a file's header through ``pread`` in 1 MiB chunks."""

    def __init__(self, fd: int, path: Path, size: int) -> None:
        self.fd, self.path, self.size = fd, path, size
        self.buf, self.base, self.pos = b"", 0, 0
        self.digest: hashlib._Hash | None = hashlib.sha256()
        """Every byte taken, in order, until :meth:`seal` (the key-value section's pin)."""

    def seal(self) -> str:
        """The sha256 of every byte taken so far (bytes 0 to :attr:`pos`); stops hashing."""
        digest, self.digest = self.digest, None
        if digest is None:  # (sealed once: the key-value section ends once)
            raise self.fail("sealed twice (a bug in tpload)")
        return digest.hexdigest()

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{escape_name(self.path)}: GGUF header: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                f"{what} at byte {self.pos} ({n} bytes) runs past the end of the file "
                f"({self.size} bytes)"
            )
        if self.pos + n > MAX_HEADER:
            raise self.fail(
                f"{what} at byte {self.pos} lies past {MAX_HEADER} bytes, more than any header "
                "needs"
            )
        end = self.pos + n
        if end > self.base + len(self.buf):
            keep = self.buf[self.pos - self.base :]
            want = max(CHUNK, end - self.pos) - len(keep)
            more = os.pread(self.fd, want, self.pos + len(keep))
            self.buf, self.base = keep + more, self.pos
            if end > self.base + len(self.buf):
                raise self.fail(
                    f"{what} at byte {self.pos}: short read (the file changed while read?)"
                )
        out = self.buf[self.pos - self.base : end - self.base]
        self.pos = end
        if self.digest is not None:
            self.digest.update(out)
        return out

    def unpack(self, fmt: str, what: str) -> int | float:
        """One scalar (``fmt``: a number's or a bool's code of :mod:`struct`)."""
        value: int | float = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def integer(self, fmt: str, what: str) -> int:
        """A count, a type or an offset (``fmt``: an unsigned integer code of :mod:`struct`)."""
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def string(self, what: str, limit: int = MAX_STRING) -> str:
        n = self.integer("<Q", f"{what}: length")
        if n > limit:
            raise self.fail(f"{what}: string length {n} is more than {limit}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: not UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> int | float | str | Sequence[object]:
        """A key's value: a scalar, a string, an array (a long one: its length, :class:`_Long`)."""
        fmt = _SCALARS.get(vtype)
        if fmt is not None:
            return self.unpack(fmt, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype != _ARRAY:
            raise self.fail(f"{what}: value type {vtype} is not a GGUF type (0..12)")
        if depth >= MAX_DEPTH:
            raise self.fail(f"{what}: arrays nested more than {MAX_DEPTH} deep")
        etype = self.integer("<I", f"{what}: array element type")
        n = self.integer("<Q", f"{what}: array length")
        if n > MAX_ARRAY:
            raise self.fail(f"{what}: array length {n} is more than {MAX_ARRAY}")
        efmt = _SCALARS.get(etype)
        if efmt is not None:  # a scalar array in one read
            size = struct.calcsize(efmt)
            raw = self.take(n * size, f"{what}: array of {n}")
            return list(struct.unpack(f"<{n}{efmt[1]}", raw)) if n <= KEPT_ARRAY else _Long(n)
        items = [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(n)]
        return items if n <= KEPT_ARRAY else _Long(n)


class _Long(int):
    """A long array's length, standing in for the array (tokenizer vocabularies: never needed
    here)."""


def read_header(path: Path, file: str) -> GGUFHeader:
    """Parse and check one GGUF file's header; CheckpointError listing every problem of its tensors
    (structural problems stop at the first: past one, offsets mean nothing)."""
    fd = open_regular(path, "GGUF file")
    try:
        size = os.fstat(fd).st_size
        cur = _Cursor(fd, path, size)
        if cur.take(4, "magic") != MAGIC:
            raise cur.fail("magic is not GGUF")
        version = cur.integer("<I", "version")
        if version not in VERSIONS:
            raise cur.fail(f"version {version} is not read (tpload reads GGUF versions 2 and 3)")
        n_tensors = cur.integer("<Q", "tensor count")
        n_kv = cur.integer("<Q", "key-value count")
        if n_tensors > MAX_TENSORS:
            raise cur.fail(f"tensor count {n_tensors} is more than {MAX_TENSORS}")
        if n_kv > MAX_KVS:
            raise cur.fail(f"key-value count {n_kv} is more than {MAX_KVS}")
        kv: dict[str, object] = {}
        for i in range(n_kv):
            key = cur.string(f"key {i}", MAX_NAME)
            vtype = cur.integer("<I", f"key {escape_name(key)}: value type")
            value = cur.value(vtype, f"key {escape_name(key)}")
            if key in kv:
                raise cur.fail(f"key {escape_name(key)} appears twice")
            kv[key] = value
        kv_bytes, kv_sha256 = cur.pos, cur.seal()
        alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            type(alignment) is not int
            or not 1 <= alignment <= MAX_ALIGNMENT
            or alignment & (alignment - 1)
        ):
            raise cur.fail(
                f"general.alignment {escape_name(repr(alignment))[:40]} is not a power of two "
                f"from 1 to {MAX_ALIGNMENT}"
            )
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for i in range(n_tensors):
            name = cur.string(f"tensor {i}: name", MAX_NAME)
            where = f"tensor {escape_name(name)}"
            nd = cur.integer("<I", f"{where}: dimension count")
            if not 1 <= nd <= MAX_DIMS:
                raise cur.fail(f"{where}: {nd} dimensions (1 to {MAX_DIMS} expected)")
            dims = struct.unpack(f"<{nd}Q", cur.take(8 * nd, f"{where}: dimensions"))
            ttype = cur.integer("<I", f"{where}: type")
            offset = cur.integer("<Q", f"{where}: offset")
            raw.append((name, dims, ttype, offset))
        data_start = -(-cur.pos // alignment) * alignment
    finally:
        os.close(fd)
    header = GGUFHeader(path, version, alignment, data_start, kv, kv_sha256, kv_bytes)
    problems: list[str] = []
    if data_start > size and raw:
        problems.append(
            f"{escape_name(path)}: GGUF header: the data would start at byte {data_start}, past "
            f"the end of the file ({size} bytes)"
        )
    for name, dims, ttype, offset in raw:
        info = _tensor(path, file, name, dims, ttype, offset, alignment, data_start, size, problems)
        if name in header.tensors:
            problems.append(
                f"{escape_name(path)}: tensor {escape_name(name)} appears twice in the header"
            )
        elif info is not None:
            header.tensors[name] = info
            header.order.append(name)
    problems += overlaps(path, header.tensors.values(), data_start)
    raise_all(CheckpointError, problems, what=f"problems in the GGUF header of {escape_name(path)}")
    return header


def _tensor(
    path: Path,
    file: str,
    name: str,
    dims: tuple[int, ...],
    ttype: int,
    offset: int,
    alignment: int,
    data_start: int,
    size: int,
    problems: list[str],
) -> GGUFTensorInfo | None:
    """One tensor entry checked and turned into torch order, or its problem filed."""
    where = f"{escape_name(path)}: tensor {escape_name(name)}"
    kind = TYPES.get(ttype)
    if kind is None:
        known = OTHER_TYPES.get(ttype, f"type {ttype}")
        problems.append(
            f"{where}: ggml type {known} is not served (tpload reads "
            f"{', '.join(t[0] for t in TYPES.values())})"
        )
        return None
    tname, per, bsize, dtype = kind
    if any(d >= 1 << 48 for d in dims) or math.prod(dims) >= 1 << 56:
        problems.append(f"{where}: dimensions {list(dims)} are too large")
        return None
    if dims[0] % per:
        problems.append(
            f"{where}: {tname} innermost dimension {dims[0]} is not a multiple of its "
            f"{per}-weight block"
        )
        return None
    if offset % alignment:
        problems.append(
            f"{where}: offset {offset} is not a multiple of general.alignment {alignment}"
        )
        return None
    elements = tuple(reversed(dims))
    nbytes = math.prod(dims) // per * bsize
    begin = data_start + offset
    if begin + nbytes > size:
        problems.append(
            f"{where}: data bytes {offset}..{offset + nbytes} run past the end of the file "
            f"({size - data_start} data bytes)"
        )
        return None
    shape = elements if per == 1 else elements[:-1] + (elements[-1] // per * bsize,)
    return GGUFTensorInfo(name, file, dtype, shape, path, begin, tname, elements)


# --- finding the files
# --------------------------------------------------------------------------------


def gguf_files(root: Path) -> list[Path] | None:
    """The GGUF files a path names: a file, or a folder's single file or split set (in part order);
    None when a folder holds no ``.gguf``. CheckpointError naming the file for a broken set, more
    than one unsplit file, or GGUF files beside safetensors shards."""
    if root.is_file():
        m = SPLIT_NAME.fullmatch(root.name)
        if not root.name.endswith(".gguf"):
            raise CheckpointError(f"{escape_name(root)}: not a .gguf file")
        if m is None:
            return [root]
        root = root.parent  # its own set only: a sibling set whose stem begins the same is not
        names = sorted(
            p.name
            for p in root.glob(f"{glob_escape(m['stem'])}-*-of-*.gguf")
            if (part := SPLIT_NAME.fullmatch(p.name)) and part["stem"] == m["stem"]
        )
    elif root.is_dir():
        names = sorted(p.name for p in root.glob("*.gguf"))
        if not names:
            return None
        shards = sorted(p.name for p in root.glob("*.safetensors"))
        if shards:
            raise CheckpointError(
                f"{escape_name(root / names[0])}: GGUF file beside safetensors shards "
                f"({escape_name(shards[0])}{' ...' if len(shards) > 1 else ''}) in one folder; "
                "which checkpoint is meant? Keep one format per folder"
            )
    else:
        return None
    return [root / n for n in _split_set(root, names)]


def glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


def _split_set(root: Path, names: list[str]) -> list[str]:
    plain = [n for n in names if SPLIT_NAME.fullmatch(n) is None]
    parts = [m for m in map(SPLIT_NAME.fullmatch, names) if m is not None]
    if plain and (len(plain) > 1 or parts):
        raise CheckpointError(
            f"{escape_name(root / (plain[1] if len(plain) > 1 else plain[0]))}: more than one GGUF "
            f"checkpoint in {escape_name(root)} ({', '.join(escape_name(n) for n in names[:4])}); "
            "keep one per folder, or name the file"
        )
    if plain:
        return plain
    stems = sorted({m["stem"] for m in parts})
    if len(stems) > 1:
        raise CheckpointError(
            f"{escape_name(root / parts[-1].string)}: split sets "
            f"{', '.join(map(escape_name, stems))} in one folder; keep one per folder"
        )
    counts = {int(m["count"]) for m in parts}
    count = max(counts)
    for m in parts:
        no, n = int(m["no"]), int(m["count"])
        if n != count or not 1 <= no <= count:
            raise CheckpointError(
                f"{escape_name(root / m.string)}: part {no} of {n} does not fit the split set of "
                f"{count} parts beside it"
            )
    have = {int(m["no"]) for m in parts}
    missing = [i for i in range(1, count + 1) if i not in have]
    if missing:
        name = f"{stems[0]}-{missing[0]:05d}-of-{count:05d}.gguf"
        raise CheckpointError(
            f"{escape_name(root / name)}: part {missing[0]} of the {count}-part split set is "
            "missing" + (f" ({len(missing)} parts missing)" if len(missing) > 1 else "")
        )
    return [m.string for m in sorted(parts, key=lambda m: int(m["no"]))]


def read_set(files: list[Path], root: Path) -> list[GGUFHeader]:
    """Every file's header (all problems at once), checked as one split set: ``split.no`` and
    ``split.count`` (when present) agree with the file names, and no tensor is in two parts."""
    headers, problems = [], []
    for path in files:
        try:
            headers.append(read_header(path, path.relative_to(root).as_posix()))
        except CheckpointError as e:
            problems.append(str(e))
    raise_all(
        CheckpointError, problems, what=f"problems with the GGUF files of {escape_name(root)}"
    )
    seen: dict[str, Path] = {}
    for i, h in enumerate(headers):
        no, count = h.kv.get("split.no"), h.kv.get("split.count")
        if len(files) > 1 and (
            (no is not None and no != i) or (count is not None and count != len(files))
        ):
            problems.append(
                f"{escape_name(h.path)}: split.no {no} / split.count {count} disagree with its "
                f"name (part {i + 1} of {len(files)})"
            )
        for name in h.order:
            if name in seen:
                problems.append(
                    f"{escape_name(h.path)}: tensor {escape_name(name)} is also in "
                    f"{escape_name(seen[name])}"
                )
            seen.setdefault(name, h.path)
    raise_all(
        CheckpointError, problems, what=f"problems with the GGUF split set of {escape_name(root)}"
    )
    return headers


class HeaderConfig(HeaderFields):
    """config.json's fields as a GGUF header gives them (a dict, read as config.json is), and
    which file and key each came from: messages name the header, not a config.json that is not
    there."""

    def __init__(self, doc: dict[str, object], *, path: Path, keys: dict[str, str]) -> None:
        super().__init__(doc)
        self.path = path
        """The GGUF file whose header was read (a split set's first part)."""
        self.gguf_keys = keys
        """{config.json field: the GGUF key it came from} (not ``keys``: the dict's own method)."""

    def source(self, field: str) -> str:
        """Where ``field`` comes from, in words (``deepseek2.attention.head_count in the GGUF
        header of FILE``)."""
        key = self.gguf_keys.get(field, field)
        return f"{key} in the GGUF header of {escape_name(self.path.name)}"


_FIELDS = (
    ("block_count", "num_hidden_layers"),
    ("expert_count", "n_routed_experts"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
)


def header_config(header: GGUFHeader) -> HeaderConfig:
    """What ``--config auto`` and head-counted rules read from config.json, from a GGUF header
    instead: ``general.architecture`` as the architecture (``gguf:deepseek2``, matched by the
    shipped configs' ``[detect]`` lists), the ``{arch}.*`` counts under config.json's field names,
    and the codec family ``gguf``."""
    kv = header.kv
    arch = kv.get("general.architecture")
    if not isinstance(arch, str):
        raise CheckpointError(
            f"{escape_name(header.path)}: GGUF header has no general.architecture string"
        )
    doc: dict[str, object] = {
        "architectures": [f"gguf:{arch}"],
        "quantization_config": {"quant_method": "gguf"},
    }
    keys = {"architectures": "general.architecture"}
    for key, field_name in _FIELDS:
        keys[field_name] = f"{arch}.{key}"
        value = kv.get(f"{arch}.{key}")
        if type(value) is int:
            doc[field_name] = value
    return HeaderConfig(doc, path=header.path, keys=keys)


def model_config(root: Path) -> HeaderConfig | None:
    """:func:`header_config` of the GGUF checkpoint ``root`` names (a folder, or a ``.gguf`` file),
    read from disk now (a load passes the header its catalogue read and checked instead); None:
    not a GGUF checkpoint."""
    files = gguf_files(root) if folder_of(root) != root or root.is_dir() else None
    if not files:
        return None
    return header_config(read_header(files[0], files[0].name))
