"""An engine rank's staging: the windows a round sent it, back to back in the manifest's order,
read by the loader as a pre-partitioned export's rank file held in memory (storage/partitioned.py's
shape, storage/held.py's bytes): each window a whole stored tensor, its sha256 the manifest's, and a
read waits until the windows it covers have arrived, so the loader's loop checks each window as it
lands."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..model.errors import CheckpointError
from ..model.pushed import WindowEntry
from ..model.text import escape_name
from ..model.values import FileSource, Stored
from ..storage.base import StorageBase
from ..storage.catalogue import Catalogue
from ..storage.held import HeldStorage

STAGED = Path("/refresh/staged")
"""The staging's name as a file (messages only; nothing is opened)."""


def chunks(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """The messages a window of ``nbytes`` is sent in: at most ``chunk_bytes`` each (one empty
    message for an empty window, so every window is seen arriving)."""
    if nbytes == 0:
        return [(0, 0)]
    return [(a, min(a + chunk_bytes, nbytes)) for a in range(0, nbytes, chunk_bytes)]


class StagedStorage(StorageBase):
    """The table of the version (for the planner) and this rank's windows in the staging buffer."""

    per_rank = True  # each rank hashes what it serves, as for an export's rank file
    file_digests: Mapping[Path, str] | None = None
    file_source: FileSource | None = None
    anchor_files: Mapping[Path, str] | None = None

    def __init__(self, catalogue: Catalogue, windows: tuple[WindowEntry, ...]) -> None:
        self.root = catalogue.root
        self.catalogue = catalogue
        self.offsets: dict[str, int] = {}
        self.windows = {w.name: w for w in windows}
        at = 0
        for w in windows:
            self.offsets[w.name] = at
            at += w.nbytes
        self.nbytes = at

    def stored(self, name: str) -> Stored:
        w = self.windows.get(name)
        if w is None:
            raise CheckpointError(
                f"{escape_name(STAGED)}: tensor {escape_name(name)} was not sent to this rank"
            )
        return Stored(name, STAGED, self.offsets[name], w.rows, w.row_bytes, w.sha256)

    def box(
        self, name: str, view: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
    ) -> tuple[Stored, tuple[int, int], tuple[int, int]]:
        stored = self.stored(name)
        want = (rows[1] - rows[0], cols[1] - cols[0])
        if stored.nbytes != want[0] * want[1]:
            raise CheckpointError(
                f"{escape_name(STAGED)}: tensor {escape_name(name)}: {stored.nbytes} bytes were "
                f"staged, this rank's plan wants a {list(want)} byte window"
            )
        return stored.seen_as(want), (0, want[0]), (0, want[1])

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        raise CheckpointError(f"{escape_name(STAGED)}: read through the held bytes only")

    def will_need(self, stored: Stored) -> None:
        return

    def evict(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        return

    def paths(self) -> list[Path]:
        return [STAGED]

    def file_size(self, path: Path) -> int:
        return self.nbytes

    def manifest_problems(self, names: list[str]) -> list[str]:
        missing = sorted(set(names) - set(self.windows))
        return [f"tensor {escape_name(n)} was not sent to this rank" for n in missing[:10]]

    def changed(self) -> list[str]:
        return []

    def close(self) -> None:
        return


class Arrival:
    """Which windows of the staging have arrived whole, for a reader that must not read a byte
    before it did (the loader's loop runs while the windows arrive: each is checked on receipt)."""

    def __init__(self, storage: StagedStorage, timeout_s: float) -> None:
        self.cond = threading.Condition()
        self.arrived: set[str] = set()
        self.aborted: str | None = None
        self.timeout_s = timeout_s
        order = sorted(storage.offsets.items(), key=lambda kv: kv[1])
        self.names = [n for n, _ in order]
        self.starts = [at for _, at in order]
        self.ends = [at + storage.windows[n].nbytes for n, at in order]

    def done(self, name: str) -> None:
        with self.cond:
            self.arrived.add(name)
            self.cond.notify_all()

    def abort(self, why: str) -> None:
        """Wake every reader: the round ended without these bytes."""
        with self.cond:
            self.aborted = why
            self.cond.notify_all()

    def wait(self, start: int, end: int) -> None:
        """Until every window holding a byte of ``[start, end)`` has arrived whole."""
        lo = max(bisect.bisect_right(self.starts, start) - 1, 0)
        hi = bisect.bisect_left(self.starts, end) if end > start else lo + 1
        names = [n for n, e in zip(self.names[lo:hi], self.ends[lo:hi], strict=True) if e > start]
        with self.cond:
            ready = self.cond.wait_for(
                lambda: self.aborted is not None or all(n in self.arrived for n in names),
                timeout=self.timeout_s,
            )
            if self.aborted is not None or not ready:
                missing = [n for n in names if n not in self.arrived]
                raise CheckpointError(
                    f"{escape_name(STAGED)}: tensor {escape_name(missing[0] if missing else '?')} "
                    f"never arrived ({self.aborted or f'not within {self.timeout_s:g} s'})"
                )


class ArrivingStorage(HeldStorage):
    """The staging as storage/held.py holds it, each read waiting for its windows to arrive."""

    def __init__(self, inner: StagedStorage, staging: np.ndarray, arrival: Arrival) -> None:
        super().__init__(inner, {STAGED: staging})
        self.arrival = arrival

    def read(self, stored: Stored, r0: int, r1: int, out: np.ndarray) -> None:
        start = stored.offset + r0 * stored.row_bytes
        self.arrival.wait(start, start + out.size)
        super().read(stored, r0, r1, out)
