"""Run under torchrun (2 replicas x tp WORLD/2; the tests use 4 ranks): rank VICTIM fails as a
receiver in the middle of the windows it receives: an I/O error on the third window it receives,
after its first piece arrived (as a failing copy of a received piece would), while the owner is
still sending. Injected here, in this process, around the product's own receive (the product has no
switch).

argv: CHECKPOINT OUT_DIR VICTIM TIMEOUT_S. Each rank records its outcome (and the seconds load()
took) in OUT_DIR/rank{R}.json."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tpload
from tpload.sources import replicas


def failing(receiving, window: int):
    calls = {"n": 0}

    def wrapped(self, name, box, owner, *, count=True):
        calls["n"] += 1
        for piece in receiving(self, name, box, owner, count=count):
            if calls["n"] == window:
                raise OSError(5, f"Input/output error (injected while receiving {name})")
            yield piece

    return wrapped


def main() -> None:
    ckpt, out, victim, timeout_s = (
        sys.argv[1],
        Path(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    rank = int(os.environ["RANK"])
    if rank == victim:
        replicas.Link.receiving = failing(replicas.Link.receiving, 3)
    outcome = {"rank": rank, "returned": False, "error": "", "seconds": 0.0}
    t0 = time.monotonic()
    try:
        tpload.load(
            ckpt,
            tp=int(os.environ["WORLD_SIZE"]) // 2,
            replicas=2,
            progress=False,
            timeout_s=timeout_s,
        )
        outcome["returned"] = True
    except tpload.LoadError as e:
        outcome["error"] = str(e)
    outcome["seconds"] = time.monotonic() - t0
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
