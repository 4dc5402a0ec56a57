"""A rank's digest: one sha256 over the fingerprints of everything it serves, in natural order
(docs/format.md). What is compared with a stored prediction and across a node."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from ..model.templates import natural_key
from ..model.values import Triple

_NAME = operator.itemgetter(0)


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
    lines in the same order, made with no tuple a tensor."""
    n = len(names)
    if ranks is not None and all(map(ranks.__contains__, names)):
        keys = list(map(ranks.__getitem__, names))
        order = sorted(range(n), key=keys.__getitem__)
    else:
        order = sorted(range(n), key=lambda i: natural_key(names[i]))
    # "dtype|shape" once for each distinct pair (a checkpoint has a few hundred), not a line
    pairs = list(zip(dtypes, shapes, strict=True))
    spelled = {
        (d, shape): f"{str(d).removeprefix('torch.')}|{'x'.join(map(str, shape))}"
        for d, shape in set(pairs)
    }
    middle = list(map(spelled.__getitem__, pairs))
    f0, f1, f2 = (fps[:, i].tolist() for i in range(3)) if n else ([], [], [])
    text = "".join([f"{names[i]}|{middle[i]}|{f0[i]}|{f1[i]}|{f2[i]}\n" for i in order])
    return hashlib.sha256(text.encode()).hexdigest()
