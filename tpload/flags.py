"""The command-line face of :class:`~tpload.options.LoadOptions`: the flags generated from its
fields, parsed flags back into options, and README's table of them."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields

from .errors import OptionsError
from .options import LoadOptions, field_types, listing, validate


class Parser(argparse.ArgumentParser):
    """Every subcommand's parser: a bad flag ends in one line (``tpload: error: ...``, exit 2), like
    every other error, instead of the usage block and a second line."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"tpload: error: {message} (usage: {self.prog} --help)\n")


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


def add_flags(parser: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None) -> None:
    """Add a flag for every command-line option (or those named in ``only``), from the fields."""
    hints = field_types()
    for f in fields(LoadOptions):
        meta = f.metadata
        if not meta["cli"] or (only is not None and f.name not in only):
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kw: dict[str, object] = {"dest": f.name, "help": meta["help"]}
        base = hints[f.name]
        if base is bool:
            kw["action"] = "store_false" if f.default else "store_true"
        elif f.default == () and f.default is not MISSING:
            kw.update(action="append", metavar=meta["metavar"])
        else:
            kw.update(
                metavar=meta["metavar"] or f.name.upper(), type=meta["bound"] or _cli_type(base)
            )
            if meta["choices"]:
                kw.update(choices=meta["choices"], metavar=None)
        kw["default"] = argparse.SUPPRESS  # unset flags keep the dataclass default
        parser.add_argument(flag, **kw)


def _cli_type(hint: object) -> Callable[[str], object]:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if args[0] in (int, float):  # every number has its kind's rule, or none is checked anywhere
        raise TypeError(f"a numeric option without a bound= ({hint})")
    return str


def from_args(ns: argparse.Namespace, *, extra: Mapping[str, object] = ()) -> LoadOptions:
    """The options the parsed flags (plus ``extra``) ask for."""
    values = {f.name: getattr(ns, f.name) for f in fields(LoadOptions) if hasattr(ns, f.name)}
    values.update(extra)
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
    return "\n".join(rows)
