"""Whole-file sha256, for checkpoints whose files are named by their hash (hub cache snapshots).

A node's ranks split the files (whole, balanced by bytes, each to a rank that reads from it:
:func:`assign_files`). A rank hashes its share start to end on a thread of its own while its
loop copies windows, and from the very bytes it hashes fingerprints every node peer's window of
every tensor in the file, its own included. The exchange then compares those with what each
peer served (crosscheck.py); the rank compares its own windows itself. A file whose bytes do not
match its blob name fails the load on every rank, naming the file.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..storage.reader import Reader
from ..text import escape_name
from .fingerprint import Triple
from .hashing import Hashed, HashTap
from .policy import Box, assign_hashing

RAW_CHUNK = 4 << 20  # bytes outside any tensor (the header) are read in pieces of this


@dataclass
class FileHashed:
    """One hashed file: its sha256, and each peer's window fingerprint of each tensor in it."""

    path: Path
    sha256: str = ""
    nbytes: int = 0
    peers: dict[str, dict[int, Triple]] = field(default_factory=dict)
    deferred: dict[str, str] = field(default_factory=dict)
    """The sha256 of each deferred tensor's stored bytes, taken in the same pass (gate.FileDigests)."""


def assign_files(users: Mapping[Path, list[int]], sizes: Mapping[Path, int], ranks: list[int]) -> dict[int, list[Path]]:
    """Split whole files between a node's ranks, balanced by bytes, each to one of its readers
    (deterministic: every rank of the node computes the same split)."""
    keys = {str(p): p for p in sizes}
    split = assign_hashing({str(p): n for p, n in sizes.items()}, ranks, {str(p): users[p] for p in users})
    return {r: [keys[k] for k in names] for r, names in split.items()}


class FileHasher:
    """This rank's files, hashed whole on a background thread (:meth:`start`, then :meth:`finish`)."""

    def __init__(self, storage, files: list[Path], peers: Mapping[str, Mapping[int, Box]],
                 views: Mapping[str, tuple[int, int]], *, deferred: set[str] | frozenset[str] = frozenset()) -> None:
        self.storage, self.files, self.peers, self.views = storage, files, peers, views
        self.deferred = deferred
        """Tensors whose own sha256 is taken along (the load defers them: nothing else reads them)."""
        self.results: list[FileHashed] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpload-files", daemon=True)

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
            reader.drain()
        except BaseException as e:  # noqa: BLE001 - handed to the loading thread by finish()
            self.error = e

    def _hash(self, reader: Reader, path: Path) -> FileHashed:
        """The file's bytes in order: the header and any gap raw, each tensor through a tap that also
        fingerprints the peers' windows of it."""
        storage = self.storage
        shard = storage.files.get(path)
        out = FileHashed(path, nbytes=shard.opened.size)
        sha = hashlib.sha256()
        infos = sorted((i for i in storage.locations.values() if i.path == path), key=lambda i: i.begin)
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
        out.sha256 = sha.hexdigest()
        return out

    @staticmethod
    def _raw(shard, sha, begin: int, end: int, *, also: object | None = None) -> None:
        for a in range(begin, end, RAW_CHUNK):
            buf = np.empty(min(RAW_CHUNK, end - a), dtype=np.uint8)
            shard.read_into(a, buf)
            sha.update(memoryview(buf))
            if also is not None:
                also.update(memoryview(buf))


def file_problems(results: list[FileHashed], expected: Mapping[Path, str], *,
                  named_by: str = "the hash its hub blob is named by") -> list[str]:
    """Each hashed file whose sha256 is not the expected one (``named_by``: where that comes from)."""
    return [f"{escape_name(r.path)}: file sha256 {r.sha256[:16]}... is not {expected[r.path][:16]}... ({named_by}): "
            "the file is corrupt (re-download it)"
            for r in results if r.sha256 != expected[r.path]]


def own_problems(results: list[FileHashed], me: int, windows: Mapping[str, tuple[Box, Triple]]) -> list[str]:
    """This rank's windows of tensors in files it hashed itself, against the fingerprints taken from
    the hashed bytes (its two reads of the file agree, or the file changed in between)."""
    out = []
    for r in results:
        for name, by_peer in r.peers.items():
            if me in by_peer and name in windows and windows[name][1] != by_peer[me]:
                out.append(f"{escape_name(r.path)}: tensor {escape_name(name)}: the window this rank served differs "
                           "from the same window of the bytes it hashed (the file changed while loading?)")
    return out
