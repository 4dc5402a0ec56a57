"""The handshake's other cases in the slow tier (tpload/distributed/agreement.py), each a real
torchrun launch (gloo): two nodes that differ in their checkpoint, their pin or their verify mode;
ranks given different options through the API (a path, the kind, the skip globs, the replicas'
placement), an early failure on one rank (a missing device, a missing shard), each ending every rank
in seconds with the cause; and a replica owner whose read fails mid-window, whose receiver stops at
once instead of waiting out --timeout. The quick tier's launches:
tests/integration/test_agreement.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tpload.cli import main

from ..helpers import HERE, poke, torchrun
from ..integration.test_agreement import EMBED, WORLD, sha256, two_nodes, verdict_of

pytestmark = pytest.mark.slow
EIO = str(HERE / "workers" / "replicas_eio.py")


def remanifested(src: Path, dst: Path) -> Path:
    """A copy of ``src`` with a weight byte flipped and a manifest written over it."""
    shutil.copytree(src, dst)
    poke(dst, "head.weight", 5)
    assert main(["manifest", str(dst), "--force"]) == 0
    return dst


@pytest.mark.parametrize("case", ["another checkpoint", "a pin on node 0 only", "verify off"])
def test_two_nodes_that_differ_fail_every_rank_naming_what_differs(
    case: str, small_ckpt: Path, tmp_path: Path
) -> None:
    node1, extra = tmp_path / "node1", {0: [], 1: []}
    if case == "another checkpoint":  # both replicas would serve a mix of two models
        assert main(["synth", str(node1), "--preset", "small", "--seed", "7"]) == 0
    elif case == "a pin on node 0 only":  # node 0's pin holds on node 0; node 1 is tampered
        remanifested(small_ckpt, node1)
        extra[0] = ["--manifest-sha256", sha256(small_ckpt / "NATIVE_MANIFEST.json")]
    else:  # node 1 serves unhashed bytes to a node that asked for verification
        shutil.copytree(small_ckpt, node1)
        poke(node1, "head.weight", 5)
        extra[1] = ["--verify", "off"]
    folder = {0: small_ckpt, 1: node1}
    rcs, text, _ = two_nodes(
        lambda n: (
            ["-m", "tpload", "--no-progress", str(folder[n]), "--tp", "2", "--replicas", "2"]
            + extra[n]
        )
    )
    assert rcs[0] != 0 and rcs[1] != 0, text
    reporter, message = verdict_of(text)
    assert reporter == 0 and "load failed on rank 0, 1, 2, 3 (4 of 4 ranks)" in message
    if case == "verify off":
        want = "they differ in the verify mode (rank 0, 1: 'node'; rank 2, 3: 'off')"
    else:
        mine, theirs = (sha256(f / "NATIVE_MANIFEST.json")[:45] for f in (small_ckpt, node1))
        want = (
            f"they differ in the trust anchor (rank 0, 1: 'manifest sha256 {mine}...'; "
            f"rank 2, 3: 'manifest sha256 {theirs}...')"
        )
    assert want in message, message


def test_ranks_given_different_options_or_failing_early_all_end_at_once_with_the_cause(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """One launch of 4 ranks, one load() call per case (a case fails before any window, so the
    group stays in step for the next), then a call where every rank agrees."""
    other = remanifested(small_ckpt, tmp_path / "other")
    holed = tmp_path / "holed"
    shutil.copytree(small_ckpt, holed)
    (holed / "model-00002-of-00002.safetensors").unlink()
    ckpt = str(small_ckpt)
    common = {"tp": 2, "replicas": 2, "timeout_s": 60.0}
    placed = {"replicas": 1, "replica_group": [[0, 1], [2, 3]]}
    cases = [
        # without replicas, this once failed in the node cross-check: now before any read
        ({"timeout_s": 60.0}, {"2": {"checkpoint": str(other)}, "3": {"checkpoint": str(other)}}),
        (common, {"1": {"kind": "expanded"}}),
        (common, {"2": {"skip": ["mtp.*"]}, "3": {"skip": ["mtp.*"]}}),
        (common, {"0": placed, "1": placed}),
        (common, {"2": {"device": "cuda:0"}}),
        (common, {"2": {"checkpoint": str(holed)}, "3": {"checkpoint": str(holed)}}),
    ]
    calls = [{"checkpoint": ckpt, "options": o, "per_rank": p} for o, p in cases]
    # a signed copy: ranks 2-3 check no signature, then the same bundle under another name
    signed, pub = _signed_copy(small_ckpt, tmp_path)
    moved = tmp_path / "elsewhere.sig"
    shutil.copy(signed / "model.sig", moved)
    keyed = {"timeout_s": 60.0, "signer_key": str(pub)}
    calls += [
        {
            "checkpoint": str(signed),
            "options": keyed,
            "per_rank": {r: {"signature": "none"} for r in "23"},
        },
        {
            "checkpoint": str(signed),
            "options": keyed,
            "per_rank": {r: {"signature": str(moved)} for r in "23"},
        },
    ]
    calls += [{"checkpoint": ckpt, "options": common, "per_rank": {}}]
    out = tmp_path / "out"
    out.mkdir()
    run = torchrun(WORLD, [EMBED, str(out), json.dumps(calls)], timeout=600)
    assert run.rc == 0, run.text
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    per_call = list(zip(*ranks, strict=True))
    *failing, unsigned, renamed, agreed = per_call
    for outcomes in (*failing, unsigned):
        assert not any(o["returned"] for o in outcomes), outcomes
        assert len({o["error"] for o in outcomes}) == 1, outcomes  # one verdict, every rank
        assert all(o["seconds"] < 30 for o in outcomes), outcomes  # never --timeout
        assert "never reached it" not in outcomes[0]["error"]
    anchor, kind, skip, placement, device, shard = (o[0]["error"] for o in failing)
    mine, theirs = (sha256(f / "NATIVE_MANIFEST.json")[:45] for f in (small_ckpt, other))
    assert (
        f"they differ in the trust anchor (rank 0, 1: 'manifest sha256 {mine}...'; rank 2, 3: "
        f"'manifest sha256 {theirs}...')" in anchor
    ), anchor
    assert "they differ in the kind (rank 0, 2, 3: 'packed'; rank 1: 'expanded')" in kind
    assert "they differ in the skip globs (rank 0, 1: 'none'; rank 2, 3: 'mtp.*')" in skip
    assert (
        "they differ in the replicas (rank 0, 1: '2, placed [[0, 1], [2, 3]]'; rank 2, 3: '2')"
        in placement
    ), placement
    assert device.startswith("load failed on rank 2 (1 of 4 ranks); no rank returned weights\n")
    assert "rank 2: device 'cuda:0' asked for, but this process sees no CUDA device" in device
    assert device.endswith("\nrank 0, 1, 3: stopped before the copy loop: rank 2 failed before it")
    assert shard.startswith("load failed on rank 2, 3 (2 of 4 ranks)")
    assert "shard model-00002-of-00002.safetensors does not exist" in shard
    assert shard.endswith("\nrank 0, 1: stopped before the copy loop: rank 2, 3 failed before it")
    assert all(o["returned"] for o in agreed), agreed
    said = unsigned[0][
        "error"
    ]  # the signature named, not "every node must hold the same checkpoint"
    assert "they differ in the signature checked (rank 0, 1: 'bundle sha256 " in said, said
    assert "rank 2, 3: 'none')" in said and "trust anchor" not in said, said
    assert all(o["returned"] for o in renamed), renamed  # the same bundle, by its bytes


def _signed_copy(ckpt: Path, tmp_path: Path) -> tuple[Path, Path]:
    """``ckpt`` (with its manifest) signed by a key made here: model.sig beside the files."""
    ms_signing = pytest.importorskip("model_signing.signing")
    from ..ckpt_tools import ec_keypair

    folder = tmp_path / "signed"
    shutil.copytree(ckpt, folder)
    private, public = ec_keypair(tmp_path, "k")
    ms_signing.Config().use_elliptic_key_signer(private_key=private).sign(
        folder, folder / "model.sig"
    )
    return folder, public


def test_an_owner_whose_read_fails_mid_window_stops_its_receiver_at_once(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """Rank 1 (replica 0, position 1) fails reading a window it sends to rank 3. It tells rank 3
    (an abort on the wire), which stops instead of waiting out --timeout (120 s here), and every
    rank prints rank 1's own cause."""
    run = torchrun(WORLD, [EIO, str(small_ckpt), str(tmp_path), "1", "120"], timeout=600)
    assert run.rc == 0, run.text
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert not any(o["returned"] for o in outcomes)
    assert len({o["error"] for o in outcomes}) == 1, outcomes
    assert all(o["seconds"] < 80 for o in outcomes), [o["seconds"] for o in outcomes]
    error = outcomes[0]["error"]
    assert error.startswith("load failed on rank 1 (1 of 4 ranks); no rank returned weights\n")
    assert "read failed (Is a directory)" in error.split("\n")[1]  # rank 1's own cause
    assert error.split("\n")[2].startswith("rank 3: replicas: stopped receiving ")
    assert error.endswith("from rank 1 (replica 0), which failed while reading it")


def test_a_receiver_that_fails_mid_window_stops_every_rank_at_once_with_its_own_cause(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """Rank 3 (replica 1, position 1) fails (an I/O error) in the middle of a window rank 1 is
    sending it. Before, every rank waited out --timeout (120 s here), rank 3's own cause was lost
    and every message said the live sender "never reached" the exchange. Now rank 3 says it stopped
    in the rendezvous store and drains what it is sent, rank 1 stops sending and ends its stream,
    and every rank prints rank 3's own cause in seconds; no rank is called dead."""
    run = torchrun(WORLD, [EIO, str(small_ckpt), str(tmp_path), "3", "120", "receive"], timeout=600)
    assert run.rc == 0, run.text
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert not any(o["returned"] for o in outcomes)
    assert len({o["error"] for o in outcomes}) == 1, outcomes
    assert all(o["seconds"] < 30 for o in outcomes), [o["seconds"] for o in outcomes]
    error = outcomes[0]["error"]
    assert error.startswith("load failed on rank 3 (1 of 4 ranks); no rank returned weights\n")
    lines = error.split("\n")
    assert lines[1].startswith("rank 3: unexpected OSError: [Errno 5] Input/output error")
    assert "injected while receiving" in lines[1]  # rank 3's own cause
    # rank 1 stops sending when it sees rank 3's flag, or receiving when rank 3's stream ends
    # (mid-window, or at its end: which one depends on where rank 3's reads stand)
    assert lines[2].startswith("rank 1: replicas: stopped ")
    assert lines[2].endswith(
        (
            "to rank(s) 3: rank 3 failed",
            "from rank 3 (replica 1), which failed",
            "at the end of rank 3's stream (replica 1), which failed",
        )
    )
    for dead in ("never reached", "died or hung", "lost the other ranks"):
        assert dead not in error, error
