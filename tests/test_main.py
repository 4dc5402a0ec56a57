"""The command line under real torchrun: the README default, synth, and failures on every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from tpload.synth import SynthSpec, write_checkpoint

from .helpers import error_of, poke, tpload_cli

BOUND_S = 60  # a failed load must end every rank within this


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


def assert_failed_everywhere(run, *needles: str) -> str:
    assert run.rc != 0, run.text
    assert run.seconds < BOUND_S
    msgs = [error_of(run.rank_err[r], r) for r in sorted(run.rank_err)]
    assert len(msgs) == 2 and all(msgs), run.text
    assert msgs[0] == msgs[1], msgs  # the same message on every rank
    for needle in needles:
        assert needle in msgs[0], msgs[0]
    assert "no rank returned weights" in msgs[0]
    return msgs[0]


def test_flipped_bit_in_an_expert_weight(ckpt_copy: Path, tmp_path: Path) -> None:
    poke(ckpt_copy, "mtp.0.ffn.experts.3.w1.weight", 1000)
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), logs=tmp_path / "logs")
    msg = assert_failed_everywhere(run, "mtp.0.ffn.experts.3.w1.weight", "does not match the manifest",
                                   "model-00001-of-00002.safetensors")
    assert msg.startswith("load failed on rank")


@pytest.mark.parametrize("value, what", [(0xFF, "0x00/0xFF"), (0x00, "0x00/0xFF")])
def test_bad_scale_byte_even_with_a_matching_manifest(ckpt_copy: Path, tmp_path: Path, value: int, what: str) -> None:
    # rows 200.. of w3 belong to tp rank 1; the manifest is re-hashed so only the scale check can catch it
    poke(ckpt_copy, "mtp.0.ffn.experts.1.w3.scale", 200 * 8 + 3, value, fix_manifest=True)
    run = tpload_cli(2, "--checkpoint", str(ckpt_copy), "--kind", "expanded", logs=tmp_path / "logs")
    msg = assert_failed_everywhere(run, "mtp.0.ffn.experts.1.w3", what, "rank 1:")
    assert "load failed on rank 1 (1 of 2 ranks)" in msg


def test_impossible_tp_fails_everywhere_with_the_working_layouts(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "c", SynthSpec(inter=192, experts=4))
    run = tpload_cli(2, "--checkpoint", str(root), logs=tmp_path / "logs")
    assert_failed_everywhere(run, "192 channels / tp 2 = 96, not a multiple of 64", "--tp 1 --ep 2")
