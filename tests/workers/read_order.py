"""Run under torchrun (2 ranks): one load of CHECKPOINT at tp 2 with ``--verify MODE``, every read
of the shards recorded in order (the stored tensor each ``pread`` is of); writes each rank's reads,
digest and outcome to OUT/rankR.json.

argv: CHECKPOINT OUT_DIR MODE
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

import tpload
from tpload.model.values import Stored
from tpload.storage.sharded import FileReads


def main() -> None:
    root, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    rank = int(os.environ["RANK"])
    reads: list[str] = []
    read = FileReads.read

    def recorded(self: FileReads, stored: Stored, r0: int, r1: int, buf: np.ndarray) -> None:
        reads.append(stored.name)
        read(self, stored, r0, r1, buf)

    FileReads.read = recorded  # type: ignore[method-assign]
    outcome: dict[str, object] = {"reads": reads, "digest": "", "error": ""}
    try:
        shards = tpload.load(root, tp=2, progress=False, verify=mode, timeout_s=120.0)
        outcome["digest"] = shards.report.mine.digest
        shards.release()
    except tpload.LoadError as e:
        outcome["error"] = str(e)
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
