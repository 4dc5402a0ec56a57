"""Run under torchrun: load with the given options, save what this rank serves and locates.

argv: CHECKPOINT OUT_DIR [key=value ...]; keys are load() keywords (tp, ep, kind, config,
verify, skip, defer, evict_page_cache, reserve_gib); skip/defer take comma-separated globs.
Writes OUT_DIR/rank{R}.pt (the state_dict on the CPU) and OUT_DIR/rank{R}.json (report,
served names in state_dict order, deferred locators, the launcher's environment).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

import tpload

CASTS = {
    "tp": int,
    "ep": int,
    "reserve_gib": float,
    "evict_page_cache": lambda v: v == "1",
    "skip": lambda v: tuple(v.split(",")),
    "defer": lambda v: tuple(v.split(",")),
}


def main() -> None:
    ckpt, out = sys.argv[1], Path(sys.argv[2])
    kw = {k: CASTS.get(k, str)(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])}
    rank = int(os.environ["RANK"])
    shards = tpload.load(ckpt, progress=False, **kw)
    sd = shards.state_dict()
    torch.save({k: v.cpu().clone() for k, v in sd.items()}, out / f"rank{rank}.pt")
    doc = {
        "report": shards.report.to_dict(),
        "names": list(sd),
        "hashed": shards.hashed,
        "deferred": [asdict(d) | {"path": str(d.path)} for d in shards.deferred()],
        "env": {
            k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")
        },
    }
    (out / f"rank{rank}.json").write_text(json.dumps(doc))
    shards.release()


if __name__ == "__main__":
    main()
