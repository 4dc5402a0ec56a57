"""--verify digest under real torchrun: trusted digests written once by `tpload plan --write` (into
the operator's store, not the checkpoint folder), then a load that hashes nothing and still checks
every served byte. Refusals and tampering are unit-tested in-process."""

from __future__ import annotations

import json
from pathlib import Path

from tpload.cli import main

from ..helpers import tpload_cli


def test_a_digest_load_hashes_nothing_and_matches(small_ckpt: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert (
        main(["plan", str(small_ckpt), "--tp", "2", "--write", "--digest-store", str(store)]) == 0
    )
    assert not (
        small_ckpt / "TPLOAD_DIGESTS.json"
    ).exists()  # nothing written into the checkpoint folder
    report = tmp_path / "r.json"
    run = tpload_cli(
        2,
        str(small_ckpt),
        "--verify",
        "digest",
        "--digest-store",
        str(store),
        "--report",
        str(report),
    )
    assert run.rc == 0, run.text
    doc = json.loads(report.read_text())
    assert doc["verify"] == "digest" and doc["predictions"].startswith("matched (sha256-verified")
    assert sum(r["bytes_hashed"] for r in doc["ranks"]) == 0 and all(
        r["tensors"] > 0 for r in doc["ranks"]
    )
