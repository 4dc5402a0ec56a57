"""Node mode's closing argument: every rank served the bytes its node peer hashed.

In ``node`` mode rank A hashes a tensor and rank B copies its own window of it,
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
from collections.abc import Iterable, Mapping
from operator import itemgetter

from ..model.values import DIGEST_BYTES, SLOTS, Box, Triple


def fold(lines: Iterable[tuple[str, Box, Triple]]) -> bytes:
    """The 32-byte value of a set of (tensor, window, fingerprint) lines, in name order (plain
    string order: any order both sides share will do, and this one sorts in C, 92,000 names in a
    blink); zero bytes for no lines (what a rank that computed nothing sends, too)."""
    lines = sorted(lines, key=itemgetter(0))
    if not lines:
        return bytes(DIGEST_BYTES)
    # one update of every line joined: the same sha256 as line by line, without a call per tensor
    text = "".join(
        [
            f"{name}|{r0}|{r1}|{c0}|{c1}|{fp[0]}|{fp[1]}|{fp[2]}\n"
            for name, ((r0, r1), (c0, c1)), fp in lines
        ]
    )
    return hashlib.sha256(text.encode()).digest()


def _slots(values: Mapping[int, bytes], node: list[int]) -> list[bytes]:
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
    node: list[int],
    me: int,
) -> list[bytes]:
    """The :data:`SLOTS` values of what this rank, as hasher, says each node peer's windows hold."""
    per_peer: dict[int, list[tuple[str, Box, Triple]]] = {p: [] for p in node if p != me}
    for name, peers in peers_of.items():
        for p, box in peers.items():
            per_peer[p].append((name, box, fingerprints[name][p]))
    return _slots({p: fold(lines) for p, lines in per_peer.items()}, node)


def seen(
    owner: Mapping[str, int], windows: Mapping[str, tuple[Box, Triple]], node: list[int], me: int
) -> list[bytes]:
    """The :data:`SLOTS` values of what this rank read of the tensors each node peer hashed."""
    per_owner: dict[int, list[tuple[str, Box, Triple]]] = {p: [] for p in node if p != me}
    for name, hasher in owner.items():
        box, fp = windows[name]
        per_owner[hasher].append((name, box, fp))
    return _slots({p: fold(lines) for p, lines in per_owner.items()}, node)


def verdict(
    nodes: list[list[int]],
    claim_rows: Mapping[int, list[bytes]],
    seen_rows: Mapping[int, list[bytes]],
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
