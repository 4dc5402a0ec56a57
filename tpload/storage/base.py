"""What the load needs from a checkpoint on disk: the one small interface every storage implements
(:class:`Storage`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from ..model.values import FileSource, Stored
from .catalogue import Catalogue


class Storage(Protocol):
    """What the load needs from a checkpoint on disk."""

    root: Path
    catalogue: Catalogue
    per_rank: bool
    """True when each rank reads files of its own: then no rank can hash for another."""
    file_digests: Mapping[Path, str] | None
    """Without a manifest, each file's whole-file sha256 the folder carries (a hub snapshot's blob
    names, a local-dir download's etags); None: none (or not for every file the load reads)."""
    file_source: FileSource | None
    """What :attr:`file_digests` come from, in words."""
    anchor_files: Mapping[Path, str] | None
    """Where :attr:`file_digests` are set, what the same source says of the files that shape the
    plan (a snapshot's JSON blob names, a download's JSON etags: ``algorithm:digest`` by path),
    which the trust anchor covers beside them (the JSON files are checked by them before they are
    read)."""

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

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`box` of many names at once, as columns; None: ask ``box`` (:class:`StorageBase`
        gives that default)."""

    def promised(self, names: Sequence[str]) -> list[str | None] | None:
        """What :meth:`stored` says each name's bytes must hash to, as columns; None: ask
        ``stored`` (:class:`StorageBase` gives that default)."""

    def file_size(self, path: Path) -> int:
        """The size of one of :meth:`paths` as opened."""

    def manifest_problems(self, names: list[str]) -> list[str]:
        """Each named tensor the manifest does not vouch for (missing, disagreeing), and each
        manifest entry that nothing holds."""

    def changed(self) -> list[str]:
        """A problem for each file read that changed since it was opened."""

    def close(self) -> None:
        """Close every file."""


class StorageBase:
    """The base tpload's storages share: the optional methods of a :class:`Storage`, with the
    defaults a storage without columns gives (the callers then ask name by name), so that the read
    sources and the batches call them plainly."""

    def spans(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`Storage.box` of many names at once, as columns (file id, first byte, byte
        count), when the storage keeps them (planning/batches.py's ``spans_of``); None: ask
        ``box``."""
        return None

    def promised(self, names: Sequence[str]) -> list[str | None] | None:
        """What :meth:`Storage.stored` says each name's bytes must hash to, for many names at once,
        when the storage has them as columns; None: ask ``stored``."""
        return None
