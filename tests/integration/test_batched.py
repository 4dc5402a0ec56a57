"""Small tensors batched on 2 real torchrun ranks (gloo), windows of cut ones included: node
verification's split hashing and cross-check see the same bytes, and every rank serves exactly
what the one-by-one path serves (the same digest: stored predictions stay valid)."""

from __future__ import annotations

import json
from pathlib import Path

from tpload.tools.published import write_published

from ..helpers import torchrun

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "batched.py")


def test_batched_windows_serve_what_one_by_one_serves_on_two_ranks(tmp_path: Path) -> None:
    root = write_published(
        tmp_path / "v3", "deepseek-v3-tiny"
    )  # FP8 experts cut by tp, with their scales
    out = tmp_path / "out"
    out.mkdir()
    run = torchrun(2, [WORKER, str(root), str(out)], timeout=240)
    assert run.rc == 0, run.err[-3000:]
    said = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in said:
        assert r["cut_windows_batched"] > 10  # the case under test really batches
        assert r["same"]
        assert r["digests"][0] == r["digests"][1]
        assert r["hashed"][0] == r["hashed"][1] > 0
    assert said[0]["digests"][0] != said[1]["digests"][0]  # two ranks, two windows
    assert sum(r["hashed"][0] for r in said) >= 20  # the node's hashing split between the ranks
