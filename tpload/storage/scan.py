"""A safetensors header and a manifest read straight into columns: no container a tensor.

A JSON parse makes a dict a tensor and a list a shape (three containers a tensor in a header, two
in the manifest), each alive until the table is made of them: at 92,000 tensors that is the parse
itself, a pass taking every column back out of the dicts, and, in a process with no collector
policy, full collections set off by the containers surviving young ones. Both documents are
written by machines, almost always in one shape: each entry the same fields in the same order,
names without an escape. That shape is read here by one regular expression an entry, whose
``split`` gives each entry's name, its kind (the text of the fields that many tensors share: file,
dtype, shape) and its place or sha256 as columns of strings (strings are not the collector's to
walk); each distinct kind is read once, and its values (a shape's tuple too) shared.

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
import operator
import re
from pathlib import Path
from typing import Any, NamedTuple

from ..model.errors import CheckpointError
from .files import parse_json

_WS = r"[ \t\n\r]*"
_SEP = rf"{_WS},{_WS}"
_STR = r'"[^"\\\x00-\x1f]*"'  # no escape: the text is the string
_INT = r"(?:0|[1-9][0-9]{0,15})"  # below 10**16: an int64 and a double hold it exactly
_INTS = rf"(?:{_INT}(?:{_SEP}{_INT})*)?"
_TEXT = r'"[^"]*"'
"""A string's text up to the next quote, checked afterwards a column at once (:func:`_plain`)."""


def _field(key: str, value: str) -> str:
    return rf'"{key}"{_WS}:{_WS}{value}'


def _fields(*fields: tuple[str, str]) -> str:
    return _SEP.join(_field(k, v) for k, v in fields)


def _entry(name: str, kind: str, rest: str) -> re.Pattern[str]:
    """An entry: its name, then the fields of its ``kind`` (every tensor of one dtype and shape,
    in one file, shares this text: one string a kind) as the second group, then the rest."""
    return re.compile(rf"{name}{_WS}:{_WS}\{{{_WS}({kind}){_SEP}{rest}{_WS}\}}", re.DOTALL)


def _header_kind(group: str) -> str:
    """A header entry's dtype and shape (``group``: ``(`` to capture each, ``(?:`` not to)."""
    return _fields(("dtype", f'"{group}[^"]*)"'), ("shape", rf"\[{_WS}{group}{_INTS}){_WS}\]"))


def _manifest_kind(group: str) -> str:
    """A manifest entry's file, dtype and shape (``group`` as in :func:`_header_kind`)."""
    return _fields(
        ("file", f'"{group}[^"]*)"'),
        ("dtype", f'"{group}[^"]*)"'),
        ("shape", rf"\[{_WS}{group}{_INTS}){_WS}\]"),
    )


_HEADER_KIND = re.compile(_header_kind("("))
_HEADER_ENTRY = _entry(
    r'"(?!__metadata__")([^"]*)"',
    _header_kind("(?:"),
    _field("data_offsets", rf"\[{_WS}({_INT}){_SEP}({_INT}){_WS}\]"),
)
"""One header entry: its name, kind (dtype and shape) and offsets as groups (a split's stride
5)."""
_MANIFEST_KIND = re.compile(_manifest_kind("("))
_MANIFEST_ENTRY = _entry(r'"([^"]*)"', _manifest_kind("(?:"), _field("sha256", r'"(.{64})"'))
"""One manifest entry: its name, kind (file, dtype and shape) and sha256's 64 characters (hex
digits only when bytes.fromhex reads 32 bytes of them all) as groups (a split's stride 4)."""
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
    """A header's entries as columns (in the header's order), and its ``__metadata__`` ({} when
    absent)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    begins: list[int]
    ends: list[int]
    meta: dict[str, str]


class ManifestScan(NamedTuple):
    """A manifest's document with its ``"tensors"`` object read empty, and that object's entries
    as columns (in the manifest's order; ``digests``: each sha256's 32 bytes, back to back)."""

    doc: dict[str, object]
    names: list[str]
    files: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    digests: bytes


def scan_header(raw: bytes) -> HeaderScan | None:
    """A safetensors header's JSON as columns, or None where it is not the usual shape (the JSON
    parser reads it then). Its entries need not be sound: the table's rules are the caller's."""
    parts = _split(raw, _HEADER_ENTRY)
    if parts is None:
        return None
    glue = parts[::5]
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
    names, kinds = parts[1::5], parts[2::5]
    if len(metas) > 1 or len(set(names)) != len(names):  # given twice: worded rule by rule
        return None
    read = _kinds(kinds, _HEADER_KIND)
    if read is None or not _plain(names):
        return None
    dtypes, shapes = read
    meta: dict[str, str] = json.loads(metas[0]) if metas else {}  # strings, no escape: a map's
    # last value of a key given twice, as serde's map and Python's dict keep it
    return HeaderScan(
        names, dtypes, shapes, list(map(int, parts[3::5])), list(map(int, parts[4::5])), meta
    )


def scan_manifest(raw: bytes) -> ManifestScan | None:
    """NATIVE_MANIFEST.json with its tensors' entries as columns, or None where it is not the
    usual shape or any part of it is refused (the JSON parser reads it then, and words why).

    The entries must lie back to back inside one object opened by ``"tensors": {`` and closed by
    the next ``}``; the text before them (with no backslash: every quote in it a string's edge)
    followed by ``}}`` must parse, which proves that object the value of the top-level object's
    key ``tensors``; the text before and after them must parse as the whole document with that
    object empty, by :func:`.files.parse_json` (no key twice). No name given twice; each sha256
    64 hex digits."""
    parts = _split(raw, _MANIFEST_ENTRY)
    if parts is None:
        return None
    head, tail, between = parts[0], parts[-1], set(parts[4:-1:4])
    if "\\" in head or _TENSORS_OPEN.search(head) is None or _CLOSE.match(tail) is None:
        return None
    if not between <= {","} and not all(map(_BETWEEN.fullmatch, between)):
        return None
    names = parts[1::4]
    if len(set(names)) != len(names) or not _plain(names):
        return None
    read = _kinds(parts[2::4], _MANIFEST_KIND)
    if read is None:
        return None
    files, dtypes, shapes = read
    try:  # hex digits and ASCII whitespace, which would make it shorter
        digests = bytes.fromhex("".join(parts[3::4]))
    except ValueError:
        return None
    if len(digests) != 32 * len(names):
        return None
    try:
        parse_json((head + "}}").encode(), Path(), "manifest")
        doc = parse_json((head + tail).encode(), Path(), "manifest")
    except CheckpointError:
        return None
    if type(doc) is not dict or doc.get("tensors") != {}:  # pragma: no cover - proved above
        return None
    return ManifestScan(doc, names, files, dtypes, shapes, digests)


def _kinds(kinds: list[str], pattern: re.Pattern[str]) -> list[list[Any]] | None:
    """Each entry's kind (the text of its fields but its name and place) as columns, each of its
    fields read once a distinct kind: its strings (:func:`_plain`), and its shape last, as a tuple
    of ints shared by every tensor of that kind. None where a string is not plain."""
    read = {}
    for kind in set(kinds):
        m = pattern.fullmatch(kind)
        assert m is not None  # the entry's pattern matched these fields
        *strings, shape = m.groups()
        if not _plain(strings):
            return None
        read[kind] = (*strings, tuple(map(int, shape.split(","))) if shape else ())
    rows = list(map(read.__getitem__, kinds))
    return [list(map(operator.itemgetter(k), rows)) for k in range(pattern.groups)]


def _plain(strings: list[str]) -> bool:
    """Whether the strings, read between two quotes, are each the JSON string of that text: no
    backslash (no escape), no control character; any other character Python calls unprintable
    (a separator, a format character) is refused too, only to keep the check one C pass."""
    text = "".join(strings)
    return "\\" not in text and text.isprintable()


def _split(raw: bytes, entry: re.Pattern[str]) -> list[str] | None:
    """The text cut at each entry: [text before, the first entry's groups, text between, ...,
    text after]; None when it is not UTF-8 or holds no entry."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = entry.split(text)
    return parts if len(parts) > 1 else None
