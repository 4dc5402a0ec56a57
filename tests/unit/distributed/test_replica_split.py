"""The replicas' split taken from the plans' columns (replica_split.py) equals the split of the
runs the copy loop makes from the named items, as it was first written (kept here as the
reference: every name a dict key, every run a tuple), on real plans with batches, scales and
experts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tpload.distributed.replica_split import Names, file_units, shares, split_runs
from tpload.loading.pick import choose, model_for
from tpload.planning.layout import Layout
from tpload.planning.planner import Planner
from tpload.selection.config import with_rules
from tpload.storage.open import open_storage

from ..loading.batch_runs import runs


@dataclass
class OldPosition:
    by_name: dict[str, int] = field(default_factory=dict)
    by_batch: dict[tuple[str, int], int] = field(default_factory=dict)
    reads: list[set[str]] = field(default_factory=list)


def old_split(
    positions: Sequence[Sequence[tuple]], replicas: int, unit: Callable | None = None
) -> list[OldPosition]:
    load = [0] * replicas
    fixed: dict[object, int] = {}
    unit = unit or (lambda n: n)
    out = []
    for runs_of in positions:
        pos = OldPosition(reads=[set() for _ in range(replicas)])
        for names, nbytes, batch in runs_of:
            known = next((fixed[unit(n)] for n in names if unit(n) in fixed), None)
            r = known if known is not None else min(range(replicas), key=lambda q: (load[q], q))
            for n in names:
                fixed.setdefault(unit(n), r)
                pos.by_name.setdefault(n, r)
                pos.reads[r].add(n)
            if batch is not None:
                pos.by_batch[batch] = r
            load[r] += nbytes
        out.append(pos)
    return out


def old_load_runs(plan: object, storage: object) -> list[tuple]:
    items, out = plan.items, []
    for ks, pieces in runs(items, plan.kind, storage, classes=plan.shapes):
        batch = None
        if pieces:
            stored = [s for per_item in pieces for s, _, _ in per_item]
            batch = (str(stored[0].path), min(s.offset for s in stored))
        out.append(
            (
                [c.name for k in ks for c in items[k].cuts],
                sum(items[k].read_bytes for k in ks),
                batch,
            )
        )
    return out


@pytest.mark.parametrize(
    "tp, ep, replicas, whole",
    [(2, 2, 2, False), (2, 2, 3, True), (4, 1, 3, False), (1, 1, 2, True)],
)
def test_the_split_from_columns_is_the_split_of_the_loop_s_runs(
    small_ckpt: Path, tp: int, ep: int, replicas: int, whole: bool
) -> None:
    layout = Layout(tp, ep)
    storage = open_storage(small_ckpt, tp=tp, ep=ep, rank=0, world=layout.world)
    try:
        config, _ = choose("auto", storage.root, pins=storage.catalogue.pins)
        planner = Planner(
            storage.catalogue, with_rules(config), model=model_for(storage.root, config)
        )
        plans = [planner.plan(layout, "packed", p) for p in range(layout.world)]
        names = Names(plans[0].all_entries)
        units = file_units(names.names, storage) if whole else None
        new = split_runs([names.runs(p, storage) for p in plans], replicas, names.names, units)
        unit = (lambda n: storage.info(n).path) if whole else None
        old = old_split([old_load_runs(p, storage) for p in plans], replicas, unit)
    finally:
        storage.close()
    assert sum(len(p.by_batch) for p in old) > 0  # batches of small tensors are in the plans
    assert len(new) == len(old)
    for a, b in zip(old, new, strict=True):
        assert b.by_name == a.by_name and b.by_batch == a.by_batch and b.reads == a.reads
    # tpload plan --replicas: each item a run, bytes by replica as the reference splits them
    per_item = [[([c.name for c in i.cuts], i.read_bytes, None) for i in p.items] for p in plans]
    want = []
    for pos, runs_of in zip(old_split(per_item, replicas), per_item, strict=True):
        per = [0] * replicas
        for item_names, nbytes, _ in runs_of:
            per[pos.by_name[item_names[0]]] += nbytes
        want.append(per)
    assert shares(plans, replicas) == want


def test_plan_replicas_prints_storage_and_interconnect_bytes_per_node(
    small_ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpload.cli import main

    argv = ["plan", str(small_ckpt), "--tp", "2", "--replicas", "2", "--nproc-per-node", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "replicas 2 x 2 rank(s), 2 rank(s) a node: the cluster reads" in out
    rows = out.split(" node  storage GB     in GB    out GB  within GB\n")[1].splitlines()[:2]
    storage = [float(r.split()[1]) for r in rows]
    assert rows[0].split()[0] == "0" and rows[1].split()[0] == "1" and min(storage) > 0
