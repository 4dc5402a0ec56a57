"""Whole-file hashing, for checkpoints whose files are vouched for whole (hub cache snapshots,
local-dir downloads, a signature over the folder): the producer the gate's whole-file strategies
(verification/whole_files.py) are judged on.

A rank hashes its share of the node's files (verification/node.py's :class:`WholeFiles`: which
files, which windows to fingerprint, what each must hash to) start to end on a thread of its own
(:class:`FileHasher`) while its loop copies windows, and from the very bytes it hashes fingerprints
every node peer's window of every tensor in the file, its own included. What a file must hash to is
a sha256 hex string (a hub blob name) or an :class:`~tpload.verification.hashes.Expected` (another
hash, or the digests of fixed byte ranges), each taken in the same single pass
(:class:`PieceDigests`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..model.progress import ProgressSink
from ..model.values import Box
from ..storage.files import Shard
from ..storage.reader import Reader
from ..storage.sharded import ShardedStorage
from ..verification.hashes import (
    Expected,
    FileHashed,
    Hashed,
    HashObject,
    expected_of,
    new_blake3,
)
from ..verification.node import WholeFiles
from .hashing import HashTap

RAW_CHUNK = 4 << 20  # bytes outside any tensor (the header) are read in pieces of this


class PieceDigests:
    """A file's bytes fed in order (``update``), hashed whole by one hash, or in fixed byte
    ranges."""

    def __init__(self, want: Expected) -> None:
        self.cuts: list[tuple[int, int]] = sorted(want.pieces)
        self.whole: HashObject | None = None if want.pieces else _new_hash(want.hash)
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


def _new_hash(name: str) -> HashObject:
    if name == "blake3":
        return new_blake3(0, 1)
    return hashlib.sha256()


class FileHasher:
    """This rank's files, hashed whole on a background thread (:meth:`start`, then
    :meth:`finish`)."""

    def __init__(
        self,
        storage: ShardedStorage,
        files: Sequence[Path],
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

    @classmethod
    def of(cls, storage: ShardedStorage, plan: WholeFiles) -> FileHasher:
        """The hasher of the gate's whole-file plan (Prepared.files)."""
        hasher = cls(storage, plan.files, plan.peers, plan.views, deferred=plan.deferred)
        return hasher.expect(plan.want)

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
        want = expected_of(self.want.get(path, ""))
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
    def _raw(
        shard: Shard, sha: PieceDigests, begin: int, end: int, *, also: HashObject | None = None
    ) -> None:
        for a in range(begin, end, RAW_CHUNK):
            buf: np.ndarray = np.empty(min(RAW_CHUNK, end - a), dtype=np.uint8)
            shard.read_into(a, buf)
            sha.update(buf.data)  # the array's own buffer (a memoryview)
            if also is not None:
                also.update(buf.data)


@contextmanager
def alongside(hasher: FileHasher | None) -> Iterator[None]:
    """Run the whole-file hasher (if any) on its own thread while the body copies; wait for it at
    the end (its error re-raised), and stop it if the body fails."""
    if hasher is None:
        yield
        return
    try:
        hasher.start()
        yield
        hasher.finish()
    finally:
        hasher.cancel()
