"""A huggingface_hub local-dir download (files plus .cache/huggingface/download/<file>.metadata, no
manifest) under real torchrun at tp 2: it loads verified with no flag, each shard hashed whole once
on the node against its etag, and every rank serves what the same checkpoint serves as a hub cache
snapshot; one flipped byte fails every rank, naming the file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tpload.attest.predict import predict
from tpload.loading.pick import choose
from tpload.planning.layout import Layout
from tpload.storage.hub import to_hub_cache
from tpload.tools.published import write_published

from ..helpers import load_error, tensor_offset, torchrun
from ..unit.storage.test_localdir import COMMIT, as_local_dir, flip

pytest.importorskip("huggingface_hub._local_folder")


# Both launches are the slow tier's: whole files hashed once on the node against their anchor, and a
# flipped byte in one failing every rank, are the quick tier's launch of
# tests/integration/test_signing.py (model.sig as the anchor); the local-dir metadata as an anchor
# (a verified load, a flipped byte named with its etag) is unit-tested in-process
# (tests/unit/storage/test_localdir.py).
pytestmark = pytest.mark.slow


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return as_local_dir(write_published(tmp_path / "dl", "gpt-oss-tiny", manifest=False))


def test_a_local_dir_loads_verified_at_tp2_as_its_hub_snapshot_twin(
    local: Path, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    run = torchrun(
        2, ["-m", "tpload", "--checkpoint", str(local), "--report", str(report), "--no-progress"]
    )
    assert run.rc == 0, run.text
    doc = json.loads(report.read_text())
    assert all(r["failed"] == 0 for r in doc["ranks"])
    assert any(
        n.startswith(
            f"local-dir download (commit {COMMIT[:12]}): 2 file(s) checked whole against their "
            "local-dir etags"
        )
        for n in doc["notes"]
    ), doc["notes"]
    shards = sorted(local.glob("*.safetensors"))
    per_node = sum(os.path.getsize(s) for s in shards)
    assert (
        sum(r["bytes_hashed"] for r in doc["ranks"]) == per_node
    )  # each shard hashed whole once on the node

    # the twin: the same bytes as a hub cache snapshot, every rank's digest computed by the load's
    # own code
    twin_src = tmp_path / "twin"
    twin_src.mkdir()
    for f in local.iterdir():
        if f.is_file():
            shutil.copy2(f, twin_src / f.name)
    twin = to_hub_cache(twin_src, tmp_path / "hub", "openai/gpt-oss-tiny")
    config, _ = choose("auto", twin)
    assert [r["digest"] for r in doc["ranks"]] == predict(twin, config, Layout(2), doc["kind"])


def test_a_flipped_byte_fails_every_rank_naming_the_file(local: Path, tmp_path: Path) -> None:
    index = json.loads((local / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(
        n for n, f in sorted(index.items()) if f.endswith("00002.safetensors") and "norm" in n
    )
    path, offset, nbytes = tensor_offset(local, name)
    flip(path, offset + nbytes - 1)  # its metadata stays fresh: only the whole-file hash sees it
    run = torchrun(
        2, ["-m", "tpload", "--checkpoint", str(local), "--no-progress"], logs=tmp_path / "logs"
    )
    assert run.rc != 0 and "verified:" not in run.out
    # the node's one hasher of the file finds it; the verdict fails both ranks, one prints it in
    # full
    _, msg = load_error(run)  # (and checks that the other rank failed, pointing to it)
    assert path.name in msg and "the etag its local-dir download metadata records" in msg, msg
