"""Everything a load is asked to do: one dataclass that drives ``load()`` and the command line.

Each field carries its default, its one-line help and its check (:func:`opt`);
:mod:`tpload.options.flags` generates the command-line flags from the fields and
:meth:`LoadOptions.from_values` builds and validates an instance from
``load()``'s keywords or parsed flags. Every option is validated here (each field's own rule)
and in :mod:`tpload.options.rules` (the rules across options and on the paths they name), once,
and every problem is reported at once, named the way the caller spelled it (``timeout_s=`` for
``load()``, ``--timeout`` on the command line).
"""

from __future__ import annotations

import functools
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, Literal, TypedDict, TypeVar, cast

from ..model.bounds import COUNT, GIB, RANKS, SECONDS, THREADS, Bound
from ..model.errors import OptionsError
from ..model.modes import Kind, Verify
from ..selection.defaults import DEFAULT_CONFIG
from .rules import problems_across

__all__ = ["LoadKwargs", "LoadOptions", "field_types", "listing", "opt", "validate"]

KINDS = tuple(Kind)
VERIFY_MODES = tuple(Verify)

Value = str | int | float | bool | tuple[str, ...] | tuple[tuple[int, ...], ...] | None
"""An option's value as its field holds it (after :func:`_coerce`)."""
Hint = type | types.UnionType | types.GenericAlias
"""A field's type as :func:`field_types` gives (``str``, ``Kind | None``, ``tuple[str, ...]``)."""
Check = Callable[[Value], str | None]
_T = TypeVar("_T")


def opt(
    default: _T,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    bound: Bound | None = None,
    check: Check | None = None,
    cli: bool = True,
) -> _T:
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


def _sha256_hex(v: Value) -> str | None:
    if v is None:
        return None
    s = str(v)
    return (
        None
        if len(s) == 64 and all(c in "0123456789abcdef" for c in s.lower())
        else f"must be 64 hex digits (a sha256), got {s[:80]!r}"
    )


def _replica_group_problem(v: Value) -> str | None:
    """Groups of one size, no rank in two (the world's checks come with the layout:
    distributed/placement.py)."""
    groups = cast(Sequence[Sequence[int]], v)  # coerced first (_coerce): lists of ranks
    sizes = [len(g) for g in groups]
    if not sizes or not all(sizes):
        return f"must hold one non-empty list of ranks per position, got {len(sizes)} group(s)"
    if len(set(sizes)) > 1:
        return (
            f"groups of unequal size ({', '.join(map(str, sizes))}): each holds one rank per "
            "replica, so every group has the same size"
        )
    seen: dict[int, int] = {}
    for k, group in enumerate(groups):
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
        "checkpoint directory, or a .gguf file (a split set's first part: the set) (default: a "
        "built-in small synthetic one, written once under ~/.cache/tpload)",
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
        "from storage by one replica and sent to the others (over NCCL on GPUs whose group has "
        "it, gloo otherwise), checked on receipt",
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
        "hashing; off: nothing checked against any trust source (loudly marked)",
        choices=VERIFY_MODES,
    )
    device: str | None = opt(None, "target device (default: cuda:LOCAL_RANK, or cpu without CUDA)")
    allow_shared_device: bool = opt(
        False, "let several ranks load onto one GPU (functional checks with gloo; NCCL refuses it)"
    )
    hash_threads: int | None = opt(
        None,
        "hash worker threads per rank (sha256, or blake3 with a sidecar) (default: the cores this "
        "rank owns, less one: its CPU affinity shared among the node's ranks)",
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
        "rank 0 writes the JSON report here (its folder must exist; never inside the checkpoint; "
        "a regular file or a new one, replaced whole); `-`: on standard output, the table then on "
        "standard error",
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
        problems = validate(asdict(self), style="api")
        if problems:
            raise OptionsError(listing(problems))
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

    def ranks_asked(self) -> tuple[int, list[tuple[str, int]]]:
        """The ranks these options need (tp x ep x replicas, tp 1 when not given) and the degrees
        over 1 that ask for them, by name: what a launch mistake's message names."""
        degrees = (("tp", self.tp or 1), ("ep", self.ep), ("replicas", self.replicas))
        return (self.tp or 1) * self.ep * self.replicas, [(k, n) for k, n in degrees if n > 1]

    @classmethod
    def from_values(cls, values: Mapping[str, object], *, style: str = "api") -> LoadOptions:
        """Build from ``load()`` keywords (``style="api"``) or parsed flags (``"cli"``): unknown
        names, wrong types and bad values are all reported in one OptionsError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        # each value as its field's type (_coerce), which only the field table knows
        coerced: dict[str, Any] = {}
        problems: list[str] = []
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
            raise OptionsError(listing(problems))
        return cls(**coerced)


PathArg = str | os.PathLike[str]
"""A path as ``load()`` takes it: a string, or a path object (turned into its string)."""


class LoadKwargs(TypedDict, total=False):
    """``load()``'s keywords as a type checker and an IDE read them (PEP 692: ``**options:
    Unpack[LoadKwargs]``): one per :class:`LoadOptions` field but ``checkpoint`` (``load()``'s
    first argument), each typed as what ``load()`` accepts for it (a path object for a path, a
    mode's name, one glob for a list of them, lists of ranks); the defaults, the help and the rules
    are the fields' (tests/unit/options/test_load_options.py holds the two equal). A name not here
    is still reported by the options' one error, on every rank."""

    config: PathArg
    kind: Literal["packed", "expanded"]
    tp: int | None
    ep: int
    replicas: int
    replica_group: Sequence[Sequence[int]] | None
    verify: Literal["node", "rank", "digest", "off"]
    device: str | None
    allow_shared_device: bool
    hash_threads: int | None
    samples: int
    progress: bool
    timeout_s: float
    skip: str | Sequence[str]
    defer: str | Sequence[str]
    skip_activation_scales: bool
    evict_page_cache: bool
    reserve_gib: float
    report: PathArg | None
    digest_store: PathArg | None
    manifest_sha256: str | None
    signature: PathArg | None
    signer_key: PathArg | None
    signer_cert: PathArg | None
    signer_chain: PathArg | None
    signer_identity: str | None
    signer_issuer: str | None
    attest: PathArg | None
    attest_key: PathArg | None


def listing(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid option: {problems[0]}"
    return f"{len(problems)} invalid options:\n  - " + "\n  - ".join(problems)


def field_types() -> dict[str, Hint]:
    return typing.get_type_hints(LoadOptions)


def _coerce(name: str, value: object) -> Value:
    """``value`` as the field's type, accepting the obvious spellings (a Path for a str, one glob
    for a tuple of globs); TypeError saying what was expected otherwise."""
    want = field_types()[name]
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
        if isinstance(value, (list, tuple)) and all(
            isinstance(g, (list, tuple))
            and all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in g)
            for g in value
        ):  # numpy or torch integers too (an engine's rank lists)
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


def validate(values: Mapping[str, Value], *, style: str) -> list[str]:
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
        elif v is not None and (why := _field_problem(meta["bound"], meta["check"], v)):
            problems.append(f"{_spell(f.name, style)} {why}")
    return problems + problems_across(values, functools.partial(_spell, style=style))


def _field_problem(bound: Bound | None, check: Check | None, v: Value) -> str | None:
    # a bounded field holds a number (_coerce, the flag's parse)
    return (bound.problem(v) if bound is not None and isinstance(v, int | float) else None) or (
        check(v) if check is not None else None
    )
