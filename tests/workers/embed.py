"""Run under torchrun: an embedding caller; records whether load() returned shards or raised."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import tpload


def main() -> None:
    ckpt, out = sys.argv[1], Path(sys.argv[2])
    outcome: dict[str, object] = {"returned": False, "error": ""}
    try:
        shards = tpload.load(ckpt, progress=False)
        outcome["returned"] = bool(shards.state_dict())
    except tpload.LoadError as e:
        outcome["error"] = str(e)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
