"""Where a checkpoint's bytes are, and how a rank reads them.

Two storages share one small interface (:class:`Storage`): a native folder of
shards (:mod:`.sharded`) and a pre-partitioned export whose ranks each read
a file of their own (:mod:`.partitioned`). Both hand the planner a
:class:`~.catalogue.Catalogue` (names, dtypes, shapes) and read bytes with
``pread`` into buffers the caller owns (:mod:`.files` says why not maps).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from .catalogue import Catalogue


class Stored(NamedTuple):
    """Stored bytes a rank reads: a whole tensor of a shard, or one window in a rank file.

    A named tuple, made when asked for and dropped after (a tuple is made in C; a load of 92,000
    tensors keeps none of them to the end, so the collector has none to walk)."""

    name: str
    """The official tensor name."""
    path: Path
    """The file that holds them."""
    offset: int
    """Absolute offset of their first byte in that file."""
    rows: int
    """Rows of their 2-D byte view (a 0-D or 1-D tensor is one row)."""
    row_bytes: int
    sha256: str | None
    """What the manifest promises for exactly these bytes (None: no manifest entry)."""

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def seen_as(self, view: tuple[int, int]) -> Stored:
        """The same bytes as ``view`` rows of ``view`` bytes (any split of them)."""
        if view == (self.rows, self.row_bytes):
            return self
        if view[0] * view[1] != self.nbytes:
            raise ValueError(f"{self.name}: {self.nbytes} bytes cannot be seen as {list(view)}")
        return self._replace(rows=view[0], row_bytes=view[1])


class Storage(Protocol):
    """What the load needs from a checkpoint on disk."""

    root: Path
    catalogue: Catalogue
    per_rank: bool
    """True when each rank reads files of its own: then no rank can hash for another."""

    def stored(self, name: str) -> Stored:
        """The stored bytes of ``name`` this rank reads."""

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]:
        """Where a window lies (rows and byte columns of the tensor's bytes seen as ``view``, a
        ``(rows, row bytes)`` split of them): the stored bytes holding it, seen so that the window
        is a box of them, and its rows and byte columns there."""

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        """Rows ``[r0, r1)`` of ``stored`` into ``out`` (contiguous uint8 ``[r1 - r0,
        row_bytes]``)."""

    def will_need(self, stored: Stored) -> None:
        """Ask the kernel to read ``stored`` ahead (a cold page cache overlaps with the copies)."""

    def evict(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        """Drop these (offset, length) ranges of ``path`` from the page cache."""

    def paths(self) -> list[Path]:
        """Every file this rank may read."""

    def manifest_problems(self, names: list[str]) -> list[str]:
        """Each named tensor the manifest does not vouch for (missing, disagreeing), and each
        manifest entry that nothing holds."""

    def changed(self) -> list[str]:
        """A problem for each file read that changed since it was opened."""

    def close(self) -> None:
        """Close every file."""


def open_storage(root: str | Path, *, tp: int, ep: int, rank: int, world: int) -> Storage:
    """The storage a rank loads from: a native folder, or its own file of a pre-partitioned one."""
    from .partitioned import PartitionedStorage, is_partitioned
    from .sharded import ShardedStorage

    path = Path(root).absolute()
    if path.is_dir() and is_partitioned(path):
        return PartitionedStorage(path, tp=tp, ep=ep, rank=rank, world=world)
    return ShardedStorage(path)
