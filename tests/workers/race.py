"""Run under torchrun (2 ranks, node verification): a write lands between the hashing rank's read of
a tensor and its peer's read of its own window (an accidental concurrent write: a sync tool, a
re-download).

argv: CHECKPOINT OUT_DIR TENSOR OFFSET SHARD. Rank 1 opens SHARD, the file that holds TENSOR, only
after rank 0 has loaded and checked everything (so rank 0 hashed TENSOR from the original bytes,
and its files were unchanged when it looked) and byte OFFSET of TENSOR was flipped on disk (inside
rank 1's window): whenever rank 1 comes to read from SHARD (its own order: it reads what it leads
first, sources/order.py), it waits for rank 0's flag first; then it reads its window. Each rank
records its outcome.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import tpload
from tpload.model.progress import Silent
from tpload.storage.files import Shard
from tpload.storage.sharded import Files

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers import poke  # noqa: E402


def hold_opening(shard: str, flag: Path) -> None:
    """Rank 1: the first open of ``shard``'s read handle waits for rank 0's flag (at most 60 s)."""
    opening = Files.get

    def get(self: Files, path: Path) -> Shard:
        if path.name == shard and path not in self._open:
            deadline = time.monotonic() + 60
            while not flag.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return opening(self, path)

    Files.get = get  # type: ignore[method-assign]


class Flip:
    """Rank 0's sink: once its loop is over, and after the moment it takes rank 0 to check its
    evidence and its files and reach the exchange, flip the byte and raise the flag."""

    def __init__(self, root: Path, tensor: str, offset: int, flag: Path) -> None:
        self.root, self.tensor, self.offset, self.flag = root, tensor, offset, flag

    def update(self, nbytes: int) -> None:
        pass

    def _flip(self) -> None:
        time.sleep(2.0)
        poke(self.root, self.tensor, self.offset)  # rank 1 opens this shard only after the flag
        self.flag.write_text("flipped")

    def close(self) -> None:
        threading.Thread(target=self._flip, daemon=True).start()


def main() -> None:
    root, out, tensor, offset = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    rank = int(os.environ["RANK"])
    flag = out / "flipped"
    sink = Flip(root, tensor, offset, flag) if rank == 0 else Silent()
    if rank == 1:
        hold_opening(sys.argv[5], flag)
    outcome = {"returned": False, "error": ""}
    try:
        shards = tpload.load(
            root, progress=False, verify="node", progress_sink=sink, timeout_s=120.0
        )
        outcome["returned"] = bool(shards.state_dict())
    except tpload.LoadError as e:
        outcome["error"] = str(e)
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
