"""The storage read source, and the shape a trainer's push will have (issue 30): a pre-partitioned
export's rank file held in memory (storage/held.py) behind the same read source, loaded by the same
loop, hashed by the same taps, without the loop knowing where the bytes are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tpload.loading.loop import run
from tpload.loading.planner import planner_of
from tpload.model.errors import CheckpointError, LoadError
from tpload.model.progress import Silent
from tpload.planning.layout import Layout
from tpload.selection.config import load_config
from tpload.sources.base import ReadSource, SourceFigures
from tpload.sources.hashing import Hasher
from tpload.sources.storage import StorageSource
from tpload.storage.base import Storage
from tpload.storage.held import HeldStorage
from tpload.storage.partitioned import PartitionedStorage, rank_file
from tpload.tools.export import export
from tpload.transfer.cpu import CpuTransfer
from tpload.verification.node import HashPlan

RANK, TP = 1, 2


@pytest.fixture(scope="module")
def exported(small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "tp2"
    export(small_ckpt, out, Layout(TP), load_config())
    return out


def _load(root: Path, source_of: Callable[[Storage], ReadSource]) -> tuple[str, int, SourceFigures]:
    """Rank 1's loop over its rank file, through the read source ``source_of`` makes, every window
    hashed against the export's manifest (a rank file: each rank hashes what it serves)."""
    storage = PartitionedStorage(root, tp=TP, ep=1, rank=RANK, world=TP)
    try:
        plan = planner_of(storage.catalogue, load_config()).plan(Layout(TP), "packed", RANK)
        result = run(
            source_of(storage),
            plan,
            transfer=CpuTransfer(torch.device("cpu")),
            hasher=Hasher(HashPlan(RANK, frozenset(plan.used_tensors))),
            samples=0,
            progress=Silent(),
            ranks=storage.catalogue.ranks(),
        )
        return result.digest(), len(result.hashed), result.source
    finally:
        storage.close()


def test_a_rank_file_held_in_memory_loads_as_the_file_does(exported: Path) -> None:
    on_disk, hashed, figures = _load(exported, StorageSource)
    assert on_disk.startswith("42c10de7")  # the small checkpoint's rank 1 at tp 2, as exported
    assert hashed > 0 and figures == SourceFigures()  # read alone: nothing counted apart
    path = exported / rank_file(RANK, TP)
    held = np.fromfile(path, dtype=np.uint8)
    saved = path.read_bytes()
    header = 8 + int.from_bytes(saved[:8], "little")  # what PartitionedStorage opens with
    # the tensors' bytes on disk are zeros now: a read of them would fail its hash
    path.write_bytes(saved[:header] + bytes(len(saved) - header))
    try:
        digest, again, figures = _load(
            exported, lambda storage: StorageSource(HeldStorage(storage, {path: held}))
        )
        assert (digest, again, figures) == (on_disk, hashed, SourceFigures())
        with pytest.raises(LoadError, match="does not match the manifest"):
            _load(exported, StorageSource)  # what the loop would read from the file instead
    finally:
        path.write_bytes(saved)


def test_bytes_not_held_are_refused_by_name(exported: Path) -> None:
    path = exported / rank_file(RANK, TP)
    short = np.fromfile(path, dtype=np.uint8)[: path.stat().st_size // 2]
    with pytest.raises(CheckpointError, match=r": tensor .*: its bytes \d+\.\.\d+ are not held"):
        _load(exported, lambda storage: StorageSource(HeldStorage(storage, {path: short})))
