"""The column passes over a checkpoint's tables (each rule run over whole columns at once) against
entry by entry references written here from the rules: they must accept exactly what those accept,
build the same objects and word every refusal the same way; and natural_key must order names exactly
as it always did."""

from __future__ import annotations

import copy
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from tpload.model.errors import CheckpointError
from tpload.model.meta import TensorMeta
from tpload.model.templates import natural_key, natural_sorted
from tpload.storage import catalogue, safetensors
from tpload.storage.catalogue import ManifestEntry, parse_manifest_entries
from tpload.storage.safetensors import TensorInfo

from .shards import f32, write_raw

DATA_LEN = 96  # the sound header's tensors cover it
PATH = Path("/ckpt/m.safetensors")


def old_natural_key(name: str) -> tuple:
    """natural_key as it was first written: the reference order."""
    parts = re.split(r"(\d+)", name)
    return tuple((len(d := p.lstrip("0")), d, p) if i % 2 else p for i, p in enumerate(parts))


def tricky_name(rng: random.Random) -> str:
    pieces = [
        "",
        "x",
        ".",
        "a.b",
        "\x00",
        "\x01",
        "é",
        "٣",
        "０",
        "_",
        "\n",
    ]  # Arabic-Indic and fullwidth digits
    runs = [
        "0",
        "00",
        "1",
        "01",
        "001",
        "2",
        "02",
        "10",
        "9" * 50,
        "0" * 20 + "7",
        "1" + "0" * 5000,
        "9" * 5000,
    ]
    return "".join(
        rng.choice(runs) if rng.random() < 0.4 else rng.choice(pieces)
        for _ in range(rng.randrange(0, 7))
    )


def test_natural_key_orders_tricky_names_as_before() -> None:
    rng = random.Random(20261130)
    names = [tricky_name(rng) for _ in range(3000)] + [
        "",
        "0",
        "00",
        "x.02",
        "x.2",
        "x.1",
        "x.10",
        "x1y",
        "x01y",
    ]
    assert sorted(names, key=natural_key) == sorted(names, key=old_natural_key)
    for _ in range(20000):  # every comparison too, ties included (a sort could hide one)
        a, b = rng.choice(names), rng.choice(names)
        ka, kb, oa, ob = natural_key(a), natural_key(b), old_natural_key(a), old_natural_key(b)
        assert ((ka < kb), (ka == kb), (ka > kb)) == ((oa < ob), (oa == ob), (oa > ob)), (a, b)


def test_natural_sorted_is_the_sort_by_natural_key_ties_and_all() -> None:
    rng = random.Random(20261201)
    names = [tricky_name(rng) for _ in range(3000)]
    names += rng.sample(names, 500)  # equal names: a stable sort keeps their input order
    names += [
        f"model.layers.{i}.mlp.experts.{e}.w{k}"
        for i in (0, 2, 10, 61)
        for e in range(40)
        for k in (1, 2, 3)
    ]
    rng.shuffle(names)
    assert natural_sorted(names) == sorted(names, key=old_natural_key)
    assert natural_sorted(iter(names)) == sorted(names, key=natural_key)
    assert natural_sorted([]) == []


def sound_header() -> dict:
    """Entries out of file order (as a header's sorted names put them), a scalar, an empty
    tensor, covering the data back to back."""
    return {
        "__metadata__": {"format": "pt"},
        "z": f32(4, begin=0),
        "b.2": {"dtype": "BF16", "shape": [3, 5], "data_offsets": [16, 46]},
        "a": {"dtype": "I16", "shape": [], "data_offsets": [46, 48]},
        "empty": {"dtype": "F32", "shape": [0, 7], "data_offsets": [48, 48]},
        "m": {"dtype": "I64", "shape": [2, 1, 3], "data_offsets": [48, 96]},
    }


def checked(header: dict) -> dict[str, TensorInfo] | str:
    """The column pass: its tensors, or the words of its refusal."""
    try:
        return safetensors.entries(PATH, PATH.name, header, 8, DATA_LEN)
    except CheckpointError as e:
        return str(e)


def reference(header: dict) -> dict[str, TensorInfo] | str:
    """The header rules entry by entry (the spec the column pass must meet): tensors, or the
    words."""
    problems, infos, spans = [], {}, []
    meta = header.get("__metadata__")
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
    ):
        problems.append(
            f"{PATH}: __metadata__ {repr(meta)[:60]} is not a map of strings to strings"
        )
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        why = reference_problem(name, entry)
        if why:
            problems.append(f"{PATH}: tensor {name}: {why}")
        else:
            begin = 8 + entry["data_offsets"][0]
            infos[name] = TensorInfo(
                name, PATH.name, entry["dtype"], tuple(entry["shape"]), PATH, begin
            )
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            isinstance(offsets, list)
            and len(offsets) == 2
            and {type(o) for o in offsets} == {int}
            and 0 <= offsets[0] <= offsets[1] <= DATA_LEN
        ):
            spans.append((*offsets, name))
    complete = len(spans) == len(header) - ("__metadata__" in header)
    reach = (0, 0, "")  # the span that ends last so far
    for b, e, name in sorted(spans):  # safetensors' order: by first byte, then end
        b0, e0, n0 = reach
        if b < e0:
            problems.append(f"{PATH}: tensors {n0} and {name} overlap (bytes {b0}..{e0} and {b}..)")
        elif b > e0 and complete:
            after = f"after tensor {n0}" if n0 else "before the first tensor"
            problems.append(
                f"{PATH}: bytes {e0}..{b} of the data belong to no tensor ({after}): safetensors "
                "requires the tensors to cover the data back to back"
            )
        if e > e0 or not n0:
            reach = (b, e, name)
    last = max((e for _, e, _ in spans), default=0)
    if complete and last < DATA_LEN:
        after = f"after the last, {reach[2]}" if spans else "the header has none"
        problems.append(
            f"{PATH}: bytes {last}..{DATA_LEN} of the data belong to no tensor ({after}): the "
            f"file runs {DATA_LEN - last} byte{'s' * (DATA_LEN - last != 1)} past its tensors, or "
            "its header length is short"
        )
    if not problems:
        return infos
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the header of {PATH}:\n  - " + "\n  - ".join(problems)


def reference_problem(name: str, meta: object) -> str:
    if not isinstance(meta, dict):
        return "header entry is not an object"
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in safetensors._HEADER_ITEMSIZE:
        why = (
            "a safetensors dtype tpload refuses: complex, or narrower than a byte"
            if dtype in ("C64", "F4", "F6_E2M3", "F6_E3M2")
            else "not a safetensors dtype of whole bytes"
        )
        return f"dtype {repr(dtype)[:60]} is not served ({why})"
    if not (
        isinstance(shape, list)
        and len(shape) <= 8
        and all(type(d) is int and 0 <= d < 1 << 48 for d in shape)
    ):
        return (
            f"shape {repr(shape)[:80]} is not a list of non-negative integers "
            "(at most 8, each below 2**48)"
        )
    running = 1
    for d in shape:  # safetensors checks each product as it goes (bits in 64), torch's int64 too
        running *= d
        if running and running >= 1 << 63:
            break
    want = math.prod(shape) * safetensors.ITEMSIZE[dtype]
    if (running and running >= 1 << 63) or want * 8 >= 1 << 64:
        return (
            f"shape {shape} overflows: its bytes' bits reach 2**64, or the dimensions before a "
            "zero multiply to 2**63 or more"
        )
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and {type(o) for o in offsets} == {int}
    ):
        return f"data_offsets {repr(offsets)[:80]} is not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end:
        return f"data_offsets {offsets} are not ordered"
    if end > DATA_LEN:
        return f"data_offsets end {end} runs past the data ({DATA_LEN} bytes)"
    if end - begin != want:
        return f"data_offsets span {end - begin} bytes but {dtype} x {shape} is {want}"
    for key, value in meta.items():
        if key not in ("dtype", "shape", "data_offsets") and not ignored_ok(value, 3):
            return f"field {key!r} is nested more than 127 levels deep (safetensors' JSON limit)"
    return ""


def ignored_ok(value: object, depth: int) -> bool:
    """Whether a field safetensors ignores is nested no deeper than serde_json reads (127)."""
    if isinstance(value, dict | list):
        children = value.values() if isinstance(value, dict) else value
        return depth <= 127 and all(ignored_ok(v, depth + 1) for v in children)
    return True


def mutations(header: dict) -> list[dict]:
    """The sound header spoilt one field at a time, in every way a JSON value can be wrong."""
    bad_values = [
        None,
        True,
        1.0,
        -1,
        1 << 48,
        1 << 60,
        "F32",
        [],
        [1],
        [0, 1, 2],
        {},
        [True, 2],
        [1.0, 2],
        [-4, 0],
        [0, DATA_LEN + 1],
        [10, 4],
        "BOOL",
        "C64",
        ["F32"],
        [1] * 9,
        0,
        [1 << 40, 1 << 40, 0],  # overflows as safetensors multiplies it
        [0, 1 << 40, 1 << 40],  # does not: no elements
        [1 << 40, 1 << 23, 0],  # 2**63 before the zero: torch cannot hold it
        [2, 0],
        [[[[[]]]]],
        "F8_E4M3FNUZ",
        "F4",
        {"F32": None},  # safetensors reads a dtype as a map too; tpload does not
    ]
    out = []
    for name in [n for n in header if n != "__metadata__"]:
        for field in ("dtype", "shape", "data_offsets", None):
            for value in bad_values:
                h = copy.deepcopy(header)
                if field is None:
                    h[name] = value
                else:
                    h[name][field] = value
                out.append(h)
            h = copy.deepcopy(header)
            if field is not None:
                del h[name][field]
                out.append(h)
    moved = copy.deepcopy(header)
    moved["m"]["data_offsets"] = [40, 88]  # overlaps b.2 and a, listed before them
    out.append(moved)
    for offsets in ([47, 95], [49, 97], [46, 94]):  # overlaps; a byte past the data; bytes after
        h = copy.deepcopy(header)
        h["m"]["data_offsets"] = offsets
        out.append(h)
    gap = copy.deepcopy(header)
    del gap["a"]  # its two bytes belong to no tensor
    out.append(gap)
    inside = copy.deepcopy(header)
    inside["empty"]["data_offsets"] = [20, 20]  # no bytes, but inside b.2's
    out.append(inside)
    for depth in (124, 125):  # a field safetensors ignores, nested 127 and 128 deep in all
        h = copy.deepcopy(header)
        h["a"]["x"] = json.loads("[" * depth + "]" * depth)
        out.append(h)
    for meta in (None, {}, {"k": 1}, [], "pt", {"k": None}):
        h = copy.deepcopy(header)
        h["__metadata__"] = meta
        out.append(h)
    return out


def test_the_header_pass_accepts_and_words_exactly_what_the_rules_say() -> None:
    header = sound_header()
    infos = checked(header)
    assert infos == reference(header) and list(infos) == ["z", "b.2", "a", "empty", "m"]
    for name, info in infos.items():  # the sizes filled in are the ones the properties compute
        fresh = TensorInfo(info.name, info.file, info.dtype, info.shape, info.path, info.begin)
        assert (info.begin, info.nbytes, info.rows, info.row_bytes) == (
            fresh.begin,
            fresh.nbytes,
            fresh.rows,
            fresh.row_bytes,
        ), name
    seen_refusals = 0
    for spoilt in mutations(header):
        got, want = checked(spoilt), reference(spoilt)
        seen_refusals += isinstance(want, str)
        assert got == want
    assert seen_refusals > 300
    many = copy.deepcopy(header)  # every problem of a header at once, each entry by its first rule
    many["z"]["dtype"], many["a"] = "C64", 7
    many["m"]["data_offsets"] = [40, 88]
    assert checked(many) == reference(many) and checked(many).startswith("4 problems")


def test_a_spoilt_header_is_worded_in_full(tmp_path: Path) -> None:
    header = sound_header()
    header["m"]["data_offsets"] = [40, 88]  # listed last, overlapping two listed before it
    path = tmp_path / "m.safetensors"
    write_raw(path, header, b"\0" * 88)  # the data ends with m: no bytes after it
    with pytest.raises(CheckpointError) as e:
        safetensors.read_header(path, path.name)
    assert str(e.value) == (
        f"3 problems in the header of {path}:\n  - {path}: tensors b.2 and m overlap (bytes 16..46 "
        f"and 40..)\n  - {path}: tensors m and a overlap (bytes 40..88 and 46..)\n  - {path}: "
        "tensors m and empty overlap (bytes 40..88 and 48..)"  # no bytes, but inside m's
    )


def test_a_tensor_info_equals_the_meta_of_its_four_fields() -> None:
    infos = safetensors.entries(PATH, PATH.name, sound_header(), 8, DATA_LEN)
    metas = [TensorMeta(i.name, i.file, i.dtype, i.shape) for i in infos.values()]
    assert list(infos.values()) == metas and metas == list(infos.values())
    assert [hash(i) for i in infos.values()] == [hash(m) for m in metas]
    assert [(m.nbytes, m.rows, m.row_bytes) for m in metas] == [
        (i.nbytes, i.rows, i.row_bytes) for i in infos.values()
    ]
    z = infos["z"]
    assert z != TensorMeta(z.name, z.file, "I32", z.shape) and z != TensorMeta(
        z.name, "other", z.dtype, z.shape
    )
    assert z != (z.name, z.file, z.dtype, z.shape)


def test_the_catalogue_holds_the_located_tensors(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    write_raw(root / "m.safetensors", sound_header(), b"\0" * 96)
    cat, locations = catalogue.read_native(root, manifest=False)
    # one read-only view of the table, shared: a record a row, made when asked for and kept by
    # nobody (no object a tensor for the load's lifetime), equal to the header's entry
    assert cat.tensors == locations == dict(checked(sound_header()).items())
    assert not hasattr(cat.tensors, "__setitem__") and not hasattr(cat.tensors, "pop")
    assert cat.tensors["z"] == cat.tensors["z"] and cat.tensors["z"] is not cat.tensors["z"]
    table = cat.table
    assert table.names == list(locations) == ["z", "b.2", "a", "empty", "m"]
    for k, (name, info) in enumerate(locations.items()):
        assert (table.file_of(k), table.dtype_of(k), table.shape_of(k)) == (
            info.file,
            info.dtype,
            info.shape,
        ), name
        assert (int(table.begin[k]), int(table.nbytes[k]), int(table.rows[k])) == (
            info.begin,
            info.nbytes,
            info.rows,
        ), name
    assert cat.names() == ["a", "b.2", "empty", "m", "z"]


def sound_manifest() -> dict:
    return {
        f"t.{i}": {
            "file": f"s{i % 3}.safetensors",
            "dtype": "BF16",
            "shape": [i, 2, 3][: i % 4],
            "sha256": ("aB" * 32 if i % 2 else "0" * 64),
        }
        for i in range(12)
    }


def reference_manifest(tensors: dict) -> dict[str, ManifestEntry] | str:
    """The manifest's rules entry by entry (the spec the column pass must meet)."""
    out, problems = {}, []
    for name, e in tensors.items():
        if (
            isinstance(e, dict)
            and type(e.get("file")) is str
            and type(e.get("dtype")) is str
            and type(e.get("shape")) is list
            and len(e["shape"]) <= 8
            and all(type(d) is int and 0 <= d < 1 << 48 for d in e["shape"])
            and type(e.get("sha256")) is str
            and re.fullmatch(r"[0-9a-fA-F]{64}", e["sha256"])
        ):
            out[name] = ManifestEntry(e["file"], e["dtype"], tuple(e["shape"]), e["sha256"].lower())
        else:
            problems.append(
                f"{PATH}: entry for {name} is not "
                "{file, dtype, shape (integers), sha256 (64 hex digits)}"
            )
    if not problems:
        return out
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} bad entries in {PATH}:\n  - " + "\n  - ".join(problems)


def test_the_manifest_pass_accepts_and_words_exactly_what_the_rules_say() -> None:
    tensors = sound_manifest()
    assert _parsed(tensors) == reference_manifest(tensors)
    assert parse_manifest_entries(tensors, PATH)["t.1"].sha256 == "ab" * 32
    bad_values = [
        None,
        True,
        1.0,
        -1,
        1 << 48,
        "x",
        [],
        [1.5],
        [True],
        [-1],
        [1 << 48],
        [1] * 9,
        {},
        "0" * 63,
        "0" * 65,
        "g" * 64,
        "Ａ" * 64,
        7,
        [1, 2],
    ]
    refusals = 0
    for name in list(tensors)[:4]:
        for field in ("file", "dtype", "shape", "sha256", None):
            for value in bad_values + ["DEL"]:
                spoilt = copy.deepcopy(tensors)
                if field is None:
                    spoilt[name] = value
                elif value == "DEL":
                    del spoilt[name][field]
                else:
                    spoilt[name][field] = value
                want = reference_manifest(spoilt)
                refusals += isinstance(want, str)
                assert _parsed(spoilt) == want
    assert refusals > 200
    spoilt = copy.deepcopy(tensors)  # every bad entry at once
    spoilt["t.1"], spoilt["t.5"]["shape"] = 7, [True]
    assert _parsed(spoilt) == reference_manifest(spoilt) and _parsed(spoilt).startswith("2 bad")


def _parsed(tensors: dict) -> dict[str, ManifestEntry] | str:
    try:
        return parse_manifest_entries(tensors, PATH)
    except CheckpointError as e:
        return str(e)


def test_sha256_columns_are_hex_digits_exactly_as_the_regex_reads_them() -> None:
    """The one-pass proof (bytes.fromhex of every digest giving 32 bytes each) and the regex a
    digest agree, whitespace and other digits included."""
    good = "ab" * 32
    cases = [
        [good, good.upper()],
        [good, "ab" * 31 + "a "],
        [good, " " + "ab" * 31 + "a"],
        [good, "ab" * 31 + "\ta"],
        [good, "ab" * 31 + "٣٣"],
        [good, "ab" * 31 + "gg"],
        [good, "ab" * 30 + "a b c "],
        ["ab" * 31 + "a", "b" + "ab" * 31],  # 63 and 65 digits: their lengths tell
    ]
    for texts in cases:
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
        want = [re.fullmatch(r"[0-9a-fA-F]*", t) is not None for t in texts]
        assert catalogue._hex_digits(texts, lengths).tolist() == want, texts


def test_a_manifests_sha256s_of_many_names_are_each_names_sha256() -> None:
    """Manifest.sha256s (a batch's promised digests, one column read) gives what sha256 gives
    name by name: lowercase hex of the entry, None for a name the manifest lacks, in the order
    asked, none asked included; and the digests a parse proved hex in one step are the entries'."""
    rng = random.Random(7)
    names = [f"model.layers.{i}.w{k}" for i in range(40) for k in range(3)]
    digests = ["".join(rng.choice("0123456789abcdefABCDEF") for _ in range(64)) for _ in names]
    tensors = {
        n: {"file": "a.safetensors", "dtype": "F32", "shape": [2, 3], "sha256": d}
        for n, d in zip(names, digests, strict=True)
    }
    manifest = parse_manifest_entries(tensors, Path("/ckpt/NATIVE_MANIFEST.json"))
    for n, d in zip(names, digests, strict=True):
        assert manifest.sha256(n) == d.lower()
    asked = [rng.choice([*names, "absent", "model.layers.99.w0"]) for _ in range(300)]
    for k in (0, 1, 5, 300):
        assert manifest.sha256s(asked[:k]) == [manifest.sha256(n) for n in asked[:k]]
    present = [n for n in asked if n in manifest]
    assert manifest.sha256s(present) == [manifest.sha256(n) for n in present]
    assert manifest.sha256s(["absent"]) == [None]
