"""A hub cache snapshot (snapshots/REV/FILE -> blobs/SHA256, no manifest) under real torchrun:
it loads with its config picked from config.json and every shard checked whole against the
sha256 its blob is named by; one flipped byte in one blob fails every rank, naming the file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tpload.storage.hub import to_hub_cache
from tpload.tools.published import write_published

from ..helpers import load_error, tensor_offset, torchrun, tpload_cli


def hub_snapshot(folder: Path) -> Path:
    plain = write_published(folder / "plain", "gpt-oss-tiny", manifest=False)
    return to_hub_cache(plain, folder / "hub", "openai/gpt-oss-tiny")


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    return hub_snapshot(tmp_path)


# Whole files hashed once on the node against their anchor, and a flipped byte failing every rank,
# are the quick tier's launches of tests/integration/test_signing.py (model.sig) and, for a hub
# blob, of the deferral test below: these two are the slow tier's, keeping the quick tier to one
# launch per behaviour (the blob names as an anchor are unit-tested in-process,
# tests/unit/storage/test_hub.py).
@pytest.mark.slow
@pytest.mark.parametrize("verify", ["node", "rank"])
def test_a_hub_snapshot_loads_verified_by_its_blob_names(
    snapshot: Path, tmp_path: Path, verify: str
) -> None:
    report = tmp_path / "r.json"
    run = tpload_cli(
        2,
        "--checkpoint",
        str(snapshot),
        "--kind",
        "expanded",
        "--report",
        str(report),
        "--verify",
        verify,
    )
    assert run.rc == 0, run.text
    assert "config gpt-oss+mxfp4: config.json architectures GptOssForCausalLM" in run.text
    doc = json.loads(report.read_text())
    shards = sorted(snapshot.glob("*.safetensors"))
    assert any("2 file(s) checked whole against their blob sha256" in n for n in doc["notes"]), doc[
        "notes"
    ]
    # whole files: once on this one node (every shard byte hashed once among the ranks), or by each
    # rank
    per_node = sum(os.path.getsize(s) for s in shards)
    assert sum(r["bytes_hashed"] for r in doc["ranks"]) == (
        per_node if verify == "node" else 2 * per_node
    )
    assert all(r["failed"] == 0 for r in doc["ranks"])


@pytest.mark.slow
def test_a_flipped_byte_in_one_blob_fails_every_rank_naming_the_file(
    snapshot: Path, tmp_path: Path
) -> None:
    # flip the last byte of a tensor in the second shard (data, not header): only the file hash sees
    # it
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(
        n for n, f in sorted(index.items()) if f.endswith("00002.safetensors") and "norm" in n
    )
    path, offset, nbytes = tensor_offset(snapshot, name)
    blob = path.resolve()
    with open(blob, "r+b") as f:
        f.seek(offset + nbytes - 1)
        b = f.read(1)
        f.seek(offset + nbytes - 1)
        f.write(bytes([b[0] ^ 0x01]))
    run = tpload_cli(2, "--checkpoint", str(snapshot), logs=tmp_path / "logs")
    assert run.rc != 0
    _, msg = load_error(run)
    assert path.name in msg and "sha256" in msg, msg
    assert "verified:" not in run.out


def _second_shard(snapshot: Path) -> list[str]:
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    return sorted(n for n, f in index.items() if f.endswith("00002.safetensors"))


def test_deferring_a_whole_blob_still_hashes_it_and_vouches_for_each_locator(
    snapshot: Path, tmp_path: Path
) -> None:
    # every tensor of the second shard deferred: no rank reads a window of it, so only the gate's
    # rule (a rank hashes the file of what it defers) keeps its blob checked
    names = _second_shard(snapshot)
    # the same deferral from a second snapshot whose blob is corrupted before the load, loaded
    # next in the same launch: every rank fails naming the file
    corrupt = hub_snapshot(tmp_path / "corrupt")
    assert _second_shard(corrupt) == names
    path, offset, nbytes = tensor_offset(corrupt, names[0])
    blob = path.resolve()
    data = bytearray(blob.read_bytes())
    data[offset] ^= 0x01
    blob.write_bytes(bytes(data))
    worker = str(Path(__file__).parents[1] / "workers" / "defer_stream.py")
    run = torchrun(2, [worker, str(tmp_path), ",".join(names), str(snapshot), str(corrupt)])
    assert run.rc == 0, run.text
    for rank in range(2):
        doc = json.loads((tmp_path / f"rank{rank}-0.json").read_text())
        assert doc["returned"] and not doc["error"], doc["error"]
        assert sorted(d["name"] for d in doc["deferred"]) == names
        for d in doc["deferred"]:
            p, o, n = tensor_offset(snapshot, d["name"])
            want = hashlib.sha256(p.read_bytes()[o : o + n]).hexdigest()
            assert d["sha256"] == want and "hub blob" in d["vouched_by"], d
            assert doc["streamed"][d["name"]] == want

    for rank in range(2):
        doc = json.loads((tmp_path / f"rank{rank}-1.json").read_text())
        msg = doc["error"]
        assert not doc["returned"] and not doc["deferred"], (rank, doc)
        assert path.name in msg and "sha256" in msg, (rank, msg)
