"""The fingerprint: its two implementations (compiled host pass, torch ops) against a plain Python
reading of the definition in kernels/fingerprint.py, what it catches, and the rank digest."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch

from tpload.kernels.fingerprint import (
    DeviceFingerprint,
    HostFingerprint,
    decoded_fingerprint,
    fingerprint,
    host_fingerprint,
    not_finite,
    word_width,
    word_widths,
)
from tpload.verification.digest import digest

pytestmark = pytest.mark.usefixtures("implementation")  # numba's kernels, then ahead-of-time

Triple = tuple[int, int, int]


def definition(window: np.ndarray) -> Triple:
    """The README definition in Python ints: words of the largest of 8, 4, 2, 1 bytes dividing the
    row width, little-endian, signed except 1-byte words; the three sums taken modulo 2**64."""
    rows, width = window.shape
    w = next((k for k in (8, 4, 2, 1) if width % k == 0), 1) if width else 1
    data = np.ascontiguousarray(window).tobytes()
    words = (
        np.frombuffer(data, dtype=f"<i{w}" if w > 1 else "u1").reshape(rows, width // w).tolist()
    )
    total = sum(sum(row) for row in words)
    by_rows = sum((r + 1) * sum(row) for r, row in enumerate(words))
    by_cols = sum((j + 1) * sum(row[j] for row in words) for j in range(width // w))

    def signed64(v: int) -> int:
        v %= 1 << 64
        return v - (1 << 64) if v >= 1 << 63 else v

    return signed64(total), signed64(by_rows), signed64(by_cols)


def device(window: np.ndarray, block_rows: int = 1 << 30) -> Triple:
    """DeviceFingerprint (torch ops, here on the CPU), fed ``block_rows`` rows at a time."""
    t = torch.from_numpy(
        window if all(s >= 0 for s in window.strides) else np.ascontiguousarray(window)
    )
    fp = DeviceFingerprint(window.shape[1], t.device)
    for r in range(0, window.shape[0], block_rows):
        fp.add(t[r : r + block_rows], r)
    return tuple(fp.value().tolist())


def host(window: np.ndarray, block_rows: int = 1 << 30) -> Triple:
    fp = HostFingerprint(window.shape[1])
    for r in range(0, window.shape[0], block_rows):
        fp.add(window[r : r + block_rows], r)
    return fp.value()


def random_bytes(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    a[::3] = 0xFF  # all-ones words (negative when signed) push the sums around
    return a


def misaligned(a: np.ndarray, skew: int = 3) -> np.ndarray:
    buf = np.zeros(a.size + skew, dtype=np.uint8)
    out = buf[skew:].reshape(a.shape)
    out[...] = a
    return out


WIDE = random_bytes((40, 96), 1)
WINDOWS = {
    "contiguous": random_bytes((32, 64)),
    "cols-of-wider-rows": WIDE[:, 16:48],
    "odd-offset-cols": WIDE[:, 3:39],
    "misaligned": misaligned(random_bytes((17, 40), 2)),
    "misaligned-window": misaligned(WIDE)[5:30, 8:72],
    "row-step": WIDE[::3, :56],
    "reversed-rows": WIDE[::-1, 8:40],
    "transposed": np.ascontiguousarray(random_bytes((24, 9)).T).T,
    "width-7": random_bytes((11, 7), 3),
    "width-38": random_bytes((13, 38), 4),
    "width-36": random_bytes((13, 36), 5),
    "width-1": random_bytes((50, 1), 6),
    "one-row": random_bytes((1, 1000), 7),
    "wide-rows": random_bytes((3, 1152), 8),
}


@pytest.mark.parametrize("name", list(WINDOWS))
def test_host_and_device_fingerprints_follow_the_definition(name: str) -> None:
    window = WINDOWS[name]
    want = definition(window)
    assert host(window) == want == host_fingerprint(window)
    assert device(window) == want


@pytest.mark.parametrize(
    "name", ["contiguous", "cols-of-wider-rows", "misaligned-window", "width-7", "reversed-rows"]
)
@pytest.mark.parametrize("block_rows", [1, 5, 16])
def test_fingerprints_summed_in_row_blocks_are_the_whole_windows(
    name: str, block_rows: int
) -> None:
    window = WINDOWS[name]
    assert host(window, block_rows) == device(window, block_rows) == definition(window)


@pytest.mark.parametrize(
    "width, pieces",
    [(64, [0, 24, 64]), (1152, [0, 512, 1024, 1152]), (38, [0, 2, 30, 38]), (36, [0, 4, 36])],
)
def test_row_pieces_add_up_to_the_whole_rows(width: int, pieces: list[int]) -> None:
    # rows wider than a buffer come in pieces; each piece at its byte column, in any order
    stored = random_bytes((9, width + 10), width)
    window = stored[:, 5 : 5 + width]
    fp = HostFingerprint(width)
    spans = list(pairwise(pieces))
    for r in reversed(range(9)):
        for c0, c1 in reversed(spans):
            fp.add(window[r : r + 1, c0:c1], r, first_col=c0)
    assert fp.value() == definition(window)


def test_add_copies_the_block_it_fingerprints() -> None:
    window = WINDOWS["misaligned-window"]
    out = np.zeros(window.shape, dtype=np.uint8)
    fp = HostFingerprint(window.shape[1])
    for r in range(0, window.shape[0], 4):
        fp.add(window[r : r + 4], r, dst=out[r : r + 4])
    np.testing.assert_array_equal(out, window)
    assert fp.value() == definition(window)


def test_add_refuses_pieces_that_split_words() -> None:
    fp = HostFingerprint(64)
    with pytest.raises(ValueError, match="whole 8-byte words"):
        fp.add(np.zeros((1, 12), np.uint8), 0, first_col=0)
    with pytest.raises(ValueError, match="whole 8-byte words"):
        fp.add(np.zeros((1, 8), np.uint8), 0, first_col=4)


def test_word_width_is_the_largest_dividing_power() -> None:
    assert [word_width(n) for n in (0, 1, 2, 3, 4, 6, 8, 12, 36, 38, 64, 1152)] == [
        1,
        1,
        2,
        1,
        4,
        2,
        8,
        4,
        4,
        2,
        8,
        8,
    ]


def test_word_widths_agrees_with_word_width() -> None:
    """The batch path's vectorized widths are word_width's, row length by row length."""
    rows = np.arange(0, 300, dtype=np.int64)
    assert word_widths(rows).tolist() == [word_width(int(n)) for n in rows]


def test_sums_wrap_modulo_2_64() -> None:
    a = np.full((4096, 64), 0x7F, dtype=np.uint8)  # int64 words of 0x7F7F...: every sum overflows
    want = definition(a)
    assert host(a, 1000) == device(a, 1000) == want
    assert want[0] != 4096 * 8 * 0x7F7F7F7F7F7F7F7F


# -- what it catches


def test_every_single_byte_change_changes_the_total() -> None:
    a = random_bytes((8, 24), 9)
    base = host_fingerprint(a)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            b = a.copy()
            b[i, j] ^= 1 << (i + j) % 8
            assert host_fingerprint(b)[0] != base[0], (i, j)


def test_moved_words_change_the_row_or_column_sum() -> None:
    a = random_bytes((32, 64), 10)
    base = host_fingerprint(a)
    rows = a.copy()
    rows[[1, 2]] = rows[[2, 1]]  # two rows swapped: the total stays, the row sum moves
    assert host_fingerprint(rows)[0] == base[0] and host_fingerprint(rows)[1] != base[1]
    cols = a.copy()
    cols[:, 0:8], cols[:, 8:16] = (
        a[:, 8:16],
        a[:, 0:8],
    )  # two word columns swapped: the column sum moves
    assert host_fingerprint(cols)[:2] == base[:2] and host_fingerprint(cols)[2] != base[2]


# -- fingerprint() of served tensors, decoded slots


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 5), (6, 1, 2, 2)])
def test_fingerprint_of_a_tensor_reads_it_as_first_dimension_by_the_rest(
    shape: tuple[int, ...],
) -> None:
    t = torch.randn(shape).to(torch.bfloat16)
    rows = shape[0] if len(shape) > 1 else 1
    want = definition(t.reshape(-1).view(torch.int16).numpy().view(np.uint8).reshape(rows, -1))
    assert fingerprint(t) == want
    assert fingerprint(t.to(torch.float32).to(torch.bfloat16).clone()) == want


@pytest.mark.parametrize("shape", [(37, 64), (4, 3), (7,)])  # rows of whole int64 words, and not
def test_decoded_fingerprint_gives_the_fingerprint_and_a_non_finite_count(
    shape: tuple[int, ...],
) -> None:
    t = torch.randn(shape).to(torch.bfloat16)
    flat = t.view(-1)
    flat[0], flat[-1] = float("nan"), float("-inf")
    rows = shape[0] if len(shape) > 1 else 1
    fp, bad = decoded_fingerprint(t)
    assert tuple(fp) == definition(t.view(torch.int16).numpy().view(np.uint8).reshape(rows, -1))
    assert int(bad) >= 1
    _, clean = decoded_fingerprint(torch.ones(shape, dtype=torch.bfloat16))
    assert int(clean) == 0


def test_decoded_fingerprint_counts_each_non_finite_element_on_the_host() -> None:
    t = torch.zeros(16, 64, dtype=torch.bfloat16)
    t[0, 0], t[5, 7], t[15, 63] = float("nan"), float("inf"), float("-inf")
    assert decoded_fingerprint(t)[1] == 3


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_not_finite_sees_nan_and_both_infinities(value: float) -> None:
    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert int(not_finite(t)) == 0
    t[17, 3] = value
    assert int(not_finite(t)) == 1
    assert int(not_finite(torch.zeros(0, dtype=torch.bfloat16))) == 0


# -- digest


def test_digest_is_order_free_and_sensitive_to_every_field() -> None:
    e = [("x.10", torch.bfloat16, (2, 2), (1, 2, 3)), ("x.2", torch.int8, (4,), (4, 5, 6))]
    base = digest(e)
    assert base == digest(list(reversed(e)))
    changed = [
        ("x.3", torch.int8, (4,), (4, 5, 6)),
        ("x.2", torch.uint8, (4,), (4, 5, 6)),
        ("x.2", torch.int8, (2, 2), (4, 5, 6)),
        ("x.2", torch.int8, (4,), (7, 5, 6)),
        ("x.2", torch.int8, (4,), (4, 7, 6)),
        ("x.2", torch.int8, (4,), (4, 5, 7)),
    ]
    digests = {digest([e[0], c]) for c in changed}
    assert base not in digests and len(digests) == len(changed)
    assert digest(e[:1]) != base


def test_the_digest_sorts_by_ranks_as_by_natural_key() -> None:
    """Ranks (the catalogue's natural order) give the digest natural_key's order; a name outside
    them falls back to natural_key for all."""
    from tpload.model.templates import natural_key
    from tpload.verification.digest import digest

    names = ["x.10", "x.2", "x.02", "y", "x.1"]
    entries = [(n, torch.bfloat16, (2, 3), (i, 2, 3)) for i, n in enumerate(names)]
    ranks = {n: i for i, n in enumerate(sorted(names, key=natural_key))}
    plain = digest(entries)
    assert digest(entries, ranks=ranks) == plain
    assert digest(entries, ranks={"x.1": 0}) == plain
    assert digest(list(reversed(entries)), ranks=ranks) == plain


@pytest.mark.parametrize("shape", [(0,), (0, 4), (4, 0), (0, 4, 5), (0, 1 << 40, 1 << 40)])
def test_a_tensor_of_no_elements_has_the_fingerprint_of_no_bytes(shape: tuple[int, ...]) -> None:
    """A shape with a zero is served (safetensors reads [0, 4] and [0, 2**40, 2**40]); its view has
    no row width to infer."""
    t = torch.zeros(1, dtype=torch.bfloat16).as_strided(shape, [1] * len(shape))  # no bytes
    rows = shape[0] if len(shape) > 1 else 1
    assert fingerprint(t) == definition(np.zeros((rows, 0), dtype=np.uint8))
