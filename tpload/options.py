"""Everything a load is asked to do: one dataclass that drives ``load()`` and the command line.

Each field carries its default, its one-line help and its check (:func:`opt`);
:func:`add_flags` generates the command-line flags from the fields and
:meth:`LoadOptions.from_values` builds and validates an instance from
``load()``'s keywords or parsed flags. Every string option is validated here,
once, and every problem is reported at once, named the way the caller spelled
it (``timeout_s=`` for ``load()``, ``--timeout`` on the command line).
"""

from __future__ import annotations

import argparse
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from .errors import OptionsError

KINDS = ("packed", "expanded")
VERIFY_MODES = ("node", "rank", "digest", "off")
DEFAULT_CONFIG = "auto"
REFERENCE_CONFIG = "deepseek-v4-mtp"  # the layout of docs/format.md, for checkpoints without a config.json
MAX_WORLD = 1 << 16  # no layout has more ranks than this; bigger numbers are typos, not plans

Check = Callable[[object], str | None]


def opt(default: object, help: str, *, flag: str | None = None, choices: tuple[str, ...] = (),
        metavar: str | None = None, check: Check | None = None, cli: bool = True) -> object:
    """A :class:`LoadOptions` field: its default, its help, and how it appears on the command line.

    ``flag``: the command-line spelling (default ``--field-name``); ``check``: returns a problem
    ("must be >= 1") or None; ``cli``: False for options only ``load()`` takes.
    """
    meta = {"help": help, "flag": flag, "choices": choices, "metavar": metavar, "check": check, "cli": cli}
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults: use a tuple")
    return field(default=default, metadata=meta)


def _at_least(low: float, *, finite: bool = True) -> Check:
    def check(v: object) -> str | None:
        if finite and not math.isfinite(v):  # type: ignore[arg-type]
            return f"must be a finite number >= {low:g}, got {v}"
        return None if v >= low else f"must be >= {low:g}, got {v}"  # type: ignore[operator]
    return check


def _positive_finite(v: object) -> str | None:
    return None if math.isfinite(v) and v > 0 else f"must be a finite number > 0, got {v}"  # type: ignore[arg-type]


def _ranks(v: object) -> str | None:
    if v is None:
        return None
    return None if 1 <= v <= MAX_WORLD else f"must be between 1 and {MAX_WORLD}, got {v}"  # type: ignore[operator]


def _sha256_hex(v: object) -> str | None:
    if v is None:
        return None
    s = str(v)
    return None if len(s) == 64 and all(c in "0123456789abcdef" for c in s.lower()) else \
        f"must be 64 hex digits (a sha256), got {s[:80]!r}"


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """What one load does. ``load(DIR, tp=2, ...)`` and ``python -m tpload DIR --tp 2 ...`` both build one."""

    checkpoint: str | None = opt(None, "checkpoint directory (default: a built-in small synthetic one, written once "
                                 "under ~/.cache/tpload)", metavar="DIR")
    config: str = opt(DEFAULT_CONFIG, "auto (from the checkpoint's config.json), a shipped config or ARCH+FAMILY, or a "
                      "TOML path", metavar="NAME|PATH")
    kind: str = opt("packed", "packed: stored bytes (FP4/FP8 weights and their scales); expanded: bf16 decodes",
                    choices=KINDS)
    tp: int | None = opt(None, "tensor-parallel degree (default: the group size / ep)", check=_ranks)
    ep: int = opt(1, "expert-parallel degree; tp x ep must equal the group size", check=_ranks)
    verify: str = opt("node", "node: each tensor hashed once per node; rank: by every rank that reads it; digest: "
                      "no hashing, every served byte checked against digests `tpload plan --write` stored after "
                      "hashing; off: nothing checked against the manifest (loudly marked)", choices=VERIFY_MODES)
    device: str | None = opt(None, "target device (default: cuda:LOCAL_RANK, or cpu without CUDA)")
    allow_shared_device: bool = opt(False, "let several ranks load onto one GPU (functional checks with gloo; NCCL "
                                    "refuses it)")
    hash_threads: int = opt(2, "hash worker threads per rank (sha256, or blake3 with a sidecar)", check=_at_least(1), metavar="N")
    samples: int = opt(4, "expanded: decoded tensors per codec whose first and last rows are decoded again by an "
                       "independent implementation and compared exactly",
                       check=_at_least(0), metavar="N")
    progress: bool = opt(True, "rank-0 progress (a bar on a terminal, a line every 2 s otherwise)",
                         flag="--no-progress")
    timeout_s: float = opt(600.0, "seconds any wait may take (the exchange, a peer, a store) before every rank "
                           "fails", flag="--timeout", check=_positive_finite, metavar="S")
    skip: tuple[str, ...] = opt((), "never read nor hash tensors matching GLOB (repeatable), e.g. 'mtp.*'",
                                metavar="GLOB")
    defer: tuple[str, ...] = opt((), "do not upload tensors matching GLOB; load() returns their locators "
                                 "(repeatable)", metavar="GLOB")
    evict_page_cache: bool = opt(False, "drop each shard's page cache once this rank is done with it "
                                 "(unified-memory GPUs)")
    reserve_gib: float = opt(0.0, "device memory (GiB) the pre-flight keeps free for after the load",
                             check=_at_least(0), metavar="G")
    report: str | None = opt(None, "rank 0 writes the JSON report here (its folder must exist)", metavar="FILE")
    digest_store: str | None = opt(None, "folder of trusted digests (default $XDG_STATE_HOME/tpload, else "
                                   "~/.local/state/tpload); owned by this user, not by the checkpoint's writer",
                                   metavar="DIR")
    manifest_sha256: str | None = opt(None, "refuse the load unless NATIVE_MANIFEST.json has this sha256 (pins "
                                      "the trust anchor)", check=_sha256_hex, metavar="HEX")
    attest: str | None = opt(None, "after a verified load rank 0 writes an in-toto statement here: what every rank "
                             "serves, its windows and digest (check it with `tpload attest verify`; "
                             "docs/attestation.md)", metavar="FILE")
    attest_key: str | None = opt(None, "sign the --attest statement with this EC private key, as model-signing signs "
                                 "a model (FILE.sig beside it; needs tpload[signing])", metavar="PEM")

    def __post_init__(self) -> None:
        problems = validate({f.name: getattr(self, f.name) for f in fields(self)}, style="api")
        if problems:
            raise OptionsError(_listing(problems))

    @classmethod
    def from_values(cls, values: Mapping[str, object], *, style: str = "api") -> LoadOptions:
        """Build from ``load()`` keywords (``style="api"``) or parsed flags (``"cli"``): unknown
        names, wrong types and bad values are all reported in one OptionsError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        coerced, problems = {}, []
        if unknown:
            problems.append(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(sorted(known))})")
        for name, value in values.items():
            if name in known:
                try:
                    coerced[name] = _coerce(name, value)
                except TypeError as e:
                    problems.append(f"{_spell(name, style)}: {e}")
        problems += validate(coerced, style=style)
        if problems:
            raise OptionsError(_listing(problems))
        return cls(**coerced)


def _listing(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid option: {problems[0]}"
    return f"{len(problems)} invalid options:\n  - " + "\n  - ".join(problems)


def _field_types() -> dict[str, object]:
    return typing.get_type_hints(LoadOptions)


def _coerce(name: str, value: object) -> object:
    """``value`` as the field's type, accepting the obvious spellings (a Path for a str, one glob
    for a tuple of globs); TypeError saying what was expected otherwise."""
    want = _field_types()[name]
    optional = isinstance(want, types.UnionType) and type(None) in typing.get_args(want)
    base = next((a for a in typing.get_args(want) if a is not type(None)), want) if optional else want
    if value is None and optional:
        return None
    if base is str:
        if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
            return os.fspath(value) if isinstance(value, os.PathLike) else value
        raise TypeError(f"expected a string, got {type(value).__name__} {value!r}")
    if base is bool:
        if isinstance(value, bool):
            return value
        raise TypeError(f"expected True or False, got {type(value).__name__} {value!r}")
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(f"expected an integer, got {type(value).__name__} {value!r}")
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    if typing.get_origin(base) is tuple:  # globs: one string is one glob, never its characters
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise TypeError(f"expected a glob or a list of globs, got {type(value).__name__} {value!r}")
    raise TypeError(f"unsupported option type {base}")  # pragma: no cover - a field added without a rule


def _spell(name: str, style: str) -> str:
    if style != "cli":
        return f"{name}="
    f = next(f for f in fields(LoadOptions) if f.name == name)
    return f.metadata["flag"] or "--" + name.replace("_", "-")


def validate(values: Mapping[str, object], *, style: str) -> list[str]:
    """Every problem with these (already typed) values, each naming the option as ``style`` spells it."""
    problems = []
    for f in fields(LoadOptions):
        if f.name not in values:
            continue
        v, meta = values[f.name], f.metadata
        if meta["choices"] and v not in meta["choices"]:
            problems.append(f"{_spell(f.name, style)} {v!r} is not one of {', '.join(meta['choices'])}")
        elif meta["check"] is not None and v is not None and (why := meta["check"](v)):
            problems.append(f"{_spell(f.name, style)} {why}")
    report = values.get("report")
    if report:
        folder = Path(str(report)).absolute().parent
        if not folder.is_dir():
            problems.append(f"{_spell('report', style)} {report}: folder {folder} does not exist (checked before "
                            "loading, so the report cannot fail after the load)")
    return problems + _attest_problems(values, style)


def _attest_problems(values: Mapping[str, object], style: str) -> list[str]:
    """``attest``/``attest_key``: checked before loading, so nothing fails after the verdict but a write."""
    attest, key = values.get("attest"), values.get("attest_key")
    problems = []
    if attest and values.get("verify") == "off":
        problems.append(f"{_spell('attest', style)} {attest}: nothing to attest with {_spell('verify', style)} off "
                        "(no byte was checked)")
    if attest and not Path(str(attest)).absolute().parent.is_dir():
        problems.append(f"{_spell('attest', style)} {attest}: folder {Path(str(attest)).absolute().parent} does "
                        "not exist")
    if key and not attest:
        problems.append(f"{_spell('attest_key', style)} signs the attestation: give {_spell('attest', style)} too")
    if key and not Path(str(key)).is_file():
        problems.append(f"{_spell('attest_key', style)} {key}: no such file (an EC private key in PEM)")
    elif key:
        from .verification.attest import key_problem
        if (why := key_problem(str(key))):
            problems.append(f"{_spell('attest_key', style)}: {why}")
    return problems


# -- the command line ------------------------------------------------------------------------------

def add_flags(parser: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None) -> None:
    """Add a flag for every command-line option (or those named in ``only``), from the fields."""
    hints = _field_types()
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
            kw.update(metavar=meta["metavar"] or f.name.upper(), type=_cli_type(base))
            if meta["choices"]:
                kw.update(choices=meta["choices"], metavar=None)
        kw["default"] = argparse.SUPPRESS  # unset flags keep the dataclass default
        parser.add_argument(flag, **kw)


def _cli_type(hint: object) -> Callable[[str], object]:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    if base is int:
        return _cli_number(int, "an integer")
    if base is float:
        return _cli_number(float, "a number")
    return str


def _cli_number(kind: type, what: str) -> Callable[[str], object]:
    def parse(text: str) -> object:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    parse.__name__ = what
    return parse


def from_args(ns: argparse.Namespace, *, extra: Mapping[str, object] = ()) -> LoadOptions:
    """The options the parsed flags (plus ``extra``) ask for."""
    values = {f.name: getattr(ns, f.name) for f in fields(LoadOptions) if hasattr(ns, f.name)}
    values.update(extra)
    for glob_field in ("skip", "defer"):
        if glob_field in values and isinstance(values[glob_field], list):
            values[glob_field] = tuple(values[glob_field])
    return LoadOptions.from_values(values, style="cli")


def flags_markdown() -> str:
    """README's table of the load's flags, generated from the fields (a test keeps README in step)."""
    hints = _field_types()
    rows = ["| flag | `load()` keyword | default | meaning |", "|---|---|---|---|"]
    for f in fields(LoadOptions):
        meta = f.metadata
        if not meta["cli"]:
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        if hints[f.name] is not bool:
            flag += " " + ("|".join(meta["choices"]) if meta["choices"] else meta["metavar"] or f.name.upper())
        default = "-" if f.default in (None, ()) else str(f.default)
        cells = [f"`{flag}`", f"`{f.name}`", default, meta["help"]]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def with_option_signature(fn: Callable, returns: type) -> None:
    """Give ``fn`` (``load``) the keyword signature of :class:`LoadOptions`, so help() and IDEs show
    every option beside its own parameters."""
    import inspect
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
               for f in fields(LoadOptions) if f.name != "checkpoint"]
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)
