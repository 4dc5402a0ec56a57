"""How a group of ranks splits a checkpoint, and the arithmetic of sharing things out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.bounds import MAX_WORLD
from ..model.errors import LayoutError


@dataclass(frozen=True)
class Layout:
    """How the ranks of one group split a checkpoint: ``tp`` x ``ep``."""

    tp: int
    """Tensor-parallel degree: ranks that share every matrix, each a window."""
    ep: int = 1
    """Expert-parallel degree: groups of ``tp`` ranks that split the experts."""

    def __post_init__(self) -> None:
        if not (
            1 <= self.tp <= MAX_WORLD
            and 1 <= self.ep <= MAX_WORLD
            and self.tp * self.ep <= MAX_WORLD
        ):
            raise LayoutError(
                f"tp {self.tp} x ep {self.ep}: each must be >= 1 and their product at most "
                f"{MAX_WORLD}"
            )

    @property
    def world(self) -> int:
        return self.tp * self.ep

    def position(self, rank: int) -> tuple[int, int]:
        """(expert-parallel group, tensor-parallel rank) of a group rank: tp is innermost."""
        return divmod(rank, self.tp)


def share(n: int, parts: int, k: int) -> tuple[int, int]:
    """Part ``k`` of ``n`` things shared by ``parts`` in order: equal parts, the last taking the
    remainder (how expert parallelism shares experts out)."""
    per = n // parts
    return k * per, (n if k == parts - 1 else (k + 1) * per)


def part_of(i: int, n: int, parts: int) -> int:
    """The part that thing ``i`` of ``n`` falls in when :func:`share` shares them out (its
    inverse)."""
    per = n // parts
    return min(i // per, parts - 1) if per else parts - 1


def parts_of(i: np.ndarray, n: np.ndarray, parts: int) -> np.ndarray:
    """:func:`part_of` of each pair of ``i`` and ``n`` (one pass over a column)."""
    per: np.ndarray = n // parts
    result: np.ndarray = np.where(
        per > 0, np.minimum(i // np.maximum(per, 1), parts - 1), parts - 1
    )
    return result
