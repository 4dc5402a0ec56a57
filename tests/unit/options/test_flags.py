"""The flags are generated from the options table: one per field with its help, each number
refused as it is parsed, in one line, by the same rule as load()'s keyword."""

from __future__ import annotations

import argparse
import typing
from dataclasses import fields

import pytest

from tpload.options.flags import Parser, add_flags, from_args
from tpload.options.load_options import LoadKwargs, LoadOptions


def cli(*argv: str) -> LoadOptions:
    p = Parser(prog="tpload")
    add_flags(p)
    return from_args(p.parse_args(list(argv)))


def test_every_field_is_a_flag_and_a_keyword_with_its_help() -> None:
    p = argparse.ArgumentParser()
    add_flags(p)
    helps = {a.dest: a.help for a in p._actions if a.dest != "help"}
    for f in fields(LoadOptions):
        assert f.metadata["help"], f.name
        if f.metadata["cli"]:  # replica_group (a caller's own groups) is a load() keyword only
            assert helps.get(f.name) == f.metadata["help"]  # generated, not copied
        else:
            assert f.name not in helps
    # and a load() keyword: typed by LoadKwargs (test_load_options.py holds it to the fields)
    assert set(typing.get_type_hints(LoadKwargs)) == {f.name for f in fields(LoadOptions)} - {
        "checkpoint"
    }


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ("--timeout", "nan"),
            "argument --timeout: must be a finite number > 0 and at most 604800 (7 days), got nan",
        ),
        (
            ("--timeout", "1e300"),
            "argument --timeout: must be > 0 and at most 604800 (7 days), got 1e+300",
        ),
        (
            ("--timeout", "1e10"),
            "argument --timeout: must be > 0 and at most 604800 (7 days), got 10000000000.0",
        ),
        (
            ("--reserve-gib", "inf"),
            "argument --reserve-gib: must be a finite number between 0 and 1048576 (a PiB)",
        ),
        (
            ("--reserve-gib", "1e300"),
            "argument --reserve-gib: must be between 0 and 1048576 (a PiB), got 1e+300",
        ),
        (("--samples", "-2"), "argument --samples: must be between 0 and 16777216, got -2"),
        (
            ("--hash-threads", "1000000000"),
            "argument --hash-threads: must be between 0 and 1024, got 1000000000",
        ),
        (("--hash-threads", "two"), "argument --hash-threads: expected an integer, got 'two'"),
        (("--tp", "0"), "argument --tp: must be between 1 and 65536, got 0"),
    ],
)
def test_the_command_line_refuses_a_number_as_it_parses_it_in_one_line(
    argv: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as e:
        cli(*argv)
    err = capsys.readouterr().err
    assert (
        e.value.code == 2 and err.count("\n") == 1 and err.startswith("tpload: error: " + needle)
    ), err


def test_subcommand_numbers_use_the_same_rules(capsys: pytest.CaptureFixture) -> None:
    from tpload.cli import main

    for argv, needle in (
        (["synth", "x", "--seed", "-1"], "argument --seed: must be between 0 and 4294967295"),
        (
            ["plan", "x", "--tp", "1", "--nproc-per-node", "0"],
            "argument --nproc-per-node: must be between 1 and 65536, got 0",
        ),
        (
            ["export", "x", "y", "--tp", "1", "--hash-threads", "1000000000"],
            "argument --hash-threads: must be between 0 and 1024",
        ),
        (["verify", "x", "--threads", "5000"], "argument --threads: must be between 0 and 1024"),
        (["manifest", "x", "--threads", "-1"], "argument --threads: must be between 0 and 1024"),
        (["bench", "--timeout", "1e300"], "argument --timeout: must be > 0 and at most 604800"),
        (["bench", "--nproc", "0"], "argument --nproc: must be between 1 and 65536"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert (
            e.value.code == 2
            and err.count("\n") == 1
            and err.startswith("tpload: error: " + needle)
        ), (argv, err)


def test_the_command_line_s_own_flags_are_in_readme_s_table_and_the_parser() -> None:
    from tpload.cli.parsers import load_parser
    from tpload.options.flags import CLI_ONLY, flags_markdown

    table = flags_markdown()
    assert "| `--log-level LEVEL` | - | INFO | tpload's logging level;" in table
    assert "| `--version` | - | - | print tpload's version and exit |" in table
    actions = {a.option_strings[0]: a for a in load_parser()._actions if a.option_strings}
    for extra in CLI_ONLY:
        assert extra.flag in actions and actions[extra.flag].help.startswith(extra.help[:40])


def test_a_strenum_flag_lists_its_choices_as_typed() -> None:
    from tpload.cli.parsers import plan_parser

    generated = argparse.ArgumentParser()  # a plain parser given the options' flags
    add_flags(generated, only=("kind",))
    for parser in (plan_parser(), generated):
        kinds = next(a for a in parser._actions if a.dest == "kind")
        assert kinds.choices == ["packed", "expanded"]
        assert all(type(c) is str for c in kinds.choices)  # not the members: argparse reprs them
