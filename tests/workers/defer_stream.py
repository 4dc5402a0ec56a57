"""Run under torchrun: for each checkpoint in turn, load with ``defer``, then stream every deferred
locator through ``chunks()``.

argv: OUT_DIR DEFER_GLOBS (comma-separated) CHECKPOINT [CHECKPOINT ...]. Writes
OUT_DIR/rank{R}-{I}.json for the I-th checkpoint: whether load() returned or the error it raised,
the locators, and for each the sha256 of what ``chunks()`` streamed (or the error it raised).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import tpload
from tpload import LoadError


def load_and_stream(ckpt: str, defer: tuple[str, ...]) -> dict:
    doc: dict = {"returned": False, "error": "", "deferred": [], "streamed": {}}
    try:
        shards = tpload.load(ckpt, progress=False, defer=defer)
    except LoadError as e:
        doc["error"] = str(e)
        return doc
    doc["returned"] = True
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
    shards.release()
    return doc


def main() -> None:
    out, defer, ckpts = Path(sys.argv[1]), tuple(sys.argv[2].split(",")), sys.argv[3:]
    rank = int(os.environ["RANK"])
    for i, ckpt in enumerate(ckpts):
        doc = load_and_stream(ckpt, defer)
        (out / f"rank{rank}-{i}.json").write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
