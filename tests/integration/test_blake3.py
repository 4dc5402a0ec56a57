"""blake3 under real torchrun (2 ranks, gloo, node mode; one launch, two loads): a load with a fresh
sidecar hashes by blake3 and serves the digests a sha256 load serves; a byte changed behind an
unchanged stamp fails the next load on every rank, naming the tensor and blake3. Sidecar rules are
unit-tested in-process (tests/unit/verification/test_store.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpload.attest.predict import predict
from tpload.cli import main
from tpload.planning.layout import Layout
from tpload.selection.config import load_config

from ..helpers import HERE, torchrun

pytest.importorskip("blake3")


def test_a_blake3_load_serves_the_sha256_loads_digests_and_catches_a_changed_byte(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    assert main(["manifest", str(ckpt_copy), "--hash", "blake3", "--digest-store", str(store)]) == 0
    sha256_digests = predict(
        ckpt_copy, load_config(), Layout(2), "packed"
    )  # the load's own code, by sha256
    run = torchrun(
        2,
        [
            str(HERE / "workers" / "tamper_blake3.py"),
            str(ckpt_copy),
            str(store),
            str(tmp_path),
            "head.weight",
        ],
    )
    assert run.rc == 0, run.text
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["hash"] for r in ranks] == ["blake3", "blake3"] and all(
        r["hashed"] > 0 for r in ranks
    )
    assert [r["digest"] for r in ranks] == sha256_digests
    for r in ranks:  # the same verdict on both ranks, naming the tensor, blake3 and the sidecar
        assert (
            "tensor head.weight: blake3" in r["second"]
            and "blake3.json (the blake3 sidecar" in r["second"]
        )
