"""Which storage a rank loads from: a native folder of shards (:mod:`.sharded`), or its own file of
a pre-partitioned export (:mod:`.partitioned`)."""

from __future__ import annotations

import os
from pathlib import Path

from .base import Storage
from .partitioned import PartitionedStorage, is_partitioned
from .sharded import ShardedStorage


def open_storage(
    root: str | os.PathLike[str], *, tp: int, ep: int, rank: int, world: int
) -> Storage:
    """The storage a rank loads from: a native folder, or its own file of a pre-partitioned one."""
    path = Path(root).absolute()
    if path.is_dir() and is_partitioned(path):
        return PartitionedStorage(path, tp=tp, ep=ep, rank=rank, world=world)
    return ShardedStorage(path)
