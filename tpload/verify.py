"""Proof that the served bytes are the checkpoint's: hashes, fingerprints, digests.

Three layers, cheapest last:

* **sha256** of every official tensor a node uses, against NATIVE_MANIFEST.json.
  In ``node`` mode the node's ranks split that work (balanced by bytes), so
  each byte is hashed once per node; ``rank`` mode hashes everything a rank
  reads on that rank (the seed's behaviour); ``off`` hashes nothing.
  ``digest`` mode hashes nothing either: it trusts digests that ``tpload plan
  --write`` stored after hashing every tensor, and checks every served byte
  against them through the fingerprints below (offline.verified_prediction).
* a **fingerprint** of each served tensor, computed where it lives: on a GPU
  with integer torch reductions, so device bytes are checked against the host
  window without copying them back; on the CPU by the compiled pass that makes
  the copy (kernels.py), the same triple.
* the rank **digest**: sha256 over every served tensor's name, dtype, shape
  and fingerprint, in natural name order (README, "Digests").

Fingerprint of a tensor seen as bytes ``[R, C]`` (a 1-D tensor is one row):
take words of ``w`` bytes, ``w`` the largest of 8, 4, 2, 1 dividing ``C``,
as little-endian integers ``x[r, j]`` (signed, except 1-byte words: unsigned); then, in int64 arithmetic that
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

VERIFY_MODES = ("node", "rank", "digest", "off")
HOST_BLOCK_BYTES = 2 << 20  # CPU row blocks: cache-sized, so the int64 temporaries stay small
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


class FingerprintSum:
    """The fingerprint of a 2-D uint8 tensor ``[R, C]`` built one row block at a time.

    The triple is a sum of per-word terms, so adding row blocks in any order
    gives exactly :func:`fingerprint` of the whole; the load feeds it blocks
    while they are still in the CPU cache after their copy. Every state is a
    device tensor: nothing syncs until the caller asks for the values.
    """

    def __init__(self, cols: int, device: torch.device) -> None:
        self.width = next(w for w in (8, 4, 2, 1) if cols % w == 0) if cols else 1
        self.device = device
        self.col_index = torch.arange(1, cols // self.width + 1, dtype=torch.int64, device=device)
        self.col_sums = torch.zeros(cols // self.width, dtype=torch.int64, device=device)
        self.total = torch.zeros((), dtype=torch.int64, device=device)
        self.rows = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, block: torch.Tensor, first_row: int) -> None:
        """Add rows ``[first_row, first_row + len(block))`` (a 2-D uint8 block of the tensor)."""
        r, c = block.shape
        if r == 0 or c == 0:
            return
        words = block if self.width == 1 else _word_view(block, self.width)
        if self.width != 8:
            words = words.to(torch.int64)  # int32/int16 sums are slow; only scales and odd rows land here
        row_sums = words.sum(dim=1)
        ri = torch.arange(first_row + 1, first_row + r + 1, dtype=torch.int64, device=self.device)
        self.total += row_sums.sum()
        self.rows += (row_sums * ri).sum()
        self.col_sums += words.sum(dim=0)

    def value(self) -> torch.Tensor:
        """The int64 triple ``(total, rows, cols)`` (a device tensor)."""
        return torch.stack([self.total, self.rows, (self.col_sums * self.col_index).sum()])


def fingerprint(t: torch.Tensor, *, block_bytes: int | None = None) -> torch.Tensor:
    """The int64 triple ``(total, rows, cols)`` of a 2-D uint8 tensor, on its device.

    Returned as a tensor so callers can batch the device-to-host sync. With
    ``block_bytes`` the rows are summed in blocks of about that size (bounded
    temporaries on the CPU); the result is the same.
    """
    r, c = t.shape
    fp = FingerprintSum(c, t.device)
    step = max(1, block_bytes // max(c, 1)) if block_bytes else max(r, 1)
    for r0 in range(0, r, step):
        fp.add(t[r0:r0 + step], r0)
    return fp.value()


def _word_view(t: torch.Tensor, w: int) -> torch.Tensor:
    """``t`` reinterpreted as ``w``-byte words; copies only a misaligned host window."""
    try:
        return t.view(_WORD_DTYPES[w])
    except RuntimeError:  # a file offset that is not w-aligned: words need their own buffer
        return t.contiguous().view(_WORD_DTYPES[w])


def host_fingerprint(window: np.ndarray) -> tuple[int, int, int]:
    """The same triple for a host byte window (a view into a mapped shard)."""
    return tuple(fingerprint(torch.from_numpy(window), block_bytes=HOST_BLOCK_BYTES).tolist())


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
