"""A safetensors header's JSON, read as safetensors' own parser reads it (serde_json, in
safetensors 0.8.0), so that a header means the same to tpload as to every other reader.

Python's json and serde_json share the grammar but differ where a crafted header can use it:

- a key named twice in one object: Python keeps the last, silently; serde refuses a struct's field
  given twice (``dtype`` in an entry, ``__metadata__``) and keeps the last of a map's. Each object
  that names a key twice is read as a :class:`Twice`, and the header's rules decide
  (storage/safetensors.py);
- ``-0`` is a float to serde (not a dimension or an offset), the int 0 to Python: read as -0.0;
- a number beyond a double (``1e400``, or an integer of 309 digits) is refused by serde, made
  ``inf`` (or kept) by Python;
- an escape of a lone surrogate (``\\ud800``) is refused by serde, kept by Python (a name that
  cannot be printed or encoded later): :func:`lone_surrogate`;
- serde refuses containers nested :data:`MAX_DEPTH` + 1 deep; Python reads a thousand.

A float beyond a double is refused as it is read. An integer beyond one, a lone surrogate or deep
nesting can only matter where the header's rules accept any value (a field of an entry that
safetensors ignores: :func:`ignored_value_problem`) or any string (names, ``__metadata__``);
anywhere else such a value already breaks a rule. The reading itself is Python's C parser: a
header without a backslash, a ``-0`` or a key named twice (proved by counting its colons) is read
once with no hook per object; any other is read again with the hooks (a 92,000-tensor header:
0.29 s read plainly, 0.49 s with the hooks, CPU time on a busy 2-core machine).

The usual header (its entries of one shape, no escape) is not parsed here at all but scanned into
columns (storage/scan.py), which takes only text this reading reads the same way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NoReturn  # Any: json.loads' keyword hooks

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import Json

MAX_DEPTH = 127
"""The deepest nesting of objects and arrays serde_json reads (its recursion limit, 128)."""


class Twice(dict[str, object]):
    """A JSON object that named a key more than once: the last value kept (as a map keeps it);
    ``twice``: each key named more than once, in order."""

    __slots__ = ("twice",)
    twice: list[str]


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    out, seen, again = Twice(d), set[str](), list[str]()
    for k, _ in pairs:
        if k in seen:
            again.append(k)
        seen.add(k)
    out.twice = list(dict.fromkeys(again))
    return out


def _int(token: str) -> int | float:
    return -0.0 if token == "-0" else int(token)


def _finite(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise ValueError(f"number {token[:40]} is beyond a double")
    return value


def _no_constants(token: str) -> NoReturn:
    raise ValueError(f"{token} is not a JSON number")


def parse_header_json(raw: bytes, path: Path) -> Json:
    """The header's JSON document; CheckpointError naming the file when it is not readable JSON
    as safetensors reads it (not UTF-8, bad syntax, NaN, a number beyond a double, nested past the
    interpreter's depth)."""
    fast = b"\\" not in raw and (b"-" not in raw or b"-0" not in raw)
    doc = _loads(raw, path, fast=fast)
    if fast and not _no_key_twice(raw, doc):
        doc = _loads(raw, path, fast=False)
    return doc


def _loads(raw: bytes, path: Path, *, fast: bool) -> Json:
    hooks: dict[str, Any] = {} if fast else {"object_pairs_hook": _object, "parse_int": _int}
    try:
        doc: Json = json.loads(
            raw.decode("utf-8"), parse_float=_finite, parse_constant=_no_constants, **hooks
        )
        return doc
    except RecursionError:
        raise CheckpointError(
            f"{escape_name(path)}: header is JSON nested too deeply (safetensors reads at most "
            f"{MAX_DEPTH} levels); refused"
        ) from None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, digit limits, NaN, 1e400
        raise CheckpointError(
            f"{escape_name(path)}: header is not readable JSON ({escape_name(e)})"
        ) from None


def _no_key_twice(raw: bytes, doc: Json) -> bool:
    """Whether no object of a header read plainly named a key twice, proved without a hook: with
    no backslash in it, every colon of the text is a key's or one inside a string; so if the
    colons of the keys and strings kept (the entries' own, ``__metadata__``'s, the names') already
    account for every colon, no pair was dropped and no other object exists. Anything else
    (nested objects, colons elsewhere) answers False, and the header is read again with the hook."""
    if type(doc) is not dict:  # refused whatever its objects hold
        return True
    colons = len(doc) + "".join(doc).count(":")  # the top level's pairs; colons in the names
    colons += sum(map(len, [v for v in doc.values() if type(v) is dict]))  # entries', metadata's
    meta = doc.get("__metadata__")
    if type(meta) is dict:
        colons += sum(s.count(":") for kv in meta.items() for s in kv if isinstance(s, str))
    return raw.count(b":") == colons


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (only a ``\\ud800`` escape makes one: UTF-8 cannot
    carry it, and Python joins a pair of escapes into one character)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def ignored_value_problem(value: Json, depth: int) -> str:
    """Why serde_json refuses a value that safetensors otherwise ignores (a field of an entry it
    does not know), at ``depth`` containers deep; "" when it reads it. Iterative: the value may be
    nested as deep as Python's parser went."""
    stack = [(value, depth)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d + 1 > MAX_DEPTH:
                return f"is nested more than {MAX_DEPTH} levels deep (safetensors' JSON limit)"
            if isinstance(v, dict):
                if any(map(lone_surrogate, v)):
                    return "has a key with a lone surrogate escape (not Unicode)"
                stack.extend((x, d + 1) for x in v.values())
            else:
                stack.extend((x, d + 1) for x in v)
        elif isinstance(v, str) and lone_surrogate(v):
            return "has a string with a lone surrogate escape (not Unicode)"
        elif type(v) is int:
            try:
                float(v)
            except OverflowError:
                return "has a number beyond a double (safetensors refuses it)"
    return ""
