"""Every command line README.md and docs/ show parses with the flags of today: `python -m tpload
...`, `tpload ...` and `torchrun ... -m tpload ...` by tpload's own parsers (through the command
line's real dispatch, stopped once the flags are parsed), torchrun's part by torchrun's parser, and
`hf ...` by the installed huggingface_hub's own command-line app (click)."""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpload.cli import main
from tpload.cli.parsers import SUBCOMMANDS
from tpload.options.flags import Parser

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)  # in a list item too
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(?:-[a-z0-9-]+)?")
"""A word the reader fills in: DIR, N, HEX, NAME-tiny."""


def snippets(text: str) -> Iterator[str]:
    """Each line of each code block (continuations joined), then each inline code span."""
    for block in FENCE.findall(text):
        yield from block.replace("\\\n", " ").splitlines()
    yield from re.findall(r"`([^`\n]+)`", FENCE.sub("", text))


def alternatives(word: str) -> list[str]:
    """A synopsis's `small|medium|seed`: each; a placeholder's `NAME|PATH`: the first."""
    parts = [a for a in word.split("|") if a] or [word]
    return parts[:1] if PLACEHOLDER.fullmatch(parts[0]) else parts


def commands(snippet: str) -> Iterator[list[str]]:
    """The commands of one snippet (split at &&, ;, |), comments and synopsis brackets dropped, one
    per alternative of an `a|b` word."""
    try:
        words = shlex.split(snippet, comments=True)
    except ValueError:  # prose in backticks, not a command
        return
    run: list[str] = []
    for w in [*words, "&&"]:
        if w not in ("&&", "||", ";", "|"):
            if w.strip("[]") not in ("", "..."):
                run.append(w.strip("[]"))
            continue
        yield from (list(c) for c in itertools.product(*map(alternatives, run)) if c)
        run = []


def tpload_argv(words: list[str]) -> tuple[list[str], list[str]] | None:
    """(torchrun's own arguments, tpload's) of a tpload command line, else None."""
    if words[:3] == ["python", "-m", "tpload"]:
        return [], words[3:]
    if words[:1] == ["torchrun"] and "tpload" in words:
        at = words.index("tpload")
        if words[at - 1] == "-m":
            return words[1 : at + 1], words[at + 1 :]
    if (
        words[:1] == ["tpload"]
        and len(words) > 1
        and (words[1] in SUBCOMMANDS or words[1][0] == "-")
    ):
        return [], words[1:]  # (`tpload` alone, or a table row of the bench, is a name)
    return None


def found() -> tuple[list[tuple[str, list[str], list[str]]], list[tuple[str, list[str]]]]:
    """Every tpload command (where, torchrun's words, tpload's argv) and hf command (where,
    words)."""
    ours, hf = [], []
    for page in PAGES:
        where = str(page.relative_to(ROOT))
        for snippet in snippets(page.read_text()):
            for words in commands(snippet):
                if not words:
                    continue
                if words[0] in ("hf", "huggingface-cli"):
                    hf.append((where, words))
                elif (split := tpload_argv(words)) is not None:
                    ours.append((where, *split))
    return ours, hf


OURS, HF = found()


class Parsed(BaseException):
    """Raised once a command's flags parsed: the command itself never runs (a BaseException, so
    the command line's own error handling lets it through)."""


def fill(argv: list[str], message: str) -> list[str] | None:
    """``argv`` with a stand-in for each argument a partial mention leaves out (`tpload plan
    --write` in prose): the flags it does give are still checked. None when nothing is missing."""
    m = re.search(r"the following arguments are required: (.*?) \(usage: ", message)
    if not m:
        return None
    names = [n.strip() for n in m.group(1).split(",")]
    head = 2 if argv[:1] == ["attest"] else 1 if argv[:1] and argv[0] in SUBCOMMANDS else 0
    positional = ["X" for n in names if not n.startswith("-")]
    options = [x for n in names if n.startswith("-") for x in (n, "1")]
    return argv[:head] + positional + argv[head:] + options


def parse_problem(argv: list[str], capsys: pytest.CaptureFixture) -> str | None:
    """Why tpload's parsers refuse ``argv`` (a placeholder where a number or a choice goes is no
    problem), or None."""
    for _ in range(3):  # a stand-in for each missing argument, then again
        capsys.readouterr()
        try:
            main(list(argv))
        except Parsed:
            return None
        except SystemExit as e:
            if e.code == 0:  # --help, --version
                return None
            message = capsys.readouterr().err.strip()
            filled = fill(argv, message)
            if filled is not None:
                argv = filled
                continue
            bad = re.search(r"(?:got|invalid choice:) '([^']*)'", message)
            if bad and PLACEHOLDER.fullmatch(bad.group(1)):
                return None
            return message
        else:
            return "the command ran: its parser was not reached"
    return "still missing arguments after filling them in"


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Parser.parse_args

    def parse_args(self: Parser, args: list[str] | None = None, namespace: object = None) -> None:
        real(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(Parser, "parse_args", parse_args)


def test_the_pages_show_commands_of_every_kind() -> None:
    # the extraction itself: a change in how commands are found must not empty the test
    subcommands = {argv[0] for _, _, argv in OURS if argv and argv[0] in SUBCOMMANDS}
    assert len(OURS) > 100 and {"synth", "plan", "verify", "manifest", "export"} <= subcommands
    assert any(torchrun for _, torchrun, _ in OURS) and len(HF) >= 3


@pytest.mark.usefixtures("parse_only")
def test_every_tpload_command_parses(capsys: pytest.CaptureFixture) -> None:
    from torch.distributed.run import get_args_parser

    launcher = get_args_parser()
    launcher.exit_on_error = False
    bad = []
    for where, torchrun, argv in OURS:
        if torchrun:
            try:
                launcher.parse_args(torchrun)
            except (argparse.ArgumentError, SystemExit) as e:
                bad.append(f"{where}: torchrun {shlex.join(torchrun)}: {e}")
        problem = parse_problem(argv, capsys)
        if problem:
            bad.append(f"{where}: tpload {shlex.join(argv)}: {problem}")
    assert bad == []


def test_a_bad_flag_in_a_page_would_be_found(
    parse_only: None, capsys: pytest.CaptureFixture
) -> None:
    assert parse_problem(["plan", "--write", "--wrtie"], capsys) is not None  # after a fill-in
    assert "did you mean --tp?" in parse_problem(["DIR", "--tpp", "2"], capsys)
    assert parse_problem(["plan", "DIR", "--tp", "T", "--kind", "K"], capsys) is None
    assert "invalid choice: 'expand'" in parse_problem(["DIR", "--kind", "expand"], capsys)


def hf_problem(words: list[str]) -> str | None:
    """Why huggingface_hub as installed refuses the command ``words``: a program it does not ship
    (``huggingface-cli`` went in 2.x), or what its ``hf`` app (click; parsed, not run) refuses: an
    unknown subcommand or flag, or a glob given where a file name goes."""
    from importlib.metadata import distribution

    import click
    from huggingface_hub.cli.hf import app

    hub = distribution("huggingface_hub")
    if words[0] not in {e.name for e in hub.entry_points if e.group == "console_scripts"}:
        return f"huggingface_hub {hub.version} ships no {words[0]} command"
    ctx = click.Context(app, info_name="hf")
    command, words = app, words[1:]
    while isinstance(command, click.Group):
        if not words or words[0].startswith("-"):
            return "no subcommand"
        name, words = words[0], words[1:]
        found = command.get_command(ctx, name)
        if found is None:
            return f"no subcommand {name!r} (the installed hf has {command.list_commands(ctx)})"
        command = getattr(found, "materialize", lambda f=found: f)()  # hf imports them lazily
    try:
        parsed = command.make_context(command.name or "hf", words, parent=ctx)
    except click.MissingParameter:
        return None  # a partial mention (`hf download --local-dir`): its flags parsed
    except click.ClickException as e:
        return e.format_message()
    globs = [f for f in parsed.params.get("filenames") or () if any(c in f for c in "*?[")]
    return f"{globs} taken as file names (each --include takes one pattern)" if globs else None


def test_every_hf_command_parses_with_the_installed_hf() -> None:
    pytest.importorskip("click")
    bad = [
        f"{where}: {shlex.join(words)}: {why}" for where, words in HF if (why := hf_problem(words))
    ]
    assert bad == []
    # what would have been found: the removed command, a flag hf does not have, two patterns
    # after one --include (the second is then a file name)
    assert "ships no huggingface-cli" in hf_problem(["huggingface-cli", "download", "o/m"])
    assert "--local-dri" in hf_problem(["hf", "download", "o/m", "--local-dri", "DIR"])
    assert "taken as file names" in hf_problem(
        ["hf", "download", "o/m", "--include", "*.json", "*.py"]
    )
