"""Replicas in the slow tier, each a real torchrun launch (gloo): a replica killed mid-transfer ends
every rank in bounded time with no weights; two agents as two nodes read the checkpoint once between
them; a hub snapshot is hashed once per cluster; 2 replicas x tp 2 x ep 2 (8 processes) serve a
plain tp 2 x ep 2 load's bytes."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from tpload.cli import main
from tpload.storage.hub import to_hub_cache
from tpload.tools.published import write_published
from tpload.verification.store import DigestStore

from ..ckpt_tools import all_names, nbytes
from ..helpers import HERE, free_port, poke, shard_of, tensor_offset, torchrun, tpload_cli
from ..integration.test_multinode import agent, finish
from ..integration.test_replicas import _plain_tp2

pytestmark = pytest.mark.slow
KILL = str(HERE / "workers" / "replicas_kill.py")
GROUPS = str(HERE / "workers" / "replicas_group.py")


def planned(ckpt: Path, store: Path, tp: int, ep: int = 1) -> list[str]:
    """The rank digests a plain tp x ep load serves, predicted offline (one process, no launch)."""
    assert (
        main(
            [
                "plan",
                str(ckpt),
                "--tp",
                str(tp),
                "--ep",
                str(ep),
                "--write",
                "--digest-store",
                str(store),
            ]
        )
        == 0
    )
    sha = hashlib.sha256((ckpt / "NATIVE_MANIFEST.json").read_bytes()).hexdigest()
    (plain,) = [
        p.digests
        for k, p in DigestStore(store).read(sha).items()
        if k.startswith(f"tp{tp}-ep{ep}-packed")
    ]
    return list(plain)


def halved(ranks: list[dict], size: int) -> int:
    """Check that each position's windows were read once between the replicas; the cluster's storage
    bytes."""
    for position in range(size):
        mine = ranks[position::size]
        whole = sum(r["bytes_from_storage"] for r in mine)
        assert all(r["bytes_from_storage"] + r["bytes_from_peers"] == whole for r in mine), (
            position,
            mine,
        )
    storage = sum(r["bytes_from_storage"] for r in ranks)
    assert storage > 0 and len(ranks) // size * storage == sum(
        r["bytes_from_storage"] + r["bytes_from_peers"] for r in ranks
    )
    return storage


def test_a_replica_killed_mid_transfer_ends_every_rank_in_bounded_time_with_no_weights(
    small_ckpt: Path, tmp_path: Path
) -> None:
    victim = 3  # replica 1, position 1: it both reads (and sends) and receives
    run = torchrun(4, [KILL, str(small_ckpt), str(tmp_path), str(victim), "20"], timeout=120)
    assert run.rc != 0, run.text
    assert run.seconds < 60, f"took {run.seconds:.1f} s with --timeout 20"
    assert not (tmp_path / f"rank{victim}.json").exists()  # it died where the worker killed it
    assert "exitcode  : 9" in run.err and f"rank      : {victim} " in run.err, run.err[-2000:]
    for rank in (0, 1, 2):
        outcome = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert outcome["returned"] is False, outcome  # no survivor hands back weights
        # each names the dead rank (a survivor may also list another that left the exchange first)
        lost = re.search(r"rank ([0-9, ]+) never reached it \(died or hung\)", outcome["error"])
        assert lost and str(victim) in lost.group(1).split(", "), outcome["error"]


def test_two_agents_as_two_nodes_read_the_checkpoint_once_between_them(
    small_ckpt: Path, tmp_path: Path
) -> None:
    plain = planned(small_ckpt, tmp_path / "store", 2)
    report, port = tmp_path / "r.json", free_port()
    finish(
        [
            agent(
                n,
                port,
                [
                    "-m",
                    "tpload",
                    "--no-progress",
                    str(small_ckpt),
                    "--tp",
                    "2",
                    "--replicas",
                    "2",
                    "--report",
                    str(report),
                ],
                TPLOAD_NODE_ID=f"box{n}",
            )
            for n in (0, 1)
        ]
    )
    doc = json.loads(report.read_text())
    ranks = doc["ranks"]
    assert [r["node"] for r in ranks] == [0, 0, 1, 1]  # a replica a node
    assert [r["digest"] for r in ranks] == plain + plain
    storage = halved(ranks, 2)
    per_node = [sum(r["bytes_from_storage"] for r in ranks if r["node"] == n) for n in (0, 1)]
    assert sum(per_node) == storage
    assert all(0.25 * storage <= s <= 0.75 * storage for s in per_node), per_node  # about half each
    # each tensor hashed by the one node that read it: the checkpoint once per cluster, not once per
    # node
    hashed = doc["bytes_hashed_per_node"]
    assert set(hashed) == {"0", "1"} and all(v > 0 for v in hashed.values())
    assert sum(hashed.values()) == nbytes(small_ckpt, all_names(small_ckpt)), hashed


def test_a_hub_snapshot_with_replicas_hashes_each_file_once_per_cluster(tmp_path: Path) -> None:
    plain = write_published(tmp_path / "plain", "gpt-oss-tiny", manifest=False)
    snapshot = to_hub_cache(plain, tmp_path / "hub", "openai/gpt-oss-tiny")
    alone, shared = tmp_path / "alone.json", tmp_path / "shared.json"
    run = tpload_cli(
        2, "--checkpoint", str(snapshot), "--tp", "2", "--report", str(alone), timeout=240
    )
    assert run.rc == 0, run.text
    run = tpload_cli(
        4,
        "--checkpoint",
        str(snapshot),
        "--tp",
        "2",
        "--replicas",
        "2",
        "--report",
        str(shared),
        timeout=240,
    )
    assert run.rc == 0, run.text
    want = [r["digest"] for r in json.loads(alone.read_text())["ranks"]]
    doc = json.loads(shared.read_text())
    assert [r["digest"] for r in doc["ranks"]] == want + want
    assert any("checked whole against their blob sha256" in n for n in doc["notes"]), doc["notes"]
    shards = sorted(snapshot.glob("*.safetensors"))
    assert sum(r["bytes_hashed"] for r in doc["ranks"]) == sum(os.path.getsize(s) for s in shards)
    halved(doc["ranks"], 2)


def test_two_replicas_of_tp2_ep2_serve_a_plain_tp2_ep2_load_s_bytes(tmp_path: Path) -> None:
    ckpt = write_published(tmp_path / "ckpt", "deepseek-v3-tiny")
    plain = planned(ckpt, tmp_path / "store", 2, 2)
    report = tmp_path / "r.json"
    run = tpload_cli(
        8,
        str(ckpt),
        "--tp",
        "2",
        "--ep",
        "2",
        "--replicas",
        "2",
        "--report",
        str(report),
        timeout=420,
    )
    assert run.rc == 0, run.text
    ranks = json.loads(report.read_text())["ranks"]
    assert [r["digest"] for r in ranks] == plain + plain  # rank r: position r % 4
    halved(ranks, 4)


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
