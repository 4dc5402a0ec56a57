"""One options dataclass drives load()'s keywords and the command line; every value checked in one place."""

from __future__ import annotations

import argparse
import inspect
import math
from dataclasses import fields
from pathlib import Path

import pytest

import tpload
from tpload.errors import OptionsError
from tpload.options import LoadOptions, add_flags, from_args


def cli(*argv: str) -> LoadOptions:
    p = argparse.ArgumentParser()
    add_flags(p)
    return from_args(p.parse_args(list(argv)))


def test_defaults_are_the_documented_ones() -> None:
    o = LoadOptions()
    assert (o.kind, o.verify, o.ep, o.tp, o.samples, o.timeout_s) == ("packed", "node", 1, None, 4, 600.0)


def test_every_field_is_a_flag_and_a_keyword_with_its_help() -> None:
    p = argparse.ArgumentParser()
    add_flags(p)
    helps = {a.dest: a.help for a in p._actions if a.dest != "help"}
    for f in fields(LoadOptions):
        assert f.metadata["help"], f.name
        assert helps.get(f.name) == f.metadata["help"]  # generated, not copied
    params = inspect.signature(tpload.load).parameters
    assert {f.name for f in fields(LoadOptions)} - {"checkpoint"} <= set(params)
    assert params["verify"].default == "node" and params["verify"].kind == inspect.Parameter.KEYWORD_ONLY


def test_one_glob_is_one_glob_not_its_characters() -> None:
    assert LoadOptions.from_values({"skip": "mtp.*"}).skip == ("mtp.*",)
    assert LoadOptions.from_values({"defer": ["a", "b"]}).defer == ("a", "b")
    assert cli("--skip", "mtp.*", "--skip", "x").skip == ("mtp.*", "x")


@pytest.mark.parametrize("values, needle", [
    ({"timeout_s": math.nan}, "timeout_s= must be a finite number > 0, got nan"),
    ({"timeout_s": math.inf}, "timeout_s= must be a finite number > 0, got inf"),
    ({"timeout_s": 0}, "timeout_s= must be a finite number > 0, got 0"),
    ({"reserve_gib": math.inf}, "reserve_gib= must be a finite number >= 0, got inf"),
    ({"reserve_gib": math.nan}, "reserve_gib= must be a finite number >= 0, got nan"),
    ({"tp": 100_000_000}, "tp= must be between 1 and 65536, got 100000000"),
    ({"ep": 0}, "ep= must be between 1 and 65536, got 0"),
    ({"kind": "fp8"}, "kind= 'fp8' is not one of packed, expanded"),
    ({"verify": "yes"}, "verify= 'yes' is not one of node, rank, digest, off"),
    ({"hash_threads": True}, "hash_threads=: expected an integer, got bool True"),
    ({"progress": "no"}, "progress=: expected True or False, got str 'no'"),
    ({"skip": 5}, "skip=: expected a glob or a list of globs, got int 5"),
    ({"manifest_sha256": "abc"}, "manifest_sha256= must be 64 hex digits"),
    ({"colour": 1}, "unknown option 'colour' (known: "),
])
def test_bad_values_are_named_as_the_caller_spelled_them(values: dict, needle: str) -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values(values)
    assert needle in str(e.value)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(OptionsError) as e:
        LoadOptions.from_values({"timeout_s": math.nan, "samples": -1, "kind": "x"})
    assert str(e.value).startswith("3 invalid options:")


@pytest.mark.parametrize("argv, needle", [
    (("--timeout", "nan"), "--timeout must be a finite number > 0, got nan"),
    (("--reserve-gib", "inf"), "--reserve-gib must be a finite number >= 0, got inf"),
    (("--samples", "-2"), "--samples must be >= 0, got -2"),
])
def test_the_command_line_names_its_flags(argv: tuple[str, ...], needle: str) -> None:
    with pytest.raises(OptionsError, match=needle.replace("+", r"\+")):
        cli(*argv)


def test_a_non_number_flag_is_refused_by_argparse_naming_it(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli("--hash-threads", "two")
    assert "argument --hash-threads: expected an integer, got 'two'" in capsys.readouterr().err


def test_a_report_into_a_missing_folder_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="folder .*nowhere does not exist"):
        LoadOptions.from_values({"report": str(tmp_path / "nowhere" / "r.json")})


def test_a_path_is_accepted_for_a_string() -> None:
    assert LoadOptions.from_values({"checkpoint": Path("/x")}).checkpoint == "/x"
