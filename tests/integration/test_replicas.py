"""Replicas under real torchrun (4 ranks, gloo): 2 replicas x tp 2 read each window from storage
once per cluster and serve exactly what a replica reading alone serves; a byte changed in transit
fails every rank naming the tensor, the sender and the receiver."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tpload.cli import main
from tpload.verification.store import DigestStore

from ..helpers import HERE, torchrun, tpload_cli

CORRUPT = str(HERE / "workers" / "replicas_corrupt.py")


def _plain_tp2(ckpt: Path, store: Path) -> list[str]:
    """What a plain tp 2 load serves, predicted offline (one process, no launch)."""
    assert main(["plan", str(ckpt), "--tp", "2", "--write", "--digest-store", str(store)]) == 0
    sha = hashlib.sha256((ckpt / "NATIVE_MANIFEST.json").read_bytes()).hexdigest()
    (plain,) = [
        p.digests for k, p in DigestStore(store).read(sha).items() if k.startswith("tp2-ep1-packed")
    ]
    return plain


def test_two_replicas_of_tp2_serve_a_plain_tp2_load_s_bytes_reading_half(
    small_ckpt: Path, tmp_path: Path
) -> None:
    plain = _plain_tp2(small_ckpt, tmp_path / "store")
    report = tmp_path / "r.json"
    run = tpload_cli(
        4, str(small_ckpt), "--tp", "2", "--replicas", "2", "--report", str(report), timeout=240
    )
    assert run.rc == 0, run.text
    ranks = json.loads(report.read_text())["ranks"]
    assert [r["digest"] for r in ranks] == [
        plain[0],
        plain[1],
        plain[0],
        plain[1],
    ]  # rank r: position r % 2
    for position in (0, 1):
        a, b = ranks[position], ranks[2 + position]
        assert (
            a["bytes_from_storage"] > 0 and b["bytes_from_storage"] > 0
        )  # both replicas read their share
        whole = (
            a["bytes_from_storage"] + b["bytes_from_storage"]
        )  # the position's windows, read once
        assert (
            a["bytes_from_storage"] + a["bytes_from_peers"]
            == whole
            == b["bytes_from_storage"] + b["bytes_from_peers"]
        )
    storage = sum(r["bytes_from_storage"] for r in ranks)
    assert 2 * storage == sum(
        r["bytes_from_storage"] + r["bytes_from_peers"] for r in ranks
    )  # halved
    assert "from peers" in run.text  # the table shows the split


def test_a_byte_changed_in_transit_fails_every_rank_naming_tensor_sender_and_receiver(
    small_ckpt: Path, tmp_path: Path
) -> None:
    run = torchrun(4, [CORRUPT, str(small_ckpt), str(tmp_path), "1"], timeout=240)
    assert run.rc == 0, run.text
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert not any(o["returned"] for o in outcomes)
    assert len({o["error"] for o in outcomes}) == 1
    error = outcomes[0]["error"]
    # rank 1 (replica 0, position 1) reads the position's first window and sends it to rank 3
    assert "load failed on rank 3" in error and "tensor " in error
    assert (
        "the bytes rank 3 received from rank 1 (replica 0) differ from those rank 1 read" in error
    )
    assert "changed in transit" in error
