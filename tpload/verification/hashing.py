"""The hash scheduler: the content hash of this rank's share, from the bytes the rank read itself.

The content hash is sha256, checked against the manifest, or blake3, checked against the
operator's sidecar when one fits (blake3sums.py); :class:`Digests` says which.
Each tensor this rank hashes gets a :class:`HashTap` that the reader feeds
every stored block of the tensor, in order, straight from the staging buffer
the window is copied from. The tap updates the tensor's hash and, for each
node peer that reads a window of the tensor, that window's fingerprint: the
evidence that the peer served exactly these bytes (crosscheck.py).

With ``threads`` > 0 the taps run on worker threads (hashlib and the
fingerprint kernels release the GIL) while the main thread reads and copies
the next block; every block of one tensor goes to the same worker, in order.
With 0 they run inline, on a block still in the cache.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from ..kernels.fingerprint import HostFingerprint
from ..model.columns import RowTable
from ..model.progress import Meter, Silent
from ..model.text import escape_name
from ..model.values import Box, Stored, Triple
from ..storage.base import Storage
from ..storage.catalogue import sha256_mismatch
from ..storage.reader import Block, Reader
from .blake3sums import SHA256, Digests, new_blake3
from .policy import HashPlan

INLINE_BELOW = (
    1 << 20
)  # smaller tensors are hashed on the spot: a hand-off costs more than their hash


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


def new_hashes(digests: Digests, nbytes: int) -> dict[str, object]:
    """A fresh hasher for each hash ``digests`` takes, for a tensor of ``nbytes``."""
    return {
        h: new_blake3(nbytes, digests.threads) if h == "blake3" else hashlib.sha256()
        for h in digests.hashes
    }


class HashTap:
    """Feeds one tensor's blocks to its hash(es) and to its peers' window fingerprints."""

    def __init__(
        self,
        stored: Stored,
        peers: dict[int, Box],
        lane: ThreadPoolExecutor | None,
        done: Callable[[Hashed], None],
        *,
        sha: object | None = None,
        digests: Digests = SHA256,
    ) -> None:
        self.result = Hashed(stored.name, stored)
        self.shared = sha is not None
        """The sha256 belongs to the whole file (its bytes in order, verification/files.py), not
        this tensor."""
        self.hashes = {"sha256": sha} if sha is not None else new_hashes(digests, stored.nbytes)
        boxes: dict[Box, HostFingerprint] = {}
        for (
            box
        ) in peers.values():  # a replicated tensor: every peer has the same box, fingerprinted once
            if box not in boxes:
                boxes[box] = HostFingerprint(box[1][1] - box[1][0])
        self.boxes, self.peer_boxes = boxes, dict(peers)
        self.lane, self.done = lane, done

    def _take(self, block: Block) -> None:
        data = (
            memoryview(block.data).cast("B")
            if block.data.flags.c_contiguous
            else block.data.tobytes()
        )
        for h in self.hashes.values():
            h.update(data)
        (a, b), (c, d) = block.rows, block.cols
        for ((r0, r1), (c0, c1)), fp in self.boxes.items():
            lo, hi, left, right = max(a, r0), min(b, r1), max(c, c0), min(d, c1)
            if lo < hi and left < right:
                fp.add(
                    block.data[lo - a : hi - a, left - c : right - c], lo - r0, first_col=left - c0
                )

    def feed(self, block: Block) -> Future | None:
        if self.lane is None:
            self._take(block)
            return None
        return self.lane.submit(self._take, block)

    def _finish(self) -> None:
        if not self.shared:
            for name, h in self.hashes.items():
                setattr(self.result, name, h.hexdigest())
        self.result.peers = {p: self.boxes[box].value() for p, box in self.peer_boxes.items()}
        self.done(self.result)

    def close(self) -> None:
        if self.lane is None:
            self._finish()
        else:
            self.lane.submit(self._finish)


_NO_PEERS: Mapping[int, Box] = {}


class HashResults(RowTable[Hashed]):
    """Every tensor a rank hashed, as columns: a load hashes tens of thousands of small tensors,
    and an object a tensor held to the end of the load is one more for the collector to walk at
    every full collection. A :class:`Hashed` is made when one is asked for (the report's few, a
    mismatch's words). Rows are added from the hashing threads too: under a lock, so a row's
    columns stay together."""

    def __init__(self) -> None:
        super().__init__()
        self._paths: list[Path] = []
        self._sizes: list[int] = []
        """offset, rows, row bytes of each row's stored bytes, flattened."""
        self._want: list[str | None] = []
        self._sha256: list[str] = []
        self._blake3: list[str] = []
        self._peers: dict[int, Mapping[int, Triple]] = {}
        """Only rows whose node peers read a window of the tensor (most have none)."""
        self._lock = threading.Lock()

    def add(self, s: Stored, sha256: str, blake3: str, peers: Mapping[int, Triple] | None) -> None:
        self.add_all([(s, sha256, blake3, peers)])

    def add_all(self, rows: Sequence[tuple[Stored, str, str, Mapping[int, Triple] | None]]) -> None:
        """Rows of (stored bytes, sha256, blake3, peers' fingerprints), under one lock."""
        with self._lock:
            for s, sha256, blake3, peers in rows:
                k = self._row[s.name] = len(self._sha256)
                self._paths.append(s.path)
                self._sizes += (s.offset, s.rows, s.row_bytes)
                self._want.append(s.sha256)
                self._sha256.append(sha256)
                self._blake3.append(blake3)
                if peers:
                    self._peers[k] = peers

    def mismatched(self, digests: Digests) -> list[str]:
        """The names whose ``digests.hash`` is not the one promised (found over the columns)."""
        got = self._sha256 if digests.hash == "sha256" else self._blake3
        expected, want = digests.expected, self._want
        return [
            n for n, k in self._row.items() if (w := expected(n, want[k])) is None or got[k] != w
        ]

    def _record(self, name: str, k: int) -> Hashed:
        offset, rows, row_bytes = self._sizes[3 * k : 3 * k + 3]
        stored = Stored(name, self._paths[k], offset, rows, row_bytes, self._want[k])
        return Hashed(name, stored, self._sha256[k], self._blake3[k], self._peers.get(k, NO_PEERS))

    def column(self, attr: str) -> dict[str, object]:
        """``{name: value}`` of one of the results (``sha256``, ``blake3``, ``peers``), read from
        its column."""
        if attr == "peers":
            return {n: self._peers.get(k, NO_PEERS) for n, k in self._row.items()}
        values = {"sha256": self._sha256, "blake3": self._blake3}[attr]
        return {n: values[k] for n, k in self._row.items()}

    def nbytes(self) -> int:
        """Stored bytes hashed, all rows (a name added again counts once, as its latest row)."""
        sizes = self._sizes
        return sum(sizes[3 * k + 1] * sizes[3 * k + 2] for k in self._row.values())


class Hasher:
    """This rank's hashing work (:class:`HashPlan`), inline or on worker threads, by ``digests``'
    hash."""

    def __init__(
        self,
        plan: HashPlan,
        *,
        threads: int = 0,
        on_done: Callable[[str], None] | None = None,
        digests: Digests = SHA256,
    ) -> None:
        self.plan = plan
        self.digests = digests
        self._sha256_only = digests.hashes == ("sha256",)
        self.todo = set(plan.mine)
        self.done = HashResults()
        self._lanes = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tpload-sha{i}")
            for i in range(threads)
        ]
        self._next = 0
        self.on_done = on_done

    def tap(self, stored: Stored) -> HashTap | None:
        """A tap if this rank hashes ``stored`` and has not yet; the caller then reads every stored
        row of it through the tap (a tensor is hashed once, from its first read)."""
        if stored.name not in self.todo:
            return None
        self.todo.discard(stored.name)
        lane = None
        if self._lanes and stored.nbytes >= INLINE_BELOW:
            lane, self._next = self._lanes[self._next % len(self._lanes)], self._next + 1
        return HashTap(
            stored,
            dict(self.plan.peers.get(stored.name, {})),
            lane,
            self._record,
            digests=self.digests,
        )

    def wanted(self, names: Sequence[str]) -> list[tuple[int, Mapping[int, Box]]]:
        """Which of ``names`` this rank still hashes: (its place in ``names``, each node peer's
        window of it (empty: no peer reads it)), whose fingerprints :meth:`record` wants."""
        todo, peers = self.todo, self.plan.peers
        return [(k, peers.get(n, _NO_PEERS)) for k, n in enumerate(names) if n in todo]

    def record(self, stored: Stored, data: np.ndarray, peers: Mapping[int, Triple]) -> None:
        """A small tensor hashed whole on the spot (:meth:`record_all` of one)."""
        self.record_all([stored], [data], [dict(peers)])

    def record_all(
        self, stored: list[Stored], data: list[np.ndarray], peers: list[dict[int, Triple]]
    ) -> None:
        """Small tensors hashed whole on the spot from a batch's bytes (``data[i]``, contiguous, is
        ``stored[i]``'s), with the fingerprints of their node peers' windows taken from the same
        bytes (``peers[i]``: one for each box :meth:`wanted` gave, kept as given); nothing for a
        tensor this rank does not (or no longer) hash."""
        todo, rows = self.todo, []
        for s, raw, fps in zip(stored, data, peers, strict=True):
            if s.name not in todo:
                continue
            todo.discard(s.name)
            if self._sha256_only:  # the default: no hasher objects to make for a few hundred bytes
                rows.append((s, hashlib.sha256(memoryview(raw)).hexdigest(), "", fps))
            else:
                got = {}
                for hash_name, h in new_hashes(self.digests, s.nbytes).items():
                    h.update(memoryview(raw))
                    got[hash_name] = h.hexdigest()
                rows.append((s, got.get("sha256", ""), got.get("blake3", ""), fps))
        self.done.add_all(rows)
        if self.on_done is not None:
            for s, _, _, _ in rows:
                self.on_done(s.name)

    def _record(self, hashed: Hashed) -> None:
        self.done.add(hashed.stored, hashed.sha256, hashed.blake3, hashed.peers)
        if self.on_done is not None:
            self.on_done(hashed.name)

    def finish(self) -> HashResults:
        """Wait for every tap; the results by tensor name."""
        for lane in self._lanes:
            lane.shutdown(wait=True)
        self._lanes = []
        return self.done

    def close(self) -> None:
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)
        self._lanes = []


def hash_whole(
    storage: Storage,
    names: list[str],
    *,
    threads: int = 0,
    feeds: dict[str, Callable[[np.ndarray, int], None]] | None = None,
    digests: Digests = SHA256,
    progress: Meter | None = None,
    what: str = "",
) -> HashResults:
    """``digests``' hashes (sha256 by default) of every named tensor, each read whole once, in the
    given order (offline tools: a manifest, a verification at rest, an export's sources). ``feeds``:
    also hand each block of a tensor, whole rows at a time, to its callable (the value checks).
    ``progress``: the command's meter, told of each tensor as it is read (``what``: this pass)."""
    hasher = Hasher(HashPlan(0, frozenset(names)), threads=threads, digests=digests)
    reader = Reader(storage)
    sink = (
        progress(sum(storage.stored(n).nbytes for n in names), len(names), what)
        if progress is not None
        else Silent()
    )
    try:
        for name in names:
            stored = storage.stored(name)
            feed = (feeds or {}).get(name)
            for r, _, view in reader.blocks(
                stored,
                (0, stored.rows),
                (0, stored.row_bytes),
                tap=hasher.tap(stored),
                split_rows=feed is None,
            ):
                if feed is not None:
                    feed(view, r)
            sink.update(stored.nbytes)
        reader.drain()
        return hasher.finish()
    finally:
        hasher.close()
        sink.close()


def mismatches(hashed: HashResults, digests: Digests = SHA256) -> list[str]:
    """Every hashed tensor whose hash is not the one promised for it (one line each): the manifest's
    sha256, or the sidecar's blake3. The few wrong rows are found over the columns, then worded."""
    out = []
    for name in hashed.mismatched(digests):
        h = hashed[name]
        want, got = digests.expected(name, h.stored.sha256), getattr(h, digests.hash)
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
