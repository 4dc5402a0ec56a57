"""Reading a native folder: every malformation named with its file, every broken shard listed
at once, index paths kept inside the folder, the manifest checked against the headers."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from tpload.model.errors import CheckpointError
from tpload.model.templates import natural_key
from tpload.storage.catalogue import read_native
from tpload.storage.sharded import ShardedStorage

from ...ckpt_tools import all_names, stored_bytes
from ...helpers import edit_json, tensor_offset
from .shards import MANIFEST, f32, write_index, write_raw


def test_reads_every_tensor_of_the_small_preset(small_ckpt: Path) -> None:
    cat, locations = read_native(small_ckpt)
    assert sorted(cat.tensors) == sorted(all_names(small_ckpt)) == sorted(cat.manifest or {})
    name = "mtp.0.ffn.experts.3.w2.weight"
    path, offset, nbytes = tensor_offset(small_ckpt, name)
    info = locations[name]
    assert (info.path, info.begin, info.nbytes, info.rows, info.row_bytes) == (
        path,
        offset,
        nbytes,
        256,
        128,
    )
    assert cat.get(name).shape == (256, 128) and cat.get(name).dtype == "I8"
    assert cat.manifest[name].sha256 == hashlib.sha256(stored_bytes(small_ckpt, name)).hexdigest()


def test_sharded_storage_reads_the_stored_rows(small_ckpt: Path) -> None:
    storage = ShardedStorage(small_ckpt)
    try:
        name = "head.weight"
        stored = storage.stored(name)
        out = np.empty((stored.rows - 10, stored.row_bytes), dtype=np.uint8)
        storage.read(stored, 10, stored.rows, out)
        raw = np.frombuffer(stored_bytes(small_ckpt, name), dtype=np.uint8).reshape(stored.rows, -1)
        assert np.array_equal(out, raw[10:])
        assert stored.sha256 == storage.catalogue.manifest[name].sha256
        assert storage.paths() == sorted(small_ckpt.glob("*.safetensors"))
    finally:
        storage.close()


def test_natural_order() -> None:
    assert sorted(["x.10", "x.2", "x.1", "x.02.y"], key=natural_key) == [
        "x.1",
        "x.02.y",
        "x.2",
        "x.10",
    ]


def test_natural_order_is_a_column_of_the_catalogue_not_a_process_cache(small_ckpt: Path) -> None:
    """natural_key keeps nothing between calls (a library must not grow for the life of its host
    process); a catalogue keeps its own names' order, as ranks any sort of them can use."""
    assert not hasattr(natural_key, "cache_info")
    cat, _ = read_native(small_ckpt)
    ranks = cat.ranks()
    assert list(ranks) == cat.names() == sorted(cat.tensors, key=natural_key)
    assert list(ranks.values()) == list(range(len(cat.tensors)))
    assert cat.ranks() is ranks


@pytest.mark.parametrize(
    "header, data, needle",
    [
        (b"{not json", b"", "header is not readable JSON"),
        ({"a": f32(2)}, b"\0" * 4, "runs past the data"),
        (
            {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
            b"\0" * 8,
            r"F32 x \[3\] is 12",
        ),
        ({"a": f32(2), "b": f32(2, begin=4)}, b"\0" * 12, "tensors a and b overlap"),
        (
            {"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}},
            b"\0" * 8,
            "dtype 'C64' is not served",
        ),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}},
            b"\0" * 8,
            r"data_offsets \[8, 0\] are not ordered",
        ),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}},
            b"\0" * 8,
            "is not \\[begin, end\\]",
        ),
        ({"a": [1, 2]}, b"", "header entry is not an object"),
        (b"[1, 2]", b"", "header is not a JSON object"),
    ],
)
def test_bad_headers_are_named(
    tmp_path: Path, header: dict | bytes, data: bytes, needle: str
) -> None:
    write_raw(tmp_path / "m.safetensors", header, data)
    with pytest.raises(CheckpointError, match=needle) as e:
        read_native(tmp_path)
    assert str(tmp_path / "m.safetensors") in str(e.value)


def test_every_header_problem_is_listed_at_once(tmp_path: Path) -> None:
    write_raw(
        tmp_path / "m.safetensors",
        {
            "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
            "b": {"dtype": "Q9", "shape": [1], "data_offsets": [8, 9]},
        },
        b"\0" * 9,
    )
    with pytest.raises(CheckpointError) as e:
        read_native(tmp_path)
    msg = str(e.value)
    assert "2 problems in the header of" in msg and "tensor a:" in msg and "tensor b:" in msg


def test_every_broken_shard_is_listed_at_once(tmp_path: Path) -> None:
    write_raw(tmp_path / "a.safetensors", b"{oops", b"")
    write_raw(tmp_path / "b.safetensors", {"t": f32(4)}, b"\0" * 8)
    write_raw(tmp_path / "c.safetensors", {"u": f32(1)}, b"\0" * 4)  # sound: not listed
    (tmp_path / "d.safetensors").write_bytes(b"\1\2")
    with pytest.raises(CheckpointError) as e:
        read_native(tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"3 problems with the shards of {tmp_path}")
    for file in ("a", "b", "d"):
        assert f"{tmp_path}/{file}.safetensors: " in msg
    assert "c.safetensors" not in msg


def test_header_length_past_the_file(tmp_path: Path) -> None:
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(
        CheckpointError, match="m.safetensors: header length 1048576 runs past the file"
    ):
        read_native(tmp_path)


@pytest.mark.parametrize(
    "file", ["../x.safetensors", "/etc/x.safetensors", "a/../../x.safetensors"]
)
def test_index_paths_outside_the_folder_are_refused(tmp_path: Path, file: str) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    write_raw(
        tmp_path / "x.safetensors", {"t": f32(1)}, b"\0" * 4
    )  # there to be read, were it allowed
    write_index(root, {"t": file})
    with pytest.raises(CheckpointError, match="points outside the checkpoint folder") as e:
        read_native(root)
    assert str(root / "model.safetensors.index.json") in str(e.value)


def test_symlinked_shards_stay_allowed(tmp_path: Path) -> None:
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir(), snap.mkdir()
    write_raw(blobs / "abc123", {"t": f32(1)}, b"\1\2\3\4")
    os.symlink(blobs / "abc123", snap / "model.safetensors")
    write_index(snap, {"t": "model.safetensors"})
    storage = ShardedStorage(snap)
    try:
        stored = storage.stored("t")
        assert stored.path == snap / "model.safetensors"  # the link, not the blob
        out = np.empty((1, 4), dtype=np.uint8)
        storage.read(stored, 0, 1, out)
        assert out.tobytes() == b"\1\2\3\4"
    finally:
        storage.close()


def test_index_naming_a_missing_file(tmp_path: Path) -> None:
    write_raw(tmp_path / "here.safetensors", {"s": f32(1)}, b"\0" * 4)
    write_index(tmp_path, {"s": "here.safetensors", "t": "nope.safetensors"})
    with pytest.raises(
        CheckpointError, match="model.safetensors.index.json: shard nope.safetensors does not exist"
    ):
        read_native(tmp_path)


def test_index_naming_a_tensor_its_shard_lacks(tmp_path: Path) -> None:
    write_raw(tmp_path / "m.safetensors", {"s": f32(1)}, b"\0" * 4)
    write_index(tmp_path, {"s": "m.safetensors", "ghost": "m.safetensors"})
    with pytest.raises(
        CheckpointError, match="tensor ghost is mapped to m.safetensors but its header has no such"
    ):
        read_native(tmp_path)


def test_a_tensor_in_two_shards_without_an_index(tmp_path: Path) -> None:
    write_raw(tmp_path / "a.safetensors", {"t": f32(1)}, b"\0" * 4)
    write_raw(tmp_path / "b.safetensors", {"t": f32(1)}, b"\0" * 4)
    with pytest.raises(
        CheckpointError, match="tensor t is in both a.safetensors and b.safetensors"
    ):
        read_native(tmp_path)


def test_manifest_not_json(ckpt_copy: Path) -> None:
    (ckpt_copy / MANIFEST).write_text("{oops")
    with pytest.raises(
        CheckpointError, match="NATIVE_MANIFEST.json: manifest is not readable JSON"
    ):
        read_native(ckpt_copy)


def test_manifest_is_left_unread_when_asked(ckpt_copy: Path) -> None:
    (ckpt_copy / MANIFEST).write_text("{oops")  # `tpload manifest --force` rewrites a broken one
    cat, _ = read_native(ckpt_copy, manifest=False)
    assert cat.manifest is None and cat.manifest_sha256 is None


def test_manifest_identity_is_the_sha256_of_its_bytes(small_ckpt: Path) -> None:
    cat, _ = read_native(small_ckpt)
    assert cat.manifest_sha256 == hashlib.sha256((small_ckpt / MANIFEST).read_bytes()).hexdigest()


def test_manifest_disagreeing_with_header_is_listed(ckpt_copy: Path) -> None:
    def mutate(m: dict) -> None:
        m["tensors"]["head.weight"]["shape"] = [1, 2]
        del m["tensors"]["mtp.0.enorm.weight"]

    edit_json(ckpt_copy / MANIFEST, mutate)
    cat, _ = read_native(ckpt_copy)
    problems = cat.manifest_problems(cat.names())
    assert len(problems) == 2, problems
    assert all(p.startswith(f"{ckpt_copy / MANIFEST}: tensor ") for p in problems)
    assert any(
        "head.weight: manifest says" in p and "[1, 2]" in p and "[512, 256]" in p for p in problems
    )
    assert any(
        "mtp.0.enorm.weight (in model-00001-of-00002.safetensors) is not in the manifest" in p
        for p in problems
    )


def test_a_missing_manifest_is_one_problem(ckpt_copy: Path) -> None:
    (ckpt_copy / MANIFEST).unlink()
    cat, _ = read_native(ckpt_copy)
    assert cat.manifest is None
    [problem] = cat.manifest_problems(cat.names())
    assert "manifest missing" in problem and "tpload manifest" in problem


def test_a_sound_manifest_has_no_problems(small_ckpt: Path) -> None:
    cat, _ = read_native(small_ckpt)
    assert cat.manifest_problems(cat.names()) == []


def test_bad_manifest_entries_are_listed_at_once(ckpt_copy: Path) -> None:
    def mutate(m: dict) -> None:
        m["tensors"]["head.weight"]["sha256"] = "abc"
        del m["tensors"]["mtp.0.enorm.weight"]["file"]

    edit_json(ckpt_copy / MANIFEST, mutate)
    with pytest.raises(CheckpointError) as e:
        read_native(ckpt_copy)
    msg = str(e.value)
    assert msg.startswith("2 bad entries in")
    assert "entry for head.weight" in msg and "entry for mtp.0.enorm.weight" in msg


def test_no_index_and_no_shard(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no model.safetensors.index.json and no"):
        read_native(tmp_path)


def test_a_missing_folder_and_a_file_are_not_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint directory does not exist"):
        read_native(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        read_native(tmp_path / "f")


def test_index_without_weight_map(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match='index has no "weight_map" object'):
        read_native(tmp_path)


def test_manifest_problems_by_array_equality_word_each_row_as_the_per_name_rule(
    ckpt_copy: Path,
) -> None:
    """Every way an entry can disagree (file, dtype, shape of another length, of the same length,
    missing, an orphan) found by the column compare, each worded as the per-name rule words it, all
    at once; and the digests aligned to the table are the manifest's, row for row."""
    names = all_names(ckpt_copy)
    by_shape = [n for n in names if n.endswith(".weight")]
    touched = {
        "file": by_shape[0],
        "dtype": by_shape[1],
        "rank": by_shape[2],
        "dims": by_shape[3],
        "gone": by_shape[4],
    }

    def mutate(m: dict) -> None:
        t = m["tensors"]
        t[touched["file"]]["file"] = "elsewhere.safetensors"
        t[touched["dtype"]]["dtype"] = "F64" if t[touched["dtype"]]["dtype"] != "F64" else "F32"
        t[touched["rank"]]["shape"] = t[touched["rank"]]["shape"] + [1]
        t[touched["dims"]]["shape"] = [d + 1 for d in t[touched["dims"]]["shape"]] or [2]
        del t[touched["gone"]]
        t["orphan.weight"] = dict(t[by_shape[5]])

    edit_json(ckpt_copy / MANIFEST, mutate)
    cat, _ = read_native(ckpt_copy)
    asked = cat.names()
    got = cat.manifest_problems(asked)
    manifest = cat.manifest
    assert manifest is not None
    want = []
    path = ckpt_copy / MANIFEST
    for n in asked:  # the rule name by name, as it was written before the table
        meta, entry = cat.tensors[n], manifest.get(n)
        if entry is None:
            want.append(f"{path}: tensor {n} (in {meta.file}) is not in the manifest")
        elif (entry.file, entry.dtype, entry.shape) != (meta.file, meta.dtype, meta.shape):
            want.append(
                f"{path}: tensor {n}: manifest says {entry.file} {entry.dtype} "
                f"{list(entry.shape)}, shard header says {meta.file} {meta.dtype} "
                f"{list(meta.shape)}"
            )
    want.append(
        f"{path}: the manifest lists 1 tensor(s) no shard holds (an index or shard that leaves "
        "them out?): orphan.weight"
    )
    assert got == want and len(got) == len(touched) + 1
    digests, present = cat.digests
    table = cat.table
    for k, n in enumerate(table.names):
        assert bool(present[k]) == (n != touched["gone"])
        if present[k]:
            assert digests[k].tobytes().hex() == manifest.sha256(n) == manifest[n].sha256
    assert cat.manifest_problems([]) == want[-1:]
