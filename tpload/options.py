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
import functools
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from pathlib import Path

from .errors import OptionsError
from .modes import Kind, Verify

KINDS = tuple(Kind)
VERIFY_MODES = tuple(Verify)
DEFAULT_CONFIG = "auto"
REFERENCE_CONFIG = (
    "deepseek-v4-mtp"  # the layout of docs/format.md, for checkpoints without a config.json
)
MAX_WORLD = 1 << 16  # no layout has more ranks than this; bigger numbers are typos, not plans

Check = Callable[[object], str | None]


def opt(
    default: object,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    bound: Bound | None = None,
    check: Check | None = None,
    cli: bool = True,
) -> object:
    """A :class:`LoadOptions` field: its default, its help, and how it appears on the command line.

    ``flag``: the command-line spelling (default ``--field-name``); ``bound``: the kind of number it
    is (its range, checked as the flag is parsed and as ``load()`` is called); ``check``: any other
    rule, returning a problem ("must be 64 hex digits") or None; ``cli``: False for options only
    ``load()`` takes.
    """
    meta = {
        "help": help,
        "flag": flag,
        "choices": choices,
        "metavar": metavar,
        "bound": bound,
        "check": check,
        "cli": cli,
    }
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults: use a tuple")
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Bound:
    """One kind of number an option holds, and its one rule: the type and the range, checked where
    the number is parsed (a flag of any subcommand: ``type=SECONDS``) and where it is given
    (``load()``'s keywords, :func:`validate`). The limits are far beyond any real use and small
    enough that what consumes the number (a ``timedelta``, a socket timeout, a thread pool built up
    front, a seed) takes it."""

    kind: type
    """int or float."""
    low: float
    high: float
    above: bool = False
    """True: ``low`` itself is refused (a number > low)."""
    note: str = ""
    """Why the upper limit, said with the problem."""

    def problem(self, v: object) -> str | None:
        """Why ``v`` is out of this kind's range, or None."""
        if self.kind is float and not math.isfinite(v):  # type: ignore[arg-type]
            return f"must be a finite number {self._range()}, got {v}"
        ok = (v > self.low if self.above else v >= self.low) and v <= self.high  # type: ignore[operator]
        return None if ok else f"must be {self._range()}, got {v}"

    def _range(self) -> str:
        low = f"> {_num(self.low)} and at most" if self.above else f"between {_num(self.low)} and"
        return f"{low} {_num(self.high)}{self.note}"

    def __call__(self, text: str) -> int | float:
        """argparse's ``type``: the number, or an ArgumentTypeError saying what was expected."""
        try:
            v = self.kind(text)
        except ValueError:
            what = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if why := self.problem(v):
            raise argparse.ArgumentTypeError(why)
        return v


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


SECONDS = Bound(float, 0, 7 * 86400, above=True, note=" (7 days)")
"""Timeouts: a wait longer than a week is a typo, and 1e300 s overflows timedelta and socket
timeouts."""
GIB = Bound(float, 0, 1 << 20, note=" (a PiB)")
"""Memory sizes in GiB."""
THREADS = Bound(int, 0, 1024)
"""Threads per process (0: the work runs on the calling thread); pools are built up front."""
RANKS = Bound(int, 1, MAX_WORLD)
"""Ranks: tp, ep, processes per node, processes."""
SEED = Bound(int, 0, 2**32 - 1)
"""Random seeds (numpy takes non-negative 32-bit words)."""
COUNT = Bound(int, 0, 1 << 24)
"""How many of something (samples, rounds, tensors, synthetic dimensions)."""


def _sha256_hex(v: object) -> str | None:
    if v is None:
        return None
    s = str(v)
    return (
        None
        if len(s) == 64 and all(c in "0123456789abcdef" for c in s.lower())
        else f"must be 64 hex digits (a sha256), got {s[:80]!r}"
    )


def _replica_group_problem(v: object) -> str | None:
    """Groups of one size, no rank in two (the world's checks come with the layout: replicas.py)."""
    sizes = [len(g) for g in v]  # type: ignore[attr-defined]
    if not sizes or not all(sizes):
        return f"must hold one non-empty list of ranks per position, got {len(sizes)} group(s)"
    if len(set(sizes)) > 1:
        return (
            f"groups of unequal size ({', '.join(map(str, sizes))}): each holds one rank per "
            "replica, so every group has the same size"
        )
    seen: dict[int, int] = {}
    for k, group in enumerate(v):  # type: ignore[arg-type]
        for r in group:
            if r < 0:
                return f"rank {r} in group {k} is negative"
            if r in seen:
                where = f"groups {seen[r]} and {k}" if seen[r] != k else f"group {k} twice"
                return (
                    f"overlapping groups: rank {r} is in {where} ({len(sizes)} groups of "
                    f"{sizes[0]}); a rank holds one position of one replica"
                )
            seen[r] = k
    return None


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """What one load does. ``load(DIR, tp=2, ...)`` and ``python -m tpload DIR --tp 2 ...`` both
    build one."""

    checkpoint: str | None = opt(
        None,
        "checkpoint directory (default: a built-in small synthetic one, written once "
        "under ~/.cache/tpload)",
        metavar="DIR",
    )
    config: str = opt(
        DEFAULT_CONFIG,
        "auto (from the checkpoint's config.json), a shipped config or ARCH+FAMILY, or a TOML path",
        metavar="NAME|PATH",
    )
    kind: Kind = opt(
        Kind.PACKED,
        "packed: stored bytes (FP4/FP8 weights and their scales); expanded: bf16 decodes",
        choices=KINDS,
    )
    tp: int | None = opt(None, "tensor-parallel degree (default: the group size / ep)", bound=RANKS)
    ep: int = opt(1, "expert-parallel degree; tp x ep must equal the group size", bound=RANKS)
    replicas: int = opt(
        1,
        "replicas of the tp x ep plan in the group (world = R x tp x ep): each window is read "
        "from storage by one replica and sent to the others, checked on receipt",
        bound=RANKS,
        metavar="R",
    )
    replica_group: tuple[tuple[int, ...], ...] | None = opt(
        None,
        "replicas placed by the caller (an engine's data-parallel groups): one list per position "
        "of the tp x ep plan, in position order, each the group ranks holding that position, "
        "one per replica; instead of replicas",
        check=_replica_group_problem,
        cli=False,
    )
    verify: Verify = opt(
        Verify.NODE,
        "node: each tensor hashed once per node; rank: by every rank that reads it; digest: "
        "no hashing, every served byte checked against digests `tpload plan --write` stored after "
        "hashing; off: nothing checked against the manifest (loudly marked)",
        choices=VERIFY_MODES,
    )
    device: str | None = opt(None, "target device (default: cuda:LOCAL_RANK, or cpu without CUDA)")
    allow_shared_device: bool = opt(
        False, "let several ranks load onto one GPU (functional checks with gloo; NCCL refuses it)"
    )
    hash_threads: int = opt(
        2,
        "hash worker threads per rank (sha256, or blake3 with a sidecar)",
        bound=THREADS,
        metavar="N",
    )
    samples: int = opt(
        4,
        "expanded: decoded tensors per codec whose first and last rows are decoded again by an "
        "independent implementation and compared exactly",
        bound=COUNT,
        metavar="N",
    )
    progress: bool = opt(
        True,
        "turn off rank 0's progress (on by default: a bar on a terminal, a line every "
        "2 s otherwise)",
        flag="--no-progress",
    )
    timeout_s: float = opt(
        600.0,
        "seconds any wait may take (the exchange, a peer, a store) before every rank fails",
        flag="--timeout",
        bound=SECONDS,
        metavar="S",
    )
    skip: tuple[str, ...] = opt(
        (), "never read nor hash tensors matching GLOB (repeatable), e.g. 'mtp.*'", metavar="GLOB"
    )
    defer: tuple[str, ...] = opt(
        (),
        "do not upload tensors matching GLOB; load() returns their locators (repeatable)",
        metavar="GLOB",
    )
    skip_activation_scales: bool = opt(
        False,
        "skip the single-value *.input_scale tensors (ModelOpt NVFP4 W4A4 "
        "activation scales, unused by a W4A16 server): never read nor served",
    )
    evict_page_cache: bool = opt(
        False, "drop each shard's page cache once this rank is done with it (unified-memory GPUs)"
    )
    reserve_gib: float = opt(
        0.0,
        "device memory (GiB) the pre-flight keeps free for after the load",
        bound=GIB,
        metavar="G",
    )
    report: str | None = opt(
        None,
        "rank 0 writes the JSON report here (its folder must exist; never inside the checkpoint)",
        metavar="FILE",
    )
    digest_store: str | None = opt(
        None,
        "folder of trusted digests (default $XDG_STATE_HOME/tpload, else "
        "~/.local/state/tpload); owned by this user, not by the checkpoint's writer",
        metavar="DIR",
    )
    manifest_sha256: str | None = opt(
        None,
        "refuse the load unless NATIVE_MANIFEST.json has this sha256 (pins the trust anchor)",
        check=_sha256_hex,
        metavar="HEX",
    )
    signature: str | None = opt(
        None,
        "OpenSSF model-signing bundle to check before loading (default DIR/model.sig "
        "when present; `none` ignores it); needs a --signer-* option",
        metavar="PATH",
    )
    signer_key: str | None = opt(
        None, "the signer's public key (--signature signed with a key)", metavar="PEM"
    )
    signer_cert: str | None = opt(
        None, "the signing certificate the bundle must carry (with --signer-chain)", metavar="PEM"
    )
    signer_chain: str | None = opt(
        None,
        "certificates the signing certificate must chain to (signed with a certificate)",
        metavar="PEM",
    )
    signer_identity: str | None = opt(
        None,
        "sigstore identity that signed (with --signer-issuer; needs the network)",
        metavar="EMAIL|URI",
    )
    signer_issuer: str | None = opt(None, "OIDC issuer of --signer-identity", metavar="URL")
    attest: str | None = opt(
        None,
        "after a verified load rank 0 writes an in-toto statement here: what every rank "
        "serves, its windows and digest (check it with `tpload attest verify`; "
        "docs/attestation.md)",
        metavar="FILE",
    )
    attest_key: str | None = opt(
        None,
        "sign the --attest statement with this EC private key, as model-signing signs "
        "a model (FILE.sig beside it; needs the [signing] extra)",
        metavar="PEM",
    )

    def __post_init__(self) -> None:
        problems = validate({f.name: getattr(self, f.name) for f in fields(self)}, style="api")
        if problems:
            raise OptionsError(_listing(problems))
        object.__setattr__(
            self, "verify", Verify(self.verify)
        )  # the string given, as its named mode
        object.__setattr__(self, "kind", Kind(self.kind))

    @classmethod
    def for_load(cls, checkpoint: object, options: Mapping[str, object]) -> LoadOptions:
        """``load(checkpoint, **options)``'s options. The library needs a folder: only the command
        line writes and loads the built-in synthetic checkpoint."""
        if checkpoint is None:
            raise OptionsError(
                "checkpoint: load() needs a checkpoint folder (the built-in synthetic one is "
                "`python -m tpload`'s default, not the library's)"
            )
        return cls.from_values({**options, "checkpoint": checkpoint})

    @classmethod
    def from_values(cls, values: Mapping[str, object], *, style: str = "api") -> LoadOptions:
        """Build from ``load()`` keywords (``style="api"``) or parsed flags (``"cli"``): unknown
        names, wrong types and bad values are all reported in one OptionsError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        coerced, problems = {}, []
        if unknown:
            problems.append(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
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
    base = (
        next((a for a in typing.get_args(want) if a is not type(None)), want) if optional else want
    )
    if value is None and optional:
        return None
    if base is str or (
        isinstance(base, type) and issubclass(base, StrEnum)
    ):  # a mode: its string (checked later)
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
    if base == tuple[tuple[int, ...], ...]:  # replica_group: lists of ranks
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(g, (list, tuple))
            and all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in g)
            for g in value
        )
        if ok:  # numpy or torch integers too (an engine's rank lists)
            return tuple(tuple(int(r) for r in g) for g in value)
        raise TypeError(f"expected a list of lists of ranks, got {type(value).__name__} {value!r}")
    if typing.get_origin(base) is tuple:  # globs: one string is one glob, never its characters
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise TypeError(f"expected a glob or a list of globs, got {type(value).__name__} {value!r}")
    raise TypeError(
        f"unsupported option type {base}"
    )  # pragma: no cover - a field added without a rule


def _spell(name: str, style: str) -> str:
    if style != "cli":
        return f"{name}="
    f = next(f for f in fields(LoadOptions) if f.name == name)
    return f.metadata["flag"] or "--" + name.replace("_", "-")


def validate(values: Mapping[str, object], *, style: str) -> list[str]:
    """Every problem with these (already typed) values, each naming the option as ``style`` spells
    it."""
    problems = []
    for f in fields(LoadOptions):
        if f.name not in values:
            continue
        v, meta = values[f.name], f.metadata
        if meta["choices"] and v not in meta["choices"]:
            problems.append(
                f"{_spell(f.name, style)} {v!r} is not one of {', '.join(meta['choices'])}"
            )
        elif v is not None and (why := _field_problem(meta, v)):
            problems.append(f"{_spell(f.name, style)} {why}")
    # Paths, checked before any byte is read: a problem found after the load (or after all the
    # hashing) costs the whole load, and a report written into the checkpoint destroys it.
    problems += _signer_problems(values, style)
    report = values.get("report")
    if report:
        where = _spell("report", style)
        folder = Path(str(report)).absolute().parent
        if not folder.is_dir():
            problems.append(
                f"{where} {report}: folder {folder} does not exist (checked before "
                "loading, so the report cannot fail after the load)"
            )
        elif Path(str(report)).is_dir():
            problems.append(f"{where} {report} is a folder; name the file to write")
        elif values.get("checkpoint") and (
            why := report_in_checkpoint(str(report), str(values["checkpoint"]))
        ):
            problems.append(
                f"{where} {report} {why}; the report never writes into the checkpoint it loads: "
                "name a file outside it"
            )
    store = values.get("digest_store")
    if store and (why := not_a_folder(str(store))):
        problems.append(
            f"{_spell('digest_store', style)} {store}: {why} (the digest store is a folder, made "
            "if missing; give a folder, or leave the option out for the default)"
        )
    groups = values.get("replica_group")
    if groups and (values.get("replicas") or 1) != 1:
        problems.append(
            f"{_spell('replicas', style)} {values['replicas']} with "
            f"{_spell('replica_group', style)} ({len(groups)} groups of {len(groups[0])}): give "
            "one of them (the groups' size is the number of replicas)"
        )
    if ((values.get("replicas") or 1) > 1 or groups) and values.get("verify") == "rank":
        what = (
            f"{_spell('replica_group', style)} ({len(groups)} groups)"
            if groups
            else f"{_spell('replicas', style)} {values['replicas']}"
        )
        problems.append(
            f"{what} with {_spell('verify', style)} rank: a receiving rank never sees the whole "
            "stored tensor, so it cannot hash what it serves; use node (the reading rank hashes, "
            "receivers check its fingerprints)"
        )
    return problems + _attest_problems(values, style)


def _attest_problems(values: Mapping[str, object], style: str) -> list[str]:
    """``attest``/``attest_key``: checked before loading, so nothing fails after the verdict but a
    write."""
    attest, key = values.get("attest"), values.get("attest_key")
    problems = []
    if attest and values.get("verify") == "off":
        problems.append(
            f"{_spell('attest', style)} {attest}: nothing to attest with "
            f"{_spell('verify', style)} off (no byte was checked)"
        )
    if attest and not Path(str(attest)).absolute().parent.is_dir():
        problems.append(
            f"{_spell('attest', style)} {attest}: folder {Path(str(attest)).absolute().parent} "
            "does not exist"
        )
    elif (
        attest
        and values.get("checkpoint")
        and (why := report_in_checkpoint(str(attest), str(values["checkpoint"])))
    ):
        problems.append(
            f"{_spell('attest', style)} {attest} {why}; the attestation never writes into the "
            "checkpoint it vouches for: name a file outside it"
        )
    if key and not attest:
        problems.append(
            f"{_spell('attest_key', style)} signs the attestation: give {_spell('attest', style)} "
            "too"
        )
    if key and not Path(str(key)).is_file():
        problems.append(
            f"{_spell('attest_key', style)} {key}: no such file (an EC private key in PEM)"
        )
    elif key:
        from .verification.attest import key_problem

        if why := key_problem(str(key)):
            problems.append(f"{_spell('attest_key', style)}: {why}")
    return problems


def _field_problem(meta: Mapping[str, object], v: object) -> str | None:
    bound, check = meta["bound"], meta["check"]
    return (bound.problem(v) if bound is not None else None) or (
        check(v) if check is not None else None
    )  # type: ignore[union-attr,operator]


def report_in_checkpoint(report: str, checkpoint: str) -> str | None:
    """Why writing a report at ``report`` would write into the checkpoint folder ``checkpoint`` (a
    path inside it, spelled directly or through symlinks, or a file elsewhere that one of its
    entries is: a hub snapshot's blob, a hard link), or None."""
    ckpt = Path(checkpoint)
    if not ckpt.is_dir():
        return None  # no checkpoint there: the load says so
    try:
        folders = {Path(os.path.abspath(ckpt)), ckpt.resolve()}
        targets = {Path(os.path.abspath(report)), Path(report).resolve()}
    except (OSError, RuntimeError) as e:  # a symlink loop: refuse rather than guess where it points
        return f"cannot be resolved ({e})"
    for t in targets:
        for f in folders:
            if t.is_relative_to(f):
                return f"is inside the checkpoint {f}"
    try:
        st = os.stat(report)
    except OSError:
        return None  # a new file outside the folder
    with os.scandir(ckpt) as entries:
        for entry in entries:
            try:
                e = os.stat(entry.path)
            except OSError:
                continue
            if (e.st_dev, e.st_ino) == (st.st_dev, st.st_ino):
                return (
                    f"is the checkpoint's {entry.name} (the same file as "
                    f"{Path(checkpoint) / entry.name})"
                )
    return None


def not_a_folder(path: str) -> str | None:
    """Why ``path`` cannot be (or be made) a folder: it, or the nearest of its parents that exists,
    is not a folder; None if it can."""
    p = Path(os.path.abspath(path))
    for q in (p, *p.parents):
        if q.exists():
            return (
                None
                if q.is_dir()
                else (
                    f"{q} is not a folder"
                    if q == p
                    else f"{q} is a file, so the folder cannot be made"
                )
            )
        if q.is_symlink():
            return f"{q} is a broken symlink"
    return None


def _signer_problems(values: Mapping[str, object], style: str) -> list[str]:
    """One way to check a signature at a time, each complete (verification/signing.py uses it)."""
    given = {
        k
        for k in ("signer_key", "signer_cert", "signer_chain", "signer_identity", "signer_issuer")
        if values.get(k)
    }
    ways = [
        w
        for w, keys in (
            ("a key", {"signer_key"}),
            ("a certificate", {"signer_cert", "signer_chain"}),
            ("a sigstore identity", {"signer_identity", "signer_issuer"}),
        )
        if given & keys
    ]
    s = functools.partial(_spell, style=style)
    if len(ways) > 1:
        return [
            (
                f"{s('signer_key')}, {s('signer_chain')} and {s('signer_identity')} are three "
                f"ways to check a signature; give one (got {' and '.join(ways)})"
            )
        ]
    pairs = (
        ("signer_cert", "signer_chain"),
        ("signer_identity", "signer_issuer"),
        ("signer_issuer", "signer_identity"),
    )
    return [f"{s(a)} needs {s(b)}" for a, b in pairs if a in given and b not in given]


# -- the command line ------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """Every subcommand's parser: a bad flag ends in one line (``tpload: error: ...``, exit 2), like
    every other error, instead of the usage block and a second line."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"tpload: error: {message} (usage: {self.prog} --help)\n")


def check_flags(ns: argparse.Namespace) -> None:
    """The load's path checks for the options a subcommand takes from :func:`add_flags` (``plan
    --write --digest-store``...), before it reads anything; OptionsError listing every problem."""
    values = {f.name: getattr(ns, f.name) for f in fields(LoadOptions) if hasattr(ns, f.name)}
    problems = validate(values, style="cli")
    if problems:
        raise OptionsError(_listing(problems))


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
    hints = _field_types()
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


def with_option_signature(fn: Callable, returns: type) -> None:
    """Give ``fn`` (``load``) the keyword signature of :class:`LoadOptions`, so help() and IDEs show
    every option beside its own parameters."""
    import inspect

    params = [p for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
        for f in fields(LoadOptions)
        if f.name != "checkpoint"
    ]
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)
