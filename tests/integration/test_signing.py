"""A signed folder (model_signing, an EC key made here) under real torchrun at tp 2: it loads with
every shard checked whole against its signed digest once on the node; one flipped byte in a shard
fails every rank, naming the file; a model.sig that is a FIFO or far too big fails every rank at
once, well within --timeout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpload.tools.published import write_published
from tpload.verification import signing

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
    # the report and the verified line name the bundle and its signer, as the bundle proves it
    signer = signing.key_id(pub.read_bytes())
    assert doc["trust"]["kind"] == "signature" and doc["trust"]["signer"] == signer
    assert doc["trust"]["file"] == str(folder / "model.sig")
    verified = next(line for line in run.out.splitlines() if line.startswith("verified:"))
    assert f"against model.sig (sha256 {doc['trust']['sha256'][:16]}..., signer {signer})" in (
        verified
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


# a bundle too big to read is the same launch refused by size instead of type: the slow tier runs
# it, keeping the quick tier to one launch per behaviour (the FIFO, which would hang a plain open())
@pytest.mark.parametrize("planted", ["fifo", pytest.param("oversize", marks=pytest.mark.slow)])
def test_a_bundle_that_cannot_be_read_fails_every_rank_within_the_timeout(
    signed: tuple[Path, Path], tmp_path: Path, planted: str
) -> None:
    folder, pub = signed
    bundle = folder / "model.sig"
    bundle.unlink()
    if planted == "fifo":  # a plain open() waits for a writer that never comes, past any timeout
        os.mkfifo(bundle)
        said = f"{bundle}: signature bundle is a FIFO; refused (only regular files are read)"
    else:  # 3 GiB, sparse: refused by its size, never read
        with open(bundle, "wb") as f:
            f.truncate(3 << 30)
        said = (
            f"{bundle}: signature bundle is {3 << 30} bytes, more than any signature bundle needs "
            f"(at most {64 << 20}); refused"
        )
    run = tpload_cli(
        2,
        "--checkpoint",
        str(folder),
        "--signer-key",
        str(pub),
        "--timeout",
        "30",
        logs=tmp_path / "logs",
        timeout=90,  # the old plain open() of a FIFO never returned: the launch would time out
    )
    assert run.rc != 0
    assert run.seconds < 30, f"took {run.seconds:.0f} s: a rank waited on the bundle"
    _, msg = load_error(run)  # one rank prints it in full, the other points to it: both failed
    assert msg.startswith("load failed on rank 0, 1 (2 of 2 ranks); no rank returned weights"), msg
    assert f"rank 0, 1: {said}" in msg, msg
