"""The scan of a usual header or manifest straight into columns (storage/scan.py) against the JSON
parser's reading of the same text: where the scan takes a document, the reading through JSON gives
the same columns, metadata and document; where that reading refuses one, the scan takes none (the
refusal is then the JSON reading's own, worded as before)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.unit.storage.test_safetensors_oracle import SEEDS, case
from tpload.model.errors import CheckpointError
from tpload.storage import scan
from tpload.storage.catalogue import (
    parse_manifest,
    parse_manifest_entries,
    read_native,
    scanned_manifest,
)
from tpload.storage.files import parse_json
from tpload.storage.safetensors import parse_columns, parsed_columns, scanned_columns

P = Path("m.safetensors")


def _both(text: bytes, data_len: int) -> tuple[object, object]:
    """(the scan's reading or None, the JSON reading or its refusal) of a header's text."""
    scanned = scanned_columns(text, P, 8 + len(text), data_len)
    try:
        parsed: object = parsed_columns(text, P, 8 + len(text), data_len)
    except CheckpointError as e:
        parsed = str(e)
    return scanned, parsed


def test_the_oracles_headers_scanned_read_as_through_json() -> None:
    """Every seeded shard of the oracle test whose length field fits the file."""
    taken = 0
    blobs = {seed: case(seed).blob() for seed in SEEDS}
    for seed, raw in blobs.items():
        length = int.from_bytes(raw[:8], "little")
        fits = length <= len(raw) - 8
        scanned, parsed = _both(raw[8 : 8 + length], len(raw) - 8 - length) if fits else (None, 0)
        if scanned is not None:
            taken += 1
            assert scanned == parsed, seed
    assert taken >= 50, taken  # the sound headers among the seeds (69 of 600)


def _header(entries: str, meta: str = "", *, at: str = "first") -> bytes:
    body = {"first": meta + entries, "last": entries + meta}[at]
    return ("{" + body + "}").encode()


E = (
    '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
    '"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}'
)
M = '"__metadata__":{"format":"pt"}'
TAKEN = {
    "compact": _header(E),
    "metadata first": _header(E, M + ","),
    "metadata last": _header(E, "," + M, at="last"),
    "metadata between": _header(E.replace("},", "}," + M + ",", 1)),
    "metadata empty": _header(E, '"__metadata__":{},'),
    "metadata key twice (a map: the last kept)": _header(
        E, '"__metadata__":{"format":"pt","format":"np"},'
    ),
    "indented": json.dumps(json.loads(_header(E, M + ",")), indent=2).encode(),
    "spaced": json.dumps(json.loads(_header(E)), separators=(", ", ": ")).encode(),
    "padded": _header(E) + b"      ",
    "led by whitespace": b" \n\t" + _header(E),
    "a name of any Unicode but escapes": _header(E.replace('"a"', '"é😀 :{}[],"')),
    "an empty name": _header(E.replace('"a"', '""')),
    "a scalar": _header(
        E.replace('"shape":[2],"data_offsets":[0,8]', '"shape":[],"data_offsets":[0,4]').replace(
            '"shape":[2],"data_offsets":[8,16]', '"shape":[3],"data_offsets":[4,16]'
        )
    ),
}
NOT_TAKEN = {
    "a name with an escape": _header(E.replace('"a"', '"a\\u0041"')),
    "a lone surrogate": _header(E.replace('"a"', '"\\ud800"')),
    "a name given twice": _header(E.replace('"b"', '"a"')),
    "metadata given twice": _header(E, M + "," + M + ","),
    "metadata not strings": _header(E, '"__metadata__":{"n":1},'),
    "metadata null": _header(E, '"__metadata__":null,'),
    "metadata shaped as an entry": _header(
        E, '"__metadata__":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
    ),
    "fields in another order": _header(
        E.replace('"dtype":"F32","shape":[2]', '"shape":[2],"dtype":"F32"', 1)
    ),
    "an extra field": _header(E.replace('"data_offsets":[0,8]', '"data_offsets":[0,8],"x":1', 1)),
    "minus zero": _header(E.replace("[0,8]", "[-0,8]")),
    "a number of 17 digits": _header(E.replace("[2]", "[00000000000000002]")),
    "a float": _header(E.replace("[2]", "[2.0]")),
    "a control character in a name": _header(E.replace('"a"', '"a\x01"')),
    "a tab in a dtype": _header(E.replace('"F32"', '"F3\t2"', 1)),
    "a name of a separator Python calls unprintable": _header(E.replace('"a"', '"a\u2028"')),
    "trailing junk": _header(E) + b"x",
    "a BOM": "\ufeff".encode() + _header(E),
    "not UTF-8": _header(E).replace(b'"a"', b'"a\xff"'),
    "a trailing comma": _header(E + ","),
    "no entry": _header("", M),
    "an array": b"[" + _header(E) + b"]",
    "a field twice": _header(E.replace('"dtype":"F32"', '"dtype":"F32","dtype":"F32"', 1)),
    "offsets overlapping": _header(E.replace("[8,16]", "[4,12]")),
    "a dtype refused": _header(E.replace("F32", "C64", 1)),
}


@pytest.mark.parametrize("text", list(TAKEN.values()), ids=list(TAKEN))
def test_a_usual_header_is_scanned_as_json_reads_it(text: bytes) -> None:
    scanned, parsed = _both(text, 16)
    assert scanned is not None
    assert scanned == parsed
    assert parse_columns(text, P, 8 + len(text), 16) == parsed


@pytest.mark.parametrize("text", list(NOT_TAKEN.values()), ids=list(NOT_TAKEN))
def test_any_other_header_is_left_to_the_json_reading(text: bytes) -> None:
    scanned, parsed = _both(text, 16)
    assert scanned is None
    try:
        got: object = parse_columns(text, P, 8 + len(text), 16)
    except CheckpointError as e:
        got = str(e)
    assert got == parsed


def test_each_kind_is_read_once_and_its_values_shared() -> None:
    """The fields of one dtype and shape are read once, their strings and shape held once."""
    got = scan.scan_header(_header(E, M + ","))
    assert got is not None and got.shapes == [(2,), (2,)] and got.dtypes == ["F32", "F32"]
    assert got.shapes[0] is got.shapes[1] and got.dtypes[0] is got.dtypes[1]


# -- the manifest --------------------------------------------------------------------------------

SHA = "ab" * 32


def _manifest(tensors: str, *, head: str = '"format": 1, ', tail: str = "") -> bytes:
    return ("{" + head + '"tensors": {' + tensors + "}" + tail + "}").encode()


ME = (
    f'"a": {{"file": "m.safetensors", "dtype": "F32", "shape": [2], "sha256": "{SHA}"}}, '
    f'"b": {{"file": "m.safetensors", "dtype": "F32", "shape": [2, 3], "sha256": "{SHA.upper()}"}}'
)


def _manifest_both(raw: bytes) -> tuple[object, object]:
    """(the scan's reading or None, the JSON reading or its refusal), each as plain values."""
    got = scanned_manifest(raw)
    scanned = None if got is None else (got[0], _columns(got[1]))
    try:
        doc = parse_json(raw, P, "manifest")
        entries = parse_manifest_entries(doc.get("tensors") if isinstance(doc, dict) else None, P)
    except CheckpointError as e:
        return scanned, str(e)
    assert isinstance(doc, dict)
    return scanned, ({**doc, "tensors": {}}, _columns(entries))


def _columns(m: object) -> tuple[object, ...]:
    return (list(m._row), m.files, m.dtypes, m.shapes, m.digests.tolist())  # type: ignore[attr-defined]


M_TAKEN = {
    "indented": json.dumps(json.loads(_manifest(ME)), indent=1).encode(),
    "compact": json.dumps(json.loads(_manifest(ME)), separators=(",", ":")).encode(),
    "spaced": _manifest(ME),
    "pins first": _manifest(
        ME, head=f'"format": 1, "files": {{"config.json": {{"sha256": "{SHA}"}}}}, '
    ),
    "keys after the tensors": _manifest(ME, head="", tail=', "format": 1'),
    "a scalar": _manifest(ME.replace('"shape": [2]', '"shape": []')),
}
M_NOT_TAKEN = {
    "a name given twice": _manifest(ME.replace('"b"', '"a"')),
    "tensors given twice": _manifest(ME, tail=', "tensors": {}'),
    "tensors nested in another key": (
        '{"format": 1, "x": {"tensors": {' + ME + '}}, "tensors": {}}'
    ).encode(),
    "tensors in a string": ('{"format": "\\"", "tensors": {' + ME + "}}").encode(),
    "a backslash before the tensors": _manifest(ME, head='"f\\u006frmat": 1, '),
    "a name with an escape": _manifest(ME.replace('"a"', '"\\u0061"')),
    "nine dimensions": _manifest(ME.replace("[2]", "[1,1,1,1,1,1,1,1,2]")),
    "a dimension of 2**48": _manifest(ME.replace("[2]", f"[{1 << 48}]")),
    "a sha256 short": _manifest(ME.replace(SHA, SHA[:-2], 1)),
    "a sha256 short by one": _manifest(ME.replace(SHA, SHA[:-1], 1)),
    "a sha256 with a space": _manifest(ME.replace(SHA, SHA[:-2] + " a", 1)),
    "a sha256 not hex": _manifest(ME.replace(SHA, SHA[:-1] + "g", 1)),
    "a tab in a name": _manifest(ME.replace('"a"', '"a\tb"')),
    "a control character in a file": _manifest(ME.replace("m.safetensors", "m\x01", 1)),
    "fields in another order": _manifest(
        ME.replace(
            '"file": "m.safetensors", "dtype": "F32"', '"dtype": "F32", "file": "m.safetensors"', 1
        )
    ),
    "trailing junk": _manifest(ME) + b"x",
    "no tensors": _manifest(""),
    "an array": b"[" + _manifest(ME) + b"]",
    "a top-level key twice": _manifest(ME, head='"format": 1, "format": 1, '),
}


@pytest.mark.parametrize("raw", list(M_TAKEN.values()), ids=list(M_TAKEN))
def test_a_usual_manifest_is_scanned_as_json_reads_it(raw: bytes) -> None:
    scanned, parsed = _manifest_both(raw)
    assert scanned is not None
    assert scanned == parsed


@pytest.mark.parametrize("raw", list(M_NOT_TAKEN.values()), ids=list(M_NOT_TAKEN))
def test_any_other_manifest_is_left_to_the_json_reading(raw: bytes) -> None:
    scanned, parsed = _manifest_both(raw)
    assert scanned is None
    try:
        doc, made = parse_manifest(raw, P)
        columns = _columns(made())
        assert isinstance(doc, dict)
        got: object = ({**doc, "tensors": {}}, columns)
    except CheckpointError as e:
        got = str(e)
    assert got == parsed


def test_a_written_checkpoints_manifest_and_headers_are_scanned(
    ckpt_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tpload's own writing (synth's, the manifest indented) is the usual shape: read through the
    scan, and the catalogue read through JSON alone is the same."""
    raw = (ckpt_copy / "NATIVE_MANIFEST.json").read_bytes()
    assert scan.scan_manifest(raw) is not None
    for shard in sorted(ckpt_copy.glob("*.safetensors")):
        blob = shard.read_bytes()
        (n,) = struct.unpack("<Q", blob[:8])
        assert scan.scan_header(blob[8 : 8 + n]) is not None, shard
    fast, _ = read_native(ckpt_copy)
    import tpload.storage.catalogue as catalogue
    import tpload.storage.safetensors as st

    monkeypatch.setattr(catalogue, "scanned_manifest", lambda raw: None)
    monkeypatch.setattr(st, "scanned_columns", lambda *a: None)
    slow, _ = read_native(ckpt_copy)
    assert fast.table.names == slow.table.names
    for column in ("file_id", "dtype_code", "shape", "ndim", "begin", "nbytes"):
        assert np.array_equal(getattr(fast.table, column), getattr(slow.table, column)), column
    assert fast.manifest is not None and slow.manifest is not None
    assert _columns(fast.manifest) == _columns(slow.manifest)
    assert fast.pins == slow.pins
