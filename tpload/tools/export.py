"""Pre-partitioned checkpoints: each rank's windows, cut once, in a file of its own.

``python -m tpload export DIR OUT --tp 4 --ep 2`` plans every rank of the
layout against DIR, checks every byte it copies against DIR's manifest, and
writes one safetensors file per rank holding that rank's windows as stored
(the packed bytes) plus its deferred tensors whole. ``OUT/NATIVE_MANIFEST.json``
names the layout, the config (its name and the sha256 of its canonical rules, which a load of the
export must plan by), the source's tensor table (whole shapes, which the planner
needs to cut the same windows again) and, per rank file, the sha256 of every
window it holds. The reading side is :mod:`tpload.storage.partitioned`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any  # JSON rows and figures

import numpy as np

from ..loading.planner import planner_of
from ..model.errors import CheckpointError
from ..model.progress import Meter, silent
from ..model.templates import natural_key, natural_sorted
from ..model.text import escape_name
from ..model.values import MANIFEST_NAME, Layout
from ..planning.planner import RankPlan
from ..selection.config import Config
from ..sources.hashing import at_rest as gate_at_rest
from ..sources.hashing import spare_cores
from ..storage.files import atomic_write
from ..storage.partitioned import rank_file
from ..storage.pins import pins_to_write
from ..storage.reader import Reader
from ..storage.safetensors import write_safetensors
from ..storage.sharded import ShardedStorage
from ..verification.vouched import Vouched


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote."""

    out: Path
    """The folder of rank files and manifest."""
    layout: Layout
    """The layout the files are cut for."""
    rank_bytes: tuple[int, ...]
    """Data bytes of each rank's file (its windows plus deferred tensors)."""


def _verify_sources(
    storage: ShardedStorage, names: list[str], threads: int, progress: Meter | None
) -> Vouched:
    """sha256 of every tensor the export copies from, against the source manifest, through the gate
    (all problems at once): a source without per-tensor digests is refused, never exported
    unchecked."""
    return gate_at_rest(storage, names, threads=threads, what="nothing exported", progress=progress)


def _rank_tensors(
    storage: ShardedStorage, plan: RankPlan
) -> dict[str, tuple[str, tuple[int, ...], tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]]:
    """{name: (dtype, window shape, rows, cols, view)} of everything the rank's file holds: each
    window a box of its tensor's bytes seen as ``view`` (a stacked tensor cut on an inner dimension
    is seen as [experts x rows, cols]), written in that view's row order."""
    out = {}
    for item in plan.items:
        for cut in item.cuts:
            out[cut.name] = (cut.dtype, cut.shape, cut.rows, cut.cols, cut.view)
    for name in plan.deferred:  # whole: the model streams them from this file
        meta = storage.catalogue.get(name)
        out[name] = (
            meta.dtype,
            meta.shape,
            (0, meta.rows),
            (0, meta.row_bytes),
            (meta.rows, meta.row_bytes),
        )
    return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))


def export(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    layout: Layout,
    config: Config,
    *,
    hash_threads: int | None = None,
    progress: Meter | None = None,
) -> ExportSummary:
    """Write ``out``: one file per rank of ``layout`` and a manifest; see the module doc.
    ``progress``: the command's meter (the sources' check, then each rank file)."""
    storage = ShardedStorage(Path(src).absolute())
    dst = Path(out).absolute()
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"{escape_name(dst)}: export folder is not empty; give a new folder")
    try:
        storage.catalogue.refuse_headers_only("exporting it")
        planner = planner_of(storage.catalogue, config)
        planner.check_layout(layout, layout.world)
        plans = [planner.plan(layout, "packed", r) for r in range(layout.world)]
        copied = natural_sorted({n for p in plans for n in p.used_tensors + list(p.deferred)})
        threads = hash_threads if hash_threads is not None else max(1, spare_cores(1))
        checked = _verify_sources(storage, copied, threads, progress)
        if set(checked.names) != set(
            copied
        ):  # every byte it copies was checked, or nothing is written
            raise CheckpointError(
                "the gate did not vouch for every source tensor; nothing exported"
            )
        dst.mkdir(parents=True, exist_ok=True)
        source_pins = storage.catalogue.pins
        if (
            source_pins is None
        ):  # (a native folder's catalogue has its pins: read with its manifest)
            raise CheckpointError("the source's pins were not read (a bug in tpload)")
        model = source_pins.read("config.json", "model config")  # checked against the source's pins
        if (
            model is not None
        ):  # head counts for rules that cut by heads; pinned by the export's manifest below
            atomic_write(dst / "config.json", model)
        meta = {
            "tp": layout.tp,
            "ep": layout.ep,
            "world": layout.world,
            "config": config.name,
            # what the config decides, not only its name (a TOML path can be edited after):
            # a load of the export refuses other rules (loading/pick.py's refuse_other_rules)
            "config_sha256": config.rules_sha256(),
            "source": str(storage.root),
        }
        reader = Reader(storage)
        ranks, sizes = [], []
        for plan in plans:
            held = _rank_tensors(storage, plan)

            def chunks(name: str, held: dict[str, Any] = held) -> Iterator[np.ndarray]:
                _, _, rows, cols, view = held[name]
                stored, rows, cols = storage.box(name, view, rows, cols)
                for _, _, block in reader.blocks(stored, rows, cols):
                    yield block

            file = rank_file(plan.rank, layout.world)
            size = sum((r[1] - r[0]) * (c[1] - c[0]) for _, _, r, c, _ in held.values())
            sink = (progress or silent)(size, len(held), f"writing {file}")
            digests = write_safetensors(
                dst / file,
                [(n, d, s) for n, (d, s, *_) in held.items()],
                chunks,
                {"format": "pt", "writer": "tpload.export", "rank": str(plan.rank)}
                | {k: str(v) for k, v in meta.items()},
                sink,
            )
            sink.close()
            ranks.append(
                {
                    "file": file,
                    "tensors": {
                        n: {"dtype": d, "shape": list(s), "sha256": digests[n]}
                        for n, (d, s, *_) in held.items()
                    },
                }
            )
            sizes.append(size)
        changed = storage.changed()
        if changed:
            raise CheckpointError(
                "the source changed during the export; nothing exported:\n  - "
                + "\n  - ".join(changed)
            )
        # The source's whole table (skipped tensors too: a load must classify every name the same
        # way).
        cat = storage.catalogue
        table = {
            n: {
                "file": m.file,
                "dtype": m.dtype,
                "shape": list(m.shape),
                "sha256": cat.promised(n),
            }
            for n, m in cat.tensors.items()
        }
        pins = pins_to_write(
            dst, known={"config.json": hashlib.sha256(model).hexdigest()} if model else None
        )
        doc = {"format": 1, "partitioned": meta, "files": pins, "tensors": table, "ranks": ranks}
        atomic_write(dst / MANIFEST_NAME, json.dumps(doc, indent=1))  # last: else no export
    finally:
        storage.close()
    return ExportSummary(dst, layout, tuple(sizes))
