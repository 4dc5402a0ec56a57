"""A native checkpoint folder: shards, index, manifest; each rank reads its windows of shared
shards."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import SNAPSHOT, FileSource, Stored
from . import hub, localdir
from .base import StorageBase
from .catalogue import Catalogue, read_native
from .files import Shard, folder_of
from .pagecache import drop_ranges
from .pins import PLAN_FILES
from .safetensors import TableRows, TensorInfo


class Files:
    """Open shard handles, one per path, opened on first use (thread-safe)."""

    def __init__(self) -> None:
        self._open: dict[Path, Shard] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> Shard:
        shard = self._open.get(path)
        if shard is None:
            with self._lock:
                shard = self._open.get(path)
                if shard is None:
                    shard = self._open[path] = Shard(path)
        return shard

    def changed(self) -> list[str]:
        with self._lock:
            opened = list(self._open.items())
        return [
            f"{escape_name(p)}: {why}; what was read from it cannot be trusted"
            for p, s in opened
            if (why := s.changed())
        ]

    def close(self) -> None:
        with self._lock:
            for s in self._open.values():
                s.close()
            self._open.clear()


class FileReads(StorageBase):
    """What both storages do the same way: ``pread`` through one handle per file, readahead and
    eviction advice, the changed-file check. Subclasses set ``files`` and say where bytes are."""

    files: Files
    file_digests: Mapping[Path, str] | None = None
    file_source: FileSource | None = None
    anchor_files: Mapping[Path, str] | None = None

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        self.files.get(stored.path).read_into(
            stored.offset + r0 * stored.row_bytes, out, tensor=stored.name
        )

    def will_need(self, stored: Stored) -> None:
        if hasattr(os, "POSIX_FADV_WILLNEED"):
            self.files.get(stored.path).advise(stored.offset, stored.nbytes, os.POSIX_FADV_WILLNEED)

    def evict(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        drop_ranges(path, ranges)

    def changed(self) -> list[str]:
        return self.files.changed()

    def file_size(self, path: Path) -> int:
        return self.files.get(path).opened.size

    def close(self) -> None:
        self.files.close()


class ShardedStorage(FileReads):
    """The shards of a native folder, read with ``pread``."""

    per_rank = False

    def __init__(self, root: Path, *, manifest: bool = True) -> None:
        named, root = root, folder_of(root)  # a .gguf file: its folder vouches for it
        self.root = root
        snapshot = hub.is_snapshot(root)
        local = localdir.LocalDir(root) if not snapshot and localdir.is_local_dir(root) else None
        checked: dict[str, bytes] = {}
        if snapshot:
            checked = hub.check_small_files(root)
        elif local is not None:
            # the JSON files with download metadata, by their etags, before they are read
            checked = local.check_small_files()
        self.catalogue: Catalogue
        self.catalogue, self.locations = read_native(named, manifest=manifest, checked=checked)
        self.files = Files()
        self.file_digests: Mapping[Path, str] | None = None
        """Without a manifest, each shard's expected sha256: a hub snapshot's blob name, or a
        local-dir download's etag (set only when every file the load reads has one)."""
        self.file_source: FileSource | None = None
        """What :attr:`file_digests` come from, in words (the gate's note and messages)."""
        self.local: localdir.LocalDir | None = None
        """A local-dir download without a manifest: its vouched etags and unvouched files (even when
        :attr:`file_digests` is None: `tpload manifest` still checks the vouched ones)."""
        table = self.catalogue.table
        shards = sorted(table.files[i] for i in np.unique(table.file_id).tolist())
        # the anchor covers the JSON files that shape the plan too, by the same names or etags
        shaping = [n for n in PLAN_FILES if os.path.lexists(root / n)]
        if snapshot and self.catalogue.manifest is None:
            self.file_digests = {root / f: d for f, d in hub.shard_digests(root, shards).items()}
            self.file_source = SNAPSHOT
            self.anchor_files = {
                root / n: f"{b.algorithm}:{b.digest}" for n, b in hub.blobs(root, shaping).items()
            }
        elif local is not None and self.catalogue.manifest is None:
            self.local = local
            local.shard_digests(shards)
            self.file_source = local.source()
            if not local.unvouched:
                self.file_digests = dict(local.digests)
                self.anchor_files = {
                    root / n: f"{m.blob.algorithm}:{m.blob.digest}"
                    for n, m in local.fresh.items()
                    if n in shaping
                }

    def info(self, name: str) -> TensorInfo:
        try:
            return self.locations[name]
        except KeyError:
            raise CheckpointError(
                f"{escape_name(self.root)}: no tensor named {escape_name(name)}"
            ) from None

    def stored(self, name: str) -> Stored:
        """Made per call from the catalogue (a tuple made in C), not kept: see :class:`Stored`."""
        rows = self.locations
        if isinstance(rows, TableRows) and name in rows:  # read from the table's columns
            return rows.stored(name, self.catalogue.promised(name))
        info = self.info(name)  # no such tensor: raises, naming it
        return Stored(
            name, info.path, info.begin, info.rows, info.row_bytes, self.catalogue.promised(name)
        )

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]:
        return self.stored(name).seen_as(view), rows, cols

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Where each named tensor's bytes are, as columns from the table (its file id, first
        byte, byte count): :meth:`box` of many at once, the window a box of its stored tensor in the
        cut's own view. None when a name is not in the table (then ``box`` words why)."""
        rows = self.locations
        if not isinstance(rows, TableRows):
            return None
        try:
            k = np.fromiter(map(rows.table.row.__getitem__, names), np.int64, len(names))
        except KeyError:
            return None
        t = rows.table
        return t.file_id[k].astype(np.int64), t.begin[k].astype(np.int64), t.nbytes[k]

    def promised(self, names: Sequence[str]) -> list[str | None]:
        """Each name's manifest sha256, as :meth:`stored` gives it (None: no entry): one column
        read for the batch, not a call a name."""
        return self.catalogue.promised_of(names)

    def paths(self) -> list[Path]:
        if isinstance(self.locations, TableRows):
            return self.locations.paths()
        return sorted({i.path for i in self.locations.values()})

    def tensors_in(self, path: Path) -> list[TensorInfo]:
        """The tensors of one file, in order of their first byte."""
        if isinstance(self.locations, TableRows):
            return self.locations.in_file(path)
        return sorted((i for i in self.locations.values() if i.path == path), key=lambda i: i.begin)

    def manifest_problems(self, names: list[str]) -> list[str]:
        if self.file_digests is not None:
            # every shard is named by its sha256 or has its etag (checked whole while loading)
            return []
        if (
            self.local is not None
        ):  # a local-dir download with unvouched files: each named, and the ways on
            return self.local.problems()
        return self.catalogue.manifest_problems(names)
