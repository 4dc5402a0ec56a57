"""The storage itself as a read source: every window read with ``pread`` through storage/reader.py's
ring of private staging buffers, the hash taps (sources/hashing.py) fed from the same buffers.

Any :class:`~tpload.storage.base.Storage` sits behind it: a native folder's shards, a
pre-partitioned export's rank file, or bytes held in memory (storage/held.py). The last is how a
trainer's push plugs in (issue 30): on an engine rank, the windows a trainer sent for this rank
arrive over a process group in the plan's order, each a whole stored tensor, which is exactly a
pre-partitioned export's rank file (storage/partitioned.py), held in memory instead of on disk.
Checked on receipt against the version manifest the trainer names (each window's sha256, as an
export's manifest lists them), it is loaded as an export's rank file is: ``per_rank`` (each rank
hashes what it serves), every window a whole stored tensor (``box``), read from the held bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..model.values import Box, Stored
from ..storage.base import Storage
from ..storage.reader import CHUNK_BYTES, Reader, Tap
from .base import Piece, SourceFigures, Span

if TYPE_CHECKING:  # the plans read and the exchanged rows a verdict reads (annotations only)
    from ..model.figures import RankFigures
    from ..planning.planner import RankPlan


class StorageSource:
    """This rank reads every window of its plan from its storage."""

    own_order = True
    """Nobody waits on this rank's reads: it reads in the order that shares them best."""

    def __init__(self, storage: Storage, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.storage = storage
        self.reader = Reader(storage, chunk_bytes=chunk_bytes)

    def box(self, name: str, view: Span, rows: Span, cols: Span) -> tuple[Stored, Span, Span]:
        return self.storage.box(name, view, rows, cols)

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`box` of many names at once as columns (file id, first byte, byte count), when
        the storage keeps them (planning/batches.py's ``spans_of``); None: ask ``box``."""
        return self.storage.spans(names)

    def promised(self, names: Sequence[str]) -> list[str | None] | None:
        """What :meth:`stored` says each name's bytes must hash to, for many names at once, when
        the storage has them as columns; None: ask ``stored``."""
        return self.storage.promised(names)

    def stored(self, name: str) -> Stored:
        return self.storage.stored(name)

    def start(self, chunk_bytes: int) -> None:
        if chunk_bytes != self.reader.chunk_bytes:
            self.reader = Reader(self.storage, chunk_bytes=chunk_bytes)

    def blocks(
        self,
        stored: Stored,
        rows: Span,
        cols: Span,
        *,
        tap: Tap | None = None,
        row_multiple: int = 1,
        split_rows: bool = True,
    ) -> Iterator[Piece]:
        return self.reader.blocks(
            stored, rows, cols, tap=tap, row_multiple=row_multiple, split_rows=split_rows
        )

    def read_run(self, span: Stored, out: np.ndarray, *, window_bytes: int) -> None:
        self.storage.read(span, 0, span.rows, out.reshape(span.rows, span.row_bytes))

    def will_need(self, stored: Stored) -> None:
        self.storage.will_need(stored)

    def storage_reads(self, plans: Mapping[int, RankPlan]) -> dict[int, Mapping[str, Box]]:
        return {p: plan.reads for p, plan in plans.items()}

    def source(self, name: str) -> str:
        return ""

    def finish(self) -> SourceFigures:
        self.reader.drain()
        return SourceFigures(problems=tuple(self.storage.changed()))

    def abort(self) -> None:
        return  # nobody waits on a rank that reads alone

    def verdict(self, rows: Sequence[RankFigures]) -> list[str]:
        return []
