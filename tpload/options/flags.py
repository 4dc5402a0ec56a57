"""The command-line face of :class:`~tpload.options.load_options.LoadOptions`: the flags generated
from its fields, parsed flags back into options, and README's table of them."""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from typing import Any

from ..model.errors import OptionsError
from ..model.values import SIGNER_FIELDS
from .load_options import Check, Hint, LoadOptions, field_types, listing, validate


def choice_words(choices: Iterable[object]) -> list[object]:
    """A flag's choices as the words typed: a StrEnum member is its value (argparse lists choices
    by ``repr``, which for a member is ``<Kind.PACKED: 'packed'>``)."""
    return [c.value if isinstance(c, Enum) else c for c in choices]


def closest(word: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` closest to a mistyped ``word``, if any is close (difflib: the Python
    tpload runs on has no suggestions in argparse)."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` for :func:`closest`, or nothing."""
    guess = closest(word, known)
    return f"; did you mean {guess}?" if guess else ""


HELP_COLUMNS = 100
"""The widest ``--help`` line: the terminal's width, at most this (the style's line length)."""


class Formatter(argparse.HelpFormatter):
    """``--help`` at most :data:`HELP_COLUMNS` wide (argparse fills the whole terminal), each flag's
    text in one column beside it."""

    def __init__(self, prog: str) -> None:
        width = min(shutil.get_terminal_size((HELP_COLUMNS, 24)).columns, HELP_COLUMNS)
        super().__init__(prog, max_help_position=30, width=width)


GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("what to load", ("checkpoint", "config", "kind", "skip", "defer", "skip_activation_scales")),
    ("layout and devices", ("tp", "ep", "replicas", "device", "allow_shared_device")),
    ("verification", ("verify", "manifest_sha256", "digest_store", "hash_threads", "samples")),
    ("signatures (a signed folder's model.sig)", SIGNER_FIELDS),
    ("outputs", ("report", "attest", "attest_key", "progress")),
    ("memory and time", ("reserve_gib", "evict_page_cache", "timeout_s")),
)
"""The load's ``--help`` in groups: every command-line option is in one (a test holds this)."""


class Parser(argparse.ArgumentParser):
    """Every subcommand's parser: a bad flag ends in one line (``tpload: error: ...``, exit 2), like
    every other error, instead of the usage block and a second line, with the closest flag or choice
    to a mistyped one (the command line's parsers also say it once under torchrun:
    ``tpload.cli.parsers``)."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: typing.Any, **kwargs: typing.Any) -> argparse.Action:
        if kwargs.get("choices") is not None:
            kwargs["choices"] = choice_words(kwargs["choices"])
        return super().add_argument(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value: object) -> None:
        # argparse's own check, worded with the choices as typed and the closest one
        if action.choices is not None and value not in action.choices:
            words = [str(c) for c in action.choices]
            if isinstance(action, argparse._SubParsersAction):  # `attest v3`: name the actions
                raise argparse.ArgumentError(
                    None,
                    f"{self.prog} {value}: no such action; the actions: {', '.join(words)}"
                    + did_you_mean(str(value), words),
                )
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r} (choose from {', '.join(words)})"
                + did_you_mean(str(value), words),
            )

    # argparse's overloads (a namespace given or not) in one signature: this parser returns its own
    def parse_known_args(  # type: ignore[override]  # the overloads in one (above)
        self, args: typing.Sequence[str] | None = None, namespace: typing.Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # An unknown flag first: argparse would otherwise say only that a required one is missing
        # (`plan DIR --tpp 2`: "--tp is required", not "did you mean --tp?")
        argv = sys.argv[1:] if args is None else list(args)
        unknown = self._unknown_flags(argv)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_known_args(argv, namespace)

    def _unknown_flags(self, argv: list[str]) -> list[str]:
        """The flags in ``argv`` this parser does not know (nor abbreviates), each with the word
        after it (its value, as argparse lists them), up to ``--`` or a subcommand (whose own parser
        checks the rest)."""
        actions = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        subcommands = {str(c) for a in actions for c in (a.choices or ())}
        known = self._option_string_actions
        unknown: list[str] = []
        for k, token in enumerate(argv):
            if token == "--" or token in subcommands:
                break
            flag = token.split("=", 1)[0]
            if (
                not token.startswith("-")
                or token == "-"
                or self._negative_number_matcher.match(token)
                or flag in known
                or (len(flag) > 2 and any(o.startswith(flag) for o in known))  # an abbreviation
            ):
                continue
            after = argv[k + 1] if k + 1 < len(argv) and "=" not in token else "-"
            unknown.append(token if after.startswith("-") else f"{token} {after}")  # its value
        return unknown

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, self.error_line(message) + "\n")

    def error_line(self, message: str) -> str:
        """argparse's ``message`` as tpload says it, with the closest flag to an unknown one."""
        unknown = re.fullmatch(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [a.split("=", 1)[0] for a in unknown.group(1).split() if a.startswith("-")]
            guesses = [(a, closest(a, self._option_string_actions)) for a in flags]
            guesses = [(a, g) for a, g in guesses if g]
            if len(flags) == 1 and guesses:
                message += f"; did you mean {guesses[0][1]}?"
            else:
                message += "".join(f"; {a}: did you mean {g}?" for a, g in guesses)
        return f"tpload: error: {message} (usage: {self.prog} --help)"


@dataclass(frozen=True)
class CliFlag:
    """A flag of the load's command line that is no load option (README's table lists it too)."""

    flag: str
    metavar: str | None
    default: str
    help: str


CLI_ONLY = (
    CliFlag(
        "--log-level",
        "LEVEL",
        "INFO",
        "tpload's logging level; other libraries' loggers stay at WARNING unless named: "
        "--log-level DEBUG,numba=DEBUG",
    ),
    CliFlag("--version", None, "-", "print tpload's version and exit"),
)
"""The command line's own flags beside the options: one table for the parser and README."""


def add_cli_only(parser: argparse._ActionsContainer, version: str) -> None:
    """The load command's :data:`CLI_ONLY` flags."""
    log_level, version_flag = CLI_ONLY
    parser.add_argument(
        log_level.flag,
        default=log_level.default,
        metavar=log_level.metavar,
        help=f"{log_level.help} (default {log_level.default})",
    )
    parser.add_argument(
        version_flag.flag, action="version", version=f"tpload {version}", help=version_flag.help
    )


def check_flags(ns: argparse.Namespace, *, checkpoint: str | None = None) -> None:
    """The load's path checks for the options a subcommand takes from :func:`add_flags` (``plan
    --write --digest-store``...), before it reads anything; OptionsError listing every problem.
    ``checkpoint``: the folder the subcommand reads (a digest store inside it is refused)."""
    values = {f.name: getattr(ns, f.name) for f in fields(LoadOptions) if hasattr(ns, f.name)}
    if checkpoint:
        values["checkpoint"] = checkpoint
    problems = validate(values, style="cli")
    if problems:
        raise OptionsError(listing(problems))


def add_flags(
    parser: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None, grouped: bool = False
) -> None:
    """Add a flag for every command-line option (or those named in ``only``), from the fields;
    ``grouped``: in :data:`GROUPS`' argument groups (the load's ``--help``)."""
    hints = field_types()
    groups: dict[str, argparse._ActionsContainer] = {}
    for title, names in GROUPS if grouped else ():
        group = parser.add_argument_group(title)
        groups.update(dict.fromkeys(names, group))
    for f in fields(LoadOptions):
        meta = f.metadata
        if not meta["cli"] or (only is not None and f.name not in only):
            continue
        into = groups.get(f.name, parser)
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kw: dict[str, Any] = {"dest": f.name, "help": meta["help"]}  # add_argument's, by action
        base = hints[f.name]
        if base is bool:
            kw["action"] = "store_false" if f.default else "store_true"
        elif f.default == () and f.default is not MISSING:
            kw.update(action="append", metavar=meta["metavar"])
        else:
            kw.update(
                metavar=meta["metavar"] or f.name.upper(),
                type=meta["bound"] or _checked(meta["check"]) or _cli_type(base),
            )
            if meta["choices"]:
                kw.update(choices=choice_words(meta["choices"]), metavar=None)
        kw["default"] = argparse.SUPPRESS  # unset flags keep the dataclass default
        into.add_argument(flag, **kw)


def _checked(check: Check | None) -> Callable[[str], str] | None:
    """A string flag's own rule (``--manifest-sha256``: 64 hex digits) as the parser's type, so a
    malformed value is a parser refusal (exit 2, README's exit codes), as a number out of
    range is."""
    if check is None:
        return None

    def parse(text: str) -> str:
        why = check(text)
        if why:
            raise argparse.ArgumentTypeError(why)
        return text

    return parse


def _cli_type(hint: Hint) -> Callable[[str], str]:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if args[0] in (int, float):  # every number has its kind's rule, or none is checked anywhere
        raise TypeError(f"a numeric option without a bound= ({hint})")
    return str


def from_args(ns: argparse.Namespace, *, extra: Mapping[str, object] | None = None) -> LoadOptions:
    """The options the parsed flags (plus ``extra``) ask for."""
    values = {f.name: getattr(ns, f.name) for f in fields(LoadOptions) if hasattr(ns, f.name)}
    values.update(extra or {})
    for glob_field in ("skip", "defer"):
        if glob_field in values and isinstance(values[glob_field], list):
            values[glob_field] = tuple(values[glob_field])
    return LoadOptions.from_values(values, style="cli")


def flags_markdown() -> str:
    """README's table of the load's flags, generated from the fields (a test keeps README in
    step)."""
    hints = field_types()
    rows = ["| flag | `load()` keyword | default | meaning |", "|---|---|---|---|"]
    for f in fields(LoadOptions):
        meta = f.metadata
        if not meta["cli"]:
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        if hints[f.name] is not bool:
            flag += " " + (
                "|".join(meta["choices"]) if meta["choices"] else meta["metavar"] or f.name.upper()
            )
        default = "-" if f.default in (None, ()) else str(f.default)
        cells = [f"`{flag}`", f"`{f.name}`", default, meta["help"]]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    for extra in CLI_ONLY:  # the command line's own: no load() keyword
        flag = f"{extra.flag} {extra.metavar}" if extra.metavar else extra.flag
        cells = [f"`{flag}`", "-", extra.default, extra.help]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
