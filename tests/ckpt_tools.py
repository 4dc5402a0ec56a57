"""Checkpoint surgery for the tests, with the safetensors library (no tpload code; configs are
built from the shipped TOML text), and a launcher for the serve worker."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .helpers import HERE, tensor_offset, torchrun

SERVE = str(HERE / "workers" / "serve.py")


def serve(root: Path, out: Path, nproc: int, *, timeout: float = 240, **kw: str) -> list[dict]:
    """torchrun the serve worker (load(**kw) on every rank); each rank's JSON record."""
    out.mkdir(exist_ok=True)
    run = torchrun(
        nproc, [SERVE, str(root), str(out), *(f"{k}={v}" for k, v in kw.items())], timeout=timeout
    )
    assert run.rc == 0, run.text
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def add_tensors(
    root: Path,
    tensors: dict[str, torch.Tensor],
    *,
    file: str = "extra.safetensors",
    manifest: str = "right",
) -> None:
    """Write ``tensors`` into a new shard of ``root`` and list them in its index.

    ``manifest``: ``right`` adds their true sha256 to NATIVE_MANIFEST.json, ``wrong`` a
    sha256 that cannot match (so any hashing of them fails), ``none`` leaves them out.
    """
    save_file(tensors, str(root / file))
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({n: file for n in tensors})
    index_path.write_text(json.dumps(index))
    repin(root)  # the index changed on purpose: what is tested is the manifest's tensors
    if manifest == "none":
        return
    m = json.loads((root / "NATIVE_MANIFEST.json").read_text())
    for name, t in tensors.items():
        sha = (
            hashlib.sha256(stored_bytes(root, name)).hexdigest()
            if manifest == "right"
            else "0" * 64
        )
        dtype = json.loads(_header(root / file))[name]["dtype"]
        m["tensors"][name] = {"file": file, "dtype": dtype, "shape": list(t.shape), "sha256": sha}
    (root / "NATIVE_MANIFEST.json").write_text(json.dumps(m))


PLAN_FILES = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")
"""The JSON files a manifest pins (docs/format.md), spelled here independently of tpload."""


def repin(root: Path) -> None:
    """Pin ``root``'s JSON files as they are now in its manifest's ``"files"`` (what `tpload
    manifest --force` would write there): for a test that edits one on purpose, so the load reaches
    the check the test is about instead of refusing the edit."""
    path = root / "NATIVE_MANIFEST.json"
    if not path.exists():
        return
    m = json.loads(path.read_text())
    m["files"] = {
        n: {"sha256": hashlib.sha256((root / n).read_bytes()).hexdigest()}
        for n in PLAN_FILES
        if (root / n).exists()
    }
    path.write_text(json.dumps(m))


def _header(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(int.from_bytes(f.read(8), "little"))


def stored_bytes(root: Path, name: str) -> bytes:
    path, off, n = tensor_offset(root, name)
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def nbytes(root: Path, names: list[str] | set[str]) -> int:
    return sum(tensor_offset(root, n)[2] for n in names)


def all_names(root: Path) -> list[str]:
    return list(json.loads((root / "model.safetensors.index.json").read_text())["weight_map"])


def config_with(tmp_path: Path, first_rules: str, base: str = "deepseek-v4-mtp") -> Path:
    """A TOML config: ``first_rules`` (TOML [[rules]] text) before the shipped config's rules."""
    from importlib import resources

    text = (resources.files("tpload.configs") / f"{base}.toml").read_text()
    head, sep, rules = text.partition("[[rules]]")
    path = tmp_path / "config.toml"
    path.write_text(head + first_rules.strip() + "\n\n" + sep + rules)
    return path


def renamed(src: Path, dst: Path, rename, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """A copy of checkpoint ``src`` at ``dst`` with every tensor named ``rename(name)`` (shards,
    index and manifest; the bytes, hence each tensor's sha256, unchanged), plus ``extra`` tensors in
    a new shard."""
    import shutil

    from safetensors.torch import load_file

    shutil.copytree(src, dst)
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for file in sorted(set(index["weight_map"].values())):
        tensors = load_file(str(dst / file))
        save_file(
            {rename(n): t for n, t in tensors.items()}, str(dst / file), metadata={"format": "pt"}
        )
    index["weight_map"] = {rename(n): f for n, f in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    m = json.loads((dst / "NATIVE_MANIFEST.json").read_text())
    m["tensors"] = {rename(n): e for n, e in m["tensors"].items()}
    (dst / "NATIVE_MANIFEST.json").write_text(json.dumps(m))
    repin(dst)
    if extra:  # a new shard each time (a copy of a copy keeps the first's)
        add_tensors(
            dst, extra, file=f"extra-{len(list(dst.glob('extra*.safetensors')))}.safetensors"
        )
    return dst


def ec_keypair(folder: Path, name: str) -> tuple[Path, Path]:
    """A fresh P-256 key pair written as PEM: (``name``.pem private, ``name``.pub.pem public)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def whole(root: Path) -> dict[str, torch.Tensor]:
    """Every stored tensor of a folder's shards, whole (read by safetensors, not tpload)."""
    from safetensors import safe_open

    out = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})  # noqa: SIM118  a safe_open handle is no mapping: keys() is how it lists its tensors
    return out
