"""Run under torchrun: load with ``defer``, then stream every deferred locator through ``chunks()``.

argv: CHECKPOINT OUT_DIR DEFER_GLOBS (comma-separated). Writes OUT_DIR/rank{R}.json: the locators,
and for each the sha256 of what ``chunks()`` streamed (or the error it raised).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import tpload
from tpload.model.errors import LoadError


def main() -> None:
    ckpt, out, defer = sys.argv[1], Path(sys.argv[2]), tuple(sys.argv[3].split(","))
    rank = int(os.environ["RANK"])
    shards = tpload.load(ckpt, progress=False, defer=defer)
    doc = {"deferred": [], "streamed": {}}
    for d in shards.deferred():
        doc["deferred"].append(
            {
                "name": d.name,
                "sha256": d.sha256,
                "vouched_by": d.vouched_by,
                "path": str(d.path),
                "offset": d.offset,
                "nbytes": d.nbytes,
            }
        )
        h = hashlib.sha256()
        try:
            for chunk in d.chunks(1 << 12):
                h.update(chunk)
            doc["streamed"][d.name] = h.hexdigest()
        except LoadError as e:
            doc["streamed"][d.name] = f"error: {e}"
    (out / f"rank{rank}.json").write_text(json.dumps(doc))
    shards.release()


if __name__ == "__main__":
    main()
