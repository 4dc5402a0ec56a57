"""A signed folder (model_signing, an EC key made here) under real torchrun at tp 2: it loads with
every shard checked whole against its signed digest once on the node; one flipped byte in a shard
fails every rank, naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpload.tools.published import write_published

from ..ckpt_tools import ec_keypair
from ..helpers import load_error, tensor_offset, tpload_cli

ms_signing = pytest.importorskip("model_signing.signing")


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path]:
    folder = write_published(tmp_path / "m", "gpt-oss-tiny", manifest=False)
    private, public = ec_keypair(tmp_path, "k")
    ms_signing.Config().use_elliptic_key_signer(private_key=private).sign(
        folder, folder / "model.sig"
    )
    return folder, public


def test_a_signed_folder_loads_at_tp2_and_a_tampered_shard_fails_every_rank(
    signed: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, pub = signed
    report = tmp_path / "r.json"
    run = tpload_cli(
        2, "--checkpoint", str(folder), "--signer-key", str(pub), "--report", str(report)
    )
    assert run.rc == 0, run.text
    doc = json.loads(report.read_text())
    shards = sorted(folder.glob("*.safetensors"))
    assert all(r["failed"] == 0 for r in doc["ranks"])
    assert sum(r["bytes_hashed"] for r in doc["ranks"]) == sum(
        os.path.getsize(s) for s in shards
    )  # once a node
    assert any(
        "model.sig: 2 file(s) checked whole against their signed digests" in n for n in doc["notes"]
    )

    path, offset, nbytes = tensor_offset(folder, "model.layers.1.post_attention_layernorm.weight")
    with open(path, "r+b") as f:  # a data byte, not the header: only the file's digest sees it
        f.seek(offset + nbytes - 1)
        b = f.read(1)
        f.seek(offset + nbytes - 1)
        f.write(bytes([b[0] ^ 0x01]))
    run = tpload_cli(
        2, "--checkpoint", str(folder), "--signer-key", str(pub), logs=tmp_path / "logs"
    )
    assert run.rc != 0
    _, msg = load_error(run)  # one rank prints it in full, the other points to it: both failed
    assert f"{path.name}: file sha256" in msg and "the digest model.sig signs for it" in msg, msg
    assert "verified:" not in run.out
