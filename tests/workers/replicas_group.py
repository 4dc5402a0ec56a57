"""Run under torchrun (4 ranks): 2 replicas x tp 2 placed by the caller, as an engine's
data-parallel groups would place them: ``load(replica_group=GROUPS)``, one list per position, each
the ranks holding it (one per replica).

argv: CHECKPOINT OUT_DIR GROUPS_JSON. Rank 0 writes the report to OUT_DIR/report.json; each rank
records its outcome in OUT_DIR/rank{R}.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import tpload


def main() -> None:
    ckpt, out, groups = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    rank = int(os.environ["RANK"])
    outcome = {"rank": rank, "returned": False, "error": ""}
    try:
        shards = tpload.load(
            ckpt,
            tp=2,
            replica_group=groups,
            progress=False,
            timeout_s=120.0,
            report=str(out / "report.json"),
        )
        outcome["returned"] = True
        outcome["tensors"] = len(shards.state_dict())
    except tpload.LoadError as e:
        outcome["error"] = str(e)
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
