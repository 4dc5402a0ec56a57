"""plan (predicted digests), verify and manifest: the tools that need no GPU and no world."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tpload.checkpoint import Checkpoint
from tpload.config import load_config
from tpload.offline import PREDICTIONS_NAME, predict, verify_checkpoint
from tpload.plan import Layout, Planner

from .helpers import edit_json, poke, shard_of, tpload_cli


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpload", *args], capture_output=True, text=True)


def test_plan_prints_every_rank_and_predicts_what_the_load_serves(ckpt_copy: Path, tmp_path: Path) -> None:
    out = cli("plan", str(ckpt_copy), "--tp", "2", "--kind", "expanded", "--write")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1"] and all(len(r[-1]) == 64 for r in rows)
    stored = json.loads((ckpt_copy / PREDICTIONS_NAME).read_text())["layouts"]
    (key, entry), = stored.items()
    digests = entry["digests"]
    assert key.startswith("tp2-ep1-expanded-config-") and digests == [r[-1] for r in rows]
    assert set(entry["verified"]["shards"]) == {p.name for p in ckpt_copy.glob("*.safetensors")}
    report = tmp_path / "r.json"
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), "--kind", "expanded", "--report", str(report))
    assert run.rc == 0, run.text
    doc = json.loads(report.read_text())
    assert doc["predictions"] == "matched" and [r["digest"] for r in doc["ranks"]] == digests


def test_predictions_differ_by_kind_and_layout(small_ckpt: Path) -> None:
    planner = Planner(Checkpoint(small_ckpt), load_config())
    packed, expanded = predict(planner, Layout(2), "packed"), predict(planner, Layout(2), "expanded")
    assert len(set(packed + expanded)) == 4
    assert predict(planner, Layout(1), "packed")[0] not in packed


def test_verify_lists_every_bad_tensor(ckpt_copy: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.1.w1.weight", 5)
    poke(ckpt_copy, "head.weight", 9)
    poke(ckpt_copy, "mtp.0.ffn.experts.4.w2.scale", 0, 0xFF, fix_manifest=True)
    edit_json(ckpt_copy / "NATIVE_MANIFEST.json", lambda m: m["tensors"].pop("mtp.0.enorm.weight"))
    problems = verify_checkpoint(ckpt_copy, load_config())
    text = "\n".join(problems)
    assert len(problems) == 4, text
    for needle in ("mtp.0.ffn.experts.1.w1.weight: sha256", "head.weight: sha256", "tensor mtp.0.enorm.weight (in model-00001-of-00002.safetensors) is not in the manifest",
                   "mtp.0.ffn.experts.4.w2.scale: 1 E8M0 scale bytes 0x00/0xFF"):
        assert needle in text
    out = cli("verify", str(ckpt_copy))
    assert out.returncode == 1 and out.stdout.count("BAD ") == 4 and "4 problem(s)" in out.stdout


def test_verify_passes_a_good_checkpoint(small_ckpt: Path) -> None:
    out = cli("verify", str(small_ckpt))
    assert out.returncode == 0 and out.stdout.strip().endswith("OK")


def test_manifest_writes_refuses_and_forces(ckpt_copy: Path) -> None:
    original = json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"]
    (ckpt_copy / "NATIVE_MANIFEST.json").unlink()
    assert cli("manifest", str(ckpt_copy)).returncode == 0
    assert json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())["tensors"] == original
    again = cli("manifest", str(ckpt_copy))
    assert again.returncode == 1 and "--force" in again.stderr
    assert cli("manifest", str(ckpt_copy), "--force").returncode == 0


def _digest_load(root: Path, tmp_path: Path) -> tuple[object, dict | None]:
    report = tmp_path / "digest.json"
    report.unlink(missing_ok=True)
    run = tpload_cli(2, "--checkpoint", str(root), "--verify", "digest", "--report", str(report))
    return run, json.loads(report.read_text()) if run.rc == 0 else None


def test_verify_digest_trusts_only_fresh_sha256_verified_predictions(ckpt_copy: Path, tmp_path: Path) -> None:
    run, _ = _digest_load(ckpt_copy, tmp_path)  # nothing stored yet: refused on every rank, nothing read
    assert run.rc != 0 and run.text.count("holds no prediction for tp2-ep1-packed") >= 2, run.text
    assert f"plan {ckpt_copy} --tp 2 --ep 1 --kind packed" in run.text
    assert cli("plan", str(ckpt_copy), "--tp", "2", "--write").returncode == 0
    run, doc = _digest_load(ckpt_copy, tmp_path)
    assert run.rc == 0, run.text
    assert doc["verify"] == "digest" and doc["predictions"].startswith("matched (sha256-verified")
    assert sum(r["bytes_hashed"] for r in doc["ranks"]) == 0 and all(r["tensors"] > 0 for r in doc["ranks"])
    # A changed byte whose shard keeps its size and mtime: the fingerprints still catch it, naming the rank.
    shard = ckpt_copy / shard_of(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight")
    stat = shard.stat()
    poke(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 0)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    run, _ = _digest_load(ckpt_copy, tmp_path)
    assert run.rc != 0 and "rank 0: digest" in run.text and "differs from the prediction" in run.text, run.text
    # A rewritten shard (new mtime) makes the prediction stale: refused before reading.
    poke(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 0)
    run, _ = _digest_load(ckpt_copy, tmp_path)
    assert run.rc != 0 and f"shard {shard.name} changed (size or mtime)" in run.text, run.text


def test_plan_write_refuses_a_checkpoint_that_fails_sha256(ckpt_copy: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.2.w3.weight", 7)
    out = cli("plan", str(ckpt_copy), "--tp", "2", "--write")
    assert out.returncode == 1 and "mtp.0.ffn.experts.2.w3.weight" in out.stderr and "sha256" in out.stderr, out.stderr
    assert not (ckpt_copy / PREDICTIONS_NAME).exists()
