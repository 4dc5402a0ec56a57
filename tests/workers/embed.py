"""Run under torchrun: an embedding caller making one or more load() calls; records each outcome.

argv: OUT_DIR CALLS_JSON, where CALLS_JSON is a list of calls, each
{"checkpoint": PATH, "options": {load() keywords}, "per_rank": {"RANK": {keywords for that rank
only}}}. Writes OUT_DIR/rank{R}.json: for each call, {"returned": bool, "error": str, "digest": str,
"tensors": int, "seconds": float (the call's, load() to its return or raise)}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tpload


def main() -> None:
    out, calls = Path(sys.argv[1]), json.loads(sys.argv[2])
    rank = os.environ["RANK"]
    outcomes = []
    for call in calls:
        kw = {
            "progress": False,
            **call.get("options", {}),
            **call.get("per_rank", {}).get(rank, {}),
        }
        ckpt = kw.pop("checkpoint", call.get("checkpoint"))
        outcome: dict[str, object] = {"returned": False, "error": "", "digest": "", "tensors": 0}
        t0 = time.monotonic()
        try:
            shards = tpload.load(ckpt, **kw)
            sd = shards.state_dict()
            outcome.update(returned=bool(sd), digest=shards.report.mine.digest, tensors=len(sd))
            shards.release()
        except tpload.LoadError as e:
            outcome["error"] = str(e)
        outcome["seconds"] = time.monotonic() - t0
        outcomes.append(outcome)
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes))


if __name__ == "__main__":
    main()
