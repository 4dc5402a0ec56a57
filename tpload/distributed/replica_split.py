"""Who reads what with replicas: each position's runs split between the replicas
(sources/replicas.py), and the figures ``tpload plan --replicas`` prints.

Every rank computes the split from the plans alone, the same on every rank, before any read. The
plans' runs are taken as columns (:class:`Runs`: each run's tensors as integer ids, its bytes, its
batch key), without making the named items of positions other than the rank's own: only batches (a
few hundred small items a position) are made as items, to ask planning/batches.py how it reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..planning.batches import PlanRuns
from ..planning.entries import Entries
from ..planning.planner import RankPlan
from ..storage.base import Storage

Run = tuple[Sequence[str], int, "tuple[str, int] | None"]
"""A run of a position's plan: its tensor names, its window bytes, and its batch key (None: one
item)."""


@dataclass
class Runs:
    """A position's runs as columns: run ``k`` reads tensors ``ids[bounds[k]:bounds[k + 1]]`` (in
    the loop's cut order), ``nbytes[k]`` window bytes, and is batch ``batches[k]`` if one."""

    ids: np.ndarray
    bounds: np.ndarray
    nbytes: np.ndarray
    batches: dict[int, tuple[str, int]]

    @classmethod
    def of(cls, runs_of: Sequence[Run], ids: dict[str, int]) -> Runs:
        """From runs as tuples (``ids``: every name's id so far, grown here)."""
        flat = [ids.setdefault(n, len(ids)) for names, _, _ in runs_of for n in names]
        sizes = [len(names) for names, _, _ in runs_of]
        return cls(
            np.asarray(flat, dtype=np.int64),
            np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]),
            np.asarray([b for _, b, _ in runs_of], dtype=np.int64),
            {k: key for k, (_, _, key) in enumerate(runs_of) if key is not None},
        )


class Names:
    """Every stored tensor a plan can read, numbered: entry ``k``'s weight is ``k``, its scales
    follow (one table for all the positions' plans, which share their entries)."""

    def __init__(self, entries: Entries) -> None:
        self.names: list[str] = list(entries.names)
        ids = {n: k for k, n in enumerate(self.names)}
        self.scale = self._ids(entries.scales, ids)
        self.scale2 = self._ids(entries.scales2, ids)

    def _ids(self, column: Sequence[str | None], ids: dict[str, int]) -> np.ndarray:
        out: np.ndarray = np.full(len(column), -1, dtype=np.int64)
        for k, n in enumerate(column):
            if n:
                if n not in ids:
                    ids[n] = len(self.names)
                    self.names.append(n)
                out[k] = ids[n]
        return out

    def runs(self, plan: RankPlan, storage: Storage | None) -> Runs:
        """``plan``'s runs as the copy loop makes them (loading/loop.py, planning/batches.py); with
        no ``storage``, each item a run of its own (``tpload plan``: batches are the load's)."""
        index, klass = plan.index, plan.klass
        classes = np.arange(int(klass.max()) + 1 if len(klass) else 0)
        table = [plan.table.get(int(c)) for c in classes]
        scale = np.array([s is not None and s.scale is not None for s in table], dtype=bool)
        scale2 = np.array([s is not None and s.scale2 is not None for s in table], dtype=bool)
        per_class = np.array([s.read_bytes if s is not None else 0 for s in table], dtype=np.int64)
        # each item's tensors in cut order (its scales, then its weight: planning/items.py)
        cols = np.stack([self.scale[index], self.scale2[index], index], axis=1)
        keep = np.stack([scale[klass], scale2[klass], np.ones(len(index), bool)], axis=1)
        if storage is None:
            ids, item_bounds = cols[keep], np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
            return Runs(ids, item_bounds, per_class[klass], {})
        order, starts, batches = self._batches(plan, storage)
        cols, keep = cols[order], keep[order]  # the items in the loop's reading order
        ids, item_bounds = cols[keep], np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
        ends: np.ndarray = np.append(starts[1:], len(index))
        sums = np.concatenate([[0], np.cumsum(per_class[klass[order]])])
        return Runs(
            ids, item_bounds[np.append(starts, len(index))], sums[ends] - sums[starts], batches
        )

    @staticmethod
    def _batches(
        plan: RankPlan, storage: Storage
    ) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[str, int]]]:
        """The items in reading order, each run's first place in it, and each batch's key by run
        (its file and first byte), as the copy loop's PlanRuns makes them."""
        runs = PlanRuns(plan, plan.kind, storage)
        keys: dict[int, tuple[str, int]] = {}
        for r, (i, j, batched) in enumerate(runs.runs):
            if batched:  # a batch, a small item alone included: one read, keyed by its start
                p, q = runs.pieces(i, j)
                path = storage.stored(runs.names[p]).path
                keys[r] = (str(path), int(runs.spans.offset[p:q].min()))
        return runs.order, np.array([i for i, _, _ in runs.runs], dtype=np.int64), keys


class Position:
    """Who reads what at one position: each run's replica (``owner``), and views of it."""

    def __init__(self, runs_of: Runs, owner: np.ndarray, names: Sequence[str], replicas: int):
        self.runs, self.owner, self._names, self.replicas = runs_of, owner, names, replicas

    @functools.cached_property
    def _per_id(self) -> tuple[np.ndarray, np.ndarray]:
        """Each tensor id of the position's runs (in run order) and its run's replica."""
        r = self.runs
        return r.ids, np.repeat(self.owner, np.diff(r.bounds))

    @functools.cached_property
    def by_name(self) -> dict[str, int]:
        """The replica reading each tensor's window (a tensor read in several runs: its first
        run's)."""
        ids, owner = self._per_id
        names = self._names
        # reversed, so that a tensor's first run is the one kept
        return dict(
            zip(map(names.__getitem__, ids[::-1].tolist()), owner[::-1].tolist(), strict=True)
        )

    @functools.cached_property
    def by_batch(self) -> dict[tuple[str, int], int]:
        """The replica reading each batch, by (file, first byte)."""
        return {key: int(self.owner[k]) for k, key in self.runs.batches.items()}

    @functools.cached_property
    def reads(self) -> list[set[str]]:
        """Each replica's tensors read from storage at this position (what its hash plan covers)."""
        ids, owner = self._per_id
        return [
            set(map(self._names.__getitem__, ids[owner == q].tolist()))
            for q in range(self.replicas)
        ]

    def shares(self) -> list[int]:
        """Window bytes each replica reads here."""
        return [int(self.runs.nbytes[self.owner == q].sum()) for q in range(self.replicas)]


def split_runs(
    positions: Sequence[Runs], replicas: int, names: Sequence[str], units: np.ndarray | None = None
) -> list[Position]:
    """Each position's runs split between the replicas, in order: a run goes to the replica that
    reads one of its units already (a tensor; with ``units``, each tensor id's unit id: a file, for
    anchors that vouch for whole files), at this position or an earlier one (so a unit is read,
    and hashed, by one replica, whose node then holds every window of it), else to the replica with
    the fewest bytes so far (the lowest among equals). Deterministic: every rank computes the same
    from the same plans.

    A run whose units were all placed at earlier positions (most runs of every position after the
    first: tensor parallelism cuts the same tensors) follows its first unit, worked out for all of
    them at once; only the others go one by one, each seeing the bytes of every run before it.
    """
    size = max((int(p.ids.max()) + 1 for p in positions if len(p.ids)), default=0)
    unit = units[:size] if units is not None else np.arange(size)
    fixed: np.ndarray = np.full(int(unit.max()) + 1 if size else 0, -1, dtype=np.int64)
    load = [0] * replicas
    out = []
    for p in positions:
        u = unit[p.ids]
        n, starts = len(p.nbytes), p.bounds[:-1]
        first = fixed[u]  # every run reads one tensor at least
        placed = np.minimum.reduceat(first, starts) >= 0 if n else np.zeros(0, bool)
        owner = np.where(placed, first[starts], -1) if n else np.zeros(0, np.int64)
        # each replica's bytes of the placed runs before each run
        before = [
            np.concatenate([[0], np.cumsum(np.where(owner == q, p.nbytes, 0))]).tolist()
            for q in range(replicas)
        ]
        extra = [0] * replicas  # bytes of the runs placed one by one, so far
        bounds, ul, nbytes = p.bounds.tolist(), u.tolist(), p.nbytes.tolist()
        for k in np.flatnonzero(~placed).tolist():
            mine = ul[bounds[k] : bounds[k + 1]]
            r = next((f for f in (int(fixed[x]) for x in mine) if f >= 0), -1)
            if r < 0:
                now = [load[q] + before[q][k] + extra[q] for q in range(replicas)]
                r = now.index(min(now))
            for x in mine:
                if fixed[x] < 0:
                    fixed[x] = r
            extra[r] += nbytes[k]
            owner[k] = r
        for q in range(replicas):
            load[q] += before[q][-1] + extra[q]
        out.append(Position(p, owner, names, replicas))
    return out


def split(
    positions: Sequence[Sequence[Run]], replicas: int, unit: Callable[[str], object] | None = None
) -> list[Position]:
    """:func:`split_runs` of runs given as tuples of names (``unit``: each name's unit)."""
    ids: dict[str, int] = {}
    columns = [Runs.of(runs_of, ids) for runs_of in positions]
    names = list(ids)
    units = None
    if unit is not None:
        seen: dict[object, int] = {}
        units = np.asarray([seen.setdefault(unit(n), len(seen)) for n in names], dtype=np.int64)
    return split_runs(columns, replicas, names, units)


def shares(plans: Sequence[RankPlan], replicas: int) -> list[list[int]]:
    """Window bytes each replica reads at each position (``plans``: one per position), split as the
    load splits its runs (each item a run here: batches of small items are the load's)."""
    if not plans:
        return []
    names = Names(plans[0].all_entries)
    positions = [names.runs(plan, None) for plan in plans]
    return [pos.shares() for pos in split_runs(positions, replicas, names.names)]


def plan_lines(plans: Sequence[RankPlan], replicas: int, per_node: int) -> list[str]:
    """``tpload plan --replicas R``: storage bytes and interconnect bytes (in and out, between
    nodes) per node, with ranks placed node by node (rank r: replica r // len(plans), position r %
    len(plans))."""
    size, got = len(plans), shares(plans, replicas)
    nodes: dict[int, list[int]] = {}
    for g in range(size * replicas):
        q, p = divmod(g, size)
        # storage; in, out (other nodes); received within
        n = nodes.setdefault(g // per_node, [0, 0, 0, 0])
        n[0] += got[p][q]
        for q2 in range(replicas):
            if q2 == q:
                continue
            if (q2 * size + p) // per_node != g // per_node:  # the peer is on another node
                n[1] += got[p][q2]
                n[2] += got[p][q]
            else:
                n[3] += got[p][q2]
    alone = sum(plan.read_bytes for plan in plans)
    total = sum(map(sum, got))
    lines = [
        (
            f"replicas {replicas} x {size} rank(s), {per_node} rank(s) a node: the cluster reads "
            f"{total / 1e9:.3f} GB from storage (one replica's windows; "
            f"{replicas * alone / 1e9:.3f} GB "
            "when each replica reads alone)"
        ),
        f"{'node':>5} {'storage GB':>11} {'in GB':>9} {'out GB':>9} {'within GB':>10}",
    ]
    for k, (a, b, c, d) in sorted(nodes.items()):
        lines.append(f"{k:>5} {a / 1e9:>11.3f} {b / 1e9:>9.3f} {c / 1e9:>9.3f} {d / 1e9:>10.3f}")
    return lines


def file_units(names: Sequence[str], storage: Storage) -> np.ndarray:
    """Each tensor's file, numbered: the unit of anchors that vouch for whole files."""
    seen: dict[object, int] = {}
    units: np.ndarray = np.fromiter(
        (seen.setdefault(storage.stored(n).path, len(seen)) for n in names), np.int64, len(names)
    )
    return units
