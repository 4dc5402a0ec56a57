"""The published families as data: ``tpload/configs/presets/*.toml`` read, and their tensor lists
expanded into the tensors a writer writes (published.py: safetensors; synth_gguf.py: GGUF).

A family file holds its ``published`` config.json, its ``presets`` and ``lists`` of tensors
(docs/tools.md, "The presets' data"). Each entry of a list is a tensor (``name``, or a linear's
``stem`` whose format names its tensors; ``as``, its stored format; ``shape``) or a group (``each``:
entries; or ``use``: another list of the file, ``at`` its prefix), and either may say ``if``; a
group may say ``for`` (a name) ``in`` (a count, or an array of values) and ``let`` (names it binds,
in order). ``as``, each of ``shape``, ``if``, ``in``, the values of ``let`` and a tensor's ``below``
(an ``i64``'s bound) are expressions; ``name``, ``stem`` and ``at`` are templates
(``blk.{i}.attn_q.weight``). A key no writer reads is refused, never ignored.

Expressions are a small part of Python: names, numbers and strings, ``+ - * // %``, comparisons,
``and or not``, ``a if c else b`` and indexing (``compress_ratios[layer]``); templates are f-strings
of them. A file's lists are checked against that grammar when it is read, and compiled once (a
tensor's name, format and shape into one expression): the files are tpload's own, but a wrong one
fails by name, and never runs anything else.
"""

from __future__ import annotations

import ast
import copy
import functools
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from types import CodeType
from typing import Any, TypeVar

from ..model.errors import ConfigError

V = TypeVar("V")

FOLDER = "presets"
"""Where the families' files live, under ``tpload/configs/``."""

_GRAMMAR = (
    ast.Expression,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.FloorDiv,
    ast.Mod,
    ast.UnaryOp,
    ast.USub,
    ast.Not,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.IfExp,
    ast.Subscript,
    ast.JoinedStr,
    ast.FormattedValue,
)
_NO_BUILTINS: dict[str, Any] = {"__builtins__": {}}
_WRONG = (NameError, TypeError, IndexError, KeyError, ZeroDivisionError, ValueError)
"""What a checked expression can still raise: a name not in scope, a wrong type, an index out of
range."""


def _parsed(source: str | int | float, *, template: bool = False) -> ast.expr:  # a TOML value
    """An expression (or a template: an f-string's body; or a TOML number) checked against the
    grammar."""
    if not isinstance(source, str):
        return ast.Constant(source)
    try:
        tree = ast.parse("f" + repr(source) if template else source, mode="eval")
    except SyntaxError as e:
        raise ConfigError(f"preset data: {source!r} is not an expression ({e.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _GRAMMAR):
            raise ConfigError(
                f"preset data: {source!r}: {type(node).__name__} is not allowed (names, numbers, "
                "strings, arithmetic, comparisons, and/or/not, if-else, indexing)"
            )
    return tree.body


def _compiled(expr: ast.expr, source: str | int | float) -> CodeType:
    """``expr`` compiled; its file name, ``source``'s repr, is what an error names."""
    return compile(ast.fix_missing_locations(ast.Expression(expr)), repr(source), "eval")


def _code(source: str | int | float) -> CodeType:  # a TOML value
    return _compiled(_parsed(source), source)


def _template(source: str) -> CodeType:
    return _compiled(_parsed(source, template=True), source)


def _run(code: CodeType, scope: dict[str, Any]) -> Any:
    try:  # checked: it reads names and never binds one, so the scope is not copied
        return eval(code, _NO_BUILTINS, scope)
    except _WRONG as e:
        raise ConfigError(f"preset data: {code.co_filename}: {e}") from None


def evaluate(source: str | float | bool | list[Any], scope: dict[str, Any]) -> Any:
    """An expression's value in ``scope`` (a TOML number, array or boolean is its own value)."""
    if not isinstance(source, str):
        return source
    return _run(_expression(source), scope)


@functools.cache
def _expression(source: str) -> CodeType:
    return _code(source)


@dataclass(frozen=True)
class Tensor:
    """One entry of a tensor list, expanded: what a writer turns into stored tensors."""

    name: str
    """The tensor's name, or (``stem``) a linear's stem, which its format names tensors after."""
    stem: bool
    form: str
    """Its stored format (``as``): a name the writer knows (``bf16``, ``fp8``; a ggml type)."""
    shape: tuple[int, ...]
    """Its shape (a linear's: the weight's ``[out, in]``)."""
    scope: dict[str, Any]
    """Every name in scope where it was listed, with its other keys' values (``below``)."""


@dataclass(frozen=True)
class _Entry:
    """One entry of a list, checked and compiled."""

    test: CodeType | None
    """``if``."""
    tensor: CodeType | None
    """A tensor's (name, format, shape), one expression; None: a group."""
    stem: bool = False
    extra: tuple[tuple[str, CodeType], ...] = ()
    """A tensor's other keys (``below``)."""
    var: str = ""
    """A group's ``for``."""
    over: CodeType | tuple[Any, ...] | None = None
    """A group's ``in``: a count, or the values themselves."""
    lets: tuple[tuple[str, CodeType], ...] = ()
    at: CodeType | None = None
    body: tuple[_Entry, ...] | str = ()
    """A group's entries, or the name of the list it uses."""


_TENSOR = {"name", "stem", "as", "shape", "if"}
_ARGS = {"below"}
"""A tensor's other keys, the writer's: ``below`` (an ``i64`` tensor's values are below it)."""
_GROUP = {"each", "use", "at", "for", "in", "let", "if"}


def _entry(raw: dict[str, Any], where: str) -> _Entry:
    """``raw`` checked and compiled; ``where``: its file and list, for messages."""
    if not isinstance(raw, dict):
        raise ConfigError(f"preset data {where}: {raw!r} is not an entry (a TOML table)")
    test = _code(raw["if"]) if "if" in raw else None
    if "each" in raw or "use" in raw:
        if ("each" in raw) == ("use" in raw) or ("for" in raw) != ("in" in raw):
            raise ConfigError(
                f"preset data {where}: {raw!r}: a group says each or use (not both), for with in"
            )
        if raw.keys() - _GROUP:
            raise ConfigError(f"preset data {where}: {raw!r}: a group has no {raw.keys() - _GROUP}")
        over = raw.get("in")
        at = raw.get("at")
        return _Entry(
            test,
            None,
            var=raw.get("for", ""),
            over=None if over is None else tuple(over) if isinstance(over, list) else _code(over),
            lets=tuple((k, _code(v)) for k, v in raw.get("let", {}).items()),
            at=None if at is None else _template(at),
            body=raw["use"] if "use" in raw else tuple(_entry(e, where) for e in raw["each"]),
        )
    named = "stem" if "stem" in raw else "name"
    if not {named, "as", "shape"} <= raw.keys():
        raise ConfigError(f"preset data {where}: {raw!r}: a tensor says name (or stem), as, shape")
    if raw.keys() - _TENSOR - _ARGS:
        raise ConfigError(f"preset data {where}: {raw!r}: a tensor has no {raw.keys() - _TENSOR}")
    parts = [_parsed(raw[named], template=True), _parsed(raw["as"])]
    shape = ast.Tuple([_parsed(d) for d in raw["shape"]], ast.Load())
    return _Entry(
        test,
        _compiled(ast.Tuple([*parts, shape], ast.Load()), raw[named]),
        stem=named == "stem",
        extra=tuple((k, _code(raw[k])) for k in sorted(raw.keys() & _ARGS)),
    )


def compile_list(raw: list[Any], where: str) -> tuple[_Entry, ...]:
    """A tensor list as TOML parsed it, checked and compiled (what :func:`expand` takes);
    ``where``: its file and name, for messages."""
    if not isinstance(raw, list):
        raise ConfigError(f"preset data {where}: not a list of entries")
    return tuple(_entry(e, where) for e in raw)


def expand(
    entries: tuple[_Entry, ...], scope: dict[str, Any], lists: Mapping[str, tuple[_Entry, ...]]
) -> list[Tensor]:
    """Every tensor ``entries`` (a list of :func:`read`'s) lists in ``scope``, in order;
    ``lists``: what ``use`` may name."""
    out: list[Tensor] = []
    _walk(entries, scope, lists, out)
    return out


def _walk(
    entries: tuple[_Entry, ...],
    scope: dict[str, Any],
    lists: Mapping[str, tuple[_Entry, ...]],
    out: list[Tensor],
) -> None:
    for e in entries:
        if e.test is not None and not _run(e.test, scope):
            continue
        if e.tensor is not None:
            name, form, shape = _run(e.tensor, scope)
            own = {**scope, **{k: _run(v, scope) for k, v in e.extra}} if e.extra else scope
            out.append(Tensor(name, e.stem, form, shape, own))
            continue
        body = lists[e.body] if isinstance(e.body, str) else e.body
        if e.over is None:
            steps: Iterator[dict[str, Any]] = iter((scope,))
        else:
            values = e.over if isinstance(e.over, tuple) else range(_run(e.over, scope))
            steps = ({**scope, e.var: value} for value in values)
        for step in steps:
            if e.lets or e.at is not None:
                step = dict(step)
                for key, code in e.lets:
                    step[key] = _run(code, step)
                if e.at is not None:
                    step["at"] = _run(e.at, step)
            _walk(body, step, lists, out)


_FILE_KEYS = {
    "like",
    "loads_as",
    "published",
    "defaults",
    "let",
    "files",
    "lists",
    "presets",
    "archs",
}
"""What a family file may hold (docs/tools.md, "The presets' data"; ``archs``: gguf.toml's)."""


def preset(name: str, table: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """Preset ``name``'s table, refused if it holds a key its writer does not read (``keys``)."""
    if table.keys() - keys:
        raise ConfigError(f"preset data: preset {name}: no {sorted(table.keys() - keys)}")
    return table


@functools.cache
def read(name: str) -> dict[str, Any]:
    """The family file ``name`` (``tpload/configs/presets/NAME.toml``), parsed, its lists checked
    and compiled; a ``like`` file's ``published``, ``defaults``, ``let``, ``lists`` and ``files``
    under its own."""
    res = resources.files("tpload.configs") / FOLDER / f"{name}.toml"
    try:
        doc = tomllib.loads(res.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"preset data {FOLDER}/{name}.toml: {e}") from None
    if doc.keys() - _FILE_KEYS:
        raise ConfigError(f"preset data {FOLDER}/{name}.toml: no {sorted(doc.keys() - _FILE_KEYS)}")
    doc["lists"] = {
        key: compile_list(entries, f"{FOLDER}/{name}.toml, {key}")
        for key, entries in doc.get("lists", {}).items()
    }
    if "like" in doc:
        base = read(doc["like"])
        for key in ("published", "defaults", "let", "lists", "files"):
            doc[key] = {**base.get(key, {}), **doc.get(key, {})}
    return doc


def published_config(
    doc: dict[str, Any], preset: dict[str, Any], presets: Mapping[str, Any]
) -> dict[str, Any]:
    """A preset's config.json: the family's published one with the preset's changes (and its
    ``base`` preset's first), less its ``drop`` keys; a fresh copy (presets never share one)."""
    changes: dict[str, Any] = {}
    if "base" in preset:
        changes |= presets[preset["base"]].get("config", {})
    changes |= preset.get("config", {})
    config = {**copy.deepcopy(doc["published"]), **copy.deepcopy(changes)}
    for key in preset.get("drop", ()):
        del config[key]
    return config


class Lazy(Mapping[str, V]):
    """A mapping ``make()`` builds when first asked: a table of presets, read from the families'
    files only when a command needs it (never at import)."""

    def __init__(self, make: Callable[[], dict[str, V]]) -> None:
        self._make = functools.cache(make)

    def __getitem__(self, name: str) -> V:
        return self._make()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._make())

    def __len__(self) -> int:
        return len(self._make())
