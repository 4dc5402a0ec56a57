"""Replicas under real torchrun (4 ranks, gloo): 2 replicas x tp 2 read each window from storage
once per cluster and serve exactly what a replica reading alone serves; a byte changed in transit
fails every rank naming the tensor, the sender and the receiver."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tpload.__main__ import main
from tpload.verification.store import DigestStore

from ..helpers import HERE, poke, shard_of, tensor_offset, torchrun, tpload_cli

CORRUPT = str(HERE / "workers" / "replicas_corrupt.py")
GROUPS = str(HERE / "workers" / "replicas_group.py")


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


def test_replica_groups_given_to_load_place_the_replicas_as_the_caller_says(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """An engine's data-parallel groups, placed unlike ``--replicas`` (rank order): position 0 is
    held by ranks 0 and 1, position 1 by ranks 2 and 3; every rank serves its position's bytes."""
    plain = _plain_tp2(small_ckpt, tmp_path / "store")
    run = torchrun(4, [GROUPS, str(small_ckpt), str(tmp_path), "[[0, 1], [2, 3]]"], timeout=240)
    assert run.rc == 0, run.text
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(o["returned"] for o in outcomes), outcomes
    ranks = json.loads((tmp_path / "report.json").read_text())["ranks"]
    assert [r["digest"] for r in ranks] == [plain[0], plain[0], plain[1], plain[1]]
    storage = [r["bytes_from_storage"] for r in ranks]
    assert all(storage) and 2 * sum(storage) == sum(
        r["bytes_from_storage"] + r["bytes_from_peers"] for r in ranks
    )  # each position's windows read once, by one of its two ranks


def test_verify_digest_with_replicas_checks_every_rank_against_its_position_s_prediction(
    ckpt_copy: Path, tmp_path: Path
) -> None:
    """``--verify digest``: nothing hashed; every rank, reader or receiver, serves its position's
    stored prediction; a byte changed under the predictions fails the load naming the tensor (the
    per-tensor predictions ``plan --write`` stores beside the digests) and where a receiver's
    window came from. (A byte changed in transit fails by the check on receipt, in every mode.)"""
    store = tmp_path / "store"
    plain = _plain_tp2(ckpt_copy, store)
    report = tmp_path / "r.json"
    run = tpload_cli(
        4,
        str(ckpt_copy),
        "--tp",
        "2",
        "--replicas",
        "2",
        "--verify",
        "digest",
        "--digest-store",
        str(store),
        "--report",
        str(report),
        timeout=240,
    )
    assert run.rc == 0, run.text
    ranks = json.loads(report.read_text())["ranks"]
    assert [r["digest"] for r in ranks] == [plain[0], plain[1], plain[0], plain[1]]
    assert all(r["bytes_hashed"] == 0 for r in ranks)
    assert sum(r["bytes_from_peers"] for r in ranks) > 0
    # a byte changed in the checkpoint under the stored predictions (its mtime put back): nothing
    # is hashed, so only the predictions catch it, per tensor, on the readers and the receivers
    shard = ckpt_copy / shard_of(ckpt_copy, "head.weight")
    stat = shard.stat()
    _, _, nbytes = tensor_offset(ckpt_copy, "head.weight")
    poke(ckpt_copy, "head.weight", nbytes - 1)  # the last row: position 1's window
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    args = ["--tp", "2", "--replicas", "2", "--verify", "digest", "--digest-store", str(store)]
    run = tpload_cli(4, str(ckpt_copy), *args, timeout=240)
    assert run.rc != 0
    assert "differs from the prediction stored in" in run.text and "head.weight" in run.text
    assert "(received from rank" in run.text  # the receiver names where its window came from
