"""The content hash that proves a stored byte, and what the gate judges of what it found.

The content hash is sha256, checked against the manifest, or blake3, checked against the
operator's sidecar when one fits (store.py's sidecar); :class:`Digests` says which. The hashing
itself (taps fed by the reader, whole tensors read at rest, whole files hashed on a thread of their
own) is the read sources' (sources/hashing.py, sources/whole_files.py): they fill a
:class:`HashResults` a tensor a row, or a :class:`FileHashed` a file, and the gate judges them
(:func:`mismatches`, :func:`file_problems`, :func:`own_problems`).

What a file must hash to is a sha256 hex string (a hub blob name), or an :class:`Expected`: a
whole-file digest by another hash (blake3), or the digests of fixed byte ranges of the file (the
``path:start:end`` pieces of a shard-mode signature), each taken in the same single pass.

blake3 is an optional extra (``pip install -e ".[blake3]"`` in tpload's clone): without it tpload
works as before, and ``--hash blake3`` says how to get it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import itemgetter
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Protocol

import numpy as np

from ..model.columns import RowTable
from ..model.errors import LoadError
from ..model.text import escape_name, sha256_mismatch
from ..model.values import DIGEST_BYTES, Box, Stored, Triple


def _optional(name: str) -> ModuleType | None:
    """An optional extra's module, or None when it is not installed (tpload works without it)."""
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - depends on the environment
        return None


_blake3 = _optional("blake3")

INSTALL = 'pip install blake3 (or, in tpload\'s clone, pip install -e ".[blake3]")'
THREADED_FROM = (
    4 << 20
)  # a tensor this big is hashed on several threads when the rank has cores to spare


class HashObject(Protocol):
    """A running hash (hashlib's sha256, blake3's): bytes in, a hex digest out."""

    def update(self, data: bytes | memoryview, /) -> HashObject | None: ...  # blake3: itself

    def hexdigest(self) -> str: ...


def available() -> bool:
    return _blake3 is not None


def require() -> None:
    """Raise a clear LoadError when the blake3 package is missing."""
    if _blake3 is None:
        raise LoadError(
            f"--hash blake3 needs the blake3 package, which is not installed: {INSTALL}"
        )


def new_blake3(nbytes: int, threads: int) -> HashObject:
    """A blake3 hasher for a tensor of ``nbytes``: on up to ``threads`` threads when it is large."""
    require()
    assert _blake3 is not None  # require() raised otherwise
    hasher: HashObject = _blake3.blake3(
        max_threads=max(1, threads) if nbytes >= THREADED_FROM else 1
    )
    return hasher


@dataclass(frozen=True)
class Digests:
    """The content hash that proves a tensor's bytes, and what it must equal.

    ``sha256`` (the default): the manifest's, held in each :class:`~tpload.model.values.Stored`.
    ``blake3``: ``want`` (the sidecar's, read from ``source``). ``also``: hashes taken along from
    the same bytes and kept, not compared (``manifest --hash blake3`` takes blake3 while it checks
    sha256)."""

    hash: str = "sha256"
    want: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    threads: int = 1
    """blake3: threads for one large tensor (the rank's spare cores)."""
    also: tuple[str, ...] = ()

    @property
    def hashes(self) -> tuple[str, ...]:
        return (self.hash, *self.also)

    def expected(self, name: str, manifest_sha256: str | None) -> str | None:
        return manifest_sha256 if self.hash == "sha256" else self.want.get(name)

    def mismatch(self, path: Path | str, name: str, got: str, want: str) -> str:
        """The blake3 wording of a failed check (sha256's is model/text.sha256_mismatch)."""
        return (
            f"{escape_name(path)}: tensor {escape_name(name)}: blake3 {got[:16]}... does not match "
            f"{want[:16]}... from {escape_name(self.source)} (the blake3 sidecar, written after "
            "every sha256 matched the manifest)"
        )


SHA256 = Digests()


@dataclass(frozen=True)
class Expected:
    """What a source vouches for one file: its whole digest by ``hash``, or each byte range's
    sha256."""

    hash: str = "sha256"
    """``sha256`` or ``blake3`` (the whole file); pieces are always sha256."""
    whole: str | None = None
    pieces: Mapping[tuple[int, int], str] = field(default_factory=dict)
    """``(start, end)`` -> sha256 of those bytes; together they tile the file from 0."""
    source: str = "the hash its hub blob is named by"
    """Where the expected digest comes from, in words (the failure names it)."""
    fix: str = "the file is corrupt (re-download it)"


def expected_of(want: str | Expected) -> Expected:
    return want if isinstance(want, Expected) else Expected(whole=want)


@dataclass
class FileHashed:
    """One hashed file: its digest (or its pieces'), and each peer's window fingerprint of each
    tensor in it."""

    path: Path
    sha256: str = ""
    """The whole file's digest by ``hash`` (sha256 unless the source says otherwise; empty for
    pieces)."""
    nbytes: int = 0
    hash: str = "sha256"
    pieces: dict[tuple[int, int], str] = field(default_factory=dict)
    peers: dict[str, Mapping[int, Triple]] = field(default_factory=dict)
    deferred: dict[str, str] = field(default_factory=dict)
    """The sha256 of each deferred tensor's stored bytes, taken in the same pass
    (whole_files.FileDigests)."""


NO_PEERS: Mapping[int, Triple] = MappingProxyType({})


@dataclass(slots=True)
class Hashed:
    """One hashed tensor: its content hash(es) and the fingerprints of its node peers' windows."""

    name: str
    stored: Stored
    sha256: str = ""
    blake3: str = ""
    peers: Mapping[int, Triple] = field(default_factory=lambda: NO_PEERS)
    """Fingerprints of the node peers' windows of it, by peer rank (most tensors have none: they
    share one empty mapping rather than hold a dict each, which the collector would walk)."""


class HashResults(RowTable[Hashed]):
    """Every tensor a rank hashed, as columns: a load hashes tens of thousands of small tensors,
    and an object a tensor held to the end of the load is one more for the collector to walk at
    every full collection. The sha256 digests are one ``[rows, 32]`` byte column, compared with the
    manifest's in one array compare (:meth:`mismatched`); the node peers' window fingerprints are
    columns of (row, peer, fingerprint). A :class:`Hashed` is made when one is asked for (the
    report's few, a mismatch's words). Rows are added from the hashing threads too: under a lock,
    so a row's columns stay together."""

    def __init__(self) -> None:
        super().__init__()
        self._names: list[str] = []
        self._paths: list[Path] = []
        self._offsets: list[int] = []
        self._rows: list[int] = []
        self._row_bytes: list[int] = []
        self._want: list[str | None] = []
        self._sha256 = bytearray()
        """32 bytes a row: the sha256 digest (zeros where none was taken: :attr:`_no_sha256`)."""
        self._no_sha256: set[int] = set()
        self._blake3: dict[int, str] = {}
        """Only rows that took a blake3 (``--hash blake3``, or taken along)."""
        self._peer_row: list[int] = []
        self._peer_rank: list[int] = []
        self._peer_fp: list[int] = []
        """Three integers a (row, peer): only rows whose node peers read a window of the tensor."""
        self._peers_by_row: dict[int, dict[int, Triple]] | None = None
        self._lock = threading.Lock()

    def add(self, s: Stored, sha256: str, blake3: str, peers: Mapping[int, Triple] | None) -> None:
        self.add_all([(s, sha256, blake3, peers)])

    def add_all(self, rows: Sequence[tuple[Stored, str, str, Mapping[int, Triple] | None]]) -> None:
        """Rows of (stored bytes, sha256 hex, blake3 hex, peers' fingerprints), under one lock."""
        if not rows:
            return
        stored, sha256, blake3, peers = zip(*rows, strict=True)
        at: list[int] = []
        ranks: list[int] = []
        fps: list[int] = []
        for k, by_peer in enumerate(peers):
            for p, fp in (by_peer or {}).items():
                at.append(k)
                ranks.append(p)
                fps.extend(fp)
        self.add_digests(
            stored,
            b"".join(bytes.fromhex(h) if h else bytes(DIGEST_BYTES) for h in sha256),
            (at, ranks, fps),
            blake3=blake3,
            missing=[k for k, h in enumerate(sha256) if not h],
        )

    def add_digests(
        self,
        stored: Sequence[Stored],
        digests: bytes,
        peers: tuple[Sequence[int], Sequence[int], Sequence[int]] = ((), (), ()),
        *,
        blake3: Sequence[str] = (),
        missing: Sequence[int] = (),
    ) -> None:
        """Rows of sha256 digests (``digests``: 32 bytes a row, in order; ``missing``: the rows
        that took none), with the node peers' window fingerprints as columns: (the row among
        ``stored``, the peer, its three integers flattened); ``blake3``: each row's blake3 hex, when
        taken ("" where not)."""
        if not stored:
            return
        at, ranks, fps = peers
        with self._lock:
            first = len(self._names)
            self._add(stored, digests)
            self._peer_row.extend(map(first.__add__, at))
            self._peer_rank.extend(ranks)
            self._peer_fp.extend(fps)
            if missing:  # the default takes a sha256 of every row and no blake3
                self._no_sha256.update(map(first.__add__, missing))
            if blake3:
                self._blake3.update((first + k, h) for k, h in enumerate(blake3) if h)

    def _add(self, stored: Sequence[Stored], digests: bytes) -> None:
        """The stored columns and the digests of new rows (under the lock)."""
        if len(digests) != DIGEST_BYTES * len(stored):
            raise ValueError(f"{len(digests)} digest bytes for {len(stored)} rows")
        first = len(self._names)
        names, paths, offsets, rows, row_bytes, want = zip(*stored, strict=True)
        self._names += names
        self._paths += paths
        self._offsets += offsets
        self._rows += rows
        self._row_bytes += row_bytes
        self._want += want
        self._sha256 += digests
        self._row.update(zip(names, range(first, first + len(names)), strict=True))
        self._peers_by_row = None

    def digests(self) -> np.ndarray:
        """The sha256 column, ``[rows, 32]`` bytes (zeros where none was taken)."""
        column: np.ndarray = np.frombuffer(bytes(self._sha256), np.uint8)
        return column.reshape(-1, DIGEST_BYTES)

    def mismatched(self, digests: Digests) -> list[str]:
        """The names whose ``digests.hash`` is not the one promised (found over the columns)."""
        latest = list(self._row.values())
        if digests.hash != "sha256":
            expected, blake3 = digests.expected, self._blake3
            return [
                n
                for n, k in self._row.items()
                if (w := expected(n, self._want[k])) is None or blake3.get(k, "") != w
            ]
        want = [self._want[k] for k in latest]
        joined = "".join([w or "" for w in want])
        promised = _digests_of(joined, len(want)) if None not in want else None
        if promised is None:
            # an entry missing, or hex no lowercase digest equals (upper case): row by row
            got = self.hexes("sha256")
            return [n for n, w in zip(self._row, want, strict=True) if w is None or got[n] != w]
        bad = (self.digests()[latest] != promised).any(axis=1)
        if self._no_sha256:
            bad |= np.isin(np.asarray(latest, np.int64), list(self._no_sha256))
        return list(compress(self._row, bad.tolist()))

    def _hex(self, k: int) -> str:
        if k in self._no_sha256:
            return ""
        return self._sha256[DIGEST_BYTES * k : DIGEST_BYTES * (k + 1)].hex()

    def _peers_of(self, k: int) -> Mapping[int, Triple]:
        if self._peers_by_row is None:
            by_row: dict[int, dict[int, Triple]] = {}
            fps = self._peer_fp
            for j, (row, p) in enumerate(zip(self._peer_row, self._peer_rank, strict=True)):
                by_row.setdefault(row, {})[p] = (fps[3 * j], fps[3 * j + 1], fps[3 * j + 2])
            self._peers_by_row = by_row
        return self._peers_by_row.get(k, NO_PEERS)

    def _record(self, name: str, k: int) -> Hashed:
        stored = Stored(
            name, self._paths[k], self._offsets[k], self._rows[k], self._row_bytes[k], self._want[k]
        )
        return Hashed(name, stored, self._hex(k), self._blake3.get(k, ""), self._peers_of(k))

    def hexes(self, hash: str) -> dict[str, str]:
        """``{name: hex digest}`` of ``hash`` (``sha256`` or ``blake3``), read from its column."""
        if hash == "blake3":
            return {n: self._blake3.get(k, "") for n, k in self._row.items()}
        return {n: self._hex(k) for n, k in self._row.items()}

    def peers(self) -> dict[str, Mapping[int, Triple]]:
        """``{name: each node peer's window fingerprint}`` (empty for most tensors)."""
        return {n: self._peers_of(k) for n, k in self._row.items()}

    def peer_columns(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Each (tensor, node peer) whose window this rank fingerprinted from the bytes it hashed,
        as columns: the tensor's name, the peer, the fingerprint (``[n, 3]``); a row added again
        counts as its latest."""
        rows = np.asarray(self._peer_row, np.int64)
        ranks = np.asarray(self._peer_rank, np.int64)
        fps = np.asarray(self._peer_fp, np.int64).reshape(-1, 3)
        names = self._names
        if len(self._row) != len(names):  # a name added again: only its latest row's peers
            latest: np.ndarray = np.zeros(len(names), bool)
            latest[list(self._row.values())] = True
            keep = latest[rows]
            rows, ranks, fps = rows[keep], ranks[keep], fps[keep]
        if len(rows) > 1:  # one C-level take
            return list(itemgetter(*rows.tolist())(names)), ranks, fps
        return [names[k] for k in rows.tolist()], ranks, fps

    def nbytes(self) -> int:
        """Stored bytes hashed, all rows (a name added again counts once, as its latest row)."""
        latest = list(self._row.values())
        rows = np.asarray(self._rows, np.int64)[latest]
        return int((rows * np.asarray(self._row_bytes, np.int64)[latest]).sum())


def _digests_of(joined: str, n: int) -> np.ndarray | None:
    """``n`` lowercase hex sha256 digests joined, as ``[n, 32]`` bytes; None when they are not
    exactly that (upper-case or other characters, another length: compared as text instead)."""
    if len(joined) != 2 * DIGEST_BYTES * n or (not joined.islower() and not joined.isdigit()):
        return None
    try:
        raw = bytes.fromhex(joined)
    except ValueError:
        return None
    if len(raw) != DIGEST_BYTES * n:  # fromhex skips whitespace
        return None
    promised: np.ndarray = np.frombuffer(raw, np.uint8)
    return promised.reshape(n, DIGEST_BYTES)


def mismatches(hashed: HashResults, digests: Digests = SHA256) -> list[str]:
    """Every hashed tensor whose hash is not the one promised for it (one line each): the manifest's
    sha256, or the sidecar's blake3. The few wrong rows are found over the columns, then worded."""
    out = []
    for name in hashed.mismatched(digests):
        h = hashed[name]
        want = digests.expected(name, h.stored.sha256)
        got = h.sha256 if digests.hash == "sha256" else h.blake3
        if want is None:
            out.append(
                f"{escape_name(h.stored.path)}: tensor {escape_name(name)} has no "
                f"{digests.hash} to check"
            )
        else:  # mismatched found it different
            out.append(
                sha256_mismatch(h.stored.path, name, got, want)
                if digests.hash == "sha256"
                else digests.mismatch(h.stored.path, name, got, want)
            )
    return out


def file_problems(
    results: Sequence[FileHashed],
    expected: Mapping[Path, str | Expected],
    *,
    named_by: str | None = None,
) -> list[str]:
    """Each hashed file whose digest (or a piece's) is not what its source says (``named_by``: where
    a plain digest comes from, in words: the hub blob name by default, a local-dir etag...)."""
    out = []
    for r in results:
        want = expected_of(expected[r.path])
        if named_by is not None and not isinstance(expected[r.path], Expected):
            want = replace(want, source=named_by)
        where = escape_name(r.path)
        if not want.pieces:
            if r.sha256 != want.whole:
                whole = want.whole or ""
                out.append(
                    f"{where}: file {want.hash} {r.sha256[:16]}... is not {whole[:16]}... "
                    f"({want.source}): {want.fix}"
                )
            continue
        end = max(e for _, e in want.pieces)
        if r.nbytes != end:
            out.append(f"{where}: {r.nbytes} bytes, but {want.source} covers {end}: {want.fix}")
            continue
        bad = [(a, b) for (a, b), d in sorted(want.pieces.items()) if r.pieces.get((a, b)) != d]
        if bad:
            (a, b), more = bad[0], f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            out.append(f"{where}: bytes {a}:{b}{more} do not hash to {want.source}: {want.fix}")
    return out


def own_problems(
    results: Sequence[FileHashed], me: int, windows: Mapping[str, tuple[Box, Triple]]
) -> list[str]:
    """This rank's windows of tensors in files it hashed itself, against the fingerprints taken from
    the hashed bytes (its two reads of the file agree, or the file changed in between)."""
    out = []
    for r in results:
        for name, by_peer in r.peers.items():
            if me in by_peer and name in windows and windows[name][1] != by_peer[me]:
                out.append(
                    f"{escape_name(r.path)}: tensor {escape_name(name)}: the window this rank "
                    "served differs from the same window of the bytes it hashed (the file "
                    "changed while loading?)"
                )
    return out
