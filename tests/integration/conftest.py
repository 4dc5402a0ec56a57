"""The quick tier's one launch of two torchrun agents as two nodes (--nnodes 2, c10d; each with its
own TPLOAD_NODE_ID; 4 ranks), shared by the tests of what two nodes do: each global rank's tp
position and each node hashing its own copy once (test_multinode.py), and the handshake that fails
every rank in seconds when the nodes do not load the same thing the same way (test_agreement.py).
One embedding caller (tests/workers/embed.py), one load() call per case; a case that fails does so
before any window is read, so the group stays in step for the next, and the last call, where every
rank agrees, proves it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpload.cli import main
from tpload.tools.published import write_published

from ..helpers import poke

WORLD = 4
CASES = ("tp4", "pin", "verify", "anchor", "plan_file", "version", "again")


@dataclass(frozen=True)
class TwoNodes:
    out: Path
    """Where each rank wrote its outcomes (and rank{R}-call0.pt, what it served at tp 4)."""
    outcomes: dict[str, tuple[dict, ...]]
    """Each case's outcome on ranks 0..3, by case (CASES)."""
    tampered: Path
    """Node 1's copy in the "anchor" case: a weight byte flipped and a manifest written over it."""
    heads: tuple[Path, Path]
    """The "plan_file" case's two llama-tiny copies (node 0's, node 1's: another
    num_key_value_heads in config.json), under the same manifest without "files" pins."""


@pytest.fixture(scope="session")
def two_nodes_launch(small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> TwoNodes:
    """The cases, in order: tp 4 over both nodes, saving what each rank serves; then, at 2
    replicas x tp 2 with --timeout 60: a wrong pin on rank 3 alone; node 1 with a flipped copy and
    ``verify="off"``; node 1 with a copy tampered and re-manifested (it agrees with itself); at tp
    4, node 1's config.json with other head counts under a manifest that pins no JSON file; rank 3
    claiming another tpload version; every rank agreeing."""
    from .test_agreement import EMBED, two_nodes  # here: after collection has rewritten it

    root = tmp_path_factory.mktemp("two-nodes")
    flipped, tampered = root / "flipped", root / "tampered"
    for copy in (flipped, tampered):
        shutil.copytree(small_ckpt, copy)
        poke(copy, "head.weight", 5)
    assert main(["manifest", str(tampered), "--force"]) == 0  # flipped keeps its manifest
    # node 1's config.json with another num_key_value_heads under a manifest without "files"
    # pins (an older manifest: the same bytes on both nodes, so the same anchor)
    llama, heads = root / "llama", root / "llama-heads"
    write_published(llama, "llama-tiny")
    manifest = json.loads((llama / "NATIVE_MANIFEST.json").read_text())
    del manifest["files"]
    (llama / "NATIVE_MANIFEST.json").write_text(json.dumps(manifest))
    shutil.copytree(llama, heads)
    model = json.loads((heads / "config.json").read_text())
    assert model["num_key_value_heads"] == 2
    (heads / "config.json").write_text(json.dumps({**model, "num_key_value_heads": 4}))
    common = {"tp": 2, "replicas": 2, "timeout_s": 60.0}
    off = {"checkpoint": str(flipped), "verify": "off"}
    other = {"checkpoint": str(tampered)}
    calls = [
        {"options": {"tp": 4}, "save": True},
        {"options": common, "per_rank": {"3": {"manifest_sha256": "0" * 64}}},
        {"options": common, "per_rank": {"2": off, "3": off}},
        {"options": common, "per_rank": {"2": other, "3": other}},
        {
            "checkpoint": str(llama),
            "options": {"tp": 4, "timeout_s": 60.0},
            "per_rank": {"2": {"checkpoint": str(heads)}, "3": {"checkpoint": str(heads)}},
        },
        {"options": common, "claims_version": {"3": "9.9"}},
        {"options": common},
    ]
    calls = [{"checkpoint": str(small_ckpt), **c} for c in calls]
    out = root / "out"
    out.mkdir()
    rcs, text, _ = two_nodes(lambda n: [EMBED, str(out), json.dumps(calls)])
    assert rcs == [0, 0], text
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    outcomes = dict(zip(CASES, zip(*ranks, strict=True), strict=True))
    return TwoNodes(out, outcomes, tampered, (llama, heads))
