"""Who hashes what: the verify modes, turned into this rank's share of the sha256 work.

* ``node`` (the default): the node's ranks split the tensors they read, balanced
  by bytes, each tensor going to one of the ranks that read it; every byte is
  hashed once per node. The ranks that read a tensor someone else hashed check,
  through the one exchange, that they served exactly the bytes that were hashed
  (crosscheck.py).
* ``rank``: every rank hashes everything it reads, from the bytes it serves.
* ``digest``: nothing is hashed; every served byte is checked against digests
  that ``tpload plan --write`` stored after hashing (store.py).
* ``off``: nothing is checked against the manifest (loudly marked).

A pre-partitioned checkpoint gives each rank files of its own: nobody can hash
for another, so ``node`` becomes ``rank`` there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..model.modes import Verify
from ..model.values import Box
from ..model.windows import readers


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
    rank has files of its own."""
    if mode in (Verify.OFF, Verify.DIGEST):
        return HashPlan(rank)
    if mode == Verify.RANK or per_rank or len(reads) == 1:
        return HashPlan(rank, frozenset(reads[rank]))
    users = readers(reads)
    split = assign_hashing({n: sizes[n] for n in users}, sorted(reads), users)
    owner = {n: r for r, names in split.items() for n in names}
    mine = frozenset(split[rank])
    peers = {n: {p: reads[p][n] for p in users[n] if p != rank} for n in mine}
    return HashPlan(rank, mine, {n: owner[n] for n in reads[rank] if owner[n] != rank}, peers)
