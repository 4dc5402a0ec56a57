"""Run under torchrun: load each given checkpoint (config picked automatically) packed, then
expanded, in one process, and save what this rank serves as raw bytes.

argv: OUT_DIR TP EP LABEL=DIR [LABEL=DIR ...]. Writes OUT_DIR/{LABEL}-{kind}-rank{R}.pt: a dict
{name: uint8 tensor of the served bytes} plus "__shapes__" {name: shape} and "__config__" (the
config load() chose, from its report).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import tpload


def main() -> None:
    out, tp, ep = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])
    for item in sys.argv[4:]:
        label, ckpt = item.split("=", 1)
        for kind in ("packed", "expanded"):
            shards = tpload.load(ckpt, tp=tp, ep=ep, kind=kind, progress=False)
            sd = shards.state_dict()
            record: dict[str, object] = {
                n: t.detach().cpu().contiguous().view(-1).view(torch.uint8).clone()
                for n, t in sd.items()
            }
            record["__shapes__"] = {n: tuple(t.shape) for n, t in sd.items()}
            record["__config__"] = shards.report.to_dict().get("config")
            torch.save(record, out / f"{label}-{kind}-rank{rank}.pt")
            shards.release()


if __name__ == "__main__":
    main()
