"""What planning needs of a catalogue (:class:`CatalogueView`): its tensors, their table, its
folder and their natural order. storage/catalogue.py's ``Catalogue`` has them, and is handed in;
planning names no storage type, so a plan stays arithmetic on the tensor table."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..model.meta import TensorMeta
from ..model.table import TensorTable


class CatalogueView(Protocol):
    """A checkpoint's tensors as the planner reads them (nothing here opens a file)."""

    @property
    def root(self) -> os.PathLike[str]:
        """The checkpoint's folder, as messages name it (planning opens nothing in it)."""
        ...

    @property
    def tensors(self) -> Mapping[str, TensorMeta]:
        """Every stored tensor, by name."""
        ...

    @property
    def table(self) -> TensorTable:
        """The same tensors as columns."""
        ...

    def names(self) -> Sequence[str]:
        """Every name in natural order (digests depend on it)."""
        ...
