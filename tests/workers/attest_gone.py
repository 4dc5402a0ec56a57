"""Run under torchrun: a load asked to attest whose attestation folder rank 0 removes while it
loads (its progress sink removes it at the first tensor): the write after the passed verdict
fails, as on a full disk, after every rank's options were checked.

argv: CHECKPOINT ATTEST_FILE. Each rank prints one line, ``rank R: weights N`` or ``rank R: failed:
MESSAGE``, and exits 0 or 1.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import tpload


class RemoveFolder:
    """A progress sink that removes a folder at the first tensor (rank 0's, after share_nodes: every
    rank has checked its options by then)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def update(self, nbytes: int) -> None:
        if self.folder.exists():
            shutil.rmtree(self.folder)

    def close(self) -> None:
        pass


def main() -> None:
    ckpt, attest = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    sink = RemoveFolder(attest.parent) if rank == 0 else None
    try:
        shards = tpload.load(ckpt, attest=str(attest), progress_sink=sink)
    except tpload.LoadError as e:
        print(f"rank {rank}: failed: {e}", flush=True)
        sys.exit(1)
    print(f"rank {rank}: weights {len(shards.state_dict())}", flush=True)


if __name__ == "__main__":
    main()
