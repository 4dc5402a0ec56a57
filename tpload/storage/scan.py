"""A safetensors header and a manifest read straight into columns: no container a tensor.

A JSON parse makes a dict a tensor and a list a shape (three containers a tensor in a header, two
in the manifest), each alive until the table is made of them: at 92,000 tensors that is the parse
itself, a pass taking every column back out of the dicts, and, in a process with no collector
policy, full collections set off by the containers surviving young ones. Both documents are
written by machines, almost always in one shape: each entry the same fields in the same order,
names without an escape. That shape is read here by one regular expression an entry, whose
``split`` gives each field as a column of strings (strings are not the collector's to walk), and
each shape's text once however many tensors share it.

What is read here is what :mod:`.header_json` (serde's reading of a header) and :mod:`.files`'s
parse (the manifest: no key twice) read from the same text, and no more: the text must be, from
its first byte to its last, entries of that exact shape joined by commas, with the document around
them proved by the JSON parser itself (a header's ``{``, ``}`` and ``__metadata__``; the manifest's
other keys, with ``"tensors"`` proved a key of the top-level object). Strings with no backslash
and no control character (so no escape, no lone surrogate, nothing the two parsers could differ
on), integers of at most 16 digits without a sign (no ``-0``, nothing beyond a double or an
int64). A name given twice, or anything else, is not taken: ``None``, and the caller reads the
document through the JSON parser, rule by rule, which words what is wrong with it. The scan never
refuses a document; it only takes the usual ones.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

from ..model.errors import CheckpointError
from .files import parse_json

_WS = r"[ \t\n\r]*"
_SEP = rf"{_WS},{_WS}"
_STR = r'"[^"\\\x00-\x1f]*"'  # no escape: the text is the string
_INT = r"(?:0|[1-9][0-9]{0,15})"  # below 10**16: an int64 and a double hold it exactly
_INTS = rf"((?:{_INT}(?:{_SEP}{_INT})*)?)"


def _field(key: str, value: str) -> str:
    return rf'"{key}"{_WS}:{_WS}{value}'


def _entry(name: str, *fields: tuple[str, str]) -> re.Pattern[str]:
    inner = _SEP.join(_field(k, v) for k, v in fields)
    return re.compile(rf"{name}{_WS}:{_WS}\{{{_WS}{inner}{_WS}\}}")


_HEADER_ENTRY = _entry(
    r'"((?!__metadata__")[^"\\\x00-\x1f]*)"',
    ("dtype", r'"([^"\\\x00-\x1f]*)"'),
    ("shape", rf"\[{_WS}{_INTS}{_WS}\]"),
    ("data_offsets", rf"\[{_WS}({_INT}){_SEP}({_INT}){_WS}\]"),
)
"""One header entry: its name, dtype, shape's text and offsets as groups (5: a split's stride 6)."""
_MANIFEST_ENTRY = _entry(
    r'"([^"\\\x00-\x1f]*)"',
    ("file", r'"([^"\\\x00-\x1f]*)"'),
    ("dtype", r'"([^"\\\x00-\x1f]*)"'),
    ("shape", rf"\[{_WS}{_INTS}{_WS}\]"),
    ("sha256", r'"([0-9a-fA-F]{64})"'),
)
"""One manifest entry: its name, file, dtype, shape's text and sha256 as groups (stride 6)."""
_PAIR = rf"{_STR}{_WS}:{_WS}{_STR}"
_META = rf'"__metadata__"{_WS}:{_WS}(\{{{_WS}(?:{_PAIR}(?:{_SEP}{_PAIR})*)?{_WS}\}})'
"""``__metadata__`` given as an object of strings, its text as the group."""
_HEADER_FIRST = re.compile(rf"{_WS}\{{{_WS}(?:{_META}{_SEP})?")
_HEADER_BETWEEN = re.compile(rf"{_SEP}(?:{_META}{_SEP})?")
_HEADER_LAST = re.compile(rf"(?:{_SEP}{_META})?{_WS}\}}{_WS}")
_TENSORS_OPEN = re.compile(rf'"tensors"{_WS}:{_WS}\{{{_WS}\Z')
_CLOSE = re.compile(rf"{_WS}\}}")
_BETWEEN = re.compile(_SEP)


class HeaderScan(NamedTuple):
    """A header's entries as columns of their JSON text (in the header's order), and its
    ``__metadata__`` ({} when absent)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    begins: list[int]
    ends: list[int]
    meta: dict[str, str]


class ManifestScan(NamedTuple):
    """A manifest's document with its ``"tensors"`` object read empty, and that object's entries
    as columns (in the manifest's order)."""

    doc: dict[str, object]
    names: list[str]
    files: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    sha256: list[str]


def scan_header(raw: bytes) -> HeaderScan | None:
    """A safetensors header's JSON as columns, or None where it is not the usual shape (the JSON
    parser reads it then). Its entries need not be sound: the table's rules are the caller's."""
    parts = _split(raw, _HEADER_ENTRY)
    if parts is None:
        return None
    glue = parts[::6]
    metas = []
    for pattern, text in ((_HEADER_FIRST, glue[0]), (_HEADER_LAST, glue[-1])):
        m = pattern.fullmatch(text)
        if m is None:
            return None
        metas += [g for g in m.groups() if g is not None]
    between = glue[1:-1]
    for text in set(between) - {","}:  # the usual text between two entries: a comma
        m = _HEADER_BETWEEN.fullmatch(text)
        if m is None:
            return None
        metas += [g for g in m.groups() if g is not None] * between.count(text)
    names = parts[1::6]
    if len(metas) > 1 or len(set(names)) != len(names):  # given twice: worded rule by rule
        return None
    meta: dict[str, str] = json.loads(metas[0]) if metas else {}  # strings, no escape: a map's
    # last value of a key given twice, as serde's map and Python's dict keep it
    return HeaderScan(
        names,
        parts[2::6],
        shape_tuples(parts[3::6]),
        list(map(int, parts[4::6])),
        list(map(int, parts[5::6])),
        meta,
    )


def scan_manifest(raw: bytes) -> ManifestScan | None:
    """NATIVE_MANIFEST.json with its tensors' entries as columns, or None where it is not the
    usual shape or any part of it is refused (the JSON parser reads it then, and words why).

    The entries must lie back to back inside one object opened by ``"tensors": {`` and closed by
    the next ``}``; the text before them (with no backslash: every quote in it a string's edge)
    followed by ``}}`` must parse, which proves that object the value of the top-level object's
    key ``tensors``; the text before and after them must parse as the whole document with that
    object empty, by :func:`.files.parse_json` (no key twice). No name given twice."""
    parts = _split(raw, _MANIFEST_ENTRY)
    if parts is None:
        return None
    head, tail = parts[0], parts[-1]
    if "\\" in head or _TENSORS_OPEN.search(head) is None or _CLOSE.match(tail) is None:
        return None
    if not set(parts[6:-1:6]) <= {","} and not all(map(_BETWEEN.fullmatch, set(parts[6:-1:6]))):
        return None
    names = parts[1::6]
    if len(set(names)) != len(names):
        return None
    try:
        parse_json((head + "}}").encode(), Path(), "manifest")
        doc = parse_json((head + tail).encode(), Path(), "manifest")
    except CheckpointError:
        return None
    if type(doc) is not dict or doc.get("tensors") != {}:  # pragma: no cover - proved above
        return None
    spelt: dict[str, str] = {}  # each file's and dtype's spelling held once
    return ManifestScan(
        doc,
        names,
        list(map(spelt.setdefault, parts[2::6], parts[2::6])),
        list(map(spelt.setdefault, parts[3::6], parts[3::6])),
        shape_tuples(parts[4::6]),
        parts[5::6],
    )


def _split(raw: bytes, entry: re.Pattern[str]) -> list[str] | None:
    """The text cut at each entry: [text before, the first entry's groups, text between, ...,
    text after]; None when it is not UTF-8 or holds no entry."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = entry.split(text)
    return parts if len(parts) > 1 else None


def shape_tuples(texts: list[str]) -> list[tuple[int, ...]]:
    """Each shape's text (``8,8``, ``8, 8``, empty) as a tuple of ints, each distinct text read
    once and its tuple shared by every tensor of that shape."""
    tuples = {t: tuple(map(int, t.split(","))) if t else () for t in set(texts)}
    return list(map(tuples.__getitem__, texts))
