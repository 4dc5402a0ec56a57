"""What a rank does with one stored weight: an item (its cuts, named) and the served tensors it
becomes, each a slot of the rank's arena."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..codecs.base import Codec, Cut, Fit
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

    def output(self, name: str) -> Output:
        """The served tensor named ``name`` (a packed weight's or scale's; a decode's)."""
        return next(o for o in self.outputs if o.name == name)


def item_of(e: Entry, s: Shaped, offset: int) -> Item:
    """One tensor's item: its class's cuts and outputs, named, at its arena offset."""
    f = e.fit
    scales = (Cut(f.scale.name, *s.scale),) if s.scale is not None else ()
    if s.scale2 is not None:
        scales += (Cut(f.scale2.name, *s.scale2),)
    names = (e.name, *(c.name for c in scales))  # served() lists the weight, then its scales
    outputs = []
    for name, (dtype, shape, nbytes) in zip(names, s.served, strict=False):
        outputs.append(Output(name, dtype, shape, offset, nbytes))
        offset += slot(nbytes)
    return Item(e.name, e.codec, s.rule, f, Cut(e.name, *s.weight), scales, tuple(outputs))
