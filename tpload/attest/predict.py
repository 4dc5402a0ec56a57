"""Every rank's digest for a layout, recomputed on the CPU by the load's own code.

`tpload plan --digest` prints these, `plan --write` stores them (after hashing every tensor), and
`attest verify` recomputes an attestation's digests with them: the same loop a load runs, one rank
at a time, so they are exactly what a load on any device must produce.
"""

from __future__ import annotations

import os

import torch

from ..loading.loop import run
from ..loading.planner import planner_of
from ..model.errors import CheckpointError
from ..model.progress import Meter, Silent
from ..model.values import Layout
from ..selection.config import Config
from ..sources.hashing import Hasher, spare_cores
from ..sources.storage import StorageSource
from ..storage.base import Storage
from ..storage.open import open_storage
from ..transfer.cpu import CpuTransfer
from ..verification.node import HashPlan


def predict(
    root: str | os.PathLike[str],
    config: Config,
    layout: Layout,
    kind: str,
    *,
    verify: bool = False,
    storage: Storage | None = None,
    windows: list[dict[str, list[int]]] | None = None,
    progress: Meter | None = None,
) -> list[str]:
    """Every rank's digest for this layout and kind, computed on the CPU by the load's own code.

    ``verify``: also hash every tensor the layout uses against the manifest (each once);
    any mismatch raises :class:`LoadError`, listing them all. ``storage``: an opened native folder
    to compute every rank from (the caller keeps it open and closes it); by default each rank's
    own storage is opened here. ``windows``: a list that gets, rank by rank, the fingerprint of each
    tensor the rank serves (its digest's lines: verification/store.py stores them). ``progress``:
    the command's meter, one pass a rank.
    """
    out: list[str] = []
    hashed: set[str] = set()
    shared = StorageSource(storage) if storage is not None else None  # one opening, every rank
    for rank in range(layout.world):
        mine_open = storage is None
        opened = (
            open_storage(root, tp=layout.tp, ep=layout.ep, rank=rank, world=layout.world)
            if storage is None
            else storage
        )
        try:
            opened.catalogue.refuse_headers_only("computing digests")
            planner = planner_of(opened.catalogue, config)
            planner.check_layout(layout, layout.world)
            plan = planner.plan(layout, kind, rank)
            mine: frozenset[str] = frozenset()
            if verify:
                problems = opened.manifest_problems(
                    sorted(set(plan.used_tensors) | set(plan.deferred))
                )
                if problems:
                    raise CheckpointError("\n".join(problems))
                mine = frozenset(n for n in plan.used_tensors if opened.per_rank or n not in hashed)
                hashed |= mine
            result = run(
                shared if shared is not None else StorageSource(opened),
                plan,
                transfer=CpuTransfer(torch.device("cpu")),
                hasher=Hasher(HashPlan(rank, mine), threads=min(2, max(0, spare_cores(1)))),
                samples=0,
                progress=Silent()
                if progress is None
                else progress(plan.read_bytes, plan.served, f"rank {rank} of {layout.world}"),
                ranks=opened.catalogue.ranks(),
            )
            out.append(result.digest())
            if windows is not None:
                windows.append(
                    {o.name: [int(x) for x in result.fingerprints[o.name]] for o in result.outputs}
                )
            del result  # one rank's arena at a time
        finally:
            if mine_open:
                opened.close()
    return out
