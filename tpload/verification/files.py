"""Whole-file digests, for checkpoints whose files are vouched for whole (hub cache snapshots, a
signature over the folder: verification/signing.py).

A node's ranks split the files (whole, balanced by bytes, each to a rank that reads from it:
:func:`assign_files`). A rank hashes its share start to end on a thread of its own while its
loop copies windows, and from the very bytes it hashes fingerprints every node peer's window of
every tensor in the file, its own included. The exchange then compares those with what each
peer served (crosscheck.py); the rank compares its own windows itself. A file whose bytes do not
match its blob name fails the load on every rank, naming the file.

What a file must hash to is a sha256 hex string (a hub blob name), or an :class:`Expected`: a
whole-file digest by another hash (blake3), or the digests of fixed byte ranges of the file (the
``path:start:end`` pieces of a shard-mode signature), each taken in the same single pass.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..model.progress import ProgressSink
from ..model.text import escape_name
from ..model.values import Box, Triple
from ..storage.reader import Reader
from .blake3sums import new_blake3
from .hashing import Hashed, HashTap
from .policy import assign_hashing

RAW_CHUNK = 4 << 20  # bytes outside any tensor (the header) are read in pieces of this


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


def _expected(want: str | Expected) -> Expected:
    return want if isinstance(want, Expected) else Expected(whole=want)


class PieceDigests:
    """A file's bytes fed in order (``update``), hashed whole by one hash, or in fixed byte
    ranges."""

    def __init__(self, want: Expected) -> None:
        if want.pieces:
            self.cuts = sorted(want.pieces)
            self.whole = None
        else:
            self.cuts = []
            self.whole = _new_hash(want.hash)
        self.pos, self.index = 0, 0
        self.piece = hashlib.sha256()
        self.done: dict[tuple[int, int], str] = {}

    def update(self, data: memoryview | bytes) -> None:
        if self.whole is not None:
            self.whole.update(data)
            return
        view = memoryview(data).cast("B")
        while len(view):
            if self.index >= len(
                self.cuts
            ):  # bytes past the last signed piece: counted, not hashed
                self.pos += len(view)
                return
            start, end = self.cuts[self.index]
            take = min(len(view), end - self.pos)
            self.piece.update(view[:take])
            self.pos += take
            view = view[take:]
            if self.pos == end:
                self.done[(start, end)] = self.piece.hexdigest()
                self.piece, self.index = hashlib.sha256(), self.index + 1

    def hexdigest(self) -> str:
        return self.whole.hexdigest() if self.whole is not None else ""


def _new_hash(name: str) -> object:
    if name == "blake3":
        return new_blake3(0, 1)
    return hashlib.sha256()


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
    peers: dict[str, dict[int, Triple]] = field(default_factory=dict)
    deferred: dict[str, str] = field(default_factory=dict)
    """The sha256 of each deferred tensor's stored bytes, taken in the same pass
    (whole_files.FileDigests)."""


def assign_files(
    users: Mapping[Path, list[int]], sizes: Mapping[Path, int], ranks: list[int]
) -> dict[int, list[Path]]:
    """Split whole files between a node's ranks, balanced by bytes, each to one of its readers
    (deterministic: every rank of the node computes the same split)."""
    keys = {str(p): p for p in sizes}
    split = assign_hashing(
        {str(p): n for p, n in sizes.items()}, ranks, {str(p): users[p] for p in users}
    )
    return {r: [keys[k] for k in names] for r, names in split.items()}


class FileHasher:
    """This rank's files, hashed whole on a background thread (:meth:`start`, then
    :meth:`finish`)."""

    def __init__(
        self,
        storage,
        files: list[Path],
        peers: Mapping[str, Mapping[int, Box]],
        views: Mapping[str, tuple[int, int]],
        *,
        deferred: set[str] | frozenset[str] = frozenset(),
        progress: ProgressSink | None = None,
    ) -> None:
        self.storage, self.files, self.peers, self.views = storage, files, peers, views
        self.progress = progress
        """Told of each file once hashed (an offline command's; the caller closes it)."""
        self.deferred = deferred
        """Tensors whose own sha256 is taken along (the load defers them: nothing else reads
        them)."""
        self.want: Mapping[Path, str | Expected] = {}
        """What each file must hash to, when not a whole sha256 (set by :meth:`expect` before
        start)."""
        self.results: list[FileHashed] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpload-files", daemon=True)

    def expect(self, want: Mapping[Path, str | Expected]) -> FileHasher:
        """Hash each file the way ``want`` says (another hash, or in pieces), in the same one
        pass."""
        self.want = want
        return self

    def start(self) -> FileHasher:
        if self.files:
            self._thread.start()
        return self

    def finish(self) -> list[FileHashed]:
        """Wait for every file; re-raise what stopped the thread."""
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error
        return self.results

    def cancel(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            reader = Reader(self.storage)
            for path in self.files:
                if self._stop.is_set():
                    return
                self.results.append(self._hash(reader, path))
                if self.progress is not None:
                    self.progress.update(self.results[-1].nbytes)
            reader.drain()
        except BaseException as e:  # noqa: BLE001 - handed to the loading thread by finish()
            self.error = e

    def _hash(self, reader: Reader, path: Path) -> FileHashed:
        """The file's bytes in order: the header and any gap raw, each tensor through a tap that
        also fingerprints the peers' windows of it."""
        storage = self.storage
        shard = storage.files.get(path)
        want = _expected(self.want.get(path, ""))
        out = FileHashed(path, nbytes=shard.opened.size, hash=want.hash)
        sha = PieceDigests(want)
        infos = sorted(
            (i for i in storage.locations.values() if i.path == path), key=lambda i: i.begin
        )
        pos = 0
        for info in infos:
            self._raw(shard, sha, pos, info.begin)
            if info.name in self.deferred:  # its bytes feed the file's hash and a hash of its own
                own = hashlib.sha256()
                self._raw(shard, sha, info.begin, info.begin + info.nbytes, also=own)
                out.deferred[info.name] = own.hexdigest()
                pos = max(pos, info.begin + info.nbytes)
                continue
            stored = storage.stored(info.name)
            stored = stored.seen_as(self.views.get(info.name, (stored.rows, stored.row_bytes)))

            def keep(h: Hashed, name: str = info.name) -> None:
                out.peers[name] = h.peers

            tap = HashTap(stored, dict(self.peers.get(info.name, {})), None, keep, sha=sha)
            for _ in reader.blocks(stored, (0, 0), (0, 0), tap=tap):
                pass
            pos = max(pos, info.begin + info.nbytes)
        self._raw(shard, sha, pos, out.nbytes)
        out.sha256, out.pieces = sha.hexdigest(), sha.done
        return out

    @staticmethod
    def _raw(shard, sha, begin: int, end: int, *, also: object | None = None) -> None:
        for a in range(begin, end, RAW_CHUNK):
            buf = np.empty(min(RAW_CHUNK, end - a), dtype=np.uint8)
            shard.read_into(a, buf)
            sha.update(memoryview(buf))
            if also is not None:
                also.update(memoryview(buf))


def file_problems(
    results: list[FileHashed],
    expected: Mapping[Path, str | Expected],
    *,
    named_by: str | None = None,
) -> list[str]:
    """Each hashed file whose digest (or a piece's) is not what its source says (``named_by``: where
    a plain digest comes from, in words: the hub blob name by default, a local-dir etag...)."""
    out = []
    for r in results:
        want = _expected(expected[r.path])
        if named_by is not None and not isinstance(expected[r.path], Expected):
            want = replace(want, source=named_by)
        where = escape_name(r.path)
        if not want.pieces:
            if r.sha256 != want.whole:
                out.append(
                    f"{where}: file {want.hash} {r.sha256[:16]}... is not {want.whole[:16]}... "
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
    results: list[FileHashed], me: int, windows: Mapping[str, tuple[Box, Triple]]
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
