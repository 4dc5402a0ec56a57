"""What one rank handed to an engine, and what the engine read of it: element ranges of the stored
tensor, recorded per read, and whether the reads together cover what was handed."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from ..model.errors import LoadError

Range = tuple[int, int]
ElementRanges = tuple[Range, ...]
"""One [start, end) element range per dimension of a stored tensor: the part of it a rank holds,
or the part an engine read (not a verification Box, which cuts a 2-D byte view)."""


class HandoffError(LoadError):
    """The engine asked a handed tensor for bytes this rank does not hold, or accessed it in a way
    the hand-off does not serve."""


class Handed:
    """One tensor handed to the engine: the element ranges of the stored tensor this rank holds
    (``held``, stored coordinates) and the ranges the engine read of it (``reads``)."""

    __slots__ = ("name", "held", "reads", "taken", "whole")

    def __init__(self, name: str, held: ElementRanges, *, whole: bool) -> None:
        self.name, self.held, self.whole = name, held, whole
        self.reads: set[ElementRanges] = set()
        self.taken = False

    def read(self, part: ElementRanges | None = None) -> None:
        """The engine got these bytes (None: all of them)."""
        self.reads.add(self.held if part is None else part)

    @property
    def consumed(self) -> bool:
        return self.held in self.reads or (
            bool(self.reads) and _covers(self.held, list(self.reads))
        )

    def what(self) -> str:
        """Why it is not consumed, in a few words."""
        if not self.taken:
            return "never taken from the weights iterator"
        if not self.reads:
            return "taken, never read" + (
                "" if self.whole else f" (this rank holds {ranges_text(self.held)})"
            )
        parts = ", ".join(sorted(ranges_text(b) for b in self.reads)[:4])
        return f"only {parts} read of the {ranges_text(self.held)} this rank holds"


def _covers(whole: ElementRanges, parts: list[ElementRanges], dim: int = 0) -> bool:
    """Whether the union of ``parts`` covers ``whole``: a sweep along ``dim``, each slab between two
    part edges covered in the remaining dimensions by the parts that span it."""
    if dim == len(whole):
        return bool(parts)
    lo, hi = whole[dim]
    edges = sorted({lo, hi} | {min(max(e, lo), hi) for p in parts for e in p[dim]})
    for a, b in pairwise(edges):
        spanning = [p for p in parts if p[dim][0] <= a and b <= p[dim][1]]
        if not spanning or not _covers(whole, spanning, dim + 1):
            return False
    return True


def ranges_text(ranges: Sequence[Range]) -> str:
    """``[0:4, 8:16]``: element ranges as a message shows them."""
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in ranges) + "]"
