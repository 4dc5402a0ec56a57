"""Where the ranks of a load with replicas stand: rank ``r`` is replica ``r // (tp*ep)`` at position
``r % (tp*ep)``, or where the caller's ``replica_group`` puts it (:class:`Placement`), and every
rank at a position has the same plan (:func:`position`: the planner plans a position, the load asks
it for each rank's). The transfers themselves: sources/replicas.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..model.errors import OptionsError
from ..storage.reader import CHUNK_BYTES
from ..transfer.base import CUDA_CHUNK_BYTES

RING = 4
"""Buffers in flight each way on a rank's link (of the reader's chunk size; the wire's device
buffers beside them on a GPU)."""


def check_world(
    world: int, replicas: int, tp: int, ep: int, groups: Sequence[Sequence[int]] | None = None
) -> None:
    """One line naming the option and the sizes when the group is not ``replicas x tp x ep``, or the
    caller's ``groups`` (one per position, one rank per replica) do not place every rank of it."""
    what = f"replicas {replicas}"
    if groups:
        what = f"replica_group ({len(groups)} groups of {replicas})"
    if world != replicas * tp * ep:
        raise OptionsError(
            f"{what}: a group of {world} ranks is not replicas {replicas} x tp {tp} x "
            f"ep {ep} = {replicas * tp * ep} ranks"
        )
    if groups is None:
        return
    if len(groups) != tp * ep:
        raise OptionsError(
            f"{what}: tp {tp} x ep {ep} has {tp * ep} positions, so {tp * ep} groups are needed "
            f"(one per position), not {len(groups)}"
        )
    if outside := sorted(r for g in groups for r in g if r >= world):
        raise OptionsError(
            f"{what}: rank(s) {', '.join(map(str, outside[:8]))} outside the load's group of "
            f"{world} ranks (the groups hold ranks of the load's group)"
        )


class Placement:
    """Where each rank of the load's group stands: ``groups[position][replica]`` is its rank (the
    caller's ``replica_group``, already checked: equal sizes, no rank twice, :func:`check_world`).
    """

    def __init__(self, groups: Sequence[Sequence[int]]) -> None:
        self.groups = tuple(tuple(g) for g in groups)
        self.replicas, self.size = len(self.groups[0]), len(self.groups)
        self._where = {r: (q, p) for p, g in enumerate(self.groups) for q, r in enumerate(g)}

    @classmethod
    def in_order(cls, replicas: int, size: int) -> Placement:
        """``--replicas R``: rank ``r`` is replica ``r // size`` at position ``r % size``."""
        return cls([[q * size + p for q in range(replicas)] for p in range(size)])

    def where(self, rank: int) -> tuple[int, int]:
        """(replica, position) of a group rank."""
        return self._where[rank]

    def rank(self, replica: int, position: int) -> int:
        return self.groups[position][replica]


class Sharing(Protocol):
    """The options that say how windows are shared (options/load_options.py's LoadOptions): what
    placing the ranks reads, and how long a replica's peers wait (sources/open.py)."""

    @property
    def replicas(self) -> int: ...

    @property
    def replica_group(self) -> Sequence[Sequence[int]] | None: ...

    @property
    def timeout_s(self) -> float: ...


def count(opts: Sharing) -> int:
    """The number of replicas the options ask for (``replica_group``: the groups' size)."""
    groups = opts.replica_group
    return len(groups[0]) if groups else opts.replicas


def placement(opts: Sharing, world: int) -> Placement | None:
    """Where each rank stands (None without replicas)."""
    groups, n = opts.replica_group, count(opts)
    if n <= 1:
        return None
    return Placement(groups) if groups else Placement.in_order(n, world // n)


def position(at: Placement | None, rank: int) -> int:
    """The position ``rank`` is planned as: its place in its replica (``at``: where the ranks
    stand), or the rank itself without replicas. Every rank at a position has the same plan."""
    return at.where(rank)[1] if at is not None else rank


def planned_world(opts: Sharing, world: int, tp: int, ep: int) -> int:
    """The ranks one replica's layout spans: ``world`` without replicas; with them, a group of
    ``replicas x tp x ep`` ranks (refused in one line naming the sizes otherwise) spans
    ``world // replicas``."""
    n = count(opts)
    if n <= 1:
        return world
    check_world(world, n, tp, ep, opts.replica_group)
    return world // n


def wire_device_bytes(device: torch.device) -> int:
    """Device memory the replicas' wire holds beyond the plan (the out-of-memory pre-flight counts
    it): on a GPU, a send and a receive ring of the largest piece; counted for any CUDA load with
    replicas, an upper bound for one whose group turns out to have no NCCL."""
    if device.type != "cuda":
        return 0
    return 2 * RING * max(CUDA_CHUNK_BYTES, CHUNK_BYTES)
