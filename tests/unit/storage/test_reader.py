"""Reader.blocks: exactly the window, every stored byte to the tap in order, scale-block aligned
blocks, rows wider than a buffer in pieces; a shard truncated or rewritten under an open storage."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tpload.model.errors import CheckpointError
from tpload.model.values import Stored
from tpload.storage.reader import Block, Reader
from tpload.storage.sharded import ShardedStorage

from .shards import write_tensors

ROWS, WIDTH = 300, 1152  # the tensor "t": 300 stored rows of 1152 bytes
WIDE = 10_000  # the tensor "w": 3 rows wider than a 4 KiB buffer (and not a multiple of 4 KiB)


@pytest.fixture
def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "pad": rng.integers(0, 256, 3, dtype=np.uint8),  # puts "t" off word alignment in its shard
        "t": rng.integers(0, 256, (ROWS, WIDTH), dtype=np.uint8),
        "w": rng.integers(0, 256, (3, WIDE), dtype=np.uint8),
    }


@pytest.fixture
def storage(tmp_path: Path, tensors: dict[str, np.ndarray]) -> Iterator[ShardedStorage]:
    write_tensors(tmp_path / "m.safetensors", tensors)
    s = ShardedStorage(tmp_path)
    yield s
    s.close()


class ShaTap:
    """A tap that hashes what it is fed and remembers where each block was."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.blocks: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.closed = 0

    def feed(self, block: Block) -> Future | None:
        self.sha.update(np.ascontiguousarray(block.data).tobytes())
        self.blocks.append((block.rows, block.cols))
        return None

    def close(self) -> None:
        self.closed += 1


def assemble(
    pieces: Iterator[tuple[int, int, np.ndarray]], shape: tuple[int, int]
) -> tuple[np.ndarray, list]:
    """The window put back together from its pieces (each copied at once: the buffers are reused),
    checking that every byte of it came exactly once; and each piece's (row, col, shape)."""
    out, seen, where = np.zeros(shape, dtype=np.uint8), np.zeros(shape, dtype=np.int32), []
    for r, c, view in pieces:
        out[r : r + view.shape[0], c : c + view.shape[1]] = view
        seen[r : r + view.shape[0], c : c + view.shape[1]] += 1
        where.append((r, c, view.shape))
    assert (seen == 1).all(), "a byte of the window came twice or never"
    return out, where


WINDOWS = [
    ((0, ROWS), (0, WIDTH)),
    ((150, ROWS), (0, WIDTH)),
    ((0, 150), (576, WIDTH)),
    ((150, ROWS), (576, WIDTH)),
    ((7, 8), (3, 1000)),
    ((299, 300), (0, 1)),
]


@pytest.mark.parametrize("rows, cols", WINDOWS)
def test_blocks_yield_exactly_the_window(
    storage: ShardedStorage, tensors: dict, rows: tuple, cols: tuple
) -> None:
    reader = Reader(storage, chunk_bytes=64 * WIDTH)  # 64 rows a block: the window spans several
    got, where = assemble(
        reader.blocks(storage.stored("t"), rows, cols), (rows[1] - rows[0], cols[1] - cols[0])
    )
    assert np.array_equal(got, tensors["t"][rows[0] : rows[1], cols[0] : cols[1]])
    assert all(shape[0] <= 64 for _, _, shape in where)


@pytest.mark.parametrize("rows, cols", WINDOWS)
def test_a_tap_sees_every_stored_byte_in_order(
    storage: ShardedStorage, tensors: dict, rows: tuple, cols: tuple
) -> None:
    reader, tap = Reader(storage, chunk_bytes=64 * WIDTH), ShaTap()
    got, _ = assemble(
        reader.blocks(storage.stored("t"), rows, cols, tap=tap),
        (rows[1] - rows[0], cols[1] - cols[0]),
    )
    assert np.array_equal(got, tensors["t"][rows[0] : rows[1], cols[0] : cols[1]])
    assert tap.sha.hexdigest() == hashlib.sha256(tensors["t"].tobytes()).hexdigest()
    assert (
        tap.blocks == [((a, min(a + 64, ROWS)), (0, WIDTH)) for a in range(0, ROWS, 64)]
        and tap.closed == 1
    )


def test_an_empty_tensor_closes_the_tap(tmp_path: Path) -> None:
    write_tensors(tmp_path / "m.safetensors", {"e": np.zeros((0, 4), dtype=np.uint8)})
    storage, tap = ShardedStorage(tmp_path), ShaTap()
    try:
        assert list(Reader(storage).blocks(storage.stored("e"), (0, 0), (0, 4), tap=tap)) == []
        assert tap.closed == 1 and tap.blocks == []
    finally:
        storage.close()


@pytest.mark.parametrize("chunk_rows", [50, 10])  # 50: rounded down to 32 rows; 10: raised to 32
def test_blocks_start_on_multiples_of_row_multiple(
    storage: ShardedStorage, tensors: dict, chunk_rows: int
) -> None:
    reader, rows, cols = Reader(storage, chunk_bytes=chunk_rows * WIDTH), (32, 288), (100, 900)
    got, where = assemble(
        reader.blocks(storage.stored("t"), rows, cols, row_multiple=32), (256, 800)
    )
    assert np.array_equal(got, tensors["t"][32:288, 100:900])
    assert [(r, shape[0]) for r, _, shape in where] == [(r, 32) for r in range(0, 256, 32)]


def test_tapped_blocks_stay_aligned_to_row_multiple(storage: ShardedStorage, tensors: dict) -> None:
    reader, tap = Reader(storage, chunk_bytes=50 * WIDTH), ShaTap()
    got, where = assemble(
        reader.blocks(storage.stored("t"), (64, 192), (0, WIDTH), tap=tap, row_multiple=32),
        (128, WIDTH),
    )
    assert np.array_equal(got, tensors["t"][64:192])
    assert all(a % 32 == 0 for (a, _), _ in tap.blocks) and [r for r, _, _ in where] == [
        0,
        32,
        64,
        96,
    ]
    assert tap.sha.hexdigest() == hashlib.sha256(tensors["t"].tobytes()).hexdigest()


@pytest.mark.parametrize(
    "rows, cols",
    [((0, 3), (0, WIDE)), ((1, 3), (100, 9000)), ((2, 3), (4096, 8192)), ((0, 1), (9999, WIDE))],
)
@pytest.mark.parametrize("tapped", [False, True])
def test_rows_wider_than_a_buffer_come_in_pieces(
    storage: ShardedStorage, tensors: dict, rows: tuple, cols: tuple, tapped: bool
) -> None:
    reader, tap = Reader(storage, chunk_bytes=4096), ShaTap() if tapped else None
    got, where = assemble(
        reader.blocks(storage.stored("w"), rows, cols, tap=tap),
        (rows[1] - rows[0], cols[1] - cols[0]),
    )
    assert np.array_equal(got, tensors["w"][rows[0] : rows[1], cols[0] : cols[1]])
    assert all(shape[0] == 1 and shape[1] <= 4096 for _, _, shape in where)
    if tap is not None:
        assert tap.sha.hexdigest() == hashlib.sha256(tensors["w"].tobytes()).hexdigest()
        assert tap.blocks == [
            ((r, r + 1), (c, min(c + 4096, WIDE))) for r in range(3) for c in (0, 4096, 8192)
        ]


def test_wide_rows_are_read_whole_when_they_may_not_be_split(
    storage: ShardedStorage, tensors: dict
) -> None:
    reader = Reader(storage, chunk_bytes=4096)
    got, where = assemble(
        reader.blocks(storage.stored("w"), (0, 3), (10, 20), split_rows=False), (3, 10)
    )
    assert np.array_equal(got, tensors["w"][:, 10:20]) and [r for r, _, _ in where] == [0, 1, 2]


def test_a_slow_tap_holds_its_buffer_until_done(storage: ShardedStorage, tensors: dict) -> None:
    """A tap still reading a buffer on another thread: the reader waits before reusing that
    buffer."""

    class SlowTap(ShaTap):
        def __init__(self, pool: ThreadPoolExecutor) -> None:
            super().__init__()
            self.pool, self.order = pool, threading.Lock()

        def feed(self, block: Block) -> Future:
            def later() -> None:
                time.sleep(0.01)
                with self.order:
                    super(SlowTap, self).feed(block)  # reads the buffer well after feed() returned

            return self.pool.submit(later)

    with ThreadPoolExecutor(max_workers=1) as pool:  # one worker: blocks are hashed in order
        reader, tap = Reader(storage, chunk_bytes=16 * WIDTH), SlowTap(pool)
        got, _ = assemble(
            reader.blocks(storage.stored("t"), (0, ROWS), (0, WIDTH), tap=tap), (ROWS, WIDTH)
        )
        reader.drain()
    assert np.array_equal(got, tensors["t"])
    assert tap.sha.hexdigest() == hashlib.sha256(tensors["t"].tobytes()).hexdigest()


# -- the file under an open storage -----------------------------------------------------------


def test_a_file_truncated_after_opening_names_file_and_tensor(
    storage: ShardedStorage, tmp_path: Path
) -> None:
    stored = storage.stored("t")
    os.truncate(tmp_path / "m.safetensors", stored.offset + 100 * WIDTH + 5)  # ends inside row 100
    with pytest.raises(CheckpointError) as e:
        for _ in Reader(storage, chunk_bytes=64 * WIDTH).blocks(stored, (0, ROWS), (0, WIDTH)):
            pass
    assert str(e.value).startswith(
        f"{tmp_path / 'm.safetensors'}: tensor t: file ends at byte "
        f"{stored.offset + 100 * WIDTH + 5}"
    )


def test_a_file_truncated_after_opening_fails_the_wide_reads_too(
    storage: ShardedStorage, tmp_path: Path
) -> None:
    stored = storage.stored("w")
    os.truncate(tmp_path / "m.safetensors", stored.offset + WIDE + 10)
    with pytest.raises(CheckpointError, match=r"m\.safetensors: tensor w: file ends at byte"):
        list(Reader(storage, chunk_bytes=4096).blocks(stored, (0, 3), (0, WIDE)))


def _read_once(storage: ShardedStorage) -> None:
    """Open the shard by reading from it (a storage watches the files it has read)."""
    stored = storage.stored("pad")
    storage.read(stored, 0, 1, np.empty((1, 3), dtype=np.uint8))


def test_an_untouched_storage_has_not_changed(storage: ShardedStorage) -> None:
    _read_once(storage)
    assert storage.changed() == []


def test_a_shard_grown_while_open_is_reported(storage: ShardedStorage, tmp_path: Path) -> None:
    _read_once(storage)
    size = os.path.getsize(tmp_path / "m.safetensors")
    with open(tmp_path / "m.safetensors", "ab") as f:
        f.write(b"x")
    [problem] = storage.changed()
    assert problem.startswith(
        f"{tmp_path / 'm.safetensors'}: it changed while it was loaded (size {size} -> {size + 1}"
    )


def test_a_shard_rewritten_in_place_with_the_same_size_is_reported(
    storage: ShardedStorage, tmp_path: Path
) -> None:
    _read_once(storage)
    path = tmp_path / "m.safetensors"
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\0")
    os.utime(
        path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000)
    )  # coarse clocks: a visible step
    [problem] = storage.changed()
    assert f"size {st.st_size} -> {st.st_size}, mtime {st.st_mtime_ns} -> " in problem


def test_a_shard_replaced_while_open_is_reported(storage: ShardedStorage, tmp_path: Path) -> None:
    _read_once(storage)
    path = tmp_path / "m.safetensors"
    shutil.copy2(path, tmp_path / "new")  # same bytes, same size and mtime: only the inode differs
    os.replace(tmp_path / "new", path)
    assert storage.changed() == [
        f"{path}: it was replaced by another file while it was loaded; what was read "
        "from it cannot be trusted"
    ]


def test_a_shard_deleted_while_open_is_reported(storage: ShardedStorage, tmp_path: Path) -> None:
    _read_once(storage)
    (tmp_path / "m.safetensors").unlink()
    [problem] = storage.changed()
    assert problem.startswith(f"{tmp_path / 'm.safetensors'}: cannot stat it now")


def test_stored_says_where_the_bytes_are(storage: ShardedStorage, tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    with open(path, "rb") as f:
        data_start = 8 + int.from_bytes(f.read(8), "little")
    assert storage.stored("t") == Stored(
        "t", path, data_start + 3, ROWS, WIDTH, None
    )  # after "pad", no manifest
    assert storage.stored("pad") == Stored("pad", path, data_start, 1, 3, None)  # 1-D: one row
