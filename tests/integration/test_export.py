"""Pre-partitioned checkpoints: export writes one file per rank; loading it under real torchrun
reads only the rank's own file and serves what the source serves; other layouts are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .ckpt_tools import serve
from .helpers import HERE, error_of, poke, tpload_cli


def export(src: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpload", "export", str(src), str(out), *flags],
                          capture_output=True, text=True, check=False, env={"PYTHONPATH": str(HERE.parent), "PATH": ""})


def data_bytes(path: Path) -> int:
    """A safetensors file's data bytes (file size less its header), read without tpload."""
    with open(path, "rb") as f:
        return path.stat().st_size - 8 - int.from_bytes(f.read(8), "little")



@pytest.fixture(scope="module")
def exported(small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("x") / "tp2ep2"
    done = export(small_ckpt, out, "--tp", "2", "--ep", "2")
    assert done.returncode == 0, done.stderr
    return out


def test_export_files_and_manifest(exported: Path, small_ckpt: Path) -> None:
    files = sorted(p.name for p in exported.glob("*.safetensors"))
    assert files == [f"rank-{r:05d}-of-00004.safetensors" for r in range(4)]
    doc = json.loads((exported / "NATIVE_MANIFEST.json").read_text())
    assert doc["partitioned"]["tp"] == 2 and doc["partitioned"]["ep"] == 2 and doc["partitioned"]["world"] == 4
    assert [r["file"] for r in doc["ranks"]] == files
    src = json.loads((small_ckpt / "NATIVE_MANIFEST.json").read_text())["tensors"]
    assert {n: e["sha256"] for n, e in doc["tensors"].items()} == {n: e["sha256"] for n, e in src.items()}
    with open(exported / files[3], "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    assert (meta["tp"], meta["ep"], meta["rank"]) == ("2", "2", "3")


def test_same_layout_reads_only_its_own_file_and_serves_the_same(exported: Path, small_ckpt: Path,
                                                                  tmp_path: Path) -> None:
    mine = serve(exported, tmp_path / "x", 4, tp="2", ep="2")
    theirs = serve(small_ckpt, tmp_path / "s", 4, tp="2", ep="2")
    ranks = mine[0]["report"]["ranks"]
    for r in range(4):
        own = data_bytes(exported / f"rank-{r:05d}-of-00004.safetensors")
        assert ranks[r]["bytes_read"] == own == ranks[r]["bytes_hashed"]  # its own file, read and hashed once
        assert ranks[r]["page_cache_before"] <= (exported / f"rank-{r:05d}-of-00004.safetensors").stat().st_size
        assert ranks[r]["digest"] == theirs[0]["report"]["ranks"][r]["digest"]
        a, b = torch.load(tmp_path / "x" / f"rank{r}.pt"), torch.load(tmp_path / "s" / f"rank{r}.pt")
        assert list(a) == list(b) and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def test_expanded_from_an_export_has_the_source_digests(exported: Path, small_ckpt: Path, tmp_path: Path) -> None:
    docs = []
    for name, root in (("x", exported), ("s", small_ckpt)):
        run = tpload_cli(4, "--checkpoint", str(root), "--tp", "2", "--ep", "2", "--kind", "expanded",
                         "--report", str(tmp_path / f"{name}.json"), timeout=240)
        assert run.rc == 0, run.text
        docs.append(json.loads((tmp_path / f"{name}.json").read_text()))
    assert [r["digest"] for r in docs[0]["ranks"]] == [r["digest"] for r in docs[1]["ranks"]]


def test_another_layout_is_refused_naming_both(exported: Path, tmp_path: Path) -> None:
    run = tpload_cli(2, "--checkpoint", str(exported), logs=tmp_path / "logs")
    assert run.rc != 0
    msgs = [error_of(run.rank_err[r], r) for r in range(2)]
    assert msgs[0] == msgs[1]
    assert "pre-partitioned for tp 2 x ep 2 (4 ranks); this load asks for tp 2 x ep 1 on 2 ranks" in msgs[0]
    assert "--tp 2 --ep 2" in msgs[0]


def test_a_corrupt_rank_file_fails_naming_it(exported: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    path = copy / "rank-00001-of-00004.safetensors"
    with open(path, "r+b") as f:
        f.seek(-100, 2)  # a byte of the last tensor of rank 1's file
        b = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([b[0] ^ 1]))
    run = tpload_cli(4, "--checkpoint", str(copy), "--tp", "2", "--ep", "2", logs=tmp_path / "logs", timeout=240)
    assert run.rc != 0
    msg = error_of(run.rank_err[0], 0)
    assert "load failed on rank 1 (1 of 4 ranks)" in msg and "rank-00001-of-00004.safetensors" in msg
    assert "does not match the manifest" in msg


def test_deferred_and_skipped_at_export(small_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "x"
    done = export(small_ckpt, out, "--tp", "1", "--defer", "head.weight", "--skip", "mtp.0.ffn.shared_experts.*")
    assert done.returncode == 0, done.stderr
    doc = serve(out, tmp_path / "o", 1, tp="1", defer="head.weight", skip="mtp.0.ffn.shared_experts.*")[0]
    (loc,) = doc["deferred"]
    assert loc["name"] == "head.weight" and loc["path"] == str(out / "rank-00000-of-00001.safetensors")
    with open(loc["path"], "rb") as f:
        f.seek(loc["offset"])
        assert loc["sha256"] == hashlib.sha256(f.read(loc["nbytes"])).hexdigest()
    assert not any("shared_experts" in n for n in doc["names"])
    # the same folder under another config: its plan does not match the file
    run = tpload_cli(1, "--checkpoint", str(out), "--tp", "1", logs=tmp_path / "logs")
    assert "does not match this load's plan for rank 0" in error_of(run.rank_err[0], 0)


def test_a_corrupt_source_is_not_exported(ckpt_copy: Path, tmp_path: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.2.w3.scale", 3)
    done = export(ckpt_copy, tmp_path / "x", "--tp", "2")
    assert done.returncode == 1
    assert "mtp.0.ffn.experts.2.w3.scale: sha256" in done.stderr and "nothing exported" in done.stderr
    assert not (tmp_path / "x" / "NATIVE_MANIFEST.json").exists()
