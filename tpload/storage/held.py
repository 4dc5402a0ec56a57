"""A storage whose files are held in memory: another storage's table and geometry, with its bytes
read from buffers instead of files.

What a trainer's push is on an engine rank (issue 30): a pre-partitioned export's rank file
(storage/partitioned.py: each window a whole stored tensor, in the plan's order) that arrived over a
process group instead of being written to disk. Behind sources/storage.py's read source the loop
reads it as it reads a file: the same staging buffers, the same hash taps, the same checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import FileSource, Stored
from .base import Storage, StorageBase
from .catalogue import Catalogue


class HeldStorage(StorageBase):
    """``inner``'s table, windows and manifest, with the bytes of each of its files taken from
    ``files`` (path -> the file's bytes, flat uint8): no file is opened, read or watched."""

    def __init__(self, inner: Storage, files: Mapping[Path, np.ndarray]) -> None:
        self.inner = inner
        self.files = {
            Path(p): np.ascontiguousarray(b, dtype=np.uint8).reshape(-1) for p, b in files.items()
        }
        self.root: Path = inner.root
        self.catalogue: Catalogue = inner.catalogue
        self.per_rank: bool = inner.per_rank
        self.file_digests: Mapping[Path, str] | None = inner.file_digests
        self.file_source: FileSource | None = inner.file_source
        self.anchor_files: Mapping[Path, str] | None = inner.anchor_files

    def stored(self, name: str) -> Stored:
        return self.inner.stored(name)

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]:
        return self.inner.box(name, view, rows, cols)

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        held = self.files.get(stored.path)
        start = stored.offset + r0 * stored.row_bytes
        if held is None or start + out.size > held.size:
            raise CheckpointError(
                f"{escape_name(stored.path)}: tensor {escape_name(stored.name)}: its bytes "
                f"{start}..{start + out.size} are not held ({0 if held is None else held.size} "
                "bytes are)"
            )
        out.reshape(-1)[:] = held[start : start + out.size]

    def will_need(self, stored: Stored) -> None:
        return  # in memory already

    def evict(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        return  # no page cache to drop

    def file_size(self, path: Path) -> int:
        held = self.files.get(path)
        return int(held.size) if held is not None else self.inner.file_size(path)

    def paths(self) -> list[Path]:
        return self.inner.paths()

    def manifest_problems(self, names: list[str]) -> list[str]:
        return self.inner.manifest_problems(names)

    def changed(self) -> list[str]:
        return []  # held bytes do not change: they were checked when they arrived

    def close(self) -> None:
        self.inner.close()
