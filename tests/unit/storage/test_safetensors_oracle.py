"""tpload's safetensors header reader against safetensors' own parser (0.8.0, pinned in the test
extra): seeded mutations of small shards (the length field, padding, trailing bytes, offsets,
dtypes, shapes, names given twice, fields given twice, nesting, numbers, metadata, names) given to
both. Both accept or both refuse; where both accept, every tensor's bytes, dtype and shape and the
metadata are equal; a refusal is one line per problem, each naming the file and the rule.

Exempt are only the refusals docs/format.md lists, which safetensors accepts: more than 8
dimensions, C64 and the dtypes narrower than a byte, an entry written as an array or a dtype as a
map, a name given twice, and a shape of no elements with a dimension of 2**48 or more or leading
dimensions that multiply to 2**63 (torch holds no such shape)."""

from __future__ import annotations

import json
import math
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import safetensors
import torch

import tpload
from tpload.model.errors import CheckpointError, LoadError
from tpload.model.text import escape_name
from tpload.storage import header_json
from tpload.storage.safetensors import MAX_HEADER_BYTES, entries, read_header

SIZES = {  # safetensors' dtypes of whole bytes, with their sizes
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
REFUSED_DTYPES = {"C64", "F4", "F6_E2M3", "F6_E3M2"}  # docs/format.md: safetensors reads them
OTHER_DTYPES = ["C64", "F4", "F6_E2M3", "F6_E3M2", "F128", "f32", "", "Q4_K"]
# The words each refusal uses for its rule: every line of a refusal must name one.
RULES = (
    "too short for a safetensors header length",
    "header length",
    "is not readable JSON",
    "nested too deeply",
    "is not a JSON object",
    "header entry is not an object",
    "is given twice",
    "is not served",
    "is not a list of non-negative integers",
    "overflows",
    "is not [begin, end]",
    "are not ordered",
    "runs past the data",
    "data_offsets span",
    "overlap",
    "belong to no tensor",
    "is not a map of strings to strings",
    "lone surrogate",
    "nested more than 127 levels",
    "beyond a double",
)


class Raw(str):
    """JSON text written as it is (``-0``, ``1e400``, a malformed fragment)."""


class Obj(list):
    """A JSON object as its pairs in order, so a key may be given twice."""


def enc(value: object, ascii_only: bool) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        return "{" + ",".join(f"{enc(k, ascii_only)}:{enc(v, ascii_only)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(enc(v, ascii_only) for v in value) + "]"
    if isinstance(value, str) and any(0xD800 <= ord(c) < 0xE000 for c in value):
        return json.dumps(value)  # a lone surrogate only as an escape (UTF-8 cannot carry one)
    return json.dumps(value, ensure_ascii=ascii_only)


@dataclass
class Case:
    """A shard being spoilt: the header's top-level pairs, the data, and how they are framed."""

    pairs: Obj
    data: bytes
    ascii_only: bool = True
    lead: str = ""
    pad: str = ""
    length_delta: int = 0
    length: int | None = None
    text_edit: tuple[str, int] | None = None  # ("cut", n) or ("junk", n) on the JSON text
    flags: set[str] = field(default_factory=set)  # documented refusals the mutations made
    steps: list[str] = field(default_factory=list)

    def blob(self) -> bytes:
        text = self.lead + enc(self.pairs, self.ascii_only)
        if self.text_edit == ("bom", 0):
            text = "\ufeff" + text
        raw = text.encode("utf-8")
        if self.text_edit and self.text_edit[0] == "cut":
            raw = raw[: -self.text_edit[1]]
        elif self.text_edit and self.text_edit[0] == "junk":
            raw += b"x\xff\x00"[: self.text_edit[1]]
        pad = self.pad if self.pad else " " * (-len(raw) % 8)
        raw += pad.encode("latin-1")
        n = self.length if self.length is not None else len(raw) + self.length_delta
        return struct.pack("<Q", n) + raw + self.data

    def entries(self) -> list[tuple[int, Obj]]:
        """The entries still written as objects, with their places among the pairs."""
        if not isinstance(self.pairs, Obj):
            return []
        return [
            (i, v)
            for i, (k, v) in enumerate(self.pairs)
            if k != "__metadata__" and isinstance(v, Obj)
        ]


def base_case(rng: random.Random, dtypes: list[str]) -> Case:
    """A sound shard: 1 to 6 tensors of random dtypes and small shapes (some with no elements),
    listed in another order than their bytes, with or without metadata."""
    tensors, offset, data = [], 0, []
    for i in range(rng.randint(1, 6)):
        dtype = rng.choice(dtypes)
        shape = [rng.choice([0, 1, 2, 3, 5]) if rng.random() < 0.1 else rng.randint(1, 5)]
        shape = shape + [rng.randint(1, 4) for _ in range(rng.randint(0, 2))]
        shape = shape[: rng.randint(0, len(shape))] if rng.random() < 0.2 else shape
        n = math.prod(shape) * SIZES[dtype]
        name = rng.choice(["model.layers.{i}.w", "t{i}", "blk.{i}.attn_q.weight"]).format(i=i)
        tensors.append((name, dtype, shape, [offset, offset + n]))
        data.append(rng.randbytes(n))
        offset += n
    rng.shuffle(tensors)
    pairs = Obj(
        (name, Obj([("dtype", d), ("shape", s), ("data_offsets", o)])) for name, d, s, o in tensors
    )
    meta = rng.choice([None, {"format": "pt"}, {"format": "pt", "when": "2024-01-01T12:00:00"}])
    if meta is not None:
        pairs.insert(rng.randint(0, len(pairs)), ("__metadata__", Obj(meta.items())))
    return Case(pairs, b"".join(data), ascii_only=rng.random() < 0.7)


# -- the mutations: each spoils one thing, as a crafted or damaged shard would ----------------


def _entry(c: Case, rng: random.Random) -> Obj:
    entries = c.entries()
    return entries[rng.randrange(len(entries))][1] if entries else Obj()


def _field(entry: Obj, key: str) -> int | None:
    return next((i for i, (k, _) in enumerate(entry) if k == key), None)


def _set(entry: Obj, key: str, value: object) -> None:
    i = _field(entry, key)
    if i is None:
        entry.append((key, value))
    else:
        entry[i] = (key, value)


def m_length(c: Case, rng: random.Random) -> str:
    c.length_delta = rng.choice([-3, -2, -1, 1, 2, 8])
    return f"length {c.length_delta:+d}"


def m_length_absurd(c: Case, rng: random.Random) -> str:
    c.length = rng.choice([0, MAX_HEADER_BYTES + 1, 1 << 63, (1 << 64) - 1, 7])
    return f"length {c.length}"


def m_pad(c: Case, rng: random.Random) -> str:
    c.pad = "".join(
        rng.choice(" \t\n\r" if rng.random() < 0.7 else " \t\x00x")
        for _ in range(rng.randint(1, 9))
    )
    c.lead = rng.choice(["", " ", "\n\t"])
    return f"pad {c.pad!r} lead {c.lead!r}"


def m_trailing(c: Case, rng: random.Random) -> str:
    k = rng.randint(1, 9)
    c.data += rng.randbytes(k)
    return f"{k} bytes after the data"


def m_truncate(c: Case, rng: random.Random) -> str:
    k = min(len(c.data), rng.randint(1, 9))
    c.data = c.data[: len(c.data) - k]
    return f"data {k} bytes short"


def m_offsets(c: Case, rng: random.Random) -> str:
    e = _entry(c, rng)
    i = _field(e, "data_offsets")
    if i is None:
        return "no entry"
    b, end = e[i][1] if isinstance(e[i][1], list) and len(e[i][1]) == 2 else (0, 0)
    choice = rng.randrange(4)
    if choice == 0:
        d = rng.choice([-8, -2, -1, 1, 2, 8])
        new = [b + d, end + d]
    elif choice == 1:
        new = [b, end + rng.choice([-1, 1])]
    elif choice == 2:
        other = _entry(c, rng)
        j = _field(other, "data_offsets")
        new = list(other[j][1]) if j is not None and isinstance(other[j][1], list) else [b, end]
    else:
        new = rng.choice(
            [
                [end, b],
                [1.0, 4],
                ["0", 4],
                [0],
                [0, 4, 4],
                Raw("[-0, 4]"),
                Raw(f"[0, {end}.0]"),
                Obj([("0", 0), ("1", 4)]),
                None,
                [(1 << 64) - 1, (1 << 64) - 1],
                [1 << 64, 1 << 64],
                [-1, 3],
                [True, 4],
            ]
        )
    e[i] = ("data_offsets", new)
    return f"offsets {new!r}"


def m_minus_zero(c: Case, rng: random.Random) -> str:
    """A 0 written ``-0``: to serde a float, so no offset or dimension; to Python the int 0."""
    for _, e in c.entries():
        i = _field(e, "data_offsets")
        offsets = e[i][1] if i is not None else None
        if isinstance(offsets, list) and len(offsets) == 2 and offsets[0] == 0:
            e[i] = ("data_offsets", Raw(f"[-0, {enc(offsets[1], True)}]"))
            return "begin -0"
    return "no begin 0"


def m_swap(c: Case, rng: random.Random) -> str:
    es = c.entries()
    if len(es) < 2:
        return "no pair"
    (_, a), (_, b) = rng.sample(es, 2)
    i, j = _field(a, "data_offsets"), _field(b, "data_offsets")
    if i is None or j is None:
        return "no offsets"
    a[i], b[j] = ("data_offsets", b[j][1]), ("data_offsets", a[i][1])
    return "offsets swapped"


def m_dtype(c: Case, rng: random.Random) -> str:
    e = _entry(c, rng)
    value = rng.choice(
        [
            *SIZES,
            *OTHER_DTYPES,
            5,
            None,
            ["F32"],
            Obj([("F32", None)]),
            Obj([("F32", 1)]),
            Raw('"F\\u0033\\u0032"'),
        ]
    )
    if isinstance(value, Obj) and value == [("F32", None)]:
        c.flags.add("dtype-map")
    _set(e, "dtype", value)
    return f"dtype {value!r}"


def m_shape(c: Case, rng: random.Random) -> str:
    e = _entry(c, rng)
    i = _field(e, "shape")
    shape = list(e[i][1]) if i is not None and isinstance(e[i][1], list) else []
    choice = rng.randrange(5)
    if choice == 0 and shape:
        k = rng.randrange(len(shape))
        if isinstance(shape[k], int):
            shape[k] += rng.choice([-1, 1])
        new = shape
    elif choice == 1:
        new = [1, *shape] if rng.random() < 0.5 else [*shape, 1]
    elif choice == 2:
        new = [1] * rng.choice([8, 9, 12]) + shape[:1]
    elif choice == 3:
        new = [*shape, 0]
    else:
        new = rng.choice(
            [
                True,
                1.5,
                Raw("[-0]"),
                Raw("[1e400]"),
                Raw("[4.0]"),
                [1 << 64],
                ["4"],
                None,
                4,
                [[1]],
                [-1],
                [(1 << 64) - 1],
                Obj([("0", 1)]),
            ]
        )
    _set(e, "shape", new)
    return f"shape {new!r}"


EMPTY_SHAPES = [
    [0],
    [0, 4],
    [4, 0],
    [0, 1 << 40, 1 << 40],
    [1 << 40, 1 << 40, 0],
    [1 << 31, 1 << 31, 0],
    [1 << 40, 1 << 23, 0],  # 2**63 before the zero: safetensors reads it, torch cannot hold it
    [1 << 47, 0],
    [1 << 48, 0],
    [0, (1 << 64) - 1],
    [(1 << 64) - 1, 0],
    [1 << 32, 1 << 32, 0],
    [0] * 9,
]


def m_add_empty(c: Case, rng: random.Random) -> str:
    """A tensor of no bytes: at the end of the data, at its start, or inside another's range."""
    shape = rng.choice(EMPTY_SHAPES)
    at = rng.choice([len(c.data), 0, max(0, len(c.data) // 2)])
    c.pairs.insert(
        rng.randint(0, len(c.pairs)),
        (
            f"empty.{len(c.pairs)}",  # a new name each time
            Obj(
                [
                    ("dtype", rng.choice(["F32", "BF16", "U8"])),
                    ("shape", shape),
                    ("data_offsets", [at, at]),
                ]
            ),
        ),
    )
    return f"empty tensor {shape} at {at}"


def m_name_twice(c: Case, rng: random.Random) -> str:
    es = c.entries()
    if not es:
        return "no entry"
    i, e = rng.choice(es)
    name = c.pairs[i][0]
    copy = Obj(e)
    if rng.random() < 0.5 and len(es) > 1:
        copy = Obj(rng.choice(es)[1])  # another tensor's entry under the same name
    c.pairs.insert(rng.randint(0, len(c.pairs)), (name, copy))
    c.flags.add("twice")
    return f"name {name} twice"


def m_field_twice(c: Case, rng: random.Random) -> str:
    e = _entry(c, rng)
    key = rng.choice(["dtype", "shape", "data_offsets", "x"])
    i = _field(e, key)
    value = e[i][1] if i is not None else 1
    if key == "dtype" and rng.random() < 0.5:
        value = rng.choice(["F16", "BF16", "U8", "F32"])
    e.insert(rng.randint(0, len(e)), (key, value))
    return f"field {key} twice"


def m_metadata(c: Case, rng: random.Random) -> str:
    value = rng.choice(
        [
            None,
            Obj(),
            Obj([("k", 1)]),
            Obj([("k", None)]),
            [],
            "pt",
            Obj([("k", Obj([("a", "b")]))]),
            Obj([("k", "v:1"), ("j", "a-0")]),
            Obj([("k\ud800", "v")]),
            Obj([("k", "\udc00")]),
            Obj([("k", "a\\b")]),
            Obj([("k", "1"), ("k", "2")]),
            Obj([("k", Raw("1e400"))]),
        ]
    )
    i = next((i for i, (k, _) in enumerate(c.pairs) if k == "__metadata__"), None)
    if i is None or rng.random() < 0.2:
        c.pairs.insert(rng.randint(0, len(c.pairs)), ("__metadata__", value))
    else:
        c.pairs[i] = ("__metadata__", value)
    return f"metadata {value!r}"


def m_name(c: Case, rng: random.Random) -> str:
    es = c.entries()
    if not es:
        return "no entry"
    i, e = rng.choice(es)
    name = rng.choice(
        [
            "",
            "a:b",
            "x-0",
            "e\\u",
            "é.weight",
            "\ud800",
            "x\udc00y",
            "😀",
            "a\x00b",
            "n" * 300,
            "\ud83d\ude00",
            "a\\ud800",
        ]
    )
    c.pairs[i] = (name, e)
    return f"name {name!r}"


def m_ignored(c: Case, rng: random.Random) -> str:
    """A field safetensors ignores, with a value serde_json may refuse to read."""
    e = _entry(c, rng)
    depth = rng.choice([1, 10, 124, 125, 126, 127, 300])
    value = rng.choice(
        [
            1.5,
            Raw("1e400"),
            Raw("-0"),
            Raw("1e-400"),
            "s",
            None,
            Raw("[" * depth + "]" * depth),
            Raw('{"k":' * depth + "1" + "}" * depth),
            Raw("9" * 300),
            Raw("9" * 400),
            Raw("-" + "9" * 400),
            Raw("9" * 5000),
            "\ud800",
            Obj([("x", 1), ("x", 2)]),
        ]
    )
    key = rng.choice(["x", "extra", "\ud800"])
    e.insert(rng.randint(0, len(e)), (key, value))
    return f"field {key!r} = {str(value)[:20]!r}"


def m_entry_kind(c: Case, rng: random.Random) -> str:
    es = c.entries()
    if not es:
        return "no entry"
    i, e = rng.choice(es)
    if rng.random() < 0.5:
        value = [v for _, v in e]  # an array in field order: safetensors reads it, tpload does not
        c.flags.add("array")
    else:
        value = rng.choice([5, None, "x", Raw("[" * 200 + "]" * 200)])
    c.pairs[i] = (c.pairs[i][0], value)
    return f"entry {value!r:.30}"


def m_text(c: Case, rng: random.Random) -> str:
    c.text_edit = rng.choice(
        [("cut", 1), ("cut", 3), ("junk", 1), ("junk", 2), ("junk", 3), ("bom", 0)]
    )
    return f"text {c.text_edit}"


def m_top(c: Case, rng: random.Random) -> str:
    c.pairs = rng.choice([Obj(), Raw("[]"), Raw("null"), Raw("1")])  # type: ignore[assignment]
    if isinstance(c.pairs, Raw) or rng.random() < 0.5:
        c.data = b""
    return f"top {c.pairs!r}"


MUTATIONS = [
    (m_length, 3),
    (m_length_absurd, 1),
    (m_pad, 2),
    (m_trailing, 2),
    (m_truncate, 2),
    (m_offsets, 5),
    (m_swap, 2),
    (m_minus_zero, 1),
    (m_dtype, 4),
    (m_shape, 4),
    (m_add_empty, 4),
    (m_name_twice, 3),
    (m_field_twice, 3),
    (m_metadata, 3),
    (m_name, 3),
    (m_ignored, 4),
    (m_entry_kind, 2),
    (m_text, 1),
    (m_top, 1),
]


def case(seed: int, dtypes: list[str] = list(SIZES)) -> Case:  # noqa: B006  (never changed)
    """A sound shard spoilt by one to three mutations (a tenth left sound), from ``seed``."""
    rng = random.Random(seed)
    c = base_case(rng, dtypes)
    fns, weights = zip(*MUTATIONS, strict=True)
    for _ in range(0 if rng.random() < 0.1 else rng.choice([1, 1, 1, 2, 3])):
        if not isinstance(c.pairs, Obj):  # no header object left to spoil
            break
        c.steps.append(rng.choices(fns, weights)[0](c, rng))
    return c


# -- the two readers ---------------------------------------------------------------------------


def oracle(blob: bytes) -> dict[str, tuple[str, list[int], bytes]] | str:
    """safetensors' reading: {name: (dtype, shape, bytes)}, or its refusal."""
    try:
        return {
            name: (t["dtype"], list(t["shape"]), bytes(t["data"]))
            for name, t in safetensors.deserialize(blob)
        }
    except safetensors.SafetensorError as e:
        return str(e)


def ours(path: Path) -> tuple[dict[str, tuple[str, list[int], bytes]], dict] | str:
    """tpload's reading: {name: (dtype, shape, the bytes it would serve)} and the metadata, or its
    refusal."""
    try:
        infos, meta = read_header(path, path.name)
    except CheckpointError as e:
        return str(e)
    blob = path.read_bytes()
    return {
        n: (i.dtype, list(i.shape), blob[i.begin : i.begin + i.nbytes]) for n, i in infos.items()
    }, meta


def documented(c: Case, read: dict[str, tuple[str, list[int], bytes]]) -> str | None:
    """The documented refusal a shard safetensors reads falls under (the words tpload's refusal
    must use), or None."""
    if "twice" in c.flags:
        return "is given twice"
    if "array" in c.flags:
        return "header entry is not an object"
    if "dtype-map" in c.flags or any(d in REFUSED_DTYPES for d, _, _ in read.values()):
        return "is not served"
    if any(len(s) > 8 or max(s, default=0) >= 1 << 48 for _, s, _ in read.values()):
        return "is not a list of non-negative integers (at most 8, each below 2**48)"
    for _, s, _ in read.values():
        if 0 in s and math.prod(s[: s.index(0)]) >= 1 << 63:
            return "overflows"
    return None


def assert_worded(message: str, path: Path) -> None:
    """One line per problem, each naming the file and a rule."""
    where = escape_name(path)
    lines = message.split("\n")
    problems = lines
    if len(lines) > 1:
        assert lines[0] == f"{len(lines) - 1} problems in the header of {where}:", message
        problems = [line.removeprefix("  - ") for line in lines[1:]]
    for line in problems:
        assert line.startswith(f"{where}: "), message
        assert any(rule in line for rule in RULES), f"no rule named in: {line}"


SEEDS = range(20261202, 20261202 + 600)


def test_tpload_reads_exactly_what_safetensors_reads(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    tally = {"both read": 0, "both refused": 0, "documented": 0}
    for seed in SEEDS:
        c = case(seed)
        blob = c.blob()
        path.write_bytes(blob)
        theirs, mine = oracle(blob), ours(path)
        what = f"seed {seed}: {c.steps}"
        if isinstance(theirs, str) and isinstance(mine, str):
            tally["both refused"] += 1
            assert_worded(mine, path)
            continue
        if isinstance(mine, str):  # safetensors reads it: only a documented refusal
            rule = documented(c, theirs)
            assert rule is not None and rule in mine, f"{what}: tpload refused: {mine}"
            assert_worded(mine, path)
            tally["documented"] += 1
            continue
        assert not isinstance(theirs, str), (
            f"{what}: tpload read what safetensors refuses: {theirs}"
        )
        got, meta = mine
        assert got == theirs, what
        with safetensors.safe_open(path, framework="np") as f:
            assert meta == (f.metadata() or {}), what
        tally["both read"] += 1
    assert len(SEEDS) >= 300 and min(tally.values()) >= 20, tally


def test_a_header_read_plainly_equals_it_read_with_the_hooks(tmp_path: Path) -> None:
    """The plain reading (no hook per object), where it is taken, gives what the reading that sees
    every key given twice gives: its colon count proves no pair was dropped."""
    taken = 0
    for seed in SEEDS:
        raw = case(seed).blob()
        n = int.from_bytes(raw[:8], "little")
        text = raw[8 : 8 + n] if n <= len(raw) - 8 else b""
        try:
            slow = header_json._loads(text, tmp_path, fast=False)
        except CheckpointError:
            continue
        if b"\\" in text or b"-0" in text:
            continue
        plain = header_json._loads(text, tmp_path, fast=True)
        if header_json._no_key_twice(text, plain):
            taken += 1
            assert plain == slow and type(slow) is not header_json.Twice, seed
            values = slow.values() if isinstance(slow, dict) else ()
            assert all(type(v) is not header_json.Twice for v in values), seed
    assert taken >= 100


# -- the cases found beside safetensors, one by one -------------------------------------------


def shard(path: Path, pairs: list, data: bytes, *, delta: int = 0) -> bytes:
    """Write a shard from header pairs (a key may repeat; Raw values are written as they are),
    padded to 8 as safetensors pads; ``delta``: added to the length field. Returns its bytes."""
    text = enc(Obj(pairs), True).encode()
    text += b" " * (-len(text) % 8)
    blob = struct.pack("<Q", len(text) + delta) + text + data
    path.write_bytes(blob)
    return blob


def refused(path: Path, blob: bytes) -> str:
    """tpload's refusal of the shard (and safetensors refuses it too)."""
    assert isinstance(oracle(blob), str)
    with pytest.raises(CheckpointError) as e:
        read_header(path, path.name)
    assert_worded(str(e.value), path)
    return str(e.value)


def entry(dtype: str, shape: list, begin: int) -> Obj:
    n = math.prod(shape) * (SIZES.get(dtype) or 8)
    return Obj([("dtype", dtype), ("shape", shape), ("data_offsets", [begin, begin + n])])


TWO = [("a", entry("F32", [2], 0)), ("b", entry("F32", [2], 8))]


@pytest.mark.parametrize("short", [1, 2])
def test_a_header_length_short_of_its_padding_is_refused(tmp_path: Path, short: int) -> None:
    """Today's worst: the header ends inside its padding, so every tensor would be read 1 or 2
    bytes early; the data then runs past the last tensor."""
    path = tmp_path / "m.safetensors"
    blob = shard(
        path, [("__metadata__", Obj([("format", "pt")])), *TWO], bytes(range(16)), delta=-short
    )
    assert refused(path, blob) == (
        f"{path}: bytes 16..{16 + short} of the data belong to no tensor (after the last, b): the "
        f"file runs {short} byte{'s' * (short > 1)} past its tensors, or its header length is short"
    )


def test_gaps_and_bytes_after_the_data_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    blob = shard(path, [("a", entry("F32", [2], 4)), ("b", entry("F32", [2], 16))], bytes(28))
    assert refused(path, blob) == (
        f"3 problems in the header of {path}:\n"
        f"  - {path}: bytes 0..4 of the data belong to no tensor (before the first tensor): "
        "safetensors requires the tensors to cover the data back to back\n"
        f"  - {path}: bytes 12..16 of the data belong to no tensor (after tensor a): safetensors "
        "requires the tensors to cover the data back to back\n"
        f"  - {path}: bytes 24..28 of the data belong to no tensor (after the last, b): the file "
        "runs 4 bytes past its tensors, or its header length is short"
    )


def test_a_zero_byte_tensor_inside_another_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    blob = shard(path, [*TWO, ("e", entry("F32", [0], 4))], bytes(16))
    assert refused(path, blob) == f"{path}: tensors a and e overlap (bytes 0..8 and 4..)"


def test_a_name_given_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """The last would win (safetensors keeps it; tpload did): the other tensor vanished."""
    path = tmp_path / "m.safetensors"
    blob = shard(path, [*TWO, ("a", entry("F32", [2], 8))], bytes(16))
    assert refused(path, blob) == (
        f"3 problems in the header of {path}:\n"
        f"  - {path}: tensor a: the name is given twice in the header (safetensors keeps the last; "
        "refused: two readers could take different tensors)\n"
        f"  - {path}: bytes 0..8 of the data belong to no tensor (before the first tensor): "
        "safetensors requires the tensors to cover the data back to back\n"
        f"  - {path}: tensors a and b overlap (bytes 8..16 and 8..)"
    )
    # the same entry twice: safetensors reads it, and tpload still refuses it (documented)
    blob = shard(path, [*TWO, ("b", entry("F32", [2], 8))], bytes(16))
    assert not isinstance(oracle(blob), str)
    with pytest.raises(CheckpointError, match="tensor b: the name is given twice"):
        read_header(path, path.name)


@pytest.mark.parametrize("key", ["dtype", "shape", "data_offsets"])
def test_a_field_given_twice_is_refused(tmp_path: Path, key: str) -> None:
    """An F16/BF16 pair would decode differently in a reader that takes the first."""
    path = tmp_path / "m.safetensors"
    a = entry("F16", [4], 0)
    a.append((key, "BF16" if key == "dtype" else dict(a)[key]))
    blob = shard(path, [("a", a), ("b", entry("F32", [2], 8))], bytes(16))
    assert refused(path, blob) == f"{path}: tensor a: field {key} is given twice in the entry"


def test_metadata_given_twice_or_not_strings_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    for meta, words in [
        ([("__metadata__", Obj()), ("__metadata__", Obj())], "__metadata__ is given twice"),
        ([("__metadata__", Obj([("k", 1)]))], "__metadata__ {'k': 1} is not a map of strings"),
        ([("__metadata__", ["pt"])], "__metadata__ ['pt'] is not a map of strings to strings"),
        ([("__metadata__", Obj([("k", "\ud800")]))], "__metadata__ holds a lone surrogate"),
    ]:
        blob = shard(path, [*meta, *TWO], bytes(16))
        assert refused(path, blob).startswith(f"{path}: {words}")
    blob = shard(path, [("__metadata__", None), *TWO], bytes(16))  # null: as if absent
    assert not isinstance(oracle(blob), str) and read_header(path, path.name)[1] == {}


@pytest.mark.parametrize(
    "value, words",
    [
        (Raw("[" * 126 + "]" * 126), "nested more than 127 levels deep"),  # 128 with the header's
        (Raw("1e400"), "header is not readable JSON (number 1e400 is beyond a double)"),
        (Raw("9" * 400), "has a number beyond a double"),
        ("\ud800", "has a string with a lone surrogate escape"),
    ],
)
def test_a_field_safetensors_ignores_must_still_be_json_it_reads(
    tmp_path: Path, value: object, words: str
) -> None:
    path = tmp_path / "m.safetensors"
    a = entry("F32", [2], 0)
    a.append(("x", value))
    blob = shard(path, [("a", a), TWO[1]], bytes(16))
    assert words in refused(path, blob)
    a[-1] = (
        "x",
        Raw("[" * 125 + "]" * 125),
    )  # 127 deep in all: safetensors reads it, so does tpload
    blob = shard(path, [("a", a), TWO[1]], bytes(16))
    assert not isinstance(oracle(blob), str) and list(read_header(path, path.name)[0]) == ["a", "b"]


def test_minus_zero_is_not_a_dimension_or_an_offset(tmp_path: Path) -> None:
    """serde reads -0 as a float; Python's json as the int 0."""
    path = tmp_path / "m.safetensors"
    a = Obj([("dtype", "F32"), ("shape", Raw("[-0]")), ("data_offsets", [0, 0])])
    blob = shard(path, [("a", a), ("b", entry("F32", [2], 0))], bytes(8))
    assert "tensor a: shape [-0.0] is not a list of non-negative integers" in refused(path, blob)


def test_a_lone_surrogate_in_a_name_is_refused_escaped(tmp_path: Path) -> None:
    """It ended as "unexpected UnicodeEncodeError"."""
    path = tmp_path / "m.safetensors"
    blob = shard(path, [("a\ud800", TWO[0][1]), TWO[1]], bytes(16))
    assert refused(path, blob) == (
        f"{path}: tensor a\\ud800: the name holds a lone surrogate escape (not Unicode)"
    )
    blob = shard(path, [("a\ud83d\ude00", TWO[0][1]), TWO[1]], bytes(16))  # a pair: one character
    assert list(read_header(path, path.name)[0]) == ["a😀", "b"] == sorted(oracle(blob))


@pytest.mark.parametrize(
    "shape, fits",
    [([1 << 40, 1 << 40, 0], False), ([0, 1 << 40, 1 << 40], True), ([1 << 31, 1 << 31, 0], True)],
)
def test_a_shape_of_no_elements_is_refused_only_where_it_overflows(
    tmp_path: Path, shape: list, fits: bool
) -> None:
    """safetensors multiplies the dimensions in order, checking each product: [2**40, 2**40, 0]
    overflows (and then raised a raw RuntimeError from state_dict()), [0, 2**40, 2**40] does not."""
    path = tmp_path / "m.safetensors"
    blob = shard(
        path,
        [*TWO, ("z", Obj([("dtype", "F32"), ("shape", shape), ("data_offsets", [16, 16])]))],
        bytes(16),
    )
    if fits:
        assert oracle(blob)["z"] == ("F32", shape, b"")
        assert read_header(path, path.name)[0]["z"].shape == tuple(shape)
    else:
        assert refused(path, blob) == (
            f"{path}: tensor z: shape {shape} overflows: its bytes' bits reach 2**64, or the "
            "dimensions before a zero multiply to 2**63 or more"
        )


def test_the_header_length_limit_is_safetensors(tmp_path: Path) -> None:
    assert MAX_HEADER_BYTES == 100_000_000
    path = tmp_path / "m.safetensors"
    with open(path, "wb") as f:  # sparse: the length is checked before anything is read
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        f.truncate(MAX_HEADER_BYTES + 64)
    with pytest.raises(CheckpointError) as e:
        read_header(path, path.name)
    assert str(e.value) == (
        f"{path}: header length 100000001 is more than safetensors reads (100000000 bytes); refused"
    )


def test_every_problem_of_a_column_is_found_by_the_rule_written_once() -> None:
    """The rules run over whole columns: a header of many entries, one spoilt in each way, is
    worded entry by entry (the column pass finds each, not only the first)."""
    header = {f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(64)}
    header["t3"]["shape"] = [1 << 40, 1 << 40, 0]
    header["t9"]["dtype"] = "C64"
    header["t20"]["x"] = json.loads("[" * 130 + "]" * 130)
    with pytest.raises(CheckpointError) as e:
        entries(Path("/c/m.safetensors"), "m.safetensors", header, 8, 64)
    lines = str(e.value).split("\n")
    assert lines[0] == "3 problems in the header of /c/m.safetensors:"
    assert [line.split(": ")[1] for line in lines[1:]] == ["tensor t3", "tensor t9", "tensor t20"]


# -- through a real load (tp 1, in process): the bytes served are the bytes safetensors reads ---

CONFIG = 'codecs = ["bf16"]\n[[rules]]\nmatch = "*"\nrole = "auto"\n'  # every tensor whole


def served(root: Path) -> dict[str, tuple[str, list[int], bytes]]:
    shards = tpload.load(root, progress=False, verify="off", config=str(root / "c.toml"))
    try:
        return {
            name: (
                str(t.dtype),
                list(t.shape),
                t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
            )
            for name, t in shards.state_dict().items()
        }
    finally:
        shards.release()


TORCH = {"F32": "torch.float32", "BF16": "torch.bfloat16", "I64": "torch.int64"}


@pytest.mark.parametrize(
    "names",
    [
        ["model.w", "model.e", "model.z"],
        ["é.w", "x-0.e", "a:b\\c"],  # read again with the hooks: a backslash, a -0, a colon
    ],
)
def test_a_load_serves_the_bytes_safetensors_reads(tmp_path: Path, names: list[str]) -> None:
    """Zero-size tensors included ([0, 4] failed with "unexpected ValueError"; [0, 2**40, 2**40]
    could not be viewed)."""
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "c.toml").write_text(CONFIG)
    rng = np.random.default_rng(7)
    w = rng.integers(0, 256, 3 * 4 * 4, dtype=np.uint8).tobytes()
    i = rng.integers(0, 256, 5 * 8, dtype=np.uint8).tobytes()
    pairs = [
        ("__metadata__", Obj([("format", "pt")])),
        (names[0], entry("F32", [3, 4], 0)),
        (names[1], Obj([("dtype", "F32"), ("shape", [0, 4]), ("data_offsets", [48, 48])])),
        (
            names[2],
            Obj(
                [
                    ("dtype", "BF16"),
                    ("shape", [0, 1 << 40, 1 << 40]),
                    ("data_offsets", [48, 48]),
                    ("x", Raw("-0")),
                ]
            ),
        ),
        ("i", entry("I64", [5], 48)),
    ]
    blob = shard(root / "model.safetensors", pairs, w + i)
    want = {n: (TORCH[d], s, b) for n, (d, s, b) in oracle(blob).items()}
    assert served(root) == want and want[names[0]][2] == w and want["i"][2] == i


def test_seeded_shards_both_read_are_served_as_safetensors_reads_them(tmp_path: Path) -> None:
    """A handful of the seeded cases, of dtypes a load serves as stored, through a real load."""
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "c.toml").write_text(CONFIG)
    loaded = []
    for seed in SEEDS:
        c = case(seed, list(TORCH))
        blob = c.blob()
        (root / "model.safetensors").write_bytes(blob)
        theirs, mine = oracle(blob), ours(root / "model.safetensors")
        if isinstance(theirs, str) or isinstance(mine, str) or not theirs:
            continue
        assert served(root) == {n: (TORCH[d], s, b) for n, (d, s, b) in theirs.items()}, seed
        loaded.append(c.steps)
        if len(loaded) == 5:
            break
    assert len(loaded) == 5 and sum(map(bool, loaded)) >= 3, loaded  # most of them spoilt


def test_a_load_of_a_shifted_header_fails_naming_the_file_and_the_rule(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "c.toml").write_text(CONFIG)
    shard(root / "model.safetensors", TWO, bytes(range(16)), delta=-2)
    with pytest.raises(LoadError) as e:
        served(root)
    assert "no rank returned weights" in str(e.value)
    assert (
        f"{root / 'model.safetensors'}: bytes 16..18 of the data belong to no tensor (after the "
        "last, b): the file runs 2 bytes past its tensors, or its header length is short"
    ) in str(e.value)


def test_the_usual_headers_read_in_bulk_as_rule_by_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the bulk reading of a usual header (``_usual_columns``) takes one, the rule-by-rule
    reading gives the same columns; it takes none that the rule-by-rule reading refuses."""
    import tpload.storage.safetensors as st

    taken = 0
    for seed in SEEDS:
        raw = case(seed).blob()
        n = int.from_bytes(raw[:8], "little")
        if n > len(raw) - 8:
            continue
        try:
            header = header_json.parse_header_json(raw[8 : 8 + n], tmp_path)
        except CheckpointError:
            continue
        if not isinstance(header, dict):
            continue
        usual = st._usual_columns(tmp_path, header, 8 + n, len(raw) - 8 - n)
        with monkeypatch.context() as m:
            m.setattr(st, "_usual_columns", lambda *a, **k: None)
            try:
                rule_by_rule = st.header_columns(tmp_path, header, 8 + n, len(raw) - 8 - n)
            except CheckpointError:
                assert usual is None, seed
                continue
        if usual is not None:
            taken += 1
            assert usual == rule_by_rule, seed
    assert taken >= 50, taken  # the bulk reading was asked of enough sound headers
