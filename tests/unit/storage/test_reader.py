"""The CPU copy path of load.py: aligned windows take the fused kernel, misaligned ones the torch fallback."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from tpload.load import _stream
from tpload.plan import Cut
from tpload.verify import fingerprint


class _Stored:
    """Just the part of Checkpoint that _stream reads: the stored bytes of one tensor."""

    def __init__(self, raw: np.ndarray) -> None:
        self.raw = raw

    def stored_window(self, name, rows, cols):
        return self.raw, rows, cols


@pytest.mark.parametrize("offset", [0, 3])  # 3: the tensor starts off word alignment in its shard
@pytest.mark.parametrize("hashed", [False, True])
def test_stream_copies_fingerprints_and_hashes_the_whole_tensor(offset: int, hashed: bool) -> None:
    data = np.random.default_rng(offset).integers(0, 256, (300, 1152), dtype=np.uint8)
    shard = np.zeros(data.size + offset, dtype=np.uint8)
    raw = shard[offset:].reshape(data.shape)
    raw[:] = data
    cut = Cut("t", (150, 300), (576, 1152), (150, 576), "U8")
    dst = torch.empty((150, 576), dtype=torch.uint8)
    sha = hashlib.sha256() if hashed else None
    fp = _stream(_Stored(raw), cut, dst, sha)
    window = data[150:300, 576:1152]
    assert np.array_equal(dst.numpy(), window)
    assert fp == tuple(fingerprint(torch.from_numpy(np.ascontiguousarray(window))).tolist())
    if hashed:
        assert sha.hexdigest() == hashlib.sha256(data.tobytes()).hexdigest()
