"""A native checkpoint on disk: index, shard headers, manifest, mapped bytes.

Nothing here knows about ranks or roles. It answers three questions, and
refuses to answer any of them for a checkpoint whose layout is not sound:
which tensors exist (and where, byte for byte), what the manifest promises
about them, and what their stored bytes are (a zero-copy view of a map).
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CheckpointError, raise_all
from .formats import DTYPES

INDEX_NAME = "model.safetensors.index.json"
MANIFEST_NAME = "NATIVE_MANIFEST.json"
MAX_HEADER_BYTES = 256 << 20  # a header larger than this is corrupt, not big


def natural_key(name: str) -> tuple:
    """Sort key that orders ``x.2`` before ``x.10`` (numbers compared as numbers)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def sha256_mismatch(path: Path, name: str, got: str, want: str) -> str:
    """The one wording of a hash failure, wherever a tensor is checked against the manifest."""
    return f"{path}: tensor {name}: sha256 {got[:16]}... does not match the manifest's {want[:16]}..."


@dataclass(frozen=True)
class TensorInfo:
    """Where one stored tensor's bytes are, as its shard header says."""

    name: str
    file: str
    """Shard file name, relative to the checkpoint directory."""
    path: Path
    """Absolute path of the shard (symlinks not resolved: HF caches link blobs)."""
    dtype: str
    shape: tuple[int, ...]
    begin: int
    """Absolute byte offset of the first data byte in the shard file."""
    nbytes: int

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class ManifestEntry:
    """What NATIVE_MANIFEST.json promises about one tensor."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str


def _safe_member(root: Path, rel: str, *, source: str) -> Path:
    """``root/rel``, refusing names that point out of the checkpoint folder.

    The check is lexical on purpose: a symlinked shard (the Hugging Face hub
    cache links every snapshot file to a blob elsewhere) stays allowed, while
    ``../x`` and absolute names in an index are refused.
    """
    if not isinstance(rel, str) or not rel:
        raise CheckpointError(f"{source}: shard name {rel!r} is not a file name")
    if os.path.isabs(rel) or os.path.normpath(rel).split(os.sep)[0] == os.pardir:
        raise CheckpointError(f"{source}: shard name {rel!r} points outside the checkpoint folder {root}; refused")
    return root / os.path.normpath(rel)


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: {what} is not readable JSON ({e})") from None


def read_header(path: Path, file: str) -> dict[str, TensorInfo]:
    """Parse and validate one shard's safetensors header.

    Every problem in the header is collected and raised at once: bad JSON,
    a length past the file, unknown dtypes, offsets that overlap, run past
    the end or disagree with dtype x shape.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header length")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER_BYTES or 8 + hlen > size:
                raise CheckpointError(f"{path}: header length {hlen} runs past the file ({size} bytes)")
            raw = f.read(hlen)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read shard ({e.strerror})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data_start, data_len = 8 + hlen, size - 8 - hlen
    problems: list[str] = []
    infos: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        info = _header_entry(path, file, name, meta, data_start, data_len, problems)
        if info is not None:
            infos[name] = info
    spans = sorted((i.begin, i.begin + i.nbytes, i.name) for i in infos.values() if i.nbytes)
    for (b0, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            problems.append(f"{path}: tensors {n0} and {n1} overlap (bytes {b0 - data_start}..{e0 - data_start} and {b1 - data_start}..)")
    raise_all(CheckpointError, problems, what=f"problems in the header of {path}")
    return infos


def _header_entry(path: Path, file: str, name: str, meta: object, data_start: int, data_len: int,
                  problems: list[str]) -> TensorInfo | None:
    where = f"{path}: tensor {name}"
    if not isinstance(meta, dict):
        problems.append(f"{where}: header entry is not an object")
        return None
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if dtype not in DTYPES:
        problems.append(f"{where}: dtype {dtype!r} is not served (expected one of {', '.join(DTYPES)})")
        return None
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        problems.append(f"{where}: shape {shape!r} is not a list of non-negative integers")
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        problems.append(f"{where}: data_offsets {offsets!r} is not [begin, end]")
        return None
    begin, end = offsets
    want = math.prod(shape) * DTYPES[dtype].itemsize
    if not 0 <= begin <= end:
        problems.append(f"{where}: data_offsets {offsets} are not ordered")
    elif end > data_len:
        problems.append(f"{where}: data_offsets end {end} runs past the data ({data_len} bytes)")
    elif end - begin != want:
        problems.append(f"{where}: data_offsets span {end - begin} bytes but {dtype} x {shape} is {want}")
    else:
        return TensorInfo(name, file, path, dtype, tuple(shape), data_start + begin, end - begin)
    return None


def read_manifest(root: Path) -> dict[str, ManifestEntry] | None:
    """NATIVE_MANIFEST.json as entries, or None when the checkpoint has none."""
    path = root / MANIFEST_NAME
    if not path.exists():
        return None
    doc = _read_json(path, "manifest")
    tensors = doc.get("tensors") if isinstance(doc, dict) else None
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{path}: manifest has no \"tensors\" object")
    out: dict[str, ManifestEntry] = {}
    problems: list[str] = []
    for name, e in tensors.items():
        try:
            out[name] = ManifestEntry(str(e["file"]), str(e["dtype"]), tuple(int(d) for d in e["shape"]), str(e["sha256"]).lower())
        except (KeyError, TypeError, ValueError):
            problems.append(f"{path}: entry for {name} lacks file/dtype/shape/sha256")
    raise_all(CheckpointError, problems, what=f"bad entries in {path}")
    return out


class Checkpoint:
    """An opened checkpoint directory: every tensor's location, the manifest, maps.

    Opening reads only headers (a few KiB per shard); bytes are mapped lazily,
    one shared read-only map per shard, and dropped again by :meth:`unmap`.
    """

    per_rank = False
    """True when each rank reads files of its own (a pre-partitioned checkpoint): then
    no rank can hash for another, and node verification becomes per rank."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).absolute()
        if not self.root.is_dir():
            raise CheckpointError(f"{self.root}: checkpoint directory does not exist")
        self.tensors = self._read_tensors()
        self.manifest = read_manifest(self.root)
        self._maps: dict[Path, tuple[mmap.mmap, np.ndarray]] = {}

    def _shard_names(self) -> dict[str, str] | list[str]:
        index = self.root / INDEX_NAME
        if index.exists():
            doc = _read_json(index, "index")
            wmap = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(wmap, dict):
                raise CheckpointError(f"{index}: index has no \"weight_map\" object")
            return wmap
        shards = sorted(p.name for p in self.root.glob("*.safetensors"))
        if not shards:
            raise CheckpointError(f"{self.root}: no {INDEX_NAME} and no *.safetensors shard")
        return shards

    def _read_tensors(self) -> dict[str, TensorInfo]:
        names = self._shard_names()
        files = sorted(set(names.values()) if isinstance(names, dict) else names)
        source = str(self.root / INDEX_NAME) if isinstance(names, dict) else str(self.root)
        headers: dict[str, dict[str, TensorInfo]] = {}
        problems = []
        for file in files:  # every shard is read, so one error lists every broken one
            path = _safe_member(self.root, file, source=source)
            if not path.exists():
                problems.append(f"{source}: shard {file} does not exist")
                continue
            try:
                headers[file] = read_header(path, file)
            except CheckpointError as e:
                problems.append(str(e))
        raise_all(CheckpointError, problems, what=f"problems with the shards of {self.root}")
        if isinstance(names, dict):
            return self._by_index(names, headers, source)
        out: dict[str, TensorInfo] = {}
        for file, infos in headers.items():
            for name, info in infos.items():
                if name in out:
                    raise CheckpointError(f"{self.root}: tensor {name} is in both {out[name].file} and {file}")
                out[name] = info
        return out

    @staticmethod
    def _by_index(names: dict[str, str], headers: dict[str, dict[str, TensorInfo]], source: str) -> dict[str, TensorInfo]:
        out, problems = {}, []
        for name, file in names.items():
            info = headers[file].get(name)
            if info is None:
                problems.append(f"{source}: tensor {name} is mapped to {file} but its header has no such tensor")
            else:
                out[name] = info
        raise_all(CheckpointError, problems, what="index entries that do not match the shards")
        return out

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.root}: no tensor named {name}") from None

    def names(self) -> list[str]:
        """Every tensor name, in natural order."""
        return sorted(self.tensors, key=natural_key)

    def manifest_problems(self, names: list[str]) -> list[str]:
        """Every named tensor that is missing from the manifest or disagrees with its header."""
        path = self.root / MANIFEST_NAME
        if self.manifest is None:
            return [f"{path}: manifest missing; write one with `python -m tpload manifest {self.root}` "
                    "or load with --verify off"]
        problems = []
        for name in names:
            info, entry = self.tensors[name], self.manifest.get(name)
            if entry is None:
                problems.append(f"{path}: tensor {name} (in {info.file}) is not in the manifest")
            elif (entry.file, entry.dtype, entry.shape) != (info.file, info.dtype, info.shape):
                problems.append(f"{path}: tensor {name}: manifest says {entry.file} {entry.dtype} {list(entry.shape)}, "
                                f"shard header says {info.file} {info.dtype} {list(info.shape)}")
        return problems

    def hash_problems(self, names: list[str], *, threads: int = 4) -> list[str]:
        """sha256 of every named tensor (on ``threads`` workers) against the manifest: each mismatch."""
        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tpload-sha") as pool:
            got = list(pool.map(self.sha256, names))
        return [sha256_mismatch(self.tensors[n].path, n, g, self.manifest[n].sha256)
                for n, g in zip(names, got) if g != self.manifest[n].sha256]

    def check_manifest(self, names: list[str]) -> None:
        """Every named tensor is in the manifest and agrees with its header (all problems raised at once)."""
        raise_all(CheckpointError, self.manifest_problems(names), what="manifest disagreements")

    # -- bytes ---------------------------------------------------------------------------------

    def _map(self, path: Path) -> np.ndarray:
        entry = self._maps.get(path)
        if entry is None:
            with open(path, "rb") as f:
                # ACCESS_COPY: a private map gives writable buffers (torch.from_numpy
                # warns on read-only ones) while sharing the page cache; never written.
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            entry = self._maps[path] = (mm, np.frombuffer(mm, dtype=np.uint8))
        return entry[1]

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of ``name``: a uint8 view of the shard's map (no copy)."""
        info = self.info(name)
        return self._map(info.path)[info.begin:info.begin + info.nbytes]

    def raw2d(self, name: str) -> np.ndarray:
        """The stored bytes as ``[rows, row_bytes]`` (a 1-D tensor is one row)."""
        info = self.info(name)
        rows = info.shape[0] if len(info.shape) > 1 else 1
        return self.raw(name).reshape(rows, -1) if info.nbytes else self.raw(name).reshape(rows, 0)

    def stored_window(self, name: str, rows: tuple[int, int],
                      cols: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
        """(the stored bytes holding a window of ``name``, as 2-D, and the window's rows and
        byte columns in them): here the whole tensor; a pre-partitioned file holds only the window."""
        return self.raw2d(name), rows, cols

    def window(self, name: str, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """Rows ``rows`` and byte columns ``cols`` of the whole tensor's 2-D bytes (a view, no copy)."""
        stored, (r0, r1), (c0, c1) = self.stored_window(name, rows, cols)
        return stored[r0:r1, c0:c1]

    def sha256(self, name: str) -> str:
        """sha256 of the stored bytes (hashlib releases the GIL on large buffers)."""
        return hashlib.sha256(memoryview(self.raw(name))).hexdigest()

    def write_manifest(self, *, force: bool = False, threads: int = 4) -> Path:
        """Hash every tensor and write NATIVE_MANIFEST.json (refusing to overwrite unless ``force``)."""
        path = self.root / MANIFEST_NAME
        if path.exists() and not force:
            raise CheckpointError(f"{path} exists; pass --force to overwrite it")
        names = self.names()
        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tpload-sha") as pool:
            digests = list(pool.map(self.sha256, names))
        tensors = {n: {"file": self.tensors[n].file, "dtype": self.tensors[n].dtype, "shape": list(self.tensors[n].shape),
                       "sha256": d} for n, d in zip(names, digests)}
        path.write_text(json.dumps({"format": 1, "tensors": tensors}, indent=1) + "\n")
        self.manifest = read_manifest(self.root)
        return path

    def unmap(self, path: Path | None = None) -> bool:
        """Drop and close the map of one shard (or all); False if a view of one is still
        alive somewhere (that map then closes when its last view dies)."""
        closed = True
        for p in [path] if path is not None else list(self._maps):
            entry = self._maps.pop(p, None)
            if entry is None:
                continue
            mm = entry[0]
            del entry  # drops our numpy view, the map's one export unless a window is alive
            try:
                mm.close()
            except BufferError:
                closed = False
        return closed

    def shard_paths(self) -> list[Path]:
        """Every shard file this checkpoint reads from."""
        return sorted({i.path for i in self.tensors.values()})


def write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]],
                      chunks: Callable[[str], Iterable[np.ndarray]], metadata: dict[str, str]) -> dict[str, str]:
    """Write a safetensors file one chunk at a time; return {name: sha256 of its stored bytes}.

    ``tensors`` gives (name, dtype, shape) in file order and ``chunks(name)`` the
    tensor's stored bytes in order, so memory stays bounded whatever the sizes
    (the safetensors library wants every tensor whole in memory at once).
    """
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * DTYPES[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-aligned, as safetensors writes it
    digests = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, _, _ in tensors:
            h = hashlib.sha256()
            for chunk in chunks(name):
                data = memoryview(np.ascontiguousarray(chunk)).cast("B")
                h.update(data)
                f.write(data)
            digests[name] = h.hexdigest()
    return digests
