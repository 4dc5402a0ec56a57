"""The published families as data: ``tpload/configs/presets/*.toml`` read, and their tensor lists
expanded into the tensors a writer writes (published.py: safetensors; synth_gguf.py: GGUF).

A family file holds its ``published`` config.json, its ``presets`` (each: config.json's changes, its
shard count and naming, headers only or not), and ``lists`` of tensors. A tensor list is TOML: each
entry a tensor (``name``, or a linear's ``stem`` that its format names the tensors of; ``as``, its
stored format; ``shape``) or a group (``each``: entries; ``use``: another list of the file, with
``at`` its prefix), and either may say ``if``; a group may say ``for`` (a name) ``in`` (a count, or a
TOML array of values) and ``let`` (names it binds, in order). ``as``, ``shape``'s entries, ``if``,
``in``, ``let``'s values and any other key of a tensor are expressions; ``name``, ``stem`` and ``at``
are templates (``model.layers.{layer}.mlp.experts.{e}.up_proj``). docs/tools.md says the rest.

Expressions are a small part of Python: names, numbers and strings, ``+ - * // %``, comparisons,
``and or not``, ``a if c else b`` and indexing (``compress_ratios[layer]``); templates are f-strings
of such expressions. Each is checked against that grammar once, then compiled and cached: the
shipped files are tpload's own, but a bad one fails by name, never runs something else.
"""

from __future__ import annotations

import ast
import copy
import functools
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from types import CodeType
from typing import Any

from ..model.errors import ConfigError

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


@functools.cache
def _compiled(source: str, template: bool) -> CodeType:
    """``source`` (an expression, or a template: an f-string's body) checked and compiled."""
    text = "f" + repr(source) if template else source
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ConfigError(f"preset data: {source!r} is not an expression ({e.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _GRAMMAR):
            raise ConfigError(
                f"preset data: {source!r}: {type(node).__name__} is not allowed (names, numbers, "
                "strings, arithmetic, comparisons, and/or/not, if-else, indexing)"
            )
    return compile(tree, f"<preset {source!r}>", "eval")


_WRONG = (NameError, TypeError, IndexError, KeyError, ZeroDivisionError, ValueError)
"""What a checked expression can still raise: a name not in scope, a wrong type, an index out of
range."""


def evaluate(value: object, scope: dict[str, Any]) -> Any:
    """An expression's value in ``scope`` (a TOML number, array or boolean is its own value)."""
    if not isinstance(value, str):
        return value
    try:  # checked against the grammar: it reads names, never binds one (scope is not copied)
        return eval(_compiled(value, False), _NO_BUILTINS, scope)
    except _WRONG as e:
        raise ConfigError(f"preset data: {value!r}: {e}") from None


def fill(template: str, scope: dict[str, Any]) -> str:
    """A template (``blk.{i}.attn_q.weight``) filled in ``scope``."""
    try:
        return eval(_compiled(template, True), _NO_BUILTINS, scope)
    except _WRONG as e:
        raise ConfigError(f"preset data: {template!r}: {e}") from None


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


_TENSOR_KEYS = {"name", "stem", "as", "shape", "if"}


def expand(entries: list[dict], scope: dict[str, Any], lists: Mapping[str, list]) -> Iterator[Tensor]:
    """Every tensor ``entries`` list in ``scope``, in order (``lists``: what ``use`` may name)."""
    for entry in entries:
        if "if" in entry and not evaluate(entry["if"], scope):
            continue
        if "each" in entry or "use" in entry:
            yield from _group(entry, scope, lists)
            continue
        named = "stem" if "stem" in entry else "name"
        inner = scope
        extra = entry.keys() - _TENSOR_KEYS
        if extra:
            inner = {**scope, **{k: evaluate(entry[k], scope) for k in sorted(extra)}}
        yield Tensor(
            fill(entry[named], scope),
            named == "stem",
            evaluate(entry["as"], scope),
            tuple(evaluate(d, scope) for d in entry["shape"]),
            inner,
        )


def _group(entry: dict, scope: dict[str, Any], lists: Mapping[str, list]) -> Iterator[Tensor]:
    body = entry["each"] if "each" in entry else lists[entry["use"]]
    if "for" in entry:
        over = entry["in"]
        values = over if isinstance(over, list) else range(evaluate(over, scope))
        steps = ({**scope, entry["for"]: value} for value in values)
    else:
        steps = iter((scope,))
    for step in steps:
        if "let" in entry or "at" in entry:
            step = dict(step)
            for key, value in entry.get("let", {}).items():
                step[key] = evaluate(value, step)
            if "at" in entry:
                step["at"] = fill(entry["at"], step)
        yield from expand(body, step, lists)


@functools.cache
def read(name: str) -> dict[str, Any]:
    """The family file ``name`` (``tpload/configs/presets/NAME.toml``), parsed; a ``like`` file's
    ``published``, ``defaults``, ``let``, ``lists`` and ``files`` under its own."""
    res = resources.files("tpload.configs") / FOLDER / f"{name}.toml"
    try:
        doc = tomllib.loads(res.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"preset data {FOLDER}/{name}.toml: {e}") from None
    if "like" in doc:
        base = read(doc["like"])
        for key in ("published", "defaults", "let", "lists", "files"):
            doc[key] = {**base.get(key, {}), **doc.get(key, {})}
    return doc


def published_config(doc: dict[str, Any], preset: dict[str, Any], presets: Mapping) -> dict:
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
