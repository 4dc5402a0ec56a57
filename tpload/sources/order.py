"""The order a rank reads its plan in: the tensors it leads first, so each stored byte is read from
storage once per node, by the rank that leads it, and its node peers copy their windows out of the
page cache right behind.

Which rank of a node leads a stored tensor (reads it from storage first): its hasher in ``node``
mode (the hash plan's split, verification/node.py: the hasher reads the whole tensor, and the
windows it fingerprints for the cross-check are the windows its peers then read out of the pages
it brought in); in every other mode the same split, balanced by bytes over the node's readers of
each tensor. Each rank then reads in turns: first what it leads, then what the next rank of the
node leads, and so on round the node. A rank reaches a peer's tensors only after its own share, so
the peer (reading its own share first, at the same pace) has read them a share earlier: the rank's
``pread`` finds them in the page cache, and the kernel's ``read_bytes`` counts each byte once a
node, on the rank that led it, instead of on whichever rank happened to get there first (the rank
running ahead read its peers' bytes for them, and the one behind waited on nothing; issue 38).

Deterministic given the node's reads: every rank of a node computes the same leads. Nothing here is
a check: what a rank serves is proved as before (its fingerprints, the hasher's, the exchange).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..model.values import Box
from ..verification.node import reader_sets, split_tensors


def read_turns(
    me: int,
    reads: Mapping[int, Mapping[str, Box]],
    sizes: Mapping[str, int],
    owner: Mapping[str, int],
) -> dict[str, int] | None:
    """Each stored tensor ``me`` reads and its turn: 0 for the tensors ``me`` leads, ``k`` for the
    ones the ``k``-th node rank after it leads (round the node, in rank order); None when there is
    no one to share with (one rank reads, or ``me`` reads nothing). ``reads``: each node rank's
    windows it reads from storage itself (the hash plan's input); ``sizes``: stored bytes of each
    tensor (for the split); ``owner``: the node peer that hashes each tensor ``me`` reads and does
    not hash itself (the hash plan's, whose split over these reads leads them; empty outside
    ``node`` mode, where the split is made here)."""
    if len(reads) < 2 or not reads.get(me):
        return None
    node = sorted(reads)
    here, n = node.index(me), len(node)
    turn_of = {r: (k - here) % n for k, r in enumerate(node)}  # each node rank's turn for ``me``
    if owner:  # node mode: the hash plan's split, made over the same reads, already says who leads
        # (a tensor this rank reads that no peer hashes is its own); made in C passes, no call a
        # tensor: every name turn 0, then the peers' tensors their hasher's turn
        led = dict.fromkeys(reads[me], 0)
        led.update(zip(owner.keys(), map(turn_of.__getitem__, owner.values()), strict=True))
        return led
    turns: dict[str, int] = {}
    groups = reader_sets(reads)
    for (who, names), leads in zip(groups, split_tensors(groups, sizes), strict=True):
        if me not in who:
            continue
        if len(who) == 1:
            turns.update(dict.fromkeys(names, 0))
            continue
        turns.update(zip(names, map(turn_of.__getitem__, leads.tolist()), strict=True))
    return turns
