"""Loading rules: which tensor is what, and how tensor parallelism cuts it.

A config is a TOML file of ordered rules (first match wins). Dimensions are
never written in a config; they come from the checkpoint's own headers, so
one config serves every size of a model family.

    [layout]
    channel_align = 64                 # I/tp must be a multiple of this

    [[rules]]
    match = "mtp.*.ffn.experts.*.w2.weight"   # fnmatch glob over the full name
    role = "fp4"                       # fp4 | fp8 | plain | skip | defer
    split = "cols"                     # rows | cols | replicate
    experts = true                     # expert-parallel: ep groups split the experts
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

from . import codecs
from .errors import ConfigError
from .options import DEFAULT_CONFIG

SPLITS = ("rows", "cols", "replicate")
READS_NOTHING = ("skip", "defer")


def roles() -> tuple[str, ...]:
    """Every role a rule may name: a codec's (codecs/) or one that reads nothing."""
    return codecs.roles() + READS_NOTHING


@dataclass(frozen=True)
class Rule:
    """One ``[[rules]]`` entry: a name pattern and what to do with its tensors."""

    match: str
    """fnmatch glob over the official tensor name (``*`` crosses dots)."""
    role: str
    """``fp4`` expert matrix, ``fp8`` block-scaled dense, ``plain`` BF16/F32/F16/I64,
    ``skip`` (never read), ``defer`` (not uploaded; a locator is returned)."""
    split: str = "replicate"
    """How tensor parallelism cuts it: ``rows`` (column parallel, or vocabulary
    parallel), ``cols`` (row parallel), or ``replicate``."""
    scale: str = ".scale"
    """For fp4/fp8: the scale's name is the weight's with ``.weight`` replaced by
    this suffix (``.weight_scale_inv`` for DeepSeek-V3)."""
    experts: bool = False
    """Expert-parallel: with ``--ep E`` each group holds only its share of experts."""
    block: int = 0
    """fp8 only: insist on this scale block size (0: read it from the scale's shape)."""
    index: int = 0
    """Position in the file, for error messages (1-based; 0 when built in code)."""
    origin: str = ""
    """Where a rule built in code came from (``--skip``, ``defer=``...), for error messages."""

    def __post_init__(self) -> None:
        where = f"rule {self.index} ({self.match!r})"
        if self.role not in roles():
            raise ConfigError(f"{where}: role {self.role!r} is not one of {', '.join(roles())}")
        if self.split not in SPLITS:
            raise ConfigError(f"{where}: split {self.split!r} is not one of {', '.join(SPLITS)}")
        if self.block < 0:
            raise ConfigError(f"{where}: block must be >= 0, got {self.block}")
        if not self.scale.startswith("."):
            raise ConfigError(f"{where}: scale suffix {self.scale!r} must start with '.'")

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.match)

    def describe(self) -> str:
        if self.origin:
            return f"{self.origin} rule (match {self.match!r}, role {self.role})"
        return f"rule {self.index} (match {self.match!r}, role {self.role}, split {self.split})"


@dataclass(frozen=True)
class Config:
    """A parsed config: rules in order plus layout constants."""

    name: str
    """Where it came from (shipped name or path), for messages."""
    rules: tuple[Rule, ...]
    """First match wins; a tensor no rule matches is an error."""
    channel_align: int = 64
    """I/tp must be a multiple of this for fp4 expert matrices (a kernel tile)."""
    expert_pattern: str = r"experts\.(\d+)\."
    """Regex whose group 1 is the expert index; the text before it names the expert set."""
    description: str = ""
    """Free text shown by ``tpload plan``."""
    expert_regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.channel_align < 1:
            raise ConfigError(f"{self.name}: channel_align must be >= 1, got {self.channel_align}")
        if not self.rules:
            raise ConfigError(f"{self.name}: no [[rules]]")
        try:
            rx = re.compile(self.expert_pattern)
        except re.error as e:
            raise ConfigError(f"{self.name}: expert_pattern {self.expert_pattern!r} is not a regex ({e})") from None
        if rx.groups < 1:
            raise ConfigError(f"{self.name}: expert_pattern {self.expert_pattern!r} needs one group (the expert index)")
        object.__setattr__(self, "expert_regex", rx)

    def rule_for(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.matches(name)), None)

    def id(self) -> str:
        """A short hash of what the config decides (rules and layout constants, not where it came from)."""
        rules = [{k: v for k, v in asdict(r).items() if k != "index"} for r in self.rules]
        doc = json.dumps({"rules": rules, "align": self.channel_align, "experts": self.expert_pattern}, sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()[:12]


def with_rules(config: Config, *, skip: tuple[str, ...] = (), defer: tuple[str, ...] = ()) -> Config:
    """``config`` with skip and defer rules for these globs put first (so they win).

    For a serving startup that decides at run time, e.g. ``skip=("mtp.*",)`` when
    the model builds no MTP head. Defer rules are expert-parallel: a deferred
    expert tensor is located only by the ranks whose ep group holds the expert.
    """
    if not skip and not defer:
        return config
    first = [Rule(match=g, role="skip", origin="skip") for g in skip]
    first += [Rule(match=g, role="defer", experts=True, origin="defer") for g in defer]
    return replace(config, rules=tuple(first) + config.rules)


def shipped_configs() -> list[str]:
    """Names of the configs that ship inside the package (usable from a wheel)."""
    return sorted(p.name[:-5] for p in resources.files("tpload.configs").iterdir() if p.name.endswith(".toml"))


def _read_toml(name_or_path: str | os.PathLike) -> tuple[str, dict]:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists() or os.sep in str(name_or_path):
        try:
            return str(path), tomllib.loads(path.read_text())
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: config is not valid TOML ({e})") from None
    res = resources.files("tpload.configs") / f"{name_or_path}.toml"
    if not res.is_file():
        raise ConfigError(f"config {name_or_path!r} is neither a file nor a shipped config ({', '.join(shipped_configs())})")
    return str(name_or_path), tomllib.loads(res.read_text())


_RULE_KEYS = {"match", "role", "split", "scale", "experts", "block"}
_LAYOUT_KEYS = {"channel_align", "expert_pattern"}


def load_config(name_or_path: str | os.PathLike | Config = DEFAULT_CONFIG) -> Config:
    """A shipped config by name, or a TOML file by path (a Config passes through)."""
    if isinstance(name_or_path, Config):
        return name_or_path
    source, doc = _read_toml(name_or_path)
    unknown = set(doc) - {"layout", "rules", "description"}
    layout = doc.get("layout", {})
    unknown |= {f"layout.{k}" for k in set(layout) - _LAYOUT_KEYS}
    raw_rules = doc.get("rules", [])
    for i, raw in enumerate(raw_rules, 1):
        unknown |= {f"rules[{i}].{k}" for k in set(raw) - _RULE_KEYS}
        if "match" not in raw or "role" not in raw:
            raise ConfigError(f"{source}: rule {i} needs both 'match' and 'role'")
    if unknown:
        raise ConfigError(f"{source}: unknown keys {', '.join(sorted(unknown))}")
    rules = [Rule(index=i, **raw) for i, raw in enumerate(raw_rules, 1)]
    return Config(name=source, rules=tuple(rules), description=doc.get("description", ""), **layout)
