"""Proof that the served bytes are the checkpoint's: hashes, fingerprints, digests.

Three layers, cheapest last:

* **sha256** of every official tensor a node uses, against NATIVE_MANIFEST.json.
  In ``node`` mode the node's ranks split that work (balanced by bytes), so
  each byte is hashed once per node; ``rank`` mode hashes everything a rank
  reads on that rank (the seed's behaviour); ``off`` hashes nothing.
* a **fingerprint** of each served tensor, computed where it lives (CPU or
  GPU) with integer torch reductions, so device bytes are checked against the
  host window without copying them back.
* the rank **digest**: sha256 over every served tensor's name, dtype, shape
  and fingerprint, in natural name order (README, "Digests").

Fingerprint of a tensor seen as bytes ``[R, C]`` (a 1-D tensor is one row):
take words of ``w`` bytes, ``w`` the largest of 8, 4, 2, 1 dividing ``C``,
as little-endian signed integers ``x[r, j]``; then, in int64 arithmetic that
wraps modulo 2**64,

    total = sum x[r, j]
    rows  = sum (r + 1) * sum_j x[r, j]
    cols  = sum (j + 1) * sum_r x[r, j]

Integer sums are exact and order-free, so the triple is identical on any
device and any reduction order; a changed byte changes ``total``, and a
moved word changes ``rows`` or ``cols``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import torch

from .checkpoint import natural_key

VERIFY_MODES = ("node", "rank", "off")
_WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def as_bytes2d(t: torch.Tensor) -> torch.Tensor:
    """A served tensor (or window) as a 2-D uint8 view ``[rows, row_bytes]``."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() == 1:
        t = t.reshape(1, -1)
    elif t.dim() > 2:
        t = t.reshape(t.shape[0], -1)
    return t.view(torch.uint8)


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """The int64 triple ``(total, rows, cols)`` of a 2-D uint8 tensor, on its device.

    Returned as a tensor so callers can batch the device-to-host sync.
    """
    r, c = t.shape
    if r == 0 or c == 0:
        return torch.zeros(3, dtype=torch.int64, device=t.device)
    w = next(w for w in (8, 4, 2, 1) if c % w == 0)
    words = t if w == 1 else _word_view(t, w)
    if w != 8:
        words = words.to(torch.int64)  # int32/int16 sums are slow; only scales and odd rows land here
    row_sums, col_sums = words.sum(dim=1), words.sum(dim=0)
    ri = torch.arange(1, r + 1, dtype=torch.int64, device=t.device)
    ci = torch.arange(1, c // w + 1, dtype=torch.int64, device=t.device)
    return torch.stack([row_sums.sum(), (row_sums * ri).sum(), (col_sums * ci).sum()])


def _word_view(t: torch.Tensor, w: int) -> torch.Tensor:
    """``t`` reinterpreted as ``w``-byte words; copies only a misaligned host window."""
    try:
        return t.view(_WORD_DTYPES[w])
    except RuntimeError:  # a file offset that is not w-aligned: words need their own buffer
        return t.contiguous().view(_WORD_DTYPES[w])


def host_fingerprint(window: np.ndarray) -> tuple[int, int, int]:
    """The same triple for a host byte window (a view into a mapped shard)."""
    return tuple(fingerprint(torch.from_numpy(window)).tolist())


def digest(entries: Iterable[tuple[str, torch.dtype, tuple[int, ...], tuple[int, int, int]]]) -> str:
    """sha256 over ``name|dtype|shape|total|rows|cols`` lines, names in natural order."""
    h = hashlib.sha256()
    for name, dtype, shape, fp in sorted(entries, key=lambda e: natural_key(e[0])):
        h.update(f"{name}|{str(dtype).removeprefix('torch.')}|{'x'.join(map(str, shape))}|{fp[0]}|{fp[1]}|{fp[2]}\n".encode())
    return h.hexdigest()


def assign_hashing(sizes: dict[str, int], ranks: list[int],
                   users: dict[str, list[int]] | None = None) -> dict[int, list[str]]:
    """Split whole tensors between ranks, balanced by bytes (largest first, to the lightest rank).

    With ``users`` (tensor -> the ranks that read a window of it), a tensor goes only
    to one of its readers: no rank touches a tensor it does not serve (an expert of
    another ep group), and a rank done with a shard is done hashing it too.
    Deterministic given its inputs, so every rank of a node computes the same split.
    """
    load = {r: 0 for r in ranks}
    out: dict[int, list[str]] = {r: [] for r in ranks}
    for name in sorted(sizes, key=lambda n: (-sizes[n], natural_key(n))):
        r = min((users or {}).get(name) or ranks, key=lambda k: (load[k], k))
        out[r].append(name)
        load[r] += sizes[name]
    return out
