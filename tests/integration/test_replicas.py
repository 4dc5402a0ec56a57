"""Replicas under real torchrun (4 ranks, gloo): 2 replicas x tp 2 read each window from storage
once per cluster and serve exactly what a replica reading alone serves; a byte changed in transit
fails every rank naming the tensor, the sender and the receiver."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

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


def _plan_shares(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[list[list[int]], str]:
    """What ``tpload plan --tp 2 --replicas 2`` says (one process, no launch): the window bytes
    each replica reads at each position, as the command computed them, and its line."""
    from tpload.distributed import replica_split

    real, got = replica_split.shares, []

    def shares(plans: object, replicas: int) -> list[list[int]]:
        got.append(real(plans, replicas))  # type: ignore[arg-type]
        return got[-1]

    monkeypatch.setattr(replica_split, "shares", shares)
    capsys.readouterr()
    assert main(["plan", str(ckpt), "--tp", "2", "--replicas", "2"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "the cluster reads" in x]
    monkeypatch.undo()
    return got[0], line


def test_two_replicas_of_tp2_serve_a_plain_tp2_load_s_bytes_reading_half(
    small_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    plain = _plain_tp2(small_ckpt, tmp_path / "store")
    planned, line = _plan_shares(small_ckpt, monkeypatch, capsys)
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
    # one meaning a counter (docs/format.md): window bytes, read from storage or received, adding
    # up to what each rank serves; the cluster's storage bytes are what `tpload plan` says it
    # reads (one replica's windows), position by position, and the peers' as much again
    for r in ranks:
        assert r["bytes_from_storage"] + r["bytes_from_peers"] == r["bytes_read"]
    for position in (0, 1):
        mine = [ranks[position], ranks[2 + position]]
        assert sum(r["bytes_from_storage"] for r in mine) == sum(planned[position])
    assert storage == sum(map(sum, planned)) == sum(r["bytes_read"] for r in ranks) // 2
    assert sum(r["bytes_from_peers"] for r in ranks) == storage
    assert f"the cluster reads {storage / 1e9:.3f} GB from storage" in line
    assert f"{storage / 1e9:.3f} GB read from storage by the cluster" in run.text


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
