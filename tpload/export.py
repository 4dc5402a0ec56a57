"""Pre-partitioned checkpoints: each rank's windows, cut once, in a file of its own.

``python -m tpload export DIR OUT --tp 4 --ep 2`` plans every rank of the
layout against DIR, checks every byte it copies against DIR's manifest, and
writes one safetensors file per rank holding that rank's windows as stored
(the packed bytes) plus its deferred tensors whole. ``OUT/NATIVE_MANIFEST.json``
names the layout, the source's tensor table (whole shapes, which the planner
needs to cut the same windows again) and, per rank file, the sha256 of every
window it holds.

Loading OUT with the same layout opens only the rank's own file: the plan is
the one DIR would give, but each window is the whole stored tensor of that
file, so a rank reads exactly its own file's bytes and serves exactly what a
load of DIR serves (the same digests). Any other layout is refused, naming both.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import (
    INDEX_NAME,
    MANIFEST_NAME,
    Checkpoint,
    ManifestEntry,
    TensorInfo,
    _read_json,
    natural_key,
    read_header,
    write_safetensors,
)
from .config import Config
from .errors import CheckpointError, ConfigError, LayoutError, raise_all
from .formats import DTYPES
from .plan import Layout, Planner, RankPlan

log = logging.getLogger("tpload")
ROW_CHUNK_BYTES = 16 << 20


def rank_file(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.safetensors"


def is_partitioned(root: Path) -> bool:
    """An export's folder: rank files and no index (a native checkpoint has an index or plain shards)."""
    return not (root / INDEX_NAME).exists() and any(root.glob("rank-00000-of-*.safetensors"))


def open_checkpoint(root: str | os.PathLike, layout: Layout, rank: int, world: int) -> Checkpoint:
    """The checkpoint a rank loads from: a native one, or its own file of a pre-partitioned one."""
    path = Path(root).absolute()
    if path.is_dir() and is_partitioned(path):
        return PartitionedCheckpoint(path, layout, rank, world)
    return Checkpoint(path)


# -- writing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote."""

    out: Path
    """The folder of rank files and manifest."""
    layout: Layout
    """The layout the files are cut for."""
    rank_bytes: tuple[int, ...]
    """Data bytes of each rank's file (its windows plus deferred tensors)."""


def _verify_sources(ckpt: Checkpoint, names: list[str], threads: int) -> None:
    """sha256 of every tensor the export copies from, against the source manifest (all problems at once)."""
    ckpt.check_manifest(names)
    bad = ckpt.hash_problems(names, threads=threads)
    if bad:
        raise CheckpointError(f"{len(bad)} source tensor(s) do not match the manifest; nothing exported:\n  - "
                              + "\n  - ".join(bad))


def _row_chunks(window: np.ndarray) -> list[np.ndarray]:
    step = max(1, ROW_CHUNK_BYTES // max(1, window.shape[1]))
    return [window[r:r + step] for r in range(0, window.shape[0], step)]


def _rank_tensors(ckpt: Checkpoint, plan: RankPlan) -> dict[str, tuple[str, tuple[int, ...], tuple, tuple]]:
    """{name: (dtype, stored shape, rows, cols)} of everything the rank's file holds."""
    out = {}
    for item in plan.items:
        for cut in item.cuts:
            out[cut.name] = (cut.dtype, cut.shape, cut.rows, cut.cols)
    for name in plan.deferred:  # whole: the model streams them from this file
        info = ckpt.info(name)
        rows = info.shape[0] if len(info.shape) > 1 else 1
        out[name] = (info.dtype, info.shape, (0, rows), (0, info.nbytes // rows if rows else 0))
    return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))


def export(src: str | os.PathLike, out: str | os.PathLike, layout: Layout, config: Config, *,
           hash_threads: int = 2) -> ExportSummary:
    """Write ``out``: one file per rank of ``layout`` and a manifest; see the module doc."""
    ckpt = Checkpoint(src)
    dst = Path(out).absolute()
    if dst.exists() and any(dst.iterdir()):
        raise CheckpointError(f"{dst}: export folder is not empty; give a new folder")
    planner = Planner(ckpt, config)
    planner.check_layout(layout, layout.world)
    plans = [planner.plan(layout, "packed", r) for r in range(layout.world)]
    copied = sorted({n for p in plans for n in p.used_tensors + list(p.deferred)}, key=natural_key)
    _verify_sources(ckpt, copied, hash_threads)
    dst.mkdir(parents=True, exist_ok=True)
    meta = {"tp": layout.tp, "ep": layout.ep, "world": layout.world, "config": config.name, "source": str(ckpt.root)}
    ranks, sizes = [], []
    for plan in plans:
        file = rank_file(plan.rank, layout.world)
        held = _rank_tensors(ckpt, plan)
        digests = write_safetensors(
            dst / file, [(n, d, s) for n, (d, s, _, _) in held.items()],
            lambda n, held=held: _row_chunks(ckpt.window(n, held[n][2], held[n][3])),
            {"format": "pt", "writer": "tpload.export", "rank": str(plan.rank)} | {k: str(v) for k, v in meta.items()})
        ranks.append({"file": file, "tensors": {n: {"dtype": d, "shape": list(s), "sha256": digests[n]}
                                                for n, (d, s, _, _) in held.items()}})
        sizes.append(sum(math.prod(s) * DTYPES[d].itemsize for d, s, _, _ in held.values()))
        ckpt.unmap()  # bounded page-cache pressure from the source: one rank's worth of maps at a time
    # The source's whole table (skipped tensors too: a load must classify every name the same way).
    table = {n: {"file": i.file, "dtype": i.dtype, "shape": list(i.shape),
                 "sha256": ckpt.manifest[n].sha256 if n in ckpt.manifest else None} for n, i in ckpt.tensors.items()}
    doc = {"format": 1, "partitioned": meta, "tensors": table, "ranks": ranks}
    (dst / MANIFEST_NAME).write_text(json.dumps(doc, indent=1))  # last: a folder without it is no export
    return ExportSummary(dst, layout, tuple(sizes))


# -- reading ---------------------------------------------------------------------------------------


class PartitionedCheckpoint(Checkpoint):
    """One rank's view of an export: the source's tensor table for planning, and the bytes
    of this rank's own file only.

    ``tensors`` holds the source's whole shapes (so the planner cuts the same windows);
    :meth:`info` and :meth:`window` answer from the rank's file, where each window is a
    whole stored tensor.
    """

    per_rank = True

    def __init__(self, root: Path, layout: Layout, rank: int, world: int) -> None:
        # No super().__init__(): an export has no index and its other rank files are not ours to open.
        self.root = root
        path = root / MANIFEST_NAME
        if not path.exists():
            raise CheckpointError(f"{path}: a pre-partitioned checkpoint needs its manifest (the export writes it last)")
        doc = _read_json(path, "manifest")
        try:
            meta, table, ranks = doc["partitioned"], doc["tensors"], doc["ranks"]
            self.layout = Layout(int(meta["tp"]), int(meta["ep"]))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: not a tpload export manifest (partitioned/tensors/ranks)") from None
        self.source = str(meta.get("source", "?"))
        if (layout, world) != (self.layout, self.layout.world):
            raise LayoutError(f"{root} is pre-partitioned for tp {self.layout.tp} x ep {self.layout.ep} "
                              f"({self.layout.world} ranks); this load asks for tp {layout.tp} x ep {layout.ep} on "
                              f"{world} ranks. Load it with --tp {self.layout.tp} --ep {self.layout.ep} on "
                              f"{self.layout.world} ranks, or load the source checkpoint {self.source} for another layout")
        self.file = ranks[rank]["file"]
        self.path = root / self.file
        self.tensors = {n: TensorInfo(n, self.file, self.path, e["dtype"], tuple(e["shape"]), 0,
                                      math.prod(e["shape"]) * DTYPES[e["dtype"]].itemsize)
                        for n, e in table.items()}
        self.windows = self._read_windows(ranks[rank]["tensors"])
        self.manifest = {n: ManifestEntry(self.file, self.tensors[n].dtype, self.tensors[n].shape, e["sha256"])
                         for n, e in ranks[rank]["tensors"].items()}
        self._maps = {}

    def _read_windows(self, listed: dict[str, dict]) -> dict[str, TensorInfo]:
        """The rank file's header, checked against what the manifest lists for it."""
        header = read_header(self.path, self.file)
        problems = [f"{self.path}: tensor {n} is in the manifest's list for this file but not in the file"
                    for n in listed if n not in header]
        problems += [f"{self.path}: tensor {n} is in the file but not in the manifest" for n in header if n not in listed]
        problems += [f"{self.path}: tensor {n}: header says {i.dtype} {list(i.shape)}, manifest says "
                     f"{listed[n]['dtype']} {listed[n]['shape']}" for n, i in header.items()
                     if n in listed and (i.dtype, list(i.shape)) != (listed[n]["dtype"], listed[n]["shape"])]
        raise_all(CheckpointError, problems, what=f"disagreements between {self.path} and its manifest")
        return header

    def info(self, name: str) -> TensorInfo:
        """Where ``name``'s window is in this rank's file."""
        try:
            return self.windows[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: tensor {name} is not in this rank's file "
                                  "(another rank holds it, or it was skipped at export)") from None

    def stored_window(self, name: str, rows: tuple[int, int],
                      cols: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
        """The window is all this file holds of ``name``: its shape must be the plan's."""
        stored = self.raw2d(name)
        want = (rows[1] - rows[0], cols[1] - cols[0])
        if stored.shape != want:
            raise CheckpointError(f"{self.path}: tensor {name}: the file holds a {list(stored.shape)} byte window, this "
                                  f"load's plan wants {list(want)} (exported with another config?)")
        return stored, (0, want[0]), (0, want[1])

    def shard_paths(self) -> list[Path]:
        return [self.path]

    def check_plan(self, plan: RankPlan) -> None:
        """The rank's file holds exactly what its plan reads and defers (else the configs differ)."""
        wanted = set(plan.used_tensors) | set(plan.deferred)
        extra, missing = sorted(set(self.windows) - wanted, key=natural_key), sorted(wanted - set(self.windows), key=natural_key)
        if extra or missing:
            raise ConfigError(f"{self.path} does not match this load's plan for rank {plan.rank}: "
                              f"missing {', '.join(missing[:10]) or 'nothing'}; not planned {', '.join(extra[:10]) or 'nothing'} "
                              "(load it with the config, skip and defer rules it was exported with)")
