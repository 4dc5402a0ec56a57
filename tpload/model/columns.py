"""Tables held as columns: a record a row, made only when one is asked for.

A load keeps some tables to its end (the manifest, the hash results); held as one object a tensor
they would be tens of thousands more objects for the collector to walk at every full collection,
while a few lists and one name -> row dict (of strings and ints, which it does not track) are a
handful."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from typing import TypeVar

V = TypeVar("V")


class RowTable(Mapping[str, V]):
    """A mapping of names to records kept as columns: each name's row in ``_row``; a subclass
    makes the record of row ``k`` (:meth:`_record`)."""

    def __init__(self) -> None:
        self._row: dict[str, int] = {}

    @abstractmethod
    def _record(self, name: str, k: int) -> V:
        """The record of ``name``, row ``k``."""

    def __getitem__(self, name: str) -> V:
        return self._record(name, self._row[name])

    def __contains__(self, name: object) -> bool:
        return name in self._row

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)
