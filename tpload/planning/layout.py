"""The arithmetic of sharing things out among a layout's ranks (the layout itself, :class:`Layout`,
is a value on the data floor: model/values.py; named here too for the callers that know it so)."""

from __future__ import annotations

import numpy as np

from ..model.values import Layout

__all__ = ["Layout", "part_of", "parts_of", "share"]


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
