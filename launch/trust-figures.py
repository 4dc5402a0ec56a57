"""Hashing per node for each trust source on the medium checkpoint (issue 20's figure).

python launch/trust-figures.py /tmp/trust   (writes the variants, loads each at tp 2 on 2 ranks,
prints a table; needs the [test] extras: huggingface_hub, model-signing)
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from huggingface_hub._local_folder import write_download_metadata
from model_signing import signing as ms_signing

from tpload.storage.hub import git_blob_sha1, lfs_sha256, to_hub_cache

root = Path(sys.argv[1])
root.mkdir(parents=True, exist_ok=True)
med = root / "medium"
if not med.exists():
    subprocess.run(
        [sys.executable, "-m", "tpload", "synth", str(med), "--preset", "medium"], check=True
    )


def linked(name: str, *, manifest: bool) -> Path:
    d = root / name
    if d.exists():
        shutil.rmtree(d)
    subprocess.run(["cp", "-al", str(med), str(d)], check=True)
    if not manifest:
        (d / "NATIVE_MANIFEST.json").unlink()
    return d


hub = to_hub_cache(linked("plain-hub", manifest=False), root / "hub", "tpload/medium")

local = linked("local", manifest=False)
for f in sorted(p for p in local.iterdir() if p.is_file()):
    etag = lfs_sha256(f) if f.suffix == ".safetensors" else git_blob_sha1(f.read_bytes())
    write_download_metadata(local, f.name, "0" * 40, etag)

key = ec.generate_private_key(ec.SECP256R1())
priv, pub = root / "k.pem", root / "k.pub.pem"
priv.write_bytes(
    key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
)
pub.write_bytes(
    key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
)
signed = linked("signed", manifest=False)
ms_signing.Config().use_elliptic_key_signer(private_key=priv).sign(signed, signed / "model.sig")
signed_m = linked("signed-manifest", manifest=True)
ms_signing.Config().use_elliptic_key_signer(private_key=priv).sign(signed_m, signed_m / "model.sig")

runs = [
    ("manifest (per tensor)", med, []),
    ("hub blob names", hub, []),
    ("local-dir etags", local, []),
    ("model.sig, file digests", signed, ["--signer-key", str(pub)]),
    ("model.sig over the manifest", signed_m, ["--signer-key", str(pub)]),
]
print("| source | GB hashed per node | GB read per node | seconds per rank |")
print("|---|---|---|---|")
for what, d, extra in runs:
    rep = root / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "-m",
        "tpload",
        str(d),
        "--no-progress",
        "--report",
        str(rep),
        *extra,
    ]
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    if p.returncode:
        print(what, "FAILED", p.stderr[-2000:])
        continue
    doc = json.loads(rep.read_text())
    hashed = sum(r["bytes_hashed"] for r in doc["ranks"]) / 1e9
    read = sum(r["bytes_read"] for r in doc["ranks"]) / 1e9
    secs = "-".join(f"{r['seconds']:.2f}" for r in doc["ranks"])
    print(f"| {what} | {hashed:.3f} | {read:.3f} | {secs} |")
