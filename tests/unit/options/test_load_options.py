"""One options dataclass drives load()'s keywords and the command line; every value checked in one
place."""

from __future__ import annotations

import collections.abc
import inspect
import math
import types
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from tpload.model.bounds import COUNT, GIB, RANKS, SECONDS, SEED, THREADS
from tpload.model.errors import OptionsError
from tpload.options.flags import Parser, add_flags, from_args
from tpload.options.load_options import LoadKwargs, LoadOptions


def cli(*argv: str) -> LoadOptions:
    p = Parser(prog="tpload")
    add_flags(p)
    return from_args(p.parse_args(list(argv)))


def test_defaults_are_the_documented_ones() -> None:
    o = LoadOptions()
    assert (o.kind, o.verify, o.ep, o.tp, o.samples, o.timeout_s) == (
        "packed",
        "node",
        1,
        None,
        4,
        600.0,
    )


def test_one_glob_is_one_glob_not_its_characters() -> None:
    assert LoadOptions.from_values({"skip": "mtp.*"}).skip == ("mtp.*",)
    assert LoadOptions.from_values({"defer": ["a", "b"]}).defer == ("a", "b")
    assert cli("--skip", "mtp.*", "--skip", "x").skip == ("mtp.*", "x")


@pytest.mark.parametrize(
    "values, needle",
    [
        (
            {"timeout_s": math.nan},
            "timeout_s= must be a finite number > 0 and at most 604800 (7 days), got nan",
        ),
        (
            {"timeout_s": math.inf},
            "timeout_s= must be a finite number > 0 and at most 604800 (7 days), got inf",
        ),
        ({"timeout_s": 0}, "timeout_s= must be > 0 and at most 604800 (7 days), got 0.0"),
        ({"timeout_s": 1e300}, "timeout_s= must be > 0 and at most 604800 (7 days), got 1e+300"),
        (
            {"timeout_s": 1e10},
            "timeout_s= must be > 0 and at most 604800 (7 days), got 10000000000.0",
        ),
        (
            {"reserve_gib": math.inf},
            "reserve_gib= must be a finite number between 0 and 1048576 (a PiB), got inf",
        ),
        (
            {"reserve_gib": math.nan},
            "reserve_gib= must be a finite number between 0 and 1048576 (a PiB), got nan",
        ),
        ({"reserve_gib": 1e300}, "reserve_gib= must be between 0 and 1048576 (a PiB), got 1e+300"),
        ({"hash_threads": 10**9}, "hash_threads= must be between 0 and 1024, got 1000000000"),
        ({"samples": -1}, "samples= must be between 0 and 16777216, got -1"),
        ({"tp": 100_000_000}, "tp= must be between 1 and 65536, got 100000000"),
        ({"ep": 0}, "ep= must be between 1 and 65536, got 0"),
        ({"kind": "fp8"}, "kind= 'fp8' is not one of packed, expanded"),
        ({"verify": "yes"}, "verify= 'yes' is not one of node, rank, digest, off"),
        ({"hash_threads": True}, "hash_threads=: expected an integer, got bool True"),
        ({"progress": "no"}, "progress=: expected True or False, got str 'no'"),
        ({"skip": 5}, "skip=: expected a glob or a list of globs, got int 5"),
        ({"manifest_sha256": "abc"}, "manifest_sha256= must be 64 hex digits"),
        ({"colour": 1}, "unknown option 'colour' (known: "),
    ],
)
def test_bad_values_are_named_as_the_caller_spelled_them(values: dict, needle: str) -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values(values)
    assert needle in str(e.value)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values({"timeout_s": math.nan, "samples": -1, "kind": "x"})
    assert str(e.value).startswith("3 invalid options:")


def test_every_number_has_its_kind_s_one_rule() -> None:
    hints = typing.get_type_hints(LoadOptions)
    numeric = [
        f
        for f in fields(LoadOptions)
        if {int, float} & {hints[f.name], *typing.get_args(hints[f.name])}
    ]
    assert {f.name for f in numeric} == {
        "tp",
        "ep",
        "replicas",
        "hash_threads",
        "samples",
        "timeout_s",
        "reserve_gib",
    }
    assert {f.name: f.metadata["bound"] for f in numeric} == {
        "tp": RANKS,
        "ep": RANKS,
        "replicas": RANKS,
        "hash_threads": THREADS,
        "samples": COUNT,
        "timeout_s": SECONDS,
        "reserve_gib": GIB,
    }
    # the same rule at each end: parsed text and a keyword
    assert (
        SEED("4294967295") == 2**32 - 1
        and SEED.problem(-1) == "must be between 0 and 4294967295, got -1"
    )
    assert SECONDS("604800") == 604800.0 and SECONDS.problem(604801.0)
    assert THREADS("0") == 0 and THREADS.problem(1025)


def test_a_path_is_accepted_for_a_string() -> None:
    assert LoadOptions.from_values({"checkpoint": Path("/x")}).checkpoint == "/x"


def _accepts(hint: object, value: object) -> bool:
    """Whether ``value`` is of the type ``hint`` (unions, Literal, None, sequences of a type)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None):
        return value is None
    if origin is collections.abc.Sequence:
        return isinstance(value, collections.abc.Sequence) and all(
            _accepts(args[0], v) for v in value
        )
    if origin is not None:
        return isinstance(value, origin)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, typing.cast(type, hint))


def test_load_s_typed_keywords_are_the_options_fields() -> None:
    """load()'s keywords as a type checker reads them (LoadKwargs) name every field but the
    checkpoint, each field's default is a value of its type, a mode's names are its choices; and
    the door declares them (PEP 692), so a misspelt or mistyped keyword is a checker's error."""
    hints = typing.get_type_hints(LoadKwargs)
    options = {f.name: f for f in fields(LoadOptions) if f.name != "checkpoint"}
    assert list(hints) == list(options)  # the same names, in the fields' order
    for name, f in options.items():
        assert _accepts(hints[name], f.default), (name, hints[name], f.default)
        if f.metadata["choices"]:
            assert typing.get_args(hints[name]) == tuple(map(str, f.metadata["choices"])), name
    assert not _accepts(hints["tp"], "2") and not _accepts(hints["verify"], "hash")
    assert _accepts(hints["skip"], "mtp.*") and _accepts(hints["report"], Path("r.json"))
    assert _accepts(hints["replica_group"], [[0, 2], [1, 3]])
    import tpload

    options_param = inspect.signature(tpload.load).parameters["options"]
    assert options_param.kind == inspect.Parameter.VAR_KEYWORD
    assert options_param.annotation == "Unpack[LoadKwargs]"
