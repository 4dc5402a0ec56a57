"""A pre-partitioned checkpoint (``tpload export``): each rank reads only a file of its own.

The export's ``NATIVE_MANIFEST.json`` names the layout, the source's tensor
table (whole shapes, so the planner cuts the same windows again) and, per
rank file, the sha256 of every window it holds. A rank's view: the source's
catalogue for planning, and the bytes of its own file only, where each window
is a whole stored tensor.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..model.errors import CheckpointError, LayoutError, raise_all
from ..model.meta import ITEMSIZE, TensorMeta
from ..model.templates import natural_sorted
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME, Json, JsonObject, Stored
from .catalogue import Catalogue
from .files import parse_json, read_small
from .safetensors import MAX_DIM, TensorInfo, read_header
from .sharded import FileReads, Files


def rank_file(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.safetensors"


def is_partitioned(root: Path) -> bool:
    """An export's folder: rank files and no index (a native checkpoint has an index or plain
    shards)."""
    return not os.path.lexists(root / INDEX_NAME) and any(root.glob("rank-00000-of-*.safetensors"))


def _source_table(table: Json, path: Path) -> dict[str, TensorMeta]:
    if not isinstance(table, dict):
        raise CheckpointError(f'{escape_name(path)}: export manifest has no "tensors" table')
    out, bad = {}, []
    for name, e in table.items():
        ok = (
            isinstance(e, dict)
            and isinstance(e.get("file"), str)
            and isinstance(e.get("dtype"), str)
            and e["dtype"] in ITEMSIZE
            and isinstance(e.get("shape"), list)
            and len(e["shape"]) <= 8
            and all(type(d) is int and 0 <= d < MAX_DIM for d in e["shape"])
        )
        if ok:
            out[name] = TensorMeta(name, e["file"], e["dtype"], tuple(e["shape"]))
        else:
            bad.append(
                f"{escape_name(path)}: source entry for {escape_name(name)} is not {{file, dtype, "
                "shape}"
            )
    raise_all(CheckpointError, bad, what=f"bad entries in {escape_name(path)}")
    return out


def export_config(root: Path) -> str | None:
    """The config an export records it was made with (None: not an export, or it names none)."""
    return export_rules(root)[0]


def export_rules(root: Path) -> tuple[str | None, str | None]:
    """The config an export records it was made with, and the sha256 of its canonical rules
    (``Config.rules_sha256``; None: not an export, or one from before tpload recorded it)."""
    if not is_partitioned(root) or not os.path.lexists(root / MANIFEST_NAME):
        return None, None
    path = root / MANIFEST_NAME
    doc = parse_json(read_small(path, "export manifest"), path, "export manifest")
    meta = doc.get("partitioned") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        return None, None
    name, sha = meta.get("config"), meta.get("config_sha256")
    return (
        name if isinstance(name, str) and name else None,
        sha if isinstance(sha, str) and sha else None,
    )


class PartitionedStorage(FileReads):
    """One rank's view of an export: plan with the source's table, read only this rank's file."""

    per_rank = True

    def __init__(self, root: Path, *, tp: int, ep: int, rank: int, world: int) -> None:
        self.root = root
        path = root / MANIFEST_NAME
        if not os.path.lexists(path):
            raise CheckpointError(
                f"{escape_name(path)}: a pre-partitioned checkpoint needs its manifest "
                "(the export writes it last)"
            )
        raw = read_small(path, "export manifest")
        # a JSON document: its shape is checked as it is read, below
        doc: Any = parse_json(raw, path, "export manifest")
        try:
            meta, ranks = doc["partitioned"], doc["ranks"]
            self.tp, self.ep = meta["tp"], meta["ep"]
            files = [r["file"] for r in ranks]
            if not all(type(v) is int and v >= 1 for v in (self.tp, self.ep)):
                raise ValueError("tp and ep must be integers >= 1")
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(
                f"{escape_name(path)}: not a tpload export manifest (partitioned/tensors/ranks)"
            ) from None
        self.source = str(meta.get("source", "?"))
        if (tp, ep, world) != (self.tp, self.ep, self.tp * self.ep) or len(files) != world:
            raise LayoutError(
                f"{escape_name(root)} is pre-partitioned for tp {self.tp} x ep {self.ep} "
                f"({self.tp * self.ep} ranks); this load asks for tp {tp} x ep {ep} on {world} "
                f"ranks. Load it with --tp {self.tp} --ep {self.ep} on {self.tp * self.ep} ranks, "
                f"or load the source checkpoint {escape_name(self.source)} for another layout"
            )
        if files[rank] != rank_file(rank, world):
            raise CheckpointError(
                f"{escape_name(path)}: rank {rank}'s file is listed as "
                f"{escape_name(files[rank])!r}, expected {rank_file(rank, world)}"
            )
        self.file, self.rank = files[rank], rank
        self.path = root / self.file
        table = _source_table(doc.get("tensors"), path)
        self.catalogue = Catalogue(
            root, table, None, manifest_path=path, manifest_sha256=hashlib.sha256(raw).hexdigest()
        )
        self.listed = self._listed(ranks[rank], path)
        self.windows = self._read_windows(path)
        self.files = Files()

    def _listed(self, entry: Json, path: Path) -> dict[str, JsonObject]:
        listed = entry.get("tensors") if isinstance(entry, dict) else None
        if not isinstance(listed, dict) or not all(isinstance(v, dict) for v in listed.values()):
            raise CheckpointError(
                f"{escape_name(path)}: the entry for {escape_name(self.file)} lists no tensors"
            )
        return listed

    def _read_windows(self, path: Path) -> Mapping[str, TensorInfo]:
        """The rank file's header, checked against what the manifest lists for it, and its own
        metadata against the rank it is loaded as (two swapped rank files match by names and
        shapes)."""
        header, meta = read_header(self.path, self.file)
        listed = self.listed
        where = escape_name(self.path)
        said = (meta.get("rank"), meta.get("tp"), meta.get("ep"))
        problems = (
            []
            if said == (str(self.rank), str(self.tp), str(self.ep))
            else [
                f"{where}: its metadata says rank {escape_name(said[0])} of tp "
                f"{escape_name(said[1])} x ep {escape_name(said[2])}; it is loaded as rank "
                f"{self.rank} of tp {self.tp} x ep {self.ep}"
            ]
        )
        problems += [
            f"{where}: tensor {escape_name(n)} is in the manifest's list for this file but not in "
            "the file"
            for n in listed
            if n not in header
        ]
        problems += [
            f"{where}: tensor {escape_name(n)} is in the file but not in the manifest"
            for n in header
            if n not in listed
        ]
        problems += [
            f"{where}: tensor {escape_name(n)}: header says {i.dtype} {list(i.shape)}, manifest "
            f"says {escape_name(listed[n].get('dtype'))} {escape_name(listed[n].get('shape'))}"
            for n, i in header.items()
            if n in listed
            and (i.dtype, list(i.shape)) != (listed[n].get("dtype"), listed[n].get("shape"))
        ]
        problems += [
            f"{where}: tensor {escape_name(n)}: manifest sha256 is not 64 hex digits"
            for n in listed
            if not (isinstance(listed[n].get("sha256"), str) and len(listed[n]["sha256"]) == 64)
        ]
        raise_all(CheckpointError, problems, what=f"disagreements between {where} and its manifest")
        return header

    def stored(self, name: str) -> Stored:
        try:
            i = self.windows[name]
        except KeyError:
            raise CheckpointError(
                f"{escape_name(self.path)}: tensor {escape_name(name)} is not in this rank's file "
                "(another rank holds it, or it was skipped at export)"
            ) from None
        return Stored(
            name, i.path, i.begin, i.rows, i.row_bytes, str(self.listed[name]["sha256"]).lower()
        )

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]:
        """The window is all this file holds of ``name`` (written in its view's row order): its size
        must be the plan's window's."""
        stored = self.stored(name)
        want = (rows[1] - rows[0], cols[1] - cols[0])
        if stored.nbytes != want[0] * want[1]:
            raise CheckpointError(
                f"{escape_name(self.path)}: tensor {escape_name(name)}: the file holds a "
                f"{[stored.rows, stored.row_bytes]} byte window, this load's plan wants "
                f"{list(want)} (exported with another config?)"
            )
        return stored.seen_as(want), (0, want[0]), (0, want[1])

    def paths(self) -> list[Path]:
        return [self.path]

    def manifest_problems(self, names: list[str]) -> list[str]:
        """Each named tensor (read or deferred by this rank's plan) its file does not hold, and each
        tensor the file holds that the plan does not use (then the configs differ)."""
        missing = natural_sorted(set(names) - set(self.windows))
        extra = natural_sorted(set(self.windows) - set(names))
        if not missing and not extra:
            return []
        return [
            f"{escape_name(self.path)} does not match this load's plan: missing "
            f"{', '.join(escape_name(n) for n in missing[:10]) or 'nothing'}; not planned "
            f"{', '.join(escape_name(n) for n in extra[:10]) or 'nothing'} (load it with the "
            "config, skip and defer rules it was exported with)"
        ]
