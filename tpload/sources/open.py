"""Which read source a rank's load reads through, chosen once at setup: the storage itself, or, with
replicas, the replica peers (which read through the storage source themselves)."""

from __future__ import annotations

from collections.abc import Mapping

from ..distributed.placement import Sharing, count, placement
from ..distributed.replica_split import Names, file_units, split_runs
from ..distributed.world import DistContext
from ..model.errors import OptionsError
from ..model.values import Layout
from ..planning.planner import Planner, RankPlan
from ..storage.base import Storage
from .base import ReadSource
from .replicas import Link, ReplicaSource
from .storage import StorageSource


def open_source(
    storage: Storage,
    *,
    opts: Sharing,
    ctx: DistContext,
    plans: Mapping[int, RankPlan],
    planner: Planner,
    layout: Layout,
    kind: str,
    whole_files: bool,
    seq: int,
) -> ReadSource:
    """The read source of this rank's load: the storage, or with replicas the peers (made after the
    gate's strategy is chosen, ``whole_files``: whether it vouches for whole files, and before it
    prepares: the hash plan is made over what each rank reads from storage itself). Refuses what
    replicas cannot share yet, before any read. ``plans``: this rank's and its node peers'."""
    n = count(opts)
    own = StorageSource(storage)
    if n <= 1:
        return own
    if storage.per_rank:
        raise OptionsError(
            f"replicas {n}: a pre-partitioned export (each rank reads its own rank file) is not "
            "shared between replicas yet"
        )
    at = placement(opts, ctx.world)
    if at is None:  # (n > 1 always places)
        return own
    # the split of a position depends on the positions before it: those up to the last one this
    # rank asks about (its own, its node peers' for the hash plan) are split, no further
    last = max(at.where(r)[1] for r in (ctx.rank, *plans))
    every = [planner.plan(layout, kind, p) for p in range(last + 1)]
    names = Names(every[0].all_entries)
    # files vouched for whole (hub snapshots, local-dir downloads, signed files) are shared out
    # whole: a file's windows are all read by one replica, whose node hashes the file once for the
    # cluster
    whole = whole_files or storage.file_digests is not None
    units = file_units(names.names, storage) if whole else None
    shared = split_runs([names.runs(p, storage) for p in every], n, names.names, units)
    return ReplicaSource(own, Link(ctx, at, shared, opts.timeout_s, seq))
