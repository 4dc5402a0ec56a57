"""Every command's ``--help``: at most 100 columns on any terminal, a line of text for every flag
and argument, the load's flags in groups naming the subcommands."""

from __future__ import annotations

import re

import pytest

from tpload.cli import main
from tpload.options.flags import GROUPS, HELP_COLUMNS

COMMANDS = [
    [],
    ["synth"],
    ["plan"],
    ["verify"],
    ["manifest"],
    ["export"],
    ["attest"],
    ["attest", "verify"],
    ["kernels"],
    ["bench"],
    ["bench", "--replicas", "2"],
    ["bench", "--engine", "vllm"],
]


def help_of(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a) or "load")
def test_help_fits_100_columns_with_text_for_every_flag(
    argv: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "333")  # a wide terminal: argparse would fill it
    text = help_of(argv, capsys)
    lines = text.splitlines()
    assert max(map(len, lines)) <= HELP_COLUMNS, max(lines, key=len)
    body = text.split("\n\n", 1)[1]  # past the usage
    entries = [k for k, line in enumerate(lines) if re.match(r"  (-|[A-Za-z{])", line)]
    assert entries and lines.index(body.splitlines()[0]) < entries[-1]
    for k in entries:  # an argument's line: its text beside it, or on the next line, indented
        line = lines[k]
        beside = re.match(r"  \S.*?\s{2,}\S", line)
        below = k + 1 < len(lines) and re.match(r"\s{6,}\S", lines[k + 1])
        assert beside or below, f"no help for: {line.strip()}"


def test_the_load_help_is_grouped_and_names_the_subcommands(capsys: pytest.CaptureFixture) -> None:
    text = help_of([], capsys)
    for title, _ in GROUPS:
        assert f"\n{title}:\n" in text
    assert "python -m tpload SUBCOMMAND --help" in " ".join(text.split())
    plan = help_of(["plan"], capsys)
    for flag, said in (
        ("--tp", "tensor-parallel degree"),
        ("--ep", "expert-parallel degree"),
        ("--kind", "packed: the stored bytes"),
        ("DIR", "the checkpoint folder"),
    ):
        assert re.search(rf"\n  {flag}\b.*\n?.*{said}", plan), (flag, plan)


def test_every_load_option_is_in_one_group() -> None:
    from dataclasses import fields

    from tpload.options.load_options import LoadOptions

    grouped = [name for _, names in GROUPS for name in names]
    cli = [f.name for f in fields(LoadOptions) if f.metadata["cli"]]
    assert sorted(grouped) == sorted(cli)
