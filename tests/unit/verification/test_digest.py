"""verification/digest.py's columns (digest_of) against the digest over entries, and the evidence's
fingerprint table the load hands it (verification/evidence.py's FingerprintTable)."""

from __future__ import annotations

import random

import numpy as np
import torch

from tpload.model.templates import natural_sorted
from tpload.verification.digest import digest, digest_of
from tpload.verification.evidence import FingerprintTable

DTYPES = [torch.bfloat16, torch.float8_e4m3fn, torch.uint8, torch.float32]


def _entries(rng: random.Random, n: int) -> list[tuple[str, torch.dtype, tuple[int, ...], tuple]]:
    names = {
        f"model.layers.{rng.randint(0, 99)}.mlp.experts.{rng.randint(0, 300)}.w{k}"
        for k in range(n)
    }
    return [
        (
            name,
            rng.choice(DTYPES),
            tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 3))),
            tuple(rng.randint(-(2**63), 2**63 - 1) for _ in range(3)),
        )
        for name in names
    ]


def test_the_digest_from_columns_is_the_digest_over_entries() -> None:
    """The same sha256 with and without the catalogue's ranks, shuffled, for 0-d to 3-d shapes."""
    rng = random.Random(29)
    for n in (0, 1, 7, 500):
        entries = _entries(rng, n)
        rng.shuffle(entries)
        names = [e[0] for e in entries]
        fps = np.array([e[3] for e in entries], np.int64).reshape(-1, 3)
        ranks = {name: k for k, name in enumerate(natural_sorted(names))}
        columns = ([e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries], fps)
        assert digest_of(*columns) == digest(entries)
        assert digest_of(*columns, ranks=ranks) == digest(entries, ranks=ranks) == digest(entries)


def test_the_digest_from_columns_keeps_ties_and_falls_back_to_natural_order() -> None:
    """A name served twice keeps its given order (a stable sort, as the entries' sort is); ranks
    that miss a name give natural order, the same sha256."""
    rng = random.Random(30)
    entries = _entries(rng, 60)
    entries += [
        (entries[3][0], torch.uint8, (2,), (1, 2, 3)),
        (entries[5][0], torch.uint8, (), (4, 5, 6)),
    ]
    rng.shuffle(entries)
    names = [e[0] for e in entries]
    fps = np.array([e[3] for e in entries], np.int64).reshape(-1, 3)
    columns = (names, [e[1] for e in entries], [e[2] for e in entries], fps)
    ranks = {name: k for k, name in enumerate(natural_sorted(set(names)))}
    partial = dict(list(ranks.items())[1:])
    want = digest(entries)
    assert digest_of(*columns) == digest_of(*columns, ranks=ranks) == want
    assert digest_of(*columns, ranks=partial) == digest(entries, ranks=partial) == want


def test_the_fingerprint_table_reads_as_the_mapping_it_replaces() -> None:
    """Blocks and single fingerprints in load order; a name served again reads as its latest."""
    table, want = FingerprintTable(), {}
    table.add_block(["a", "b"], np.array([[1, 2, 3], [4, 5, 6]]))
    table.add("c", (7, 8, 9))
    table.add("a", (10, 11, 12))
    table.add_block(["d"], np.array([[13, 14, 15]]))
    want = {"a": (10, 11, 12), "b": (4, 5, 6), "c": (7, 8, 9), "d": (13, 14, 15)}
    assert dict(table) == want and list(table) == ["a", "b", "c", "d"]
    assert table.fps[table.rows(["d", "a"])].tolist() == [[13, 14, 15], [10, 11, 12]]
