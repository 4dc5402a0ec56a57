"""What one rank's loop leaves: its arena (the one device buffer every served tensor is a view of)
and the :class:`LoadResult` that names the slots and carries the evidence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np
import torch

from ..planning.items import Output, Outputs
from ..sources.base import SourceFigures
from ..verification.digest import digest_of
from ..verification.evidence import FingerprintTable, WindowTable
from ..verification.hashes import HashResults


class Arena:
    """The rank's one device buffer, and each served tensor's slot in it."""

    def __init__(self, buffer: torch.Tensor, *, host: bool) -> None:
        self.buffer = buffer
        self.host = buffer.numpy() if host else None
        """The same bytes as numpy, when the transfer writes host memory: slicing it costs a
        fraction of a torch view."""
        self._typed: dict[torch.dtype, torch.Tensor] = {}

    def tensor(self, out: Output) -> torch.Tensor:
        """The served tensor: one strided view of the arena reinterpreted as its dtype."""
        typed = self._typed.get(out.dtype)
        if typed is None:
            typed = self._typed[out.dtype] = self.buffer.view(
                out.dtype
            )  # slots are 256-aligned, the arena too
        item = out.dtype.itemsize
        strides = [1] * len(out.shape)
        if 0 not in out.shape:  # no elements: any strides address nothing (and its contiguous
            for i in range(len(out.shape) - 2, -1, -1):  # ones may overflow: [0, 2**40, 2**40])
                strides[i] = strides[i + 1] * out.shape[i + 1]
        return typed.as_strided(out.shape, strides, out.offset // item)

    def bytes2d(self, out: Output, rows: int) -> np.ndarray | torch.Tensor:
        """The slot's bytes as ``[rows, row_bytes]``: numpy on the CPU, a device tensor
        elsewhere. Row bytes are worked out, not inferred: a tensor with no rows (shape ``[0, 4]``)
        has none to infer them from."""
        shape = (rows, out.nbytes // rows if rows else 0)
        if self.host is not None:
            return self.host[out.offset : out.offset + out.nbytes].reshape(shape)
        return self.buffer[out.offset : out.offset + out.nbytes].view(shape)


@dataclass
class LoadResult:
    """What one rank holds after :func:`run`: the arena, its served tensors and the evidence."""

    arena: Arena
    outputs: Sequence[Output]
    """Each served tensor, in plan order: a plan's :class:`Outputs` (columns) after a load."""
    fingerprints: FingerprintTable
    hashed: HashResults = field(default_factory=HashResults)
    windows: WindowTable = field(default_factory=lambda: WindowTable([], [], np.zeros((0, 3))))
    """Every window read: its box and the fingerprint of its stored bytes (as columns)."""
    bytes_hashed: int = 0
    device_checked: int = 0
    sampled: int = 0
    ranks: Mapping[str, int] | None = None
    """Each stored name's place in natural order (the catalogue's), for the digest's sort."""
    source: SourceFigures = field(default_factory=SourceFigures)
    """What the read source counted (its bytes, one meaning each) and its evidence."""
    _tensors: dict[str, torch.Tensor] | None = None

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """{served name: its view of the arena}, in plan order (made on first use)."""
        if self._tensors is None:
            self._tensors = {o.name: self.arena.tensor(o) for o in self.outputs}
        return self._tensors

    def drop(self) -> None:
        """Let go of the arena and its views: a load that fails after its verdict (the attestation
        could not be written) leaves nothing of it behind."""
        self._tensors = None
        self.arena = None  # type: ignore[assignment]  # released: the one state without an arena
        self.outputs = []

    @property
    def window_columns(self) -> WindowTable:
        return self.windows

    def digest(self) -> str:
        """This rank's digest of what it serves (verification/digest.py), from its outputs'
        columns: each read by one C-level ``itemgetter`` pass (``zip(*outputs)`` would hold an
        iterator a tensor at once)."""
        outputs = self.outputs
        if isinstance(outputs, Outputs):  # a plan's columns, as a load leaves them
            names, dtypes, shapes = outputs.names, outputs.dtypes, outputs.shapes
        else:
            names = list(map(_NAME, outputs))
            dtypes, shapes = list(map(_DTYPE, outputs)), list(map(_SHAPE, outputs))
        table = self.fingerprints
        fps = table.fps[table.rows(names)] if names else np.zeros((0, 3), np.int64)
        return digest_of(names, dtypes, shapes, fps, ranks=self.ranks)


_NAME, _DTYPE, _SHAPE = itemgetter(0), itemgetter(1), itemgetter(2)
"""An :class:`Output`'s name, dtype and shape (its fields' places)."""
