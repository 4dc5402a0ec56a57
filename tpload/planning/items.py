"""What a rank does with one stored weight: an item (its cuts, named) and the served tensors it
becomes, each a slot of the rank's arena."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np
import torch

from ..codecs.base import Checker, Codec, Cut, Fit, present
from .cutting import Shaped, slot
from .entries import Entry


class Output(NamedTuple):
    """One served tensor: a slot of the rank's arena."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class Item(NamedTuple):
    """One unit of work: a weight (and its scales) becoming one or more served tensors."""

    name: str
    codec: Codec
    rule: str
    """The rule that classified it, for messages."""
    fit: Fit
    weight: Cut
    scales: tuple[Cut, ...]
    """The scale's cut, and a second (global) scale's when the format has one; () if none."""
    outputs: tuple[Output, ...]

    @property
    def role(self) -> str:
        return self.codec.role

    @property
    def scale(self) -> Cut | None:
        return self.scales[0] if self.scales else None

    @property
    def read_bytes(self) -> int:
        return self.weight.nbytes + sum(s.nbytes for s in self.scales)

    @property
    def cuts(self) -> list[Cut]:
        """The scales' cuts, then the weight's: the value checks need the scales first."""
        return [*self.scales, self.weight]

    def value_feed(self, checker: Checker, cut: Cut) -> Callable[[np.ndarray, int], None]:
        """The value check ``cut``'s blocks go to (as a load feeds them): the scale's, the global
        scale's, or the weight's."""
        if cut is self.weight:
            return checker.weight
        if cut is self.scale:
            return checker.scale
        return lambda view, first_row: checker.scale2(view)

    def output(self, name: str) -> Output:
        """The served tensor named ``name`` (a packed weight's or scale's; a decode's)."""
        return next(o for o in self.outputs if o.name == name)


def item_of(e: Entry, s: Shaped, offset: int) -> Item:
    """One tensor's item: its class's cuts and outputs, named, at its arena offset."""
    f = e.fit
    scales: tuple[Cut, ...] = (Cut(present(f.scale).name, *s.scale),) if s.scale is not None else ()
    if s.scale2 is not None:
        scales += (Cut(present(f.scale2, "its second scale").name, *s.scale2),)
    names = (e.name, *(c.name for c in scales))  # served() lists the weight, then its scales
    outputs = []
    for name, (dtype, shape, nbytes) in zip(names, s.served, strict=False):
        outputs.append(Output(name, dtype, shape, offset, nbytes))
        offset += slot(nbytes)
    return Item(e.name, e.codec, s.rule, f, Cut(e.name, *s.weight), scales, tuple(outputs))


class Outputs(Sequence[Output]):
    """A plan's served tensors as columns, in plan order: each one's name, arena offset and bytes,
    and its class's layout code (``layouts[code]`` is its dtype and shape). An :class:`Output` is
    made only when one is asked for (a state dict, an engine's hand-off): a load of 92,000 tensors
    keeps a few lists, not an object a tensor."""

    def __init__(
        self,
        names: list[str],
        offsets: np.ndarray,
        nbytes: np.ndarray,
        code: np.ndarray,
        layouts: Sequence[tuple[torch.dtype, tuple[int, ...]]],
    ) -> None:
        self.names, self.offsets, self.nbytes, self.code = names, offsets, nbytes, code
        self.layouts = layouts

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, k: int) -> Output: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[Output]: ...

    def __getitem__(self, k: int | slice) -> Output | Sequence[Output]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self.names)))]
        dtype, shape = self.layouts[int(self.code[k])]
        return Output(self.names[k], dtype, shape, int(self.offsets[k]), int(self.nbytes[k]))

    def __iter__(self) -> Iterator[Output]:
        layouts = self.layouts
        for name, code, offset, nbytes in zip(
            self.names, self.code.tolist(), self.offsets.tolist(), self.nbytes.tolist(), strict=True
        ):
            dtype, shape = layouts[code]
            yield Output(name, dtype, shape, offset, nbytes)

    @property
    def dtypes(self) -> list[torch.dtype]:
        return [self.layouts[c][0] for c in self.code.tolist()]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [self.layouts[c][1] for c in self.code.tolist()]
