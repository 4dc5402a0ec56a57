"""Run under torchrun (2 replicas x tp WORLD/2; the tests use 4 ranks): rank VICTIM dies (os._exit,
no cleanup, as the OOM killer leaves it) right after its first window piece went to or came from the
other replica, mid-transfer. Injected here, in this process, by wrapping
tpload.sources.replicas.send and recv: the product has no switch.

argv: CHECKPOINT OUT_DIR VICTIM TIMEOUT_S. Each surviving rank records its outcome in
OUT_DIR/rank{R}.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

import tpload
import tpload.sources.replicas


def dying(transfer):
    """``transfer`` (send or recv), ending this process once its first piece of bytes has moved."""

    def wrapped(tensor: torch.Tensor, peer: int, group: object):
        work = transfer(tensor, peer, group)
        if tensor.dtype == torch.uint8 and tensor.numel() > 0:  # a piece, not a header
            work.wait()
            os._exit(9)
        return work

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
        tpload.sources.replicas.send = dying(tpload.sources.replicas.send)
        tpload.sources.replicas.recv = dying(tpload.sources.replicas.recv)
    else:
        # torchrun SIGTERMs the survivors once the victim is gone; what is tested is that they end
        # on their own, in bounded time, with no weights (torchrun's SIGKILL after its grace still
        # bounds them)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    outcome = {"rank": rank, "returned": False, "error": ""}
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
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))
    sys.exit(0 if outcome["returned"] else 1)


if __name__ == "__main__":
    main()
