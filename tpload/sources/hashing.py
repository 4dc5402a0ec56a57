"""The hash taps: the content hash of this rank's share, from the bytes the rank read itself.

The content hash is sha256, checked against the manifest, or blake3, checked against the
operator's sidecar when one fits (verification/hashes.py's :class:`Digests` says which; the gate
judges the results). Each tensor this rank hashes gets a :class:`HashTap` that the reader feeds
every stored block of the tensor, in order, straight from the staging buffer the window is copied
from. The tap updates the tensor's hash and, for each node peer that reads a window of the tensor,
that window's fingerprint: the evidence that the peer served exactly these bytes
(verification/node.py).

With ``threads`` > 0 the taps run on worker threads (hashlib and the fingerprint kernels release
the GIL) while the main thread reads and copies the next block; every block of one tensor goes to
the same worker, in order. With 0 they run inline, on a block still in the cache.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import accumulate, compress
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from ..kernels.fingerprint import HostFingerprint
from ..model.progress import Meter, Silent
from ..model.values import DIGEST_BYTES, Box, Stored, Triple
from ..storage.base import Storage
from ..storage.reader import Block, Reader
from ..verification import gate
from ..verification.hashes import SHA256, Digests, Hashed, HashObject, HashResults, new_blake3
from ..verification.node import HashPlan, PeerWindows
from ..verification.vouched import Vouched


def spare_cores(node_ranks: int) -> int:
    """Cores a rank may use beyond its main thread: its share of the cores this process may run
    on (its CPU affinity: a GPU node's launcher often pins each rank), less one."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return cores // max(1, node_ranks) - 1


def hash_threads(asked: int | None, node_ranks: int, device: str) -> int:
    """Hash worker threads for a rank: ``asked`` (``--hash-threads``) when given, else the cores it
    owns beyond its main thread (sized to the node: 8 ranks on a 112-core node hash on 13 threads
    each, where a fixed 2 would make a verified load hash-bound). On the CPU the copies need the
    other cores, so never more than the spare ones."""
    spare = max(0, spare_cores(node_ranks))
    threads = spare if asked is None else asked
    return min(threads, spare) if device == "cpu" else threads


INLINE_BELOW = (
    1 << 20
)  # smaller tensors are hashed on the spot: a hand-off costs more than their hash


def new_hashes(digests: Digests, nbytes: int) -> dict[str, HashObject]:
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
        sha: HashObject | None = None,
        digests: Digests = SHA256,
    ) -> None:
        self.result = Hashed(stored.name, stored)
        self.shared = sha is not None
        """The sha256 belongs to the whole file (its bytes in order, sources/whole_files.py), not
        this tensor."""
        self.hashes: dict[str, HashObject] = (
            {"sha256": sha} if sha is not None else new_hashes(digests, stored.nbytes)
        )
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
            block.data.data.cast("B")  # the array's own buffer (memoryview), as bytes
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

    def feed(self, block: Block) -> Future[None] | None:
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
_NAME = itemgetter(0)
"""A :class:`Stored`'s name."""


class Wanted(NamedTuple):
    """What a batch's hashing wants (:meth:`Hasher.wanted`): the places of the tensors this rank
    hashes, and each (tensor, node peer that reads a window of it) as columns: the tensor's place
    among ``ks``, the peer, its window."""

    ks: list[int]
    at: list[int]
    ranks: list[int]
    boxes: list[Box]


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

    def hashes(self, name: str) -> bool:
        """Whether this rank hashes ``name`` and has not yet (its next read is of every row)."""
        return name in self.todo

    def wanted(self, names: Sequence[str]) -> Wanted:
        """Which of ``names`` this rank still hashes (their places in ``names``; a name given twice,
        its first), and each node peer's window of them as columns (:class:`Wanted`), whose
        fingerprints :meth:`record_batch` wants."""
        todo = self.todo
        ks = list(compress(range(len(names)), map(todo.__contains__, names)))
        mine = [names[k] for k in ks]
        if len(set(mine)) < len(mine):  # a tensor twice in one batch: hashed once
            first: dict[str, int] = {}
            for k, name in zip(ks, mine, strict=True):
                first.setdefault(name, k)
            ks, mine = list(first.values()), list(first)
        peers = self.plan.peers
        if not peers or not ks:
            return Wanted(ks, [], [], [])
        if isinstance(peers, PeerWindows):
            return Wanted(ks, *peers.columns(mine))
        at: list[int] = []
        ranks: list[int] = []
        boxes: list[Box] = []
        for j, name in enumerate(mine):
            for p, box in peers.get(name, _NO_PEERS).items():
                at.append(j)
                ranks.append(p)
                boxes.append(box)
        return Wanted(ks, at, ranks, boxes)

    def record(self, stored: Stored, data: np.ndarray, peers: Mapping[int, Triple]) -> None:
        """A small tensor hashed whole on the spot, with its node peers' window fingerprints."""
        self.record_all([stored], [data], [dict(peers)])

    def record_all(
        self, stored: list[Stored], data: list[np.ndarray], peers: list[dict[int, Triple]]
    ) -> None:
        """:meth:`record_batch` with each tensor's peers' fingerprints as a mapping."""
        at: list[int] = []
        ranks: list[int] = []
        fps: list[int] = []
        for k, by_peer in enumerate(peers):
            for p, fp in by_peer.items():
                at.append(k)
                ranks.append(p)
                fps.extend(fp)
        self.record_batch(stored, data, (at, ranks, fps))

    def record_batch(
        self,
        stored: Sequence[Stored],
        data: Sequence[np.ndarray],
        peers: tuple[Sequence[int], Sequence[int], Sequence[int]] = ((), (), ()),
    ) -> None:
        """Small tensors hashed whole on the spot from a batch's bytes (``data[i]``, contiguous, is
        ``stored[i]``'s), with the fingerprints of their node peers' windows taken from the same
        bytes as columns (``peers``: the tensor's place in ``stored``, the peer, three integers
        a fingerprint, flattened); nothing for a tensor this rank does not (or no longer) hash."""
        todo = self.todo
        names = list(map(_NAME, stored))
        if not todo.issuperset(names) or len(set(names)) < len(names):  # only those still to hash
            seen: set[str] = set()
            keep = []
            for name in names:
                keep.append(name in todo and name not in seen)
                seen.add(name)
            at, ranks, fps = peers
            place = list(accumulate(keep, initial=0))
            kept = [j for j, k in enumerate(at) if keep[k]]
            peers = (
                [place[at[j]] for j in kept],
                [ranks[j] for j in kept],
                [v for j in kept for v in fps[3 * j : 3 * j + 3]],
            )
            stored, data = list(compress(stored, keep)), list(compress(data, keep))
            names = list(compress(names, keep))
        if not stored:
            return
        todo.difference_update(names)
        if self._sha256_only:  # the default: one digest a tensor, into one column
            # one hashlib object a tensor, made from its contiguous bytes by a C-level map
            # (type: ignore: an ndarray is a buffer, numpy's stubs say so from Python 3.12 only)
            digests = b"".join([h.digest() for h in map(hashlib.sha256, data)])  # type: ignore[arg-type]
            self.done.add_digests(stored, digests, peers)
        else:
            sha256, blake3 = [], []
            for s, raw in zip(stored, data, strict=True):
                got = {}
                for hash_name, h in new_hashes(self.digests, s.nbytes).items():
                    h.update(raw.data)  # the array's own buffer
                    got[hash_name] = h.hexdigest()
                sha256.append(got.get("sha256", ""))
                blake3.append(got.get("blake3", ""))
            self.done.add_digests(
                stored,
                b"".join(bytes.fromhex(h) if h else bytes(DIGEST_BYTES) for h in sha256),
                peers,
                blake3=blake3,
                missing=[k for k, h in enumerate(sha256) if not h],
            )
        if self.on_done is not None:
            for s in stored:
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


def at_rest(
    storage: Storage,
    names: list[str],
    *,
    threads: int,
    digests: Digests = SHA256,
    what: str = "nothing written",
    progress: Meter | None = None,
) -> Vouched:
    """The gate's check at rest (verification/gate.py's ``at_rest``) of tensors read whole from
    ``storage`` here, each once (``progress``: the command's meter, for the reads): the offline
    writers' one way to :class:`~tpload.verification.vouched.Vouched` digests."""

    def read(names: Sequence[str], digests: Digests) -> HashResults:
        return hash_whole(
            storage,
            list(names),
            threads=threads,
            digests=digests,
            progress=progress,
            what="checking",
        )

    return gate.at_rest(storage, names, hash_whole=read, digests=digests, what=what)
