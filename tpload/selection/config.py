"""Loading rules: which tensor is what, and how tensor parallelism cuts it.

A config is a TOML file of ordered rules (first match wins). Dimensions are
never written in a config; they come from the checkpoint's own headers (and
head counts from its config.json), so one config serves every size of a
model family.

Configs compose: an architecture's rules say how each tensor is cut, with
``role = "auto"`` where the stored format decides; a codec family (``bf16``,
``fp8-block``, ``nvfp4``, ``mxfp4``) says which formats those may be, by the
weight's dtype and the scale tensors beside it. ``deepseek-v3+nvfp4`` is
DeepSeek-V3's names with NVFP4 weights (DeepSeek-R1-FP4); an architecture
alone brings the families its published checkpoints use.

    [layout]
    channel_align = 64                 # I/tp must be a multiple of this

    [[rules]]
    match = "mtp.*.ffn.experts.*.w2.weight"   # fnmatch glob over the full name
    role = "fp4"                       # fp4 | fp8 | nvfp4 | plain | auto | skip | defer
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
from collections.abc import Iterable
from dataclasses import asdict, astuple, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ..codecs import registry
from ..codecs.plain import PLAIN
from ..model.errors import ConfigError, LoadError
from ..model.modes import Role, Split
from ..storage.files import read_small
from .defaults import REFERENCE_CONFIG
from .prefix import CANDIDATES, config_prefix

SPLITS = tuple(Split)
KV_SCALES = ("strict", "report")
READS_NOTHING = (Role.SKIP, Role.DEFER)
AUTO = Role.AUTO


def roles() -> tuple[str, ...]:
    """Every role a rule may name: a codec's (codecs/), ``auto``, or one that reads nothing."""
    return registry.roles() + (AUTO,) + READS_NOTHING


@dataclass(frozen=True)
class Pick:
    """One way a codec family stores a weight: its dtype, its name's ending and its scale
    tensors'."""

    dtype: str
    role: str
    scale: str
    """The scale's name: the weight's with ``suffix`` replaced by this."""
    scale2: str = ""
    suffix: str = ".weight"
    scaled: bool = True
    """False: the format has no scale tensors (GGUF blocks carry their own); ``scale`` is unused."""


FAMILIES: dict[str, tuple[Pick, ...]] = {
    "bf16": (),  # every tensor plain (BF16, F16, F32, I64)
    "fp8-block": (Pick("F8_E4M3", "fp8", ".weight_scale_inv"), Pick("F8_E4M3", "fp8", ".scale")),
    "mxfp4": (
        Pick("I8", "fp4", ".scale"),
        Pick("U8", "fp4", ".scale"),
        Pick("U8", "fp4", "_scales", suffix="_blocks"),
    ),
    "nvfp4": (Pick("U8", "nvfp4", ".weight_scale", ".weight_scale_2"),),
    # GGUF's block types carry their scales inside each block: no scale tensor (codecs/gguf.py)
    "gguf": tuple(
        Pick(t, "gguf", ".scale", scaled=False)
        for t in ("Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
    ),
}
"""Codec families: what ``role = "auto"`` may resolve to, tried in order (a plain dtype is
plain)."""


@dataclass(frozen=True)
class Rule:
    """One ``[[rules]]`` entry: a name pattern and what to do with its tensors."""

    match: str
    """fnmatch glob over the official tensor name (``*`` crosses dots)."""
    role: Role
    """``fp4`` expert matrix, ``fp8`` block-scaled dense, ``plain`` BF16/F32/F16/I64,
    ``skip`` (never read), ``defer`` (not uploaded; a locator is returned)."""
    split: Split = Split.REPLICATE
    """How tensor parallelism cuts it: ``rows`` (column parallel, or vocabulary
    parallel), ``cols`` (row parallel), or ``replicate``."""
    scale: str = ".scale"
    """For fp4/fp8: the scale's name is the weight's with ``.weight`` replaced by
    this suffix (``.weight_scale_inv`` for DeepSeek-V3)."""
    experts: bool = False
    """Expert-parallel: with ``--ep E`` each group holds only its share of experts."""
    block: int = 0
    """fp8 only: insist on this scale block size (0: read it from the scale's shape)."""
    suffix: str = ".weight"
    """The weight's name ends in this; ``scale`` (and ``scale2``) replace it to name its scales
    (``_blocks`` -> ``_scales`` for gpt-oss's MXFP4 experts)."""
    scale2: str = ""
    """A second, global scale replacing ``suffix`` (NVFP4's ``.weight_scale_2``); empty: none."""
    stacked: bool = False
    """Dimension 0 indexes experts (all experts stacked in one tensor): ``--ep`` cuts it, and
    ``split`` refers to the dimensions after it."""
    units: int | str = 0
    """The split dimension is made of this many indivisible units (attention heads), an integer or
    a config.json field (``num_key_value_heads``): each rank takes whole units, and when there are
    fewer units than ranks, each unit is replicated on tp / units ranks (as vLLM does). 0: no
    units."""
    align: int = 0
    """A rank's share of the split dimension must be a multiple of this (0: the layout's
    ``channel_align`` for FP4 experts, else the codec's scale group)."""
    share_units: bool = True
    """With fewer units than ranks, ranks share a unit (kv heads); false: refuse such a tp
    (DeepSeek-V4's output groups)."""
    uneven: bool = False
    """Let the shares be uneven, as vLLM cuts gpt-oss's MXFP4 experts: each rank's share is the even
    share rounded up to ``align``, and the last rank takes what is left."""
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
        # the TOML's and the command line's strings become the named modes
        object.__setattr__(self, "role", Role(self.role))
        object.__setattr__(self, "split", Split(self.split))
        if self.block < 0:
            raise ConfigError(f"{where}: block must be >= 0, got {self.block}")
        if not self.scale or not self.suffix:
            raise ConfigError(f"{where}: scale and suffix must not be empty")
        if self.align < 0 or (isinstance(self.units, int) and self.units < 0):
            raise ConfigError(f"{where}: align and units must be >= 0")
        if self.uneven and self.units:
            raise ConfigError(f"{where}: a split is in whole units or uneven, not both")
        if not isinstance(self.units, (int, str)) or isinstance(self.units, bool):
            raise ConfigError(f"{where}: units must be a number or a config.json field name")
        # the planner groups tensors by rule: a rule's hash is taken once, not once per tensor
        object.__setattr__(self, "_hash", hash(astuple(self)))

    def __hash__(self) -> int:
        # set in __post_init__, not a field (the fields are what it is the hash of)
        hashed: int = self.__dict__["_hash"]
        return hashed

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
    families: tuple[str, ...] = ()
    """Codec families ``role = "auto"`` rules resolve through (:data:`FAMILIES`)."""
    architectures: tuple[str, ...] = ()
    """config.json ``architectures`` / ``model_type`` values this config is for (``--config
    auto``)."""
    weight_prefix: str | None = None
    """The prefix the rules are written for (``model.``, ``""``...): a checkpoint whose layers sit
    under another has its names rewritten to it for matching (prefix.py). None: read off the
    globs."""
    kv_scales: str = "strict"
    """What the KV-cache scale census does with a layer with k but no v, two spellings on one layer,
    or scales on some attention layers only: ``strict`` refuses the checkpoint, ``report`` says
    so."""
    expert_regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _matcher: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _resolved: dict[tuple[Rule, Pick | None], Rule] = field(init=False, repr=False, compare=False)
    _ways: dict[tuple[Rule, str], tuple[list[tuple[Pick, Rule]], Rule | None]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.channel_align < 1:
            raise ConfigError(f"{self.name}: channel_align must be >= 1, got {self.channel_align}")
        if not self.rules:
            raise ConfigError(f"{self.name}: no [[rules]]")
        try:
            rx = re.compile(self.expert_pattern)
        except re.error as e:
            raise ConfigError(
                f"{self.name}: expert_pattern {self.expert_pattern!r} is not a regex ({e})"
            ) from None
        if rx.groups < 1:
            raise ConfigError(
                f"{self.name}: expert_pattern {self.expert_pattern!r} needs one group (the expert "
                "index)"
            )
        object.__setattr__(self, "expert_regex", rx)
        # every glob in one regex, in rule order: the first alternative that matches is the first
        # rule
        object.__setattr__(self, "_matcher", alternatives(enumerate(self.rules)))
        object.__setattr__(self, "_resolved", {})
        object.__setattr__(self, "_ways", {})
        if self.kv_scales not in KV_SCALES:
            raise ConfigError(
                f"{self.name}: kv_scales {self.kv_scales!r} is not one of {', '.join(KV_SCALES)}"
            )
        if self.weight_prefix not in (None, *CANDIDATES):
            raise ConfigError(
                f"{self.name}: weight_prefix {self.weight_prefix!r} is not one of "
                f"{', '.join(map(repr, CANDIDATES))}"
            )
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ConfigError(
                f"{self.name}: unknown codec families {', '.join(unknown)} (known: "
                f"{', '.join(FAMILIES)})"
            )

    def rule_for(self, name: str) -> Rule | None:
        """The first rule whose glob matches ``name`` (one regex match, whatever the rule count)."""
        m = self._matcher.match(name)
        return self.rules[rule_index(m)] if m else None

    def declined(self, dtype: str) -> str:
        """Why no way of this config's families takes an ``auto`` rule's weight of ``dtype`` (none
        of :meth:`ways` fits the name, its scales or the dtype, and the dtype is not plain)."""
        return (
            f"{dtype} tensors that no codec of {'+'.join(self.families) or 'this config'} takes "
            f"(is a scale tensor missing, or is it another family? shipped families: "
            f"{', '.join(FAMILIES)})"
        )

    def ways(self, rule: Rule, dtype: str) -> tuple[list[tuple[Pick, Rule]], Rule | None]:
        """The families' ways of storing an ``auto`` rule's weight of ``dtype``, in the order
        they are tried (the first whose suffix a name ends in and whose scales are there
        takes it), each with the rule it makes; and the plain rule (None: the dtype is not plain).
        Made once per pair (planning/classify.py resolves names in bulk by them)."""
        ways = self._ways.get((rule, dtype))
        if ways is None:
            ways = self._ways[rule, dtype] = (
                [
                    (p, self._made(rule, p))
                    for f in self.families
                    for p in FAMILIES[f]
                    if p.dtype == dtype
                ],
                self._made(rule, None) if dtype in PLAIN.weight_dtypes else None,
            )
        got: tuple[list[tuple[Pick, Rule]], Rule | None] = ways
        return got

    def _made(self, rule: Rule, pick: Pick | None) -> Rule:
        """``rule`` with ``pick``'s role and names (plain when None), made once per pair."""
        key = (rule, pick)
        made = self._resolved.get(key)
        if made is None:
            made = self._resolved[key] = (
                replace(rule, role=Role.PLAIN)
                if pick is None
                else replace(
                    rule,
                    role=Role(pick.role),
                    scale=pick.scale,
                    scale2=pick.scale2,
                    suffix=pick.suffix,
                )
            )
        return made

    @property
    def rules_prefix(self) -> str | None:
        """The prefix the rules are written for: ``weight_prefix``, or read off the globs of the
        rules the config file wrote (not ``--skip``'s); None: prefix-blind."""
        if self.weight_prefix is not None:
            return self.weight_prefix
        return config_prefix(r.match for r in self.rules if not r.origin)

    def id(self) -> str:
        """A short hash of what the config decides (rules and layout constants, not where it came
        from): the first 12 hex digits of :meth:`rules_sha256`."""
        return self.rules_sha256()[:12]

    def rules_sha256(self) -> str:
        """The full sha256 of the canonical rules (:meth:`canonical`): what an export records
        beside the config's name, so a load of it can refuse other rules."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def canonical(self) -> str:
        """What the config decides as canonical JSON (rules and layout constants, not where it
        came from). Fields left at their defaults are left out, so adding a field keeps every
        existing id."""
        rules = [
            {
                k: v
                for k, v in asdict(r).items()
                if k != "index" and (k in _ID_ALWAYS or v != _DEFAULTS[k])
            }
            for r in self.rules
        ]
        what = {"rules": rules, "align": self.channel_align, "experts": self.expert_pattern}
        if self.families:
            what["families"] = list(self.families)
        if self.weight_prefix is not None:  # absent unless set: existing ids stay
            what["weight_prefix"] = self.weight_prefix
        return json.dumps(what, sort_keys=True)


def alternatives(rules: Iterable[tuple[int, Rule]]) -> re.Pattern[str] | None:
    """Every glob in one regex, in rule order: the first alternative that matches is the first rule
    (group ``r<i>``, ``i`` the rule's position, read by :func:`rule_index`); None for no rules.
    Config's own matchers and planning's (a template's first rule, rules given at run time) use
    it."""
    pattern = "|".join(f"(?P<r{i}>{fnmatch.translate(r.match)})" for i, r in rules)
    return re.compile(pattern) if pattern else None


ACTIVATION_SCALES = "*.input_scale"
"""ModelOpt NVFP4 (W4A4)'s activation scales: one 0-d tensor per quantized projection."""
ACTIVATION_ORIGIN = "skip_activation_scales"


def with_rules(
    config: Config,
    *,
    skip: tuple[str, ...] = (),
    defer: tuple[str, ...] = (),
    skip_activation_scales: bool = False,
) -> Config:
    """``config`` with skip and defer rules for these globs put first (so they win).

    For a serving startup that decides at run time, e.g. ``skip=("mtp.*",)`` when
    the model builds no MTP head. Defer rules are expert-parallel: a deferred
    expert tensor is located only by the ranks whose ep group holds the expert.
    """
    if not skip and not defer and not skip_activation_scales:
        return config
    # the switch's rule skips only single-value tensors (the planner checks): it may match none
    first = (
        [Rule(match=ACTIVATION_SCALES, role=Role.SKIP, origin=ACTIVATION_ORIGIN)]
        if skip_activation_scales
        else []
    )
    # sorted and each once: the same globs in any order or repeated are the same rules, so the same
    # Config.id() (an engine building globs from a set agrees with its peers); order within one
    # role decides nothing (the first match wins, and every rule of the role does the same)
    first += [Rule(match=g, role=Role.SKIP, origin="skip") for g in sorted(set(skip))]
    first += [
        Rule(match=g, role=Role.DEFER, experts=True, origin="defer") for g in sorted(set(defer))
    ]
    return replace(config, rules=tuple(first) + config.rules)


ALIASES = {"qwen3-moe": "qwen3", "qwen3-fp8": "qwen3+fp8-block"}
"""Other names of shipped compositions."""


def shipped_configs() -> list[str]:
    """Names of the configs that ship inside the package (usable from a wheel)."""
    files = [
        p.name[:-5] for p in resources.files("tpload.configs").iterdir() if p.name.endswith(".toml")
    ]
    return sorted(files + list(ALIASES))


def shipped_detect() -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """Each shipped config with a ``[detect]`` list: its name, the architectures it names, and its
    own codec families (``codecs``), read from its TOML without building (or checking) its rules:
    what ``--config auto`` compares config.json with; :func:`load_config` builds the one picked."""
    found = []
    for name in sorted(
        p.name[:-5] for p in resources.files("tpload.configs").iterdir() if p.name.endswith(".toml")
    ):
        res = resources.files("tpload.configs") / f"{name}.toml"
        doc = tomllib.loads(res.read_text())
        said = tuple(doc.get("detect", {}).get("architectures", ()))
        if said:
            found.append((name, said, tuple(doc.get("codecs", ()))))
    return found


def available() -> str:
    """What ``--config`` accepts, for messages."""
    return (
        f"shipped configs: {', '.join(shipped_configs())}; codec families: "
        f"{', '.join(FAMILIES)}; compose them as ARCH+FAMILY (deepseek-v3+nvfp4), or write a "
        "TOML file (docs/configs.md)"
    )


def _read_toml(name_or_path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.is_file() or os.sep in str(name_or_path):
        try:  # bounded (a FIFO or a device is refused, not waited): a few KB, 4 MiB at most
            return str(path), tomllib.loads(read_small(path, "config", limit=4 << 20).decode())
        except LoadError as e:
            raise ConfigError(str(e)) from None
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:  # bad input
            why = "nested too deeply" if isinstance(e, RecursionError) else e
            raise ConfigError(f"{path}: config is not valid TOML ({why})") from None
    res = resources.files("tpload.configs") / f"{name_or_path}.toml"
    if not res.is_file():
        raise ConfigError(
            f"config {str(name_or_path)!r} is neither a file nor a shipped config ({available()})"
        )
    return str(name_or_path), tomllib.loads(res.read_text())


_RULE_KEYS = {
    "match",
    "role",
    "split",
    "scale",
    "experts",
    "block",
    "suffix",
    "scale2",
    "stacked",
    "units",
    "align",
    "share_units",
    "uneven",
}
_DEFAULTS = {f.name: f.default for f in fields(Rule)}
_ID_ALWAYS = {
    "match",
    "role",
    "split",
    "scale",
    "experts",
    "block",
    "origin",
}  # the fields ids always had
_LAYOUT_KEYS = {"channel_align", "expert_pattern", "weight_prefix"}
_TOP_KEYS = {"layout", "rules", "description", "codecs", "detect", "kv_scales"}
_DETECT_KEYS = {"architectures"}


def split_spec(spec: str) -> tuple[str, tuple[str, ...]]:
    """``ARCH+FAMILY+...`` as (ARCH or a path, the families); a file's path is never split."""
    spec = ALIASES.get(spec, spec)
    if Path(spec).exists() or spec.endswith(".toml"):
        return spec, ()
    head, *families = spec.split("+")
    return head, tuple(families)


def load_config(name_or_path: str | os.PathLike[str] | Config = REFERENCE_CONFIG) -> Config:
    """A shipped config by name (``ARCH`` or ``ARCH+FAMILY...``), or a TOML file by path (a Config
    passes through). Naming families replaces the architecture's own."""
    if isinstance(name_or_path, Config):
        return name_or_path
    head, families = split_spec(os.fspath(name_or_path))
    if head in FAMILIES:
        raise ConfigError(
            f"{head!r} is a codec family, not a config: name the architecture too (ARCH+{head}), "
            f"or let --config auto find it from the checkpoint's config.json ({available()})"
        )
    unknown_families = [f for f in families if f not in FAMILIES]
    if unknown_families:
        raise ConfigError(
            f"config {os.fspath(name_or_path)!r}: unknown codec families "
            f"{', '.join(unknown_families)} ({available()})"
        )
    config = _parse(*_read_toml(head))
    if families:
        config = replace(config, name=f"{config.name}+{'+'.join(families)}", families=families)
    return config


def _parse(source: str, doc: dict[str, Any]) -> Config:  # a TOML document: any values
    unknown = set(doc) - _TOP_KEYS
    layout, detect = doc.get("layout", {}), doc.get("detect", {})
    unknown |= {f"layout.{k}" for k in set(layout) - _LAYOUT_KEYS}
    unknown |= {f"detect.{k}" for k in set(detect) - _DETECT_KEYS}
    raw_rules = doc.get("rules", [])
    for i, raw in enumerate(raw_rules, 1):
        unknown |= {f"rules[{i}].{k}" for k in set(raw) - _RULE_KEYS}
        if "match" not in raw or "role" not in raw:
            raise ConfigError(f"{source}: rule {i} needs both 'match' and 'role'")
    if unknown:
        raise ConfigError(f"{source}: unknown keys {', '.join(sorted(unknown))}")
    families = doc.get("codecs", [])
    if not isinstance(families, list) or not all(isinstance(f, str) for f in families):
        raise ConfigError(
            f"{source}: codecs must be a list of codec family names ({', '.join(FAMILIES)})"
        )
    rules = [Rule(index=i, **raw) for i, raw in enumerate(raw_rules, 1)]
    kv_scales = doc.get("kv_scales", "strict")
    if not isinstance(kv_scales, str) or not isinstance(layout.get("weight_prefix", ""), str):
        raise ConfigError(f"{source}: kv_scales and layout.weight_prefix are strings")
    return Config(
        name=source,
        rules=tuple(rules),
        description=doc.get("description", ""),
        families=tuple(families),
        architectures=tuple(detect.get("architectures", ())),
        kv_scales=kv_scales,
        **layout,
    )


def rule_index(m: re.Match[str]) -> int:
    """The rule a matcher's match names: each alternative is a group ``r<index>``."""
    group = m.lastgroup
    if group is None:  # (every alternative of a matcher is a named group)
        raise ValueError(f"{m.re.pattern[:80]!r} matched outside its rules' groups")
    return int(group[1:])
