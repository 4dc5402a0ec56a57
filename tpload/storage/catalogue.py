"""What a checkpoint holds: every tensor's name, dtype, shape and file, and what its manifest
promises.

The catalogue is what the planner reads; it says nothing about where bytes
are (that is the storage's job), so a native folder and a pre-partitioned
export give the planner the same table and it cuts the same windows.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..model.columns import RowTable
from ..model.errors import CheckpointError, raise_all
from ..model.meta import TensorMeta
from ..model.table import TensorTable
from ..model.templates import natural_sorted
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME, Json
from . import gguf
from .files import folder_of, parse_json, read_small
from .pins import Pins, check_plan_files, parse_pins
from .safetensors import (
    MAX_DIM,
    HeaderColumns,
    TableRows,
    TensorInfo,
    _bad_per_row,
    _dims_ok,
    _is,
    _where,
    read_columns,
    rows_of,
    table_of,
)
from .scan import scan_manifest

PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
"""Checkpoint files in Python's pickle format (pytorch_model*.bin): never read."""
HEADERS_ONLY = "tpload_headers_only"
"""Metadata key of a ``synth --headers-only`` checkpoint's shards: their data are holes."""


class ManifestEntry(NamedTuple):
    """What NATIVE_MANIFEST.json promises about one tensor (a tuple: 92,000 are made at once)."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str


_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def _sha_ok(s: Json) -> bool:
    return isinstance(s, str) and _HEX64.fullmatch(s) is not None


def parse_manifest_entries(tensors: Json, path: Path) -> Manifest:
    """``{"name": {"file", "dtype", "shape", "sha256"}}`` as entries; every bad one listed at once.

    Each rule is one pass over a column (a manifest has 92,000 entries): an object, a string file
    and dtype, a shape of at most 8 non-negative integers below 2**48, a sha256 of 64 hex digits."""
    if not isinstance(tensors, dict):
        raise CheckpointError(f'{escape_name(path)}: manifest has no "tensors" object')
    names = list(tensors)
    n = len(names)
    raw = list(tensors.values())
    ok = _is(raw, dict)
    objs = _where(ok, raw, {})
    # dict.get over the column: a C call a row (objs are dicts: the others were replaced by {})
    # JSON values: each column's rule below is what types them
    columns: list[list[Any]] = [
        list(map(dict.get, objs, itertools.repeat(k))) for k in _MANIFEST_KEYS
    ]
    files, dtypes, shapes, digests = columns
    ok &= _is(files, str) & _is(dtypes, str) & _is(shapes, list) & _is(digests, str)
    shapes = _where(ok, shapes, [])
    lens = np.fromiter(map(len, shapes), np.int64, n)
    ok &= (lens <= 8) & (
        _bad_per_row(_dims_ok(list(itertools.chain.from_iterable(shapes))), lens) == 0
    )
    digests = _where(ok, digests, "")
    lengths = np.fromiter(map(len, digests), np.int64, n)
    ok &= lengths == 64
    hexed, raw_digests = _hex_column(digests, lengths)
    ok &= hexed
    problems = [
        f"{escape_name(path)}: entry for {escape_name(names[i])} is not "
        "{file, dtype, shape (integers), sha256 (64 hex digits)}"
        for i in np.flatnonzero(~ok).tolist()
    ]
    raise_all(CheckpointError, problems, what=f"bad entries in {escape_name(path)}")
    if raw_digests is None:  # every one 64 hex digits: checked above
        raw_digests = bytes.fromhex("".join(digests))
    # each file's and dtype's spelling held once (the JSON parse made a string an entry)
    spelt: dict[str, str] = {}
    return Manifest(
        names,
        list(map(spelt.setdefault, files, files)),
        list(map(spelt.setdefault, dtypes, dtypes)),
        list(map(tuple, shapes)),  # tuples of ints: the collector stops walking them (lists it
        # would walk at every full collection of the load)
        np.frombuffer(raw_digests, np.uint8).reshape(n, DIGEST),
    )


def _hex_digits(texts: list[str], lengths: np.ndarray) -> np.ndarray:
    """Whether each text is hex digits only (``lengths``: each one's): :func:`_hex_column`'s
    mask."""
    return _hex_column(texts, lengths)[0]


def _hex_column(texts: list[str], lengths: np.ndarray) -> tuple[np.ndarray, bytes | None]:
    """Whether each text is hex digits only (``lengths``: each one's), and the texts' bytes when
    that was proved in one step. The usual column, every text 64 hex digits, is proved by one
    ``bytes.fromhex`` of them all giving 32 bytes a text (fromhex refuses anything but hex digits
    and whitespace, and whitespace would make it shorter), whose bytes are then the digests; a
    regex a text otherwise (None: the caller converts what passed)."""
    if (lengths == 64).all():
        try:
            raw = bytes.fromhex("".join(texts))
        except ValueError:
            pass
        else:
            if len(raw) == DIGEST * len(texts):
                return np.ones(len(texts), bool), raw
    return np.fromiter(map(_is_hex, texts), bool, len(texts)), None


DIGEST = 32
"""Bytes of a sha256."""


class Manifest(RowTable[ManifestEntry]):
    """A parsed manifest as columns, name -> :class:`ManifestEntry` made when asked for: a load
    holds its manifest to the end, and 92,000 entries held as tuples would be 92,000 more objects
    for the collector to walk at every full collection (these columns are a handful). The digests
    are one [n, 32] uint8 array (:attr:`digests`), not 92,000 hex strings."""

    def __init__(
        self,
        names: list[str],
        files: list[str],
        dtypes: list[str],
        shapes: list[tuple[int, ...]],
        digests: np.ndarray,
    ) -> None:
        super().__init__()
        self._row.update(zip(names, range(len(names)), strict=True))
        self.files, self.dtypes, self.shapes = files, dtypes, shapes
        self.digests = digests
        """Each entry's sha256, [n, 32] uint8, in the manifest's order."""

    def _record(self, name: str, k: int) -> ManifestEntry:
        return ManifestEntry(self.files[k], self.dtypes[k], self.shapes[k], self._hex(k))

    def _hex(self, k: int) -> str:
        hexed: str = self.digests[k].tobytes().hex()
        return hexed

    def rows_of(self, names: Sequence[str]) -> np.ndarray:
        """Each name's row in the manifest, -1 where it has none."""
        result: np.ndarray = np.fromiter(
            map(self._row.get, names, itertools.repeat(-1)), np.int64, len(names)
        )
        return result

    def disagreeing(self, table: TensorTable, rows: np.ndarray) -> np.ndarray:
        """Which of the table's ``rows`` are missing from the manifest or differ from it in file,
        dtype or shape: a mask, by array equality over the columns (the caller words each)."""
        if len(self._row) == len(table) and list(self._row) == table.names:
            at = rows  # the manifest lists the table's rows in its order: no lookup a name
        else:
            at = self.rows_of(list(map(table.names.__getitem__, rows.tolist())))
        found = at >= 0
        bad = ~found
        k = np.flatnonzero(found)
        m = at[k]
        fid = {f: i for i, f in enumerate(table.files)}
        code = {d: i for i, d in enumerate(table.dtypes)}
        files = _codes(self.files, fid, m)
        dtypes = _codes(self.dtypes, code, m)
        if 2 * len(m) >= len(self.shapes):  # most rows: the whole column, then taken
            shape, ndim = _shape_columns(self.shapes)
            shape, ndim = shape[m], ndim[m]
        else:
            shape, ndim = _shape_columns([self.shapes[i] for i in m.tolist()])
        t = rows[k]
        differs = (files != table.file_id[t]) | (dtypes != table.dtype_code[t])
        differs |= (ndim != table.ndim[t]) | (shape != table.shape[t]).any(axis=1)
        bad[k] = differs
        result: np.ndarray = bad
        return result

    def aligned(self, table: TensorTable) -> tuple[np.ndarray, np.ndarray]:
        """The digests in the table's row order, [n, 32] uint8 (zeros where the manifest has no
        entry), and which rows have one."""
        at = self.rows_of(table.names)
        present = at >= 0
        out: np.ndarray = np.zeros((len(at), DIGEST), np.uint8)
        out[present] = self.digests[at[present]]
        return out, present

    def sha256(self, name: str) -> str | None:
        """The promised sha256 of ``name`` (None: not in the manifest), read from its column."""
        k = self._row.get(name)
        return None if k is None else self._hex(k)

    def sha256s(self, names: Sequence[str]) -> list[str | None]:
        """:meth:`sha256` of many names at once: their rows found in one C pass, their digests
        taken from the column in one step and hexed as one string (no Python call a name)."""
        at = self.rows_of(names)
        found = at >= 0
        every = bool(found.all())
        hexed = (self.digests[at] if every else self.digests[at[found]]).tobytes().hex()
        step = 2 * DIGEST
        texts: list[str | None] = [hexed[i : i + step] for i in range(0, len(hexed), step)]
        if every:
            return texts
        out: list[str | None] = [None] * len(names)
        for i, text in zip(np.flatnonzero(found).tolist(), texts, strict=True):
            out[i] = text
        return out


def _codes(column: list[str], vocab: dict[str, int], m: np.ndarray) -> np.ndarray:
    """Rows ``m`` of ``column`` as their codes in ``vocab`` (-1: not in it); read over the whole
    column when ``m`` asks for most of it (one lookup a row, no fetch a row), then taken."""
    if 2 * len(m) >= len(column):
        whole = np.fromiter(map(vocab.get, column, itertools.repeat(-1)), np.int64, len(column))
        taken: np.ndarray = whole[m]
        return taken
    result: np.ndarray = np.fromiter(
        map(vocab.get, map(column.__getitem__, m.tolist()), itertools.repeat(-1)), np.int64, len(m)
    )
    return result


def _shape_columns(shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Shapes of at most 8 dimensions as a zero-padded [n, 8] int64 array and their lengths."""
    n = len(shapes)
    ndim = np.fromiter(map(len, shapes), np.int64, n)
    flat = np.fromiter(itertools.chain.from_iterable(shapes), np.int64, int(ndim.sum()))
    shape: np.ndarray = np.zeros((n, 8), np.int64)
    starts: np.ndarray = np.repeat(np.cumsum(ndim) - ndim, ndim)
    shape[np.repeat(np.arange(n), ndim), np.arange(len(flat)) - starts] = flat
    return shape, ndim


_MANIFEST_KEYS = ("file", "dtype", "shape", "sha256")
_is_hex = re.compile(r"[0-9a-fA-F]*").fullmatch


def read_manifest(root: Path) -> tuple[Manifest | None, str | None]:
    """NATIVE_MANIFEST.json as entries and the sha256 of the very bytes parsed; (None, None) when
    the checkpoint has none."""
    entries, sha, _ = _read_manifest(root)
    return entries, sha


def _read_manifest(
    root: Path, given: Mapping[str, bytes] | None = None
) -> tuple[Manifest | None, str | None, Pins]:
    """:func:`read_manifest`, and the pins of its JSON files from the same bytes
    (storage/pins.py); ``given``: small files already read and checked (Pins.given)."""
    given = given or {}
    path = root / MANIFEST_NAME
    if MANIFEST_NAME not in given and not os.path.lexists(path):
        return None, None, Pins(root, None, None, given=given)
    raw = given.get(MANIFEST_NAME) or read_small(path, "manifest")
    doc, entries = parse_manifest(raw, path)
    sha = hashlib.sha256(raw).hexdigest()
    pins = parse_pins(doc, path)
    return entries(), sha, Pins(root, sha, *pins, given=given)


def parse_manifest(raw: bytes, path: Path) -> tuple[Json, Callable[[], Manifest]]:
    """The manifest's document, and what makes its entries (called after the pins are read, so a
    refusal comes in the same order whichever way it was read). The one reading of a manifest:
    the usual one is scanned straight into columns (:func:`scanned_manifest`: no object a
    tensor); any other is parsed by :func:`.files.parse_json` and its entries read by
    :func:`parse_manifest_entries`, which words every problem."""
    scanned = scanned_manifest(raw)
    if scanned is not None:
        doc, made = scanned
        return doc, lambda: made
    doc = parse_json(raw, path, "manifest")
    tensors = doc.get("tensors") if isinstance(doc, dict) else None
    return doc, lambda: parse_manifest_entries(tensors, path)


def scanned_manifest(raw: bytes) -> tuple[Json, Manifest] | None:
    """:func:`parse_manifest` of a usual manifest (:func:`.scan.scan_manifest`: its document with
    ``"tensors"`` empty) whose entries break no rule of :func:`parse_manifest_entries` (the scan
    took only strings, sha256s of 64 hex digits and integers; left: at most 8 dimensions, each
    below 2**48, asked of each distinct shape); None for any other."""
    scan = scan_manifest(raw)
    if scan is None:
        return None
    distinct = set(scan.shapes)
    if max(map(len, distinct)) > 8 or max(itertools.chain((0,), *distinct)) >= MAX_DIM:
        return None
    digests = np.frombuffer(scan.digests, np.uint8).reshape(len(scan.names), DIGEST)
    return scan.doc, Manifest(scan.names, scan.files, scan.dtypes, scan.shapes, digests)


class Catalogue:
    """Every tensor of a checkpoint (name -> :class:`TensorMeta`) and its manifest, if any."""

    def __init__(
        self,
        root: Path,
        tensors: Mapping[str, TensorMeta],
        manifest: Manifest | None,
        *,
        manifest_path: Path | None = None,
        manifest_sha256: str | None = None,
        headers_only: bool = False,
    ) -> None:
        """``tensors``: a table's rows (:class:`TableRows`: the catalogue is a view on its table),
        or name -> TensorMeta for a table held as objects (a GGUF header's, an export's)."""
        self.root = root
        self.headers_only = headers_only
        """Made by ``synth --headers-only``: the headers are real, the data are holes."""
        self.tensors = tensors
        self.manifest = manifest
        self.manifest_sha256 = manifest_sha256
        """sha256 of the manifest file's bytes as read (the checkpoint's identity for stored
        digests)."""
        self.manifest_path = manifest_path or root / MANIFEST_NAME
        self.pins: Pins | None = None
        """What the manifest read for this table pins (None: not read here; read again from disk
        when asked)."""
        self.files_read: dict[str, str] = {}
        """The sha256 of each plan-shaping JSON file read to make this table (the index), as
        read."""
        self._names: list[str] | None = None
        self._ranks: dict[str, int] | None = None
        self.gguf: gguf.GGUFHeader | None = None
        """A GGUF checkpoint's first file's header (its key-values say what config.json would);
        None for safetensors."""
        self.gguf_kv: dict[str, tuple[str, int]] = {}
        """Each GGUF file's key-value section as read: {file: (sha256, length in bytes)}, checked
        against the manifest's pins when the table was made."""

    @functools.cached_property
    def table(self) -> TensorTable:
        """Every tensor as columns: the one the rows view, or made once from the objects."""
        if isinstance(self.tensors, TableRows):
            return self.tensors.table
        return table_from(self.tensors)

    def get(self, name: str) -> TensorMeta:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(
                f"{escape_name(self.root)}: no tensor named {escape_name(name)}"
            ) from None

    @functools.cached_property
    def digests(self) -> tuple[np.ndarray, np.ndarray]:
        """The manifest's sha256 of each of the table's rows, [n, 32] uint8, and which rows the
        manifest lists (no manifest: none)."""
        if self.manifest is None:
            n = len(self.table)
            return np.zeros((n, DIGEST), np.uint8), np.zeros(n, bool)
        return self.manifest.aligned(self.table)

    def promised(self, name: str) -> str | None:
        """The manifest's sha256 of ``name`` (None: no manifest, or no entry for it)."""
        return self.manifest.sha256(name) if self.manifest is not None else None

    def promised_of(self, names: Sequence[str]) -> list[str | None]:
        """:meth:`promised` of many names at once, read from the manifest's digest column."""
        if self.manifest is None:
            return [None] * len(names)
        return self.manifest.sha256s(names)

    def check_plan_files(self) -> list[str]:
        """Check the JSON files that shape a plan (config.json, hf_quant_config.json, the index)
        against the pins of the manifest this catalogue was opened with; raise CheckpointError
        naming each that does not match. Returns notes (a manifest written before pins: its JSON
        files are unpinned)."""
        return check_plan_files(
            self.root, self.manifest_sha256, self.pins, gguf=list(self.gguf_kv) or None
        )

    def refuse_headers_only(self, what: str) -> None:
        """Raise for a headers-only checkpoint: ``what`` (a load, a verification, a manifest) would
        read holes (gigabytes of zeros) and prove nothing; ``plan`` is what such a checkpoint is
        for."""
        if self.headers_only:
            raise CheckpointError(
                f"{escape_name(self.root)} is a headers-only checkpoint (synth --headers-only: "
                f"real headers, holes for data); {what} would read zeros. Plan it with "
                f"`python -m tpload plan {escape_name(self.root)} --tp T`"
            )

    def names(self) -> list[str]:
        """Every tensor name, in natural order."""
        if self._names is None:
            self._names = self.table.natural_names()
        return self._names

    def ranks(self) -> dict[str, int]:
        """Each tensor name's place in natural order: a sort key read from a column, computed once
        for this catalogue (:func:`natural_key` is exact but costs microseconds a name)."""
        if self._ranks is None:
            self._ranks = dict(zip(self.names(), range(len(self.tensors)), strict=True))
        return self._ranks

    def manifest_problems(self, names: list[str]) -> list[str]:
        """Every named tensor missing from the manifest or disagreeing with its header, and every
        manifest entry no shard holds (the manifest is the trust anchor: nothing it lists may
        vanish)."""
        path = escape_name(self.manifest_path)
        if self.manifest is None:
            return [
                f"{path}: manifest missing, and {escape_name(self.root)} is not a hub cache "
                "snapshot (whose files are named by their hashes), so nothing vouches for its "
                "bytes. Either write a manifest: `python -m tpload manifest "
                f"{escape_name(self.root)}` (hashes every tensor once), or load with --verify off "
                "(nothing is checked; every report says so)"
            ]
        problems = []
        table = self.table
        rows = np.fromiter(map(table.row.__getitem__, names), np.int64, len(names))
        wrong = np.flatnonzero(self.manifest.disagreeing(table, rows)).tolist()
        for name in map(names.__getitem__, wrong):  # only the wrong rows, worded
            meta, entry = self.tensors[name], self.manifest.get(name)
            if entry is None:
                problems.append(
                    f"{path}: tensor {escape_name(name)} (in {escape_name(meta.file)}) is not in "
                    "the manifest"
                )
            else:  # disagreeing found its file, dtype or shape different
                problems.append(
                    f"{path}: tensor {escape_name(name)}: manifest says {escape_name(entry.file)} "
                    f"{escape_name(entry.dtype)} {list(entry.shape)}, shard header says "
                    f"{escape_name(meta.file)} {meta.dtype} {list(meta.shape)}"
                )
        # one set difference of the two name indexes (the sort gives the order)
        orphans = natural_sorted(set(self.manifest).difference(self.table.row))
        if orphans:
            listed = ", ".join(escape_name(n) for n in orphans[:12]) + (
                f" (and {len(orphans) - 12} more)" if len(orphans) > 12 else ""
            )
            problems.append(
                f"{path}: the manifest lists {len(orphans)} tensor(s) no shard holds (an index or "
                f"shard that leaves them out?): {listed}"
            )
        return problems


def _safe_member(root: Path, rel: Json, *, source: str) -> Path:
    """``root/rel``, refusing names that point out of the checkpoint folder.

    The check is lexical on purpose: a symlinked shard (the Hugging Face hub
    cache links every snapshot file to a blob elsewhere) stays allowed, while
    ``../x`` and absolute names in an index are refused.
    """
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise CheckpointError(
            f"{source}: shard name {escape_name(repr(rel))[:80]} is not a file name"
        )
    if os.path.isabs(rel) or os.path.normpath(rel).split(os.sep)[0] == os.pardir:
        raise CheckpointError(
            f"{source}: shard name {escape_name(repr(rel))} points outside the checkpoint folder "
            f"{escape_name(root)}; refused"
        )
    return root / os.path.normpath(rel)


def _shard_names(
    root: Path, pins: Pins, read: dict[str, str]
) -> tuple[dict[str, str] | None, list[str], str]:
    """(the index's weight map or None, every shard file, the source to name in messages); the index
    is checked against its pin in the manifest before it is parsed (``read``: gets its sha256)."""
    index = root / INDEX_NAME
    raw = pins.read(INDEX_NAME, "index")
    if raw is not None:
        pinned = pins.files.get(INDEX_NAME) if pins.files is not None else None
        # a pinned index was read only if its bytes hash to the pin (Pins.read): not hashed twice
        read[INDEX_NAME] = pinned or hashlib.sha256(raw).hexdigest()
        doc = parse_json(raw, index, "index")
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict):
            raise CheckpointError(f'{escape_name(index)}: index has no "weight_map" object')
        bad = (
            [n for n, f in wmap.items() if not isinstance(f, str)]
            if set(map(type, wmap.values())) != {str}
            else []
        )
        if bad:
            raise CheckpointError(
                f"{escape_name(index)}: weight_map values must be file names; "
                f"{', '.join(escape_name(n) for n in bad[:5])} map to something else"
            )
        return wmap, sorted(set(wmap.values())), str(index)
    shards = sorted(p.name for p in root.glob("*.safetensors"))
    if not shards:
        pickles = sorted({p.name for pattern in PICKLES for p in root.glob(pattern)})
        if pickles:
            shown = ", ".join(escape_name(p) for p in pickles[:3]) + (
                f" (and {len(pickles) - 3} more)" if len(pickles) > 3 else ""
            )
            raise CheckpointError(
                f"{escape_name(root)}: holds pickle checkpoint files ({shown}) and no "
                "*.safetensors shard; tpload does not read pickles: unpickling runs whatever code "
                "the file names (arbitrary code execution), so no check could come first. Convert "
                "them to safetensors (e.g. torch.load them once in a sandbox and "
                "safetensors.torch.save_file each state dict), then load the safetensors"
            )
        raise CheckpointError(f"{escape_name(root)}: no {INDEX_NAME} and no *.safetensors shard")
    return None, shards, str(root)


def read_native(
    root: Path, *, manifest: bool = True, checked: Mapping[str, bytes] | None = None
) -> tuple[Catalogue, Mapping[str, TensorInfo]]:
    """Open a native checkpoint folder (or a ``.gguf`` file: the folder that holds it, limited to
    that file or split set): its catalogue and where each tensor's bytes are. ``checked``: the
    folder's small files as a vouching step read and checked them (a hub snapshot's, a local-dir
    download's): read from those bytes, not the disk again.

    Every shard's header is read, so one error lists every broken shard (``manifest``: False to
    leave NATIVE_MANIFEST.json unread, for writing a new one); an index
    must name exactly the tensors the headers hold (no more, and no fewer: an index
    that leaves a tensor out would otherwise load the rest and report success).
    """
    named, root = root, folder_of(root)
    if not root.is_dir():
        what = (
            "is a file, not a checkpoint directory: give the folder that holds the shards (a GGUF "
            "checkpoint may be named by its .gguf file, or a split set's first part)"
            if root.exists()
            else "checkpoint directory does not exist"
        )
        raise CheckpointError(f"{escape_name(root)}: {what}")
    # The manifest first: the index is checked against its pin before it is believed.
    entries, manifest_sha, pins = (
        _read_manifest(root, checked)
        if manifest
        else (None, None, Pins(root, None, None, given=checked or {}))
    )
    read: dict[str, str] = {}
    found = gguf.gguf_files(named)
    if found is not None:  # a GGUF file or split set: its headers are the table (storage/gguf.py)
        parts = gguf.read_set(found, root)
        kv = {h.path.relative_to(root).as_posix(): (h.kv_sha256, h.kv_bytes) for h in parts}
        if manifest:  # the key-values say what the model is: checked before anything believes them
            raise_all(
                CheckpointError,
                pins.gguf_problems(kv),
                what="GGUF key-values that do not match their pins in the manifest",
            )
        in_parts = {n: h.tensors[n] for h in parts for n in h.order}
        catalogue = Catalogue(
            root,
            dict(in_parts),
            entries,
            manifest_sha256=manifest_sha,
            headers_only=any(gguf.HEADERS_ONLY_KEY in h.kv for h in parts),
        )
        catalogue.pins, catalogue.gguf = (pins if manifest else None), parts[0]
        catalogue.gguf_kv = kv
        return catalogue, in_parts
    wmap, files, source = _shard_names(root, pins, read)
    headers: dict[str, HeaderColumns] = {}
    paths: dict[str, Path] = {}
    problems = []
    headers_only = False
    for file in files:
        path = _safe_member(root, file, source=escape_name(source))
        if not os.path.exists(path):
            problems.append(f"{escape_name(source)}: shard {escape_name(file)} does not exist")
            continue
        try:
            headers[file], meta = read_columns(path, file)
            paths[file] = path
            headers_only |= HEADERS_ONLY in meta
        except CheckpointError as e:
            problems.append(str(e))
    raise_all(CheckpointError, problems, what=f"problems with the shards of {escape_name(root)}")
    table = _joined(wmap, headers, paths, source, root)
    # The catalogue and the storage share one view of the table: no object a tensor is kept.
    locations = TableRows(table, [paths[f] for f in table.files])
    catalogue = Catalogue(
        root, locations, entries, manifest_sha256=manifest_sha, headers_only=headers_only
    )
    catalogue.files_read, catalogue.pins = read, pins if manifest else None
    return catalogue, locations


def _joined(
    wmap: dict[str, str] | None,
    headers: dict[str, HeaderColumns],
    paths: dict[str, Path],
    source: str,
    root: Path,
) -> TensorTable:
    """The shards' columns as one table: in the index's order when there is one (which must name
    exactly the tensors the headers hold, each in its file), in the headers' otherwise (no name in
    two shards). A table that breaks a rule is worded by the per-name checks below, which raise."""
    files = list(headers)
    table = table_of(files, list(headers.values()))
    unique = len(table.row) == len(table)
    if wmap is None and unique:
        return table
    if wmap is not None and unique and len(wmap) == len(table):
        fid = {f: k for k, f in enumerate(files)}
        want = np.fromiter(map(fid.get, wmap.values(), itertools.repeat(-1)), np.int64, len(table))
        if list(wmap) == table.names:  # the index lists the headers' order: the table as made
            if (table.file_id == want).all():
                return table
        else:
            rows = list(map(table.row.get, wmap))
            if None not in rows:
                at = np.array(rows, dtype=np.int64)
                if (table.file_id[at] == want).all():
                    return table.take(at)
    views = {f: rows_of(paths[f], f, c) for f, c in headers.items()}
    if wmap is None:
        _by_shard(views, root)
    else:
        _by_index(wmap, views, source)
    raise CheckpointError(  # the checks above word every way the join can fail
        f"{escape_name(source)}: the shards' headers and the index do not agree"
    )


def table_from(tensors: Mapping[str, TensorMeta]) -> TensorTable:
    """A table of tensors held as objects (a GGUF header's, an export's source table), in their
    order; a tensor with no place in a file (an export's source table) begins at 0."""
    metas = list(tensors.values())
    files = list(dict.fromkeys(m.file for m in metas))
    fid = {f: k for k, f in enumerate(files)}
    by_file: dict[str, HeaderColumns] = {f: HeaderColumns([], [], [], [], []) for f in files}
    for m in metas:
        c = by_file[m.file]
        c.names.append(m.name)
        c.dtypes.append(m.dtype)
        c.shapes.append(m.shape)
        c.begins.append(m.begin if isinstance(m, TensorInfo) else 0)
        c.nbytes.append(m.nbytes)
    table = table_of(files, list(by_file.values()))
    order = np.argsort(
        np.fromiter((fid[m.file] for m in metas), np.int64, len(metas)), kind="stable"
    )
    place: np.ndarray = np.empty(
        len(metas), np.int64
    )  # each object's row in the file-by-file table
    place[order] = np.arange(len(metas))
    return table.take(place)


def _by_shard(headers: Mapping[str, Mapping[str, TensorInfo]], root: Path) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for infos in headers.values():
        out.update(infos)
    if len(out) == sum(map(len, headers.values())):
        return out  # no name in two shards (the loop below finds and names the first that is)
    out = {}
    for file, infos in headers.items():
        for name, info in infos.items():
            if name in out:
                raise CheckpointError(
                    f"{escape_name(root)}: tensor {escape_name(name)} is in both "
                    f"{escape_name(out[name].file)} and {escape_name(file)}"
                )
            out[name] = info
    return out


def _by_index(
    names: dict[str, str], headers: Mapping[str, Mapping[str, TensorInfo]], source: str
) -> dict[str, TensorInfo]:
    try:
        out = dict(
            zip(
                names,
                map(operator.getitem, map(headers.__getitem__, names.values()), names),
                strict=True,
            )
        )
    except KeyError:
        pass  # an index entry its header lacks: said below
    else:
        if len(out) == sum(map(len, headers.values())):
            # Every index entry is in the header of its file, and the headers hold no more tensors
            # than the index names: none is left out (the checks below word what is wrong
            # otherwise).
            return out
    out, problems = {}, []
    for name, file in names.items():
        info = headers[file].get(name)
        if info is None:
            problems.append(
                f"{escape_name(source)}: tensor {escape_name(name)} is mapped to "
                f"{escape_name(file)} but its header has no such tensor"
            )
        else:
            out[name] = info
    for file, infos in headers.items():
        left_out = natural_sorted(n for n in infos if names.get(n) != file)
        if left_out:
            listed = ", ".join(escape_name(n) for n in left_out[:12]) + (
                f" (and {len(left_out) - 12} more)" if len(left_out) > 12 else ""
            )
            problems.append(
                f"{escape_name(source)}: {len(left_out)} tensor(s) in the header of "
                f"{escape_name(file)} are not mapped to it by the index (an index that leaves "
                f"tensors out): {listed}"
            )
    raise_all(CheckpointError, problems, what="index entries that do not match the shards")
    return out
