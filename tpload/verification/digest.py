"""A rank's digest: one sha256 over the fingerprints of everything it serves, in natural order
(docs/format.md). What is compared with a stored prediction and across a node."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import TypeVar

import numpy as np
import torch

from ..model.templates import natural_key, natural_order
from ..model.values import Triple

_NAME = itemgetter(0)
T = TypeVar("T")


def digest(
    entries: Iterable[tuple[str, torch.dtype, tuple[int, ...], Triple]],
    *,
    ranks: Mapping[str, int] | None = None,
) -> str:
    """A rank's digest: sha256 over ``name|dtype|shape|total|rows|cols`` lines, names in natural
    order (``ranks``: each name's place in that order, when known: the catalogue's)."""
    entries = list(entries)
    if ranks is not None and all(map(ranks.__contains__, map(_NAME, entries))):
        entries.sort(key=lambda e: ranks[e[0]])
    else:
        entries.sort(key=lambda e: natural_key(e[0]))
    dtypes: dict[torch.dtype, str] = {}
    lines = []
    for name, dtype, shape, fp in entries:
        d = dtypes.get(dtype)
        if d is None:
            d = dtypes[dtype] = str(dtype).removeprefix("torch.")
        lines.append(f"{name}|{d}|{'x'.join(map(str, shape))}|{fp[0]}|{fp[1]}|{fp[2]}\n")
    return hashlib.sha256(
        "".join(lines).encode()
    ).hexdigest()  # one update: the same sha256 as line by line


def digest_of(
    names: Sequence[str],
    dtypes: Sequence[torch.dtype],
    shapes: Sequence[tuple[int, ...]],
    fps: np.ndarray,
    *,
    ranks: Mapping[str, int] | None = None,
) -> str:
    """:func:`digest` from columns (``fps[i]``: ``names[i]``'s fingerprint, ``[n, 3]``): the same
    lines in the same order, made as column passes: the order is one permutation (an argsort of
    the catalogue's places), each distinct dtype and shape is spelled once, and the lines are
    formatted from zipped columns, with no tuple a tensor held (each one held at once is one more
    for the collector to count; a full collection over a load's heap costs a tenth of a
    second)."""
    n = len(names)
    if len(dtypes) != n or len(shapes) != n or len(fps) != n:
        raise ValueError(
            f"{n} names, {len(dtypes)} dtypes, {len(shapes)} shapes, {len(fps)} fingerprints"
        )
    if n == 0:
        return hashlib.sha256(b"").hexdigest()
    order = _natural_order(names, ranks)
    by_dtype = {d: str(d).removeprefix("torch.") for d in set(dtypes)}
    by_shape = {s: "x".join(map(str, s)) for s in set(shapes)}
    # each column reordered by one C-level take (a tuple of the column, not a tuple a tensor)
    take = itemgetter(*order.tolist()) if n > 1 else _first
    f0, f1, f2 = fps[order].T.tolist()
    dtype_of = map(by_dtype.__getitem__, take(dtypes))
    shape_of = map(by_shape.__getitem__, take(shapes))
    # f-strings over zipped columns: faster than a format call a line (zip reuses its tuple)
    text = "".join(
        [
            f"{name}|{d}|{shape}|{a}|{b}|{c}\n"
            for name, d, shape, a, b, c in zip(
                take(names), dtype_of, shape_of, f0, f1, f2, strict=True
            )
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()  # one update: the same as line by line


def _first(column: Sequence[T]) -> tuple[T]:
    """A one-row column's take (``itemgetter`` of one place returns the item, not a tuple)."""
    return (column[0],)


def _natural_order(names: Sequence[str], ranks: Mapping[str, int] | None) -> np.ndarray:
    """The permutation that puts ``names`` in natural order, ties (a name twice) in their given
    order: a stable argsort of each name's place in ``ranks`` when it has every one, else of
    :func:`natural_key` (each distinct digit run's key made once for this sort)."""
    n = len(names)
    if ranks is not None:  # one pass: a place is never negative, so -1 says a name has none
        places = np.fromiter(map(ranks.get, names, repeat(-1)), np.int64, n)
        if n == 0 or int(places.min()) >= 0:
            order: np.ndarray = np.argsort(places, kind="stable")
            return order
    slow: np.ndarray = np.asarray(natural_order(names), np.int64)
    return slow
