"""Checkpoint files written by anyone: odd file kinds refused by name without blocking, hostile
JSON refused with a message, hostile names escaped, and nothing left out of an index or manifest
unnoticed. Every test here names the file in the message it expects."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tpload.model.errors import CheckpointError
from tpload.model.templates import natural_key
from tpload.storage.catalogue import read_native
from tpload.storage.reader import Reader
from tpload.storage.sharded import ShardedStorage

from .shards import (
    ESC,
    EVIL,
    EVIL_SHOWN,
    INDEX,
    MANIFEST,
    deadline,
    f32,
    manifest_entry,
    one_tensor_ckpt,
    write_index,
    write_manifest,
    write_raw,
)


def refusal(root: Path) -> str:
    """The CheckpointError opening ``root`` gives (within a few seconds: a blocked open fails the
    test)."""
    with deadline(5), pytest.raises(CheckpointError) as e:
        storage = ShardedStorage(root)
        storage.close()
    return str(e.value)


# -- file kinds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "file, what", [("m.safetensors", "shard"), (INDEX, "index"), (MANIFEST, "manifest")]
)
def test_a_fifo_is_refused_by_name_without_blocking(tmp_path: Path, file: str, what: str) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    (root / file).unlink()
    os.mkfifo(root / file)  # no writer: a plain open() would wait for one forever
    assert (
        refusal(root) == f"{root / file}: {what} is a FIFO; refused (only regular files are read)"
    )


def test_a_fifo_shard_found_by_glob_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "m.safetensors")
    assert (
        refusal(tmp_path)
        == f"{tmp_path / 'm.safetensors'}: shard is a FIFO; refused (only regular files are read)"
    )


@pytest.mark.parametrize("indexed", [False, True])
def test_a_directory_named_like_a_shard_is_refused(tmp_path: Path, indexed: bool) -> None:
    (tmp_path / "m.safetensors").mkdir()
    if indexed:
        write_index(tmp_path, {"a": "m.safetensors"})
    assert refusal(tmp_path) == (
        f"{tmp_path / 'm.safetensors'}: shard is a directory; refused (only regular files are read)"
    )


@pytest.mark.parametrize("file, what", [(INDEX, "index"), (MANIFEST, "manifest")])
def test_a_directory_named_like_an_index_or_manifest_is_refused(
    tmp_path: Path, file: str, what: str
) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    (root / file).unlink()
    (root / file).mkdir()
    assert f"{root / file}: {what} is a directory; refused" in refusal(root)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_linked_as_a_shard_is_refused(tmp_path: Path) -> None:
    os.symlink(
        "/dev/zero", tmp_path / "m.safetensors"
    )  # endless bytes: reading it would never finish
    assert f"{tmp_path / 'm.safetensors'}: shard is a device; refused" in refusal(tmp_path)


# -- hostile JSON -----------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_index_is_refused(tmp_path: Path) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    (root / INDEX).write_text(DEEP)
    assert refusal(root) == f"{root / INDEX}: index is JSON nested too deeply; refused"


def test_deeply_nested_header_is_refused(tmp_path: Path) -> None:
    write_raw(tmp_path / "m.safetensors", ('{"a": ' + DEEP + "}").encode(), b"")
    assert (
        f"{tmp_path / 'm.safetensors'}: header is JSON nested too deeply (safetensors reads at "
        "most 127 levels); refused" in refusal(tmp_path)
    )


def test_deeply_nested_manifest_is_refused(tmp_path: Path) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    (root / MANIFEST).write_text('{"tensors": ' + DEEP + "}")
    assert refusal(root) == f"{root / MANIFEST}: manifest is JSON nested too deeply; refused"


BIG = "9" * 5000


@pytest.mark.parametrize(
    "entry",
    [
        f'{{"dtype": "F32", "shape": [{BIG}], "data_offsets": [0, 8]}}',
        f'{{"dtype": "F32", "shape": [2], "data_offsets": [0, {BIG}]}}',
        f'{{"dtype": "F32", "shape": [2], "data_offsets": [{BIG}, 8]}}',
    ],
)
def test_integers_of_5000_digits_in_a_header_are_refused(tmp_path: Path, entry: str) -> None:
    write_raw(tmp_path / "m.safetensors", f'{{"a": {entry}}}'.encode(), b"\0" * 8)
    msg = refusal(tmp_path)
    assert f"{tmp_path / 'm.safetensors'}: header is not readable JSON" in msg and "digits" in msg


@pytest.mark.parametrize("dtype", [5, ["F32"], {"F32": 1}, None, True])
def test_a_non_string_dtype_is_named(tmp_path: Path, dtype: object) -> None:
    write_raw(
        tmp_path / "m.safetensors",
        {"a": {"dtype": dtype, "shape": [2], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    assert refusal(tmp_path).startswith(
        f"{tmp_path / 'm.safetensors'}: tensor a: dtype {dtype!r} is not served"
    )


@pytest.mark.parametrize("value", [5, ["m.safetensors"], {"f": "m.safetensors"}, None])
def test_non_string_index_values_are_refused(tmp_path: Path, value: object) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    write_index(root, {"a": "m.safetensors", "b": value})
    assert (
        refusal(root)
        == f"{root / INDEX}: weight_map values must be file names; b map to something else"
    )


@pytest.mark.parametrize("constant", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_numbers_in_a_manifest_shape_are_refused(tmp_path: Path, constant: str) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    (root / MANIFEST).write_text(
        (root / MANIFEST).read_text().replace('"shape": [2]', f'"shape": [{constant}]')
    )
    assert (
        refusal(root)
        == f"{root / MANIFEST}: manifest is not readable JSON ({constant} is not a JSON number)"
    )


def test_true_is_not_a_header_dimension(tmp_path: Path) -> None:
    write_raw(
        tmp_path / "m.safetensors",
        {"a": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )  # True == 1: read as an int, [True, 2] would pass for [1, 2]
    assert refusal(tmp_path).startswith(
        f"{tmp_path / 'm.safetensors'}: tensor a: shape [True, 2] is not a list of "
        "non-negative integers"
    )


def test_true_is_not_a_manifest_dimension(tmp_path: Path) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    write_manifest(root, {"a": manifest_entry("m.safetensors", "F32", [True, 2], b"\0" * 8)})
    assert refusal(root) == (
        f"{root / MANIFEST}: entry for a is not "
        "{file, dtype, shape (integers), sha256 (64 hex digits)}"
    )


@pytest.mark.parametrize(
    "shape", [[10**1000] * 8, [10**4000, 10**4000], [2**63] * 8, [0, 10**4000]]
)
def test_an_astronomical_shape_is_refused_with_a_short_message(
    tmp_path: Path, shape: list[int]
) -> None:
    write_raw(
        tmp_path / "m.safetensors",
        {"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    msg = refusal(tmp_path)  # its element count has more digits than Python prints
    assert msg.startswith(f"{tmp_path / 'm.safetensors'}: tensor a: shape [") and len(msg) < 400


def test_an_astronomical_empty_shape_is_refused(tmp_path: Path) -> None:
    write_raw(
        tmp_path / "m.safetensors",
        {"a": {"dtype": "F32", "shape": [0, 10**4000], "data_offsets": [0, 0]}},
        b"",
    )  # zero bytes, so the offsets agree; 10**4000 rows of nothing is still not a tensor
    assert refusal(tmp_path).startswith(f"{tmp_path / 'm.safetensors'}: tensor a: shape [0, 1000")


def test_numbers_of_5000_digits_in_names_still_sort() -> None:
    names = [f"x.{'9' * 5000}", "x.10", f"x.{'1' + '0' * 4999}", "x.2"]
    assert sorted(names, key=natural_key) == ["x.2", "x.10", names[2], names[0]]


# -- left out ---------------------------------------------------------------------------------


def test_an_index_that_leaves_a_tensor_out_is_refused(tmp_path: Path) -> None:
    write_raw(tmp_path / "m.safetensors", {"a": f32(2), "hidden": f32(1, begin=8)}, b"\0" * 12)
    write_index(tmp_path, {"a": "m.safetensors"})
    assert refusal(tmp_path) == (
        f"{tmp_path / INDEX}: 1 tensor(s) in the header of m.safetensors are not mapped "
        "to it by the index (an index that leaves tensors out): hidden"
    )


def test_a_manifest_entry_no_shard_holds_is_a_problem(tmp_path: Path) -> None:
    root = one_tensor_ckpt(tmp_path / "c")
    write_manifest(
        root,
        {
            "a": manifest_entry("m.safetensors", "F32", [2], b"\0" * 8),
            "gone": manifest_entry("n.safetensors", "F32", [1], b"\0" * 4),
        },
    )
    cat, _ = read_native(root)  # opening is fine: the manifest is checked against what a load reads
    assert cat.manifest_problems(["a"]) == [
        f"{root / MANIFEST}: the manifest lists 1 tensor(s) no shard holds (an index or shard "
        "that leaves them out?): gone"
    ]


# -- hostile names ----------------------------------------------------------------------------


def _header_problem(root: Path) -> str:
    write_raw(
        root / "m.safetensors",
        {EVIL: {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    return refusal(root)


def _bad_dtype(root: Path) -> str:
    write_raw(
        root / "m.safetensors",
        {EVIL: {"dtype": ESC, "shape": [2], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    return refusal(root)


def _overlap(root: Path) -> str:
    write_raw(root / "m.safetensors", {"a": f32(2), EVIL: f32(2, begin=4)}, b"\0" * 12)
    return refusal(root)


def _mapped_but_absent(root: Path) -> str:
    write_raw(root / "m.safetensors", {"a": f32(2)}, b"\0" * 8)
    write_index(root, {"a": "m.safetensors", EVIL: "m.safetensors"})
    return refusal(root)


def _left_out(root: Path) -> str:
    write_raw(root / "m.safetensors", {"a": f32(2), EVIL: f32(1, begin=8)}, b"\0" * 12)
    write_index(root, {"a": "m.safetensors"})
    return refusal(root)


def _in_two_shards(root: Path) -> str:
    write_raw(root / "m.safetensors", {EVIL: f32(1)}, b"\0" * 4)
    write_raw(root / "n.safetensors", {EVIL: f32(1)}, b"\0" * 4)
    return refusal(root)


def _bad_manifest_entry(root: Path) -> str:
    one_tensor_ckpt(root)
    write_manifest(root, {EVIL: {"file": "m.safetensors"}})
    return refusal(root)


def _manifest_problems(root: Path) -> str:
    write_raw(root / "m.safetensors", {EVIL: f32(2), "b": f32(1, begin=8)}, b"\0" * 12)
    write_manifest(
        root,
        {
            "b": manifest_entry("m.safetensors", "F32", [9], b""),
            EVIL + ".gone": manifest_entry("m.safetensors", "F32", [1], b""),
        },
    )
    cat, _ = read_native(root)
    problems = cat.manifest_problems(cat.names())
    assert len(problems) == 3  # b disagrees; EVIL is not in the manifest; EVIL.gone is in no shard
    return "\n".join(problems)


def _disagreeing_manifest(root: Path) -> str:
    write_raw(root / "m.safetensors", {EVIL: f32(2)}, b"\0" * 8)
    write_manifest(root, {EVIL: manifest_entry(f"n{ESC}.safetensors", f"F{ESC}", [2], b"")})
    cat, _ = read_native(root)
    [problem] = cat.manifest_problems(cat.names())
    assert "n\\x1b[2J.safetensors F\\x1b[2J [2]" in problem
    return problem


def _unknown_name(root: Path) -> str:
    one_tensor_ckpt(root)
    storage = ShardedStorage(root)
    with pytest.raises(CheckpointError) as e:
        storage.stored(EVIL)
    storage.close()
    return str(e.value)


def _truncated_read(root: Path) -> str:
    write_raw(root / "m.safetensors", {EVIL: f32(2)}, b"\0" * 8)
    storage = ShardedStorage(root)
    os.truncate(root / "m.safetensors", os.path.getsize(root / "m.safetensors") - 4)
    stored = storage.stored(EVIL)
    with pytest.raises(CheckpointError) as e:
        list(Reader(storage).blocks(stored, (0, 1), (0, 8)))
    storage.close()
    return str(e.value)


def _shard_name(root: Path) -> str:
    write_index(root, {"a": f"m{ESC}.safetensors"})
    return refusal(root)


@pytest.mark.parametrize(
    "scenario",
    [
        _header_problem,
        _bad_dtype,
        _overlap,
        _mapped_but_absent,
        _left_out,
        _in_two_shards,
        _bad_manifest_entry,
        _manifest_problems,
        _disagreeing_manifest,
        _unknown_name,
        _truncated_read,
        _shard_name,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_an_escape_in_a_name_is_shown_escaped(
    tmp_path: Path, scenario: Callable[[Path], str]
) -> None:
    msg = scenario(tmp_path)
    assert "\x1b" not in msg
    assert (EVIL_SHOWN if scenario is not _shard_name else "m\\x1b[2J.safetensors") in msg


def test_an_escape_in_a_folder_name_is_shown_escaped(tmp_path: Path) -> None:
    root = tmp_path / f"c{ESC}"
    root.mkdir()
    (root / "m.safetensors").write_bytes(b"\0\0")
    msg = refusal(root)
    assert "\x1b" not in msg and f"{tmp_path}/c\\x1b[2J/m.safetensors: 2 bytes, too short" in msg


def test_an_escape_in_a_read_error_names_file_and_tensor(tmp_path: Path) -> None:
    write_raw(tmp_path / "m.safetensors", {EVIL: f32(4)}, bytes(range(16)))
    storage = ShardedStorage(tmp_path)
    try:
        out = np.empty((1, 16), dtype=np.uint8)
        storage.read(storage.stored(EVIL), 0, 1, out)  # sound: read whole
        assert out.tobytes() == bytes(range(16))
        os.truncate(tmp_path / "m.safetensors", 8)
        with pytest.raises(CheckpointError) as e:
            storage.read(storage.stored(EVIL), 0, 1, out)
        assert str(e.value).startswith(
            f"{tmp_path / 'm.safetensors'}: tensor {EVIL_SHOWN}: file ends at byte"
        )
    finally:
        storage.close()


def test_a_header_json_error_names_the_file(tmp_path: Path) -> None:
    write_raw(tmp_path / "m.safetensors", b'{"a": ' + json.dumps(ESC).encode(), b"")
    msg = refusal(tmp_path)
    assert (
        msg.startswith(f"{tmp_path / 'm.safetensors'}: header is not readable JSON")
        and "\x1b" not in msg
    )


def test_a_key_given_twice_in_a_trust_relevant_json_file_is_refused(ckpt_copy: Path) -> None:
    """The manifest and the index (as every trust-relevant JSON file, through storage/files.py's
    one parser): a second entry for a tensor would be believed by one parser and not another."""
    manifest = ckpt_copy / "NATIVE_MANIFEST.json"
    text = manifest.read_text()
    name = "mtp.0.enorm.weight"
    entry = json.dumps(json.loads(text)["tensors"][name])
    twice = text.replace('"tensors": {', f'"tensors": {{"{name}": {entry}, ', 1)
    assert twice != text
    manifest.write_text(twice)
    with pytest.raises(CheckpointError, match=f"the key '{name}' appears twice in one object"):
        read_native(ckpt_copy)
    manifest.write_text(text)
    index = ckpt_copy / "model.safetensors.index.json"
    raw = index.read_text()
    index.write_text(raw.replace("{", '{"metadata": {}, ', 1))
    with pytest.raises(CheckpointError, match="index is not readable JSON .*'metadata' appears"):
        read_native(ckpt_copy, manifest=False)
