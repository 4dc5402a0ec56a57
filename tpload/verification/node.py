"""Node mode: who hashes what, and the closing argument that every rank served the bytes its node
peer hashed.

Who hashes what: the verify modes, turned into this rank's share of the sha256 work.

* ``node`` (the default): the node's ranks split the tensors they read, balanced
  by bytes, each tensor going to one of the ranks that read it; every byte is
  hashed once per node. The ranks that read a tensor someone else hashed check,
  through the one exchange, that they served exactly the bytes that were hashed
  (below).
* ``rank``: every rank hashes everything it reads, from the bytes it serves.
* ``digest``: nothing is hashed; every served byte is checked against digests
  that ``tpload plan --write`` stored after hashing (store.py).
* ``off``: nothing is checked against the manifest (loudly marked).

A pre-partitioned checkpoint gives each rank files of its own: nobody can hash
for another, so ``node`` becomes ``rank`` there.

The cross-check. In ``node`` mode rank A hashes a tensor and rank B copies its own window of it,
each from its own read of the file. A write between the two reads (a
re-download, a sync tool) would let B serve bytes nobody hashed. So A, from
the very bytes it hashed, also fingerprints B's window; both sides fold those
fingerprints into one 32-byte value per (hasher, reader) pair:

    claim[A -> B] = sha256 over "name|rows|cols|fingerprint" of every tensor A hashed that B reads
    seen[B <- A]  = the same lines, over the windows B itself read of those tensors

Both travel in the one exchange (a row per rank: one claim and one seen value
per node peer), and every rank checks every pair: any difference fails the
load on every rank. The fingerprint is a checksum, so this stops accidents,
not an attacker who rewrites the file to keep three sums; against a hostile
writer use ``--verify rank`` (each rank hashes exactly the bytes it serves).
See docs/threat-model.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import itemgetter
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from ..model.modes import Verify
from ..model.values import DIGEST_BYTES, SLOTS, Box, Triple
from .hashes import Expected

T = TypeVar("T")


def readers(reads: Mapping[int, Iterable[str]]) -> dict[str, list[int]]:
    """Each stored tensor some rank reads (``reads``: rank -> the tensors it reads a window of),
    and the ranks that read it, ascending; tensors in the order the lowest rank reads them."""
    out: dict[str, list[int]] = {}
    for rank in sorted(reads):
        for name in reads[rank]:
            out.setdefault(name, []).append(rank)
    return out


@dataclass(frozen=True)
class HashPlan:
    """This rank's part of the node's sha256 work, and who does the rest."""

    rank: int
    mine: frozenset[str] = frozenset()
    """Tensors this rank hashes."""
    owner: Mapping[str, int] = field(default_factory=dict)
    """For every tensor this rank reads that a node peer hashes: that peer."""
    peers: Mapping[str, Mapping[int, Box]] = field(default_factory=dict)
    """For every tensor this rank hashes: each node peer that reads a window of it, and the
    window."""


def assign_hashing(
    sizes: Mapping[str, int], ranks: list[int], users: Mapping[str, list[int]] | None = None
) -> dict[int, list[str]]:
    """Split whole tensors between ranks, balanced by bytes (largest first, to the lightest rank).

    With ``users`` (tensor -> the ranks that read a window of it), a tensor goes only
    to one of its readers: no rank touches a tensor it does not serve (an expert of
    another ep group), and a rank done with a shard is done hashing it too.
    Deterministic given its inputs, so every rank of a node computes the same split.
    """
    load = {r: 0 for r in ranks}
    out: dict[int, list[str]] = {r: [] for r in ranks}
    users = users or {}
    # largest first, names in order among equals (sorts are stable, reversed ones too): an order
    # every rank agrees on, made with C-level keys
    for name in sorted(sorted(sizes), key=sizes.__getitem__, reverse=True):
        readers = users.get(name) or ranks
        r = readers[0]
        if len(readers) > 1:  # the lightest reader, the lowest rank among equals
            for k in readers[1:]:
                if load[k] < load[r] or (load[k] == load[r] and k < r):
                    r = k
        out[r].append(name)
        load[r] += sizes[name]
    return out


def reader_sets(reads: Mapping[int, Collection[str]]) -> list[tuple[tuple[int, ...], list[str]]]:
    """The stored tensors some rank reads, grouped by the ranks that read them (``reads``: rank ->
    the tensors it reads a window of, in its plan's order): (the readers ascending, their tensors
    in the order the lowest rank reads them), the groups in the order of their readers. Every rank
    of a node computes the node's plans alike, so every rank gets the same groups in the same
    order. At tp only every rank reads every tensor: one group, found by one set comparison."""
    ranks = sorted(reads)
    first = list(reads[ranks[0]])
    if all(len(reads[r]) == len(first) for r in ranks[1:]):
        names = set(first)
        if all(names.issuperset(reads[r]) for r in ranks[1:]):
            return [(tuple(ranks), first)]
    mask: dict[str, int] = {}
    for bit, rank in enumerate(ranks):
        get, one = mask.get, 1 << bit
        for name in reads[rank]:
            mask[name] = get(name, 0) | one
    groups: dict[int, list[str]] = {}
    for name, m in mask.items():
        groups.setdefault(m, []).append(name)
    out = [
        (tuple(r for k, r in enumerate(ranks) if m >> k & 1), names) for m, names in groups.items()
    ]
    return sorted(out, key=itemgetter(0))


class PeerWindows(Mapping[str, Mapping[int, Box]]):
    """For each tensor a rank hashes, each node peer that reads a window of it and the window, made
    when asked from the node's reads (a dict a tensor, held for the whole load, would be tens of
    thousands more objects for the collector to walk)."""

    def __init__(
        self,
        reads: Mapping[int, Mapping[str, Box]],
        group: Mapping[str, int],
        others: Sequence[tuple[int, ...]],
    ) -> None:
        self._reads, self._group, self._others = reads, group, others

    def peers_of(self, name: str) -> tuple[int, ...]:
        """The node peers that read a window of ``name`` (ascending; empty: none)."""
        return self._others[self._group[name]]

    def __getitem__(self, name: str) -> Mapping[int, Box]:
        reads = self._reads
        return {p: reads[p][name] for p in self._others[self._group[name]]}

    def box(self, name: str, peer: int) -> Box:
        """The window ``peer`` reads of ``name``."""
        return self._reads[peer][name]

    def boxes(self, names: Iterable[str], peer: int) -> list[Box]:
        """The windows ``peer`` reads of ``names``, in order (one C-level pass)."""
        return list(map(self._reads[peer].__getitem__, names))

    def columns(self, names: Sequence[str]) -> tuple[list[int], list[int], list[Box]]:
        """Each (tensor, node peer that reads a window of it) among ``names`` as columns: the
        tensor's place in ``names``, the peer, its window (no dict a tensor)."""
        reads, group, others = self._reads, self._group, self._others
        at: list[int] = []
        ranks: list[int] = []
        boxes: list[Box] = []
        n = len(names)
        groups = set(map(group.__getitem__, names))
        if len(groups) == 1:  # a batch read by the same peers (the usual case): column passes
            peers = others[groups.pop()]
            m = len(peers)
            if not m:
                return at, ranks, boxes
            at = np.repeat(np.arange(n), m).tolist()
            ranks = list(peers) * n
            by_peer = [list(map(reads[p].__getitem__, names)) for p in peers]
            # a name's peers next to each other, as below
            boxes = by_peer[0] if m == 1 else [b for row in zip(*by_peer, strict=True) for b in row]
            return at, ranks, boxes
        for k, name in enumerate(names):
            for p in others[group[name]]:
                at.append(k)
                ranks.append(p)
                boxes.append(reads[p][name])
        return at, ranks, boxes

    def __iter__(self) -> Iterator[str]:
        return iter(self._group)

    def __len__(self) -> int:
        return len(self._group)


class ByteSizes(Mapping[str, int]):
    """Stored bytes of each tensor, read from a column (``nbytes[row[name]]``): no dict of every
    tensor, no record a tensor; :func:`split_tensors` reads a group's sizes in one take."""

    def __init__(self, row: Mapping[str, int], nbytes: np.ndarray) -> None:
        self._row, self._nbytes = row, nbytes

    def __getitem__(self, name: str) -> int:
        return int(self._nbytes[self._row[name]])

    def column(self, names: Sequence[str]) -> np.ndarray:
        """The sizes of ``names``, in order, as int64 (KeyError for a name it does not hold)."""
        rows = np.fromiter(map(self._row.__getitem__, names), np.int64, len(names))
        out: np.ndarray = self._nbytes[rows].astype(np.int64)
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)


def split_tensors(
    groups: Sequence[tuple[tuple[int, ...], list[str]]], sizes: Mapping[str, int]
) -> list[np.ndarray]:
    """Who hashes each tensor of each reader group (:func:`reader_sets`), balanced by bytes: a
    tensor read by one rank is that rank's; a group read by several is dealt round, largest first
    (in the group's order among equals), beginning with the reader that has the least to hash so far
    (the lowest rank among equals). Array work a group, not a step a tensor; deterministic given
    its inputs, so every rank of a node computes the same split. Each tensor goes to one of its
    readers: no rank touches a tensor it does not serve, and the bytes of any two readers of a
    group differ by at most its largest tensor."""
    load: dict[int, int] = {}
    out: list[np.ndarray] = [np.empty(0, np.int64)] * len(groups)
    order = sorted(range(len(groups)), key=lambda g: len(groups[g][0]) > 1)  # forced ones first
    for g in order:
        who, names = groups[g]
        nbytes = (
            sizes.column(names)
            if isinstance(sizes, ByteSizes)
            else np.fromiter(map(sizes.__getitem__, names), np.int64, len(names))
        )
        if len(who) == 1:
            out[g] = np.full(len(names), who[0], np.int64)
            load[who[0]] = load.get(who[0], 0) + int(nbytes.sum())
            continue
        turn = np.array(sorted(who, key=lambda r: (load.get(r, 0), r)), np.int64)
        place: np.ndarray = np.empty(len(names), np.int64)
        place[np.argsort(-nbytes, kind="stable")] = np.arange(len(names)) % len(who)
        out[g] = turn[place]
        for k, r in enumerate(turn.tolist()):
            load[r] = load.get(r, 0) + int(nbytes[place == k].sum())
    return out


def hash_plan(
    mode: Verify,
    rank: int,
    reads: Mapping[int, Mapping[str, Box]],
    sizes: Mapping[str, int],
    *,
    per_rank: bool,
) -> HashPlan:
    """This rank's :class:`HashPlan`. ``reads``: for this rank and each peer on its node, the
    windows it reads (tensor -> box); ``sizes``: stored bytes of each tensor; ``per_rank``: each
    rank has files of its own. Who hashes what: :func:`split_tensors` over :func:`reader_sets`."""
    if mode in (Verify.OFF, Verify.DIGEST):
        return HashPlan(rank)
    if mode == Verify.RANK or per_rank or len(reads) == 1:
        return HashPlan(rank, frozenset(reads[rank]))
    groups = reader_sets(reads)
    hashers = split_tensors(groups, sizes)
    mine: list[str] = []
    owner: dict[str, int] = {}
    group: dict[str, int] = {}
    others: list[tuple[int, ...]] = []
    for (who, names), by in zip(groups, hashers, strict=True):
        if rank not in who:
            continue
        me = (by == rank).tolist()
        ours = list(compress(names, me))
        mine += ours
        group.update(dict.fromkeys(ours, len(others)))
        others.append(tuple(p for p in who if p != rank))
        theirs = [not m for m in me]
        owner.update(zip(compress(names, theirs), compress(by.tolist(), theirs), strict=True))
    return HashPlan(rank, frozenset(mine), owner, PeerWindows(reads, group, others))


@dataclass(frozen=True)
class WholeFiles:
    """This rank's part of the node's whole-file hashing (files vouched for whole: hub blobs,
    local-dir etags, a signature's file digests): the read sources hash each file start to end on a
    thread of their own (sources/whole_files.py), the gate judges the results (whole_files.py)."""

    files: Sequence[Path]
    """The files this rank hashes whole."""
    peers: Mapping[str, Mapping[int, Box]] = field(default_factory=dict)
    """For every tensor in those files: each node rank that reads a window of it (this one
    included), and the window, fingerprinted from the hashed bytes."""
    views: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Each tensor's 2-D byte view its windows are boxes of (default: its stored rows)."""
    deferred: frozenset[str] = frozenset()
    """Tensors whose own sha256 is taken along (the load defers them: nothing else reads them)."""
    want: Mapping[Path, str | Expected] = field(default_factory=dict)
    """What each file must hash to, when not a whole sha256 (another hash, or in pieces)."""


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


def fold(lines: Iterable[tuple[str, Box, Triple | Sequence[int]]]) -> bytes:
    """The 32-byte value of a set of (tensor, window, fingerprint) lines, in name order (plain
    string order: any order both sides share will do, and this one sorts in C, 92,000 names in a
    blink); zero bytes for no lines (what a rank that computed nothing sends, too)."""
    ordered = sorted(lines, key=itemgetter(0))
    if not ordered:
        return bytes(DIGEST_BYTES)
    # one update of every line joined: the same sha256 as line by line, without a call per tensor
    text = "".join(
        [
            f"{name}|{r0}|{r1}|{c0}|{c1}|{fp[0]}|{fp[1]}|{fp[2]}\n"
            for name, ((r0, r1), (c0, c1)), fp in ordered
        ]
    )
    return hashlib.sha256(text.encode()).digest()


def _slots(values: Mapping[int, bytes], node: Sequence[int]) -> list[bytes]:
    out = [bytes(DIGEST_BYTES)] * SLOTS
    for i, peer in enumerate(node):
        if peer in values:
            out[i % SLOTS] = bytes(
                a ^ b for a, b in zip(out[i % SLOTS], values[peer], strict=False)
            )
    return out


def claims(
    peers_of: Mapping[str, Mapping[int, Box]],
    fingerprints: Mapping[str, Mapping[int, Triple]],
    node: Sequence[int],
    me: int,
) -> list[bytes]:
    """The :data:`SLOTS` values of what this rank, as hasher, says each node peer's windows hold."""
    per_peer: dict[int, list[tuple[str, Box, Triple]]] = {p: [] for p in node if p != me}
    for name, peers in peers_of.items():
        for p, box in peers.items():
            per_peer[p].append((name, box, fingerprints[name][p]))
    return _slots({p: fold(lines) for p, lines in per_peer.items()}, node)


def seen(
    owner: Mapping[str, int],
    windows: Mapping[str, tuple[Box, Triple]],
    node: Sequence[int],
    me: int,
) -> list[bytes]:
    """The :data:`SLOTS` values of what this rank read of the tensors each node peer hashed."""
    per_owner: dict[int, list[tuple[str, Box, Triple]]] = {p: [] for p in node if p != me}
    for name, hasher in owner.items():
        box, fp = windows[name]
        per_owner[hasher].append((name, box, fp))
    return _slots({p: fold(lines) for p, lines in per_owner.items()}, node)


class WindowColumns(Protocol):
    """The windows a rank read, as columns (verification/evidence.py's WindowTable)."""

    @property
    def boxes(self) -> Sequence[Box]: ...

    @property
    def fps(self) -> np.ndarray:
        """Each window's fingerprint, ``[n, 3]``."""

    def rows(self, names: Iterable[str]) -> list[int]:
        """Each name's row (its latest window)."""


def _fold_rows(names: Sequence[str], boxes: Sequence[Box], fps: np.ndarray) -> bytes:
    """:func:`fold` of the lines ``names[i]``, ``boxes[i]``, ``fps[i]``: the same text, made from
    the columns with no tuple a line held: one stable sort of the names (string order, in C),
    each distinct window spelled once, the lines formatted over zipped columns."""
    n = len(names)
    if not n:
        return bytes(DIGEST_BYTES)
    order = sorted(range(n), key=names.__getitem__)
    take = itemgetter(*order) if n > 1 else _first
    spelled = {b: f"{b[0][0]}|{b[0][1]}|{b[1][0]}|{b[1][1]}" for b in set(boxes)}
    f0, f1, f2 = fps[order].T.tolist()
    text = "".join(
        [
            f"{name}|{box}|{a}|{b}|{c}\n"
            for name, box, a, b, c in zip(
                take(names), map(spelled.__getitem__, take(boxes)), f0, f1, f2, strict=True
            )
        ]
    )
    return hashlib.sha256(text.encode()).digest()


def _first(column: Sequence[T]) -> tuple[T]:
    """A one-row column's take (``itemgetter`` of one place returns the item, not a tuple)."""
    return (column[0],)


def claims_of(
    names: Sequence[str],
    ranks: np.ndarray,
    fps: np.ndarray,
    box: Callable[[str, int], Box] | PeerWindows,
    node: Sequence[int],
    me: int,
) -> list[bytes]:
    """:func:`claims` from columns: each (tensor, node peer) this rank fingerprinted from the bytes
    it hashed (``names[i]``, ``ranks[i]``, ``fps[i]``), ``box(name, peer)`` the peer's window (or
    the :class:`PeerWindows` that hold them, read a peer at a time). The same lines, the same
    values."""
    values: dict[int, bytes] = {}
    for p in node:
        if p == me:
            continue
        at = np.flatnonzero(ranks == p)
        mine = _pick(names, at)
        boxes = (
            box.boxes(mine, p)
            if isinstance(box, PeerWindows)
            else list(map(box, mine, repeat(p, len(mine))))
        )
        values[p] = _fold_rows(mine, boxes, fps[at])
    return _slots(values, node)


def seen_of(
    owner: Mapping[str, int], windows: WindowColumns, node: Sequence[int], me: int
) -> list[bytes]:
    """:func:`seen` from the windows' columns: the same lines, the same values."""
    names = list(owner)
    hashers = np.fromiter(owner.values(), np.int64, len(names))
    rows = np.asarray(windows.rows(names), np.int64)
    boxes = windows.boxes
    values: dict[int, bytes] = {}
    for p in node:
        if p == me:
            continue
        at = np.flatnonzero(hashers == p)
        mine = rows[at]
        values[p] = _fold_rows(
            _pick(names, at),
            _pick(boxes, mine),
            windows.fps[mine] if len(mine) else np.zeros((0, 3), np.int64),
        )
    return _slots(values, node)


def _pick(column: Sequence[T], at: np.ndarray) -> Sequence[T]:
    """``[column[k] for k in at]``, by one C-level take."""
    if len(at) > 1:
        picked: tuple[T, ...] = itemgetter(*at.tolist())(column)
        return picked
    return [column[k] for k in at.tolist()]


def verdict(
    nodes: Sequence[Sequence[int]],
    claim_rows: Mapping[int, Sequence[bytes]],
    seen_rows: Mapping[int, Sequence[bytes]],
) -> list[str]:
    """Every (hasher, reader) pair of a node whose claim and sighting differ: a pure function of the
    exchanged table, so every rank reaches the same verdict. On a node of more than :data:`SLOTS`
    ranks, peers sharing a slot are checked together (XOR of their values)."""
    problems = []
    for node in nodes:
        classes: dict[int, list[int]] = {}
        for k, r in enumerate(node):
            classes.setdefault(k % SLOTS, []).append(r)
        for i, hashers in classes.items():
            for j, readers in classes.items():
                if i == j and len(hashers) == 1:
                    continue  # a rank serves what it hashed itself from the same bytes
                if xor_fold([claim_rows[h][j] for h in hashers]) == xor_fold(
                    [seen_rows[r][i] for r in readers]
                ):
                    continue
                who = (
                    f"rank {readers[0]}"
                    if len(readers) == 1
                    else f"one of ranks {', '.join(map(str, readers))}"
                )
                by = (
                    f"rank {hashers[0]}"
                    if len(hashers) == 1
                    else f"one of ranks {', '.join(map(str, hashers))}"
                )
                problems.append(
                    f"{who} served bytes of tensors hashed by {by} that differ from the bytes that "
                    "were hashed (a file changed while the node loaded it?)"
                )
    return problems


def xor_fold(values: Iterable[bytes]) -> bytes:
    """The XOR of 32-byte values (order-free: how several ranks' values combine into one slot)."""
    out = bytes(DIGEST_BYTES)
    for v in values:
        out = bytes(a ^ b for a, b in zip(out, v, strict=False))
    return out
