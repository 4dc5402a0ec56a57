"""The read-source seam: where a rank's windows come from, chosen once at setup (sources/open.py),
and the one shape every source reports its bytes and evidence in.

The copy loop (loading/loop.py) reads every window through a :class:`ReadSource` and never knows
which one it has:

* the storage itself (:class:`~tpload.sources.storage.StorageSource`): ``pread`` through
  storage/reader.py's staging ring, the hash taps fed from the same buffers;
* the replica peers (:class:`~tpload.sources.replicas.ReplicaSource`): each window read from
  storage once per cluster, by one replica (through its storage source), and received by the
  others, checked on receipt;
* (issue 30) a trainer's push: on an engine rank, the windows a trainer sent for this rank, staged
  in host memory. That is a pre-partitioned export's rank file held in memory (each window a whole
  stored tensor, in the plan's order: storage/partitioned.py), so it is a storage source over a
  storage that reads from memory instead of a file (sources/storage.py's module doc says how).

A window is asked for by what the planner cut: :meth:`ReadSource.box` says where it lies (the
stored bytes holding it, seen so that the window is a box of them), :meth:`ReadSource.blocks`
yields its bytes in order (to a hash tap too, when this rank hashes the tensor), and
:meth:`ReadSource.read_run` reads a batch of small tensors at once. A source over a storage that
keeps its tensors as columns may also say where many lie at once (``spans``: file ids, first bytes,
byte counts; ``promised``: the sha256 each must hash to), which planning/batches.py and
loading/batch.py use instead of a ``box`` and a ``stored`` a tensor; without them, they ask those.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..model.values import Box, Stored
from ..storage.reader import Tap

if TYPE_CHECKING:  # the plans read and the exchanged rows a verdict reads (annotations only)
    from ..model.figures import RankFigures
    from ..planning.planner import RankPlan

Span = tuple[int, int]
Piece = tuple[int, int, np.ndarray]
"""(first window row, first window byte column, the bytes as a 2-D uint8 view)."""


@dataclass(frozen=True)
class SourceFigures:
    """What a read source did for one rank's load, one meaning a field (docs/format.md, "The
    report's byte counters"); the load copies them into the rank's row."""

    from_storage: int | None = None
    """Window bytes of this rank's plan it read from storage itself; None: the source does not
    count them apart (the storage source: every window, the row's ``bytes_read``)."""
    from_peers: int | None = None
    """Window bytes of this rank's plan it received from another process (a replica peer, later a
    trainer); None: no window can come from one. With both counted, they add up to ``bytes_read``,
    and the ranks' ``from_storage`` add up to what ``tpload plan`` says the cluster reads."""
    sent: str = ""
    """The fold of every window this rank read and sent (hex; empty: none): the exchange's check
    of the transfers (:meth:`ReadSource.verdict`)."""
    seen: str = ""
    """The folds of the windows it received, one per sender, XOR-ed (hex; empty: none)."""
    problems: tuple[str, ...] = ()
    """This rank's own problems the source found: a file changed while it was read, a window
    changed in transit."""


class ReadSource(Protocol):
    """Where this rank's windows come from: one, chosen once at setup (sources/open.py)."""

    own_order: bool
    """Whether this rank may read its plan in an order of its own (sources/order.py: what it leads
    first): not where windows stream between ranks in the plan's reading order (replicas)."""

    def box(self, name: str, view: Span, rows: Span, cols: Span) -> tuple[Stored, Span, Span]:
        """Where a window lies (rows and byte columns of the tensor's bytes seen as ``view``): the
        stored bytes holding it, seen so that the window is a box of them, and its rows and byte
        columns there."""

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`box` of many names at once as columns (file id, first byte, byte count), when
        the storage keeps them (planning/batches.py's ``spans_of``); None: ask ``box``."""

    def promised(self, names: Sequence[str]) -> list[str | None] | None:
        """What :meth:`stored` says each name's bytes must hash to, for many names at once, when
        the storage has them as columns; None: ask ``stored``."""

    def stored(self, name: str) -> Stored:
        """The stored bytes of ``name`` this rank reads."""

    def start(self, chunk_bytes: int) -> None:
        """The loop begins: blocks of at most ``chunk_bytes`` (the transfer's staging size)."""

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
        """The window ``rows`` x ``cols`` of ``stored``, in order; with a ``tap`` (this rank hashes
        the tensor), every stored row is read and fed to it whole, in order."""

    def read_run(self, span: Stored, out: np.ndarray, *, window_bytes: int) -> None:
        """A batch's one read: the stored bytes ``span`` (one row) into ``out``; ``window_bytes``:
        the bytes of the batch's windows in it (what the counters count)."""

    def will_need(self, stored: Stored) -> None:
        """A hint: ``stored`` is read soon (a cold page cache overlaps with the copies)."""

    def storage_reads(self, plans: Mapping[int, RankPlan]) -> dict[int, Mapping[str, Box]]:
        """Each plan's windows its rank reads from storage itself: the gate's hash plan is made
        over these (a window received is never hashed by its receiver)."""

    def source(self, name: str) -> str:
        """Where this rank's window of ``name`` came from, in words ("" when read from storage)."""

    def finish(self) -> SourceFigures:
        """The loop is done: wait for what the source started; its bytes and evidence."""

    def abort(self) -> None:
        """The loop failed: stop whoever waits on this rank (never raises; a source that talks to
        peers may wait for them, within the load's timeout)."""

    def verdict(self, rows: Sequence[RankFigures]) -> list[str]:
        """What only the exchanged table shows of this source (the replicas' folds), worded: handed
        to the gate's judge."""
