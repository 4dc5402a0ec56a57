"""The command line under real torchrun: the README default, synth, and failures on every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

from .helpers import tpload_cli

def test_readme_default_loads_the_builtin_checkpoint(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    run = tpload_cli(2, "--report", str(report), env={"TPLOAD_CACHE": str(tmp_path / "cache")})
    assert run.rc == 0, run.text
    assert "verified:" in run.out and "rank node" in run.out
    doc = json.loads(report.read_text())
    assert len(doc["ranks"]) == 2 and doc["tp"] == 2 and doc["verify"] == "node"
    assert all(r["failed"] == 0 and r["tensors"] > 0 for r in doc["ranks"])
    assert (tmp_path / "cache").is_dir()  # made once, cached


def test_synth_writes_a_checkpoint_safetensors_can_read(tmp_path: Path) -> None:
    out = tmp_path / "c"
    subprocess.run([sys.executable, "-m", "tpload", "synth", str(out), "--experts", "3", "--shards", "3"], check=True,
                   capture_output=True)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    manifest = json.loads((out / "NATIVE_MANIFEST.json").read_text())["tensors"]
    assert set(index["weight_map"]) == set(manifest)
    assert len(set(index["weight_map"].values())) == 3
    with safe_open(str(out / index["weight_map"]["mtp.0.ffn.experts.2.w2.weight"]), "pt") as f:
        assert list(f.get_slice("mtp.0.ffn.experts.2.w2.weight").get_shape()) == [256, 128]


def test_single_node_launch_script(small_ckpt: Path, tmp_path: Path) -> None:
    import os
    root = Path(__file__).parent.parent
    env = dict(os.environ, NPROC="2", OMP_NUM_THREADS="1", PYTHONPATH=str(root), CUDA_VISIBLE_DEVICES="")
    p = subprocess.run(["bash", str(root / "launch" / "single-node.sh"), str(small_ckpt), "--no-progress",
                        "--report", str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(json.loads((tmp_path / "r.json").read_text())["ranks"]) == 2
