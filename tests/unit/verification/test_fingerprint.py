"""Fingerprints, digests and the node hashing split."""

from __future__ import annotations

import numpy as np
import torch

from tpload.verify import assign_hashing, digest, fingerprint, host_fingerprint


def test_fingerprint_catches_one_changed_byte_and_moved_words() -> None:
    a = np.random.default_rng(0).integers(0, 256, (32, 64), dtype=np.uint8)
    base = host_fingerprint(a)
    b = a.copy()
    b[7, 9] ^= 0x10
    assert host_fingerprint(b) != base
    c = a.copy()
    c[[1, 2]] = c[[2, 1]]  # swap two rows: totals equal, positions not
    assert host_fingerprint(c)[0] == base[0] and host_fingerprint(c) != base
    d = a.copy()
    d[:, [0, 8]] = d[:, [8, 0]]  # swap two 8-byte word columns... of one byte each
    assert host_fingerprint(d) != base or (a[:, 0] == a[:, 8]).all()


def test_fingerprint_is_the_same_for_strided_misaligned_and_contiguous_views() -> None:
    a = np.random.default_rng(1).integers(0, 256, (16, 96), dtype=np.uint8)
    buf = np.zeros(a.size + 3, dtype=np.uint8)
    mis = buf[3:].reshape(a.shape)
    mis[:] = a
    window = a[:, 16:48]
    assert host_fingerprint(mis) == host_fingerprint(a)
    assert host_fingerprint(window) == host_fingerprint(np.ascontiguousarray(window))
    t = torch.from_numpy(np.ascontiguousarray(window))
    assert tuple(fingerprint(t).tolist()) == host_fingerprint(window)


def test_odd_row_widths_use_narrower_words() -> None:
    a = np.arange(3 * 7, dtype=np.uint8).reshape(3, 7)
    total = int(a.astype(np.int64).sum())
    assert host_fingerprint(a)[0] == total


def test_digest_is_order_free_and_sensitive() -> None:
    e = [("x.10", torch.bfloat16, (2, 2), (1, 2, 3)), ("x.2", torch.int8, (4,), (4, 5, 6))]
    assert digest(e) == digest(list(reversed(e)))
    assert digest(e) != digest([e[0], ("x.2", torch.int8, (4,), (4, 5, 7))])


def test_assign_hashing_covers_everything_once_and_balances() -> None:
    sizes = {f"t{i}": (i % 5 + 1) * 100 for i in range(40)}
    split = assign_hashing(sizes, [0, 1, 2])
    names = [n for ns in split.values() for n in ns]
    assert sorted(names) == sorted(sizes)
    loads = [sum(sizes[n] for n in ns) for ns in split.values()]
    assert max(loads) - min(loads) <= max(sizes.values())
