"""Run under torchrun (2 replicas x tp WORLD/2; the tests use 4 ranks): rank VICTIM fails mid-load,
the product's own code meeting a real OSError (the product has no switch):

* ``read`` (the default): its second window read fails (a read it owns: its receivers wait for the
  window), by a directory's descriptor put in place of the shard's just before that read (EISDIR);
* ``receive``: it fails as a receiver on the second window it receives, after its first piece
  arrived (as a failing copy of a received piece would), while the owner is still sending.

argv: CHECKPOINT OUT_DIR VICTIM TIMEOUT_S [read|receive]. Each rank records its outcome (and the
seconds load() took) in OUT_DIR/rank{R}.json."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tpload
from tpload.sources import replicas
from tpload.storage import files


def failing(read_into, after: int):
    calls = {"n": 0}

    def wrapped(self, offset, out, *, tensor=""):
        calls["n"] += 1
        if calls["n"] == after:
            directory = os.open("/", os.O_RDONLY)
            os.dup2(directory, self.fd)  # the shard's descriptor now names a directory
            os.close(directory)
        return read_into(self, offset, out, tensor=tensor)

    return wrapped


def failing_receive(receiving, window: int):
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
    where = sys.argv[5] if len(sys.argv) > 5 else "read"
    if rank == victim and where == "read":
        files.Shard.read_into = failing(files.Shard.read_into, 2)
    elif rank == victim:
        replicas.Link.receiving = failing_receive(replicas.Link.receiving, 2)
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
