"""Every rank proves, before any window is read, that it loads the same thing the same way
(tpload/distributed/agreement.py), on two nodes: two torchrun agents (--nnodes 2, c10d), each with
its own TPLOAD_NODE_ID and its own copy of the checkpoint, 2 replicas x tp 2. The quick tier's cases
share one launch with tests/integration/test_multinode.py (tests/integration/conftest.py); the
tampered copy through the command line, and the rest of the cases (another checkpoint, a pin on one
node, differences through the API, an owner failing mid-window), are the slow tier's (here and in
tests/slow/test_agreement.py)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import tpload
from tpload.cli import main

from ..helpers import HERE, free_port, poke
from .conftest import TwoNodes
from .test_multinode import agent

EMBED = str(HERE / "workers" / "embed.py")
WORLD = 4


def ends(procs: list[subprocess.Popen], timeout: float = 240) -> tuple[list[int], str, float]:
    """Wait for every agent: their exit codes, their output together, the seconds it took."""
    t0, outs = time.monotonic(), []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], "\n".join(outs), time.monotonic() - t0


def two_nodes(args_of, **extra: str) -> tuple[list[int], str, float]:
    """Two agents as two nodes; ``args_of(node)``: node's command after torchrun's options."""
    port = free_port()
    return ends([agent(n, port, args_of(n), TPLOAD_NODE_ID=f"box{n}", **extra) for n in (0, 1)])


def verdict_of(text: str) -> tuple[int, str]:
    """(reporter, message) of a failed command-line load: every rank ends, one printing the
    verdict in full (to the next rank's line) and each other pointing to it."""
    full = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(
            r"\[rank (\d)\] tpload: error: (.*?)(?=\n\S*\[rank \d\]|\Z)", text, re.S
        )
    }
    assert len(full) == 1, text
    ((reporter, message),) = full.items()
    for r in range(WORLD):
        if r != reporter:
            assert f"[rank {r}] tpload: load failed (see rank {reporter})" in text, (r, text)
    return reporter, message


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The same case through the API is in the quick tier's two-node launch (below); this one, through
# the command line, is the slow tier's.
@pytest.mark.slow
def test_a_node_whose_copy_was_tampered_and_remanifested_fails_every_rank_naming_the_anchor(
    small_ckpt: Path, tmp_path: Path
) -> None:
    """Node 1's copy has a flipped weight byte and a manifest written over it (`manifest --force`:
    the copy agrees with itself). Before the handshake node 0 served node 1's bytes under its own
    verified table, with exit 0 on every rank."""
    tampered = tmp_path / "node1"
    shutil.copytree(small_ckpt, tampered)
    poke(tampered, "head.weight", 5)
    assert main(["manifest", str(tampered), "--force"]) == 0
    mine, theirs = (
        sha256(small_ckpt / "NATIVE_MANIFEST.json"),
        sha256(tampered / "NATIVE_MANIFEST.json"),
    )
    assert mine != theirs
    folder = {0: small_ckpt, 1: tampered}
    rcs, text, _ = two_nodes(
        lambda n: ["-m", "tpload", "--no-progress", str(folder[n]), "--tp", "2", "--replicas", "2"]
    )
    assert rcs[0] != 0 and rcs[1] != 0, text
    reporter, message = verdict_of(text)
    assert reporter == 0  # every rank refuses: the lowest prints it
    assert message.startswith("load failed on rank 0, 1, 2, 3 (4 of 4 ranks); no rank returned")
    assert (
        "the ranks do not load the same thing the same way: they differ in the trust anchor "
        f"(rank 0, 1: 'manifest sha256 {mine[:45]}...'; rank 2, 3: 'manifest sha256 "
        f"{theirs[:45]}...'); every node must hold the same checkpoint" in message
    ), message
    assert "served GB" not in text  # no table: nothing was loaded


def test_through_the_api_a_node_whose_copy_was_tampered_and_remanifested_fails_every_rank(
    small_ckpt: Path, two_nodes_launch: TwoNodes
) -> None:
    """Node 1's copy has a flipped weight byte and a manifest written over it (`manifest --force`:
    the copy agrees with itself), given to load() on node 1's ranks. Before the handshake node 0
    served node 1's bytes under its own verified table, and every rank returned weights."""
    anchor = two_nodes_launch.outcomes["anchor"]
    mine, theirs = (
        sha256(small_ckpt / "NATIVE_MANIFEST.json"),
        sha256(two_nodes_launch.tampered / "NATIVE_MANIFEST.json"),
    )
    assert mine != theirs
    assert not any(o["returned"] for o in anchor)
    assert len({o["error"] for o in anchor}) == 1, anchor  # one verdict, every rank
    message = anchor[0]["error"]
    assert message.startswith("load failed on rank 0, 1, 2, 3 (4 of 4 ranks); no rank returned")
    assert (
        "the ranks do not load the same thing the same way: they differ in the trust anchor "
        f"(rank 0, 1: 'manifest sha256 {mine[:45]}...'; rank 2, 3: 'manifest sha256 "
        f"{theirs[:45]}...'); every node must hold the same checkpoint" in message
    ), message


def test_an_early_failure_or_an_option_that_differs_on_one_node_fails_every_rank_in_seconds(
    two_nodes_launch: TwoNodes,
) -> None:
    """Through the API, 2 replicas x tp 2 with --timeout 60: (1) a wrong pin on rank 3 alone, which
    before the handshake made every rank wait out the timeout and then name rank 3 as dead;
    (2) node 1 with a flipped copy (its manifest unchanged: only the verify mode differs) and
    `verify="off"`, which node 0 served unhashed; (3) the same group loads together again after
    both (and after the tampered copy above)."""
    pin, verify, again = (two_nodes_launch.outcomes[c] for c in ("pin", "verify", "again"))
    assert not any(o["returned"] for o in pin + verify)
    assert len({o["error"] for o in pin}) == 1 and len({o["error"] for o in verify}) == 1
    error = pin[0]["error"]
    assert error.startswith("load failed on rank 3 (1 of 4 ranks); no rank returned weights\n")
    assert (
        "\nrank 3: " in error
        and "is not the pinned 0000000000000000... (--manifest-sha256)" in error
    )
    assert error.endswith("\nrank 0, 1, 2: stopped before the copy loop: rank 3 failed before it")
    assert "never reached it" not in error
    assert all(o["seconds"] < 30 for o in pin), [o["seconds"] for o in pin]  # not --timeout
    assert (
        "they differ in the verify mode (rank 0, 1: 'node'; rank 2, 3: 'off'); give every rank "
        "the same --verify" in verify[0]["error"]
    )
    assert all(o["returned"] and o["tensors"] > 0 for o in again), again
    assert again[0]["digest"] == again[2]["digest"] != again[1]["digest"] == again[3]["digest"]


def test_a_node_whose_config_json_differs_unpinned_fails_every_rank_naming_config_json(
    two_nodes_launch: TwoNodes,
) -> None:
    """At tp 4 over two nodes, node 1's config.json says 4 KV heads where node 0's says 2, under a
    manifest that pins no JSON file (an older manifest: the same bytes, so the same anchor, on both
    nodes). The config id is the same (it hashes the rules); before, ranks 2-3 served k_proj and
    v_proj cut another way, with exit 0 on every rank."""
    mine, theirs = (sha256(folder / "config.json") for folder in two_nodes_launch.heads)
    assert mine != theirs
    outcome = two_nodes_launch.outcomes["plan_file"]
    assert not any(o["returned"] for o in outcome)
    assert len({o["error"] for o in outcome}) == 1, outcome  # one verdict, every rank
    message = outcome[0]["error"]
    assert message.startswith("load failed on rank 0, 1, 2, 3 (4 of 4 ranks); no rank returned")
    assert (
        "the ranks do not load the same thing the same way: they differ in config.json "
        f"(rank 0, 1: 'sha256 {mine[:16]}'; rank 2, 3: 'sha256 {theirs[:16]}'); every node must "
        "hold the same config.json" in message
    ), message
    assert "the config (" not in message  # the same rules: the file is what differs
    assert all(o["seconds"] < 30 for o in outcome), [o["seconds"] for o in outcome]


def test_a_rank_claiming_another_tpload_version_is_named_on_every_rank_before_any_collective(
    two_nodes_launch: TwoNodes,
) -> None:
    """Rank 3's tpload says it is 9.9 (the worker sets ``tpload.__version__`` for that call).
    Before, versions were never compared (a rank whose handshake row was longer aborted its peers
    in gloo); now every rank reads the others' stamps in the rendezvous store before the first
    collective and fails naming them, in seconds, and the group loads together again after."""
    outcome, again = two_nodes_launch.outcomes["version"], two_nodes_launch.outcomes["again"]
    assert not any(o["returned"] for o in outcome)
    mine = f"tpload {tpload.__version__}, handshake row format 3"
    sides = f"(rank 0-2: '{mine}'; rank 3: 'tpload 9.9, handshake row format 3')"
    for r, o in enumerate(outcome):
        assert o["error"] == (
            f"rank {r}: the ranks run different tploads {sides}; every rank must run the same "
            "tpload: install one version on every node (`python -m tpload --version` on each)"
        ), o["error"]
    assert all(o["seconds"] < 30 for o in outcome), [o["seconds"] for o in outcome]
    assert all(o["returned"] for o in again), again
