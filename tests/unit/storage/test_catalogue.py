"""Checkpoint parsing: every malformation named, paths kept inside the folder."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from tpload.checkpoint import Checkpoint, natural_key
from tpload.errors import CheckpointError


def write_raw(path: Path, header: dict | bytes, data: bytes) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_reads_every_tensor_of_the_small_preset(small_ckpt: Path) -> None:
    c = Checkpoint(small_ckpt)
    assert len(c.tensors) == len(c.manifest)
    name = "mtp.0.ffn.experts.3.w2.weight"
    assert c.sha256(name) == c.manifest[name].sha256
    assert c.raw2d(name).shape == (256, 128)


def test_natural_order() -> None:
    assert sorted(["x.10", "x.2", "x.1"], key=natural_key) == ["x.1", "x.2", "x.10"]


@pytest.mark.parametrize("header, data, needle", [
    (b"{not json", b"", "header is not JSON"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "runs past the data"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, r"F32 x \[3\] is 12"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, "overlap"),
    ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8, "dtype 'C64' is not served"),
])
def test_bad_headers_are_named(tmp_path: Path, header, data: bytes, needle: str) -> None:
    write_raw(tmp_path / "m.safetensors", header, data)
    with pytest.raises(CheckpointError, match=needle) as e:
        Checkpoint(tmp_path)
    assert "m.safetensors" in str(e.value)


def test_every_header_problem_is_listed_at_once(tmp_path: Path) -> None:
    write_raw(tmp_path / "m.safetensors", {
        "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
        "b": {"dtype": "Q9", "shape": [1], "data_offsets": [8, 9]},
    }, b"\0" * 9)
    with pytest.raises(CheckpointError) as e:
        Checkpoint(tmp_path)
    assert "2 problems" in str(e.value) and "tensor a" in str(e.value) and "tensor b" in str(e.value)


def test_header_length_past_the_file(tmp_path: Path) -> None:
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(CheckpointError, match="header length 1048576 runs past the file"):
        Checkpoint(tmp_path)


def _index(root: Path, wmap: dict) -> None:
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))


@pytest.mark.parametrize("file", ["../x.safetensors", "/etc/x.safetensors", "a/../../x.safetensors"])
def test_index_paths_outside_the_folder_are_refused(tmp_path: Path, file: str) -> None:
    _index(tmp_path, {"t": file})
    with pytest.raises(CheckpointError, match="points outside the checkpoint folder"):
        Checkpoint(tmp_path)


def test_symlinked_shards_stay_allowed(tmp_path: Path) -> None:
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir(), snap.mkdir()
    write_raw(blobs / "abc123", {"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    os.symlink(blobs / "abc123", snap / "model.safetensors")
    _index(snap, {"t": "model.safetensors"})
    assert Checkpoint(snap).info("t").nbytes == 4


def test_index_naming_a_missing_file(tmp_path: Path) -> None:
    _index(tmp_path, {"t": "nope.safetensors"})
    with pytest.raises(CheckpointError, match="shard nope.safetensors does not exist"):
        Checkpoint(tmp_path)


def test_manifest_not_json(ckpt_copy: Path) -> None:
    (ckpt_copy / "NATIVE_MANIFEST.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="NATIVE_MANIFEST.json: manifest is not readable JSON"):
        Checkpoint(ckpt_copy)


def test_manifest_disagreeing_with_header_is_listed(ckpt_copy: Path) -> None:
    m = json.loads((ckpt_copy / "NATIVE_MANIFEST.json").read_text())
    m["tensors"]["head.weight"]["shape"] = [1, 2]
    del m["tensors"]["mtp.0.enorm.weight"]
    (ckpt_copy / "NATIVE_MANIFEST.json").write_text(json.dumps(m))
    c = Checkpoint(ckpt_copy)
    with pytest.raises(CheckpointError) as e:
        c.check_manifest(c.names())
    msg = str(e.value)
    assert "head.weight: manifest says" in msg and "[1, 2]" in msg
    assert "mtp.0.enorm.weight" in msg and "not in the manifest" in msg
