"""Run under torchrun: an embedding caller making one or more load() calls; records each outcome.

argv: OUT_DIR CALLS_JSON, where CALLS_JSON is a list of calls, each
{"checkpoint": PATH, "options": {load() keywords}, "per_rank": {"RANK": {keywords for that rank
only}}, "save": bool, "claims_version": {"RANK": the tpload version that rank claims in this
call}}. Writes OUT_DIR/rank{R}.json: for each call, {"returned": bool, "error": str,
"digest": str, "tensors": int, "seconds": float (the call's, load() to its return or raise)}. A call
with "save" that returned also saves what this rank serves to OUT_DIR/rank{R}-call{I}.pt (the
state_dict on the CPU) and adds "report" (the report's dict) and "env" (the launcher's environment)
to its outcome.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import tpload

ENV = ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


def main() -> None:
    out, calls = Path(sys.argv[1]), json.loads(sys.argv[2])
    rank = os.environ["RANK"]
    outcomes = []
    for i, call in enumerate(calls):
        kw = {
            "progress": False,
            **call.get("options", {}),
            **call.get("per_rank", {}).get(rank, {}),
        }
        ckpt = kw.pop("checkpoint", call.get("checkpoint"))
        outcome: dict[str, object] = {"returned": False, "error": "", "digest": "", "tensors": 0}
        t0 = time.monotonic()
        # a rank of another tpload: this call claims another version (the package's attribute,
        # which the load reads when it leaves its stamp in the rendezvous store)
        claimed, own = call.get("claims_version", {}).get(rank), tpload.__version__
        if claimed:
            tpload.__version__ = claimed
        try:
            shards = tpload.load(ckpt, **kw)
            sd = shards.state_dict()
            outcome.update(returned=bool(sd), digest=shards.report.mine.digest, tensors=len(sd))
            if call.get("save"):
                torch.save(
                    {k: v.cpu().clone() for k, v in sd.items()}, out / f"rank{rank}-call{i}.pt"
                )
                outcome["report"] = shards.report.to_dict()
                outcome["env"] = {k: os.environ.get(k) for k in ENV}
            shards.release()
        except tpload.LoadError as e:
            outcome["error"] = str(e)
        finally:
            tpload.__version__ = own
        outcome["seconds"] = time.monotonic() - t0
        outcomes.append(outcome)
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes))


if __name__ == "__main__":
    main()
