"""Run under torchrun (2 replicas x tp WORLD/2; the tests use 4 ranks): rank SENDER changes the last
byte of the first window piece it sends to the other replica, after it fingerprinted the bytes it
read (a transport that flips a bit). Injected here, in this process, by wrapping
tpload.sources.replicas.send: the product has no switch.

argv: CHECKPOINT OUT_DIR SENDER [OPTIONS_JSON] (more load() keywords, e.g. verify and digest_store).
Each rank records its outcome in OUT_DIR/rank{R}.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import tpload
import tpload.sources.replicas


def corrupting(send):
    state = {"done": False}

    def wrapped(tensor: torch.Tensor, group_dst: int, group: object):
        if not state["done"] and tensor.dtype == torch.uint8 and tensor.numel() > 0:
            state["done"] = True
            # the send buffer's last byte (what the receiver gets, not what was read): the
            # window's last row, which the receiving position serves whether the read was its
            # window or a whole small tensor (a batch)
            tensor[-1] = tensor[-1] ^ 0x01
        return send(tensor, group_dst, group)

    return wrapped


def main() -> None:
    ckpt, out, sender = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    rank = int(os.environ["RANK"])
    if rank == sender:
        tpload.sources.replicas.send = corrupting(tpload.sources.replicas.send)
    outcome = {"rank": rank, "returned": False, "error": ""}
    try:
        tpload.load(
            ckpt,
            tp=int(os.environ["WORLD_SIZE"]) // 2,
            replicas=2,
            progress=False,
            timeout_s=60.0,
            **extra,
        )
        outcome["returned"] = True
    except tpload.LoadError as e:
        outcome["error"] = str(e)
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
