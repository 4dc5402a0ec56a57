"""Per-rank plans: which bytes of which tensor each rank reads, and where they land.

A plan is pure arithmetic on the catalogue (names, dtypes, shapes) and the
config; it touches no tensor data and no device, so any rank can compute any
other rank's plan (node verification, the pre-flight and ``tpload plan
--digest`` rely on that). Every weight and scale window comes from one place:
the rule's split gives a channel window, and the tensor's codec turns it into
byte cuts of the weight and its scale (codecs/).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch

from . import codecs
from .codecs import Codec, Cut, Fit, whole
from .config import ACTIVATION_ORIGIN, AUTO, Config, Rule
from .config import _alternatives as _alternatives_of
from .errors import ConfigError, LayoutError, LoadError, raise_all
from .kvscales import census as kv_census
from .options import KINDS, MAX_WORLD
from .pick import model_config
from .prefix import detect as detect_prefix
from .storage.catalogue import Catalogue, TensorMeta, natural_key
from .text import escape_name

SLOT_ALIGN = 256  # every served tensor starts on a 256-byte boundary of the arena
SUGGEST_UP_TO = 64  # the layout suggestions try tp values up to this (or the world size)

__all__ = [
    "Cut",
    "Item",
    "Layout",
    "Output",
    "Planner",
    "RankPlan",
    "SLOT_ALIGN",
    "paused_gc",
    "planning",
]


@dataclass(frozen=True)
class Layout:
    """How the ranks of one group split a checkpoint: ``tp`` x ``ep``."""

    tp: int
    """Tensor-parallel degree: ranks that share every matrix, each a window."""
    ep: int = 1
    """Expert-parallel degree: groups of ``tp`` ranks that split the experts."""

    def __post_init__(self) -> None:
        if not (
            1 <= self.tp <= MAX_WORLD
            and 1 <= self.ep <= MAX_WORLD
            and self.tp * self.ep <= MAX_WORLD
        ):
            raise LayoutError(
                f"tp {self.tp} x ep {self.ep}: each must be >= 1 and their product at most {MAX_WORLD}"
            )

    @property
    def world(self) -> int:
        return self.tp * self.ep

    def position(self, rank: int) -> tuple[int, int]:
        """(expert-parallel group, tensor-parallel rank) of a group rank: tp is innermost."""
        return divmod(rank, self.tp)


class Output(NamedTuple):
    """One served tensor: a slot of the rank's arena."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class Item(NamedTuple):
    """One unit of work: a weight (and its scales) becoming one or more served tensors (a named
    tuple, like Cut and Output: cheap to make by the hundred thousand)."""

    name: str
    codec: Codec
    rule: str
    """The rule that classified it, for messages."""
    fit: Fit
    weight: Cut
    scales: tuple[Cut, ...]
    """The scale's cut, and a second (global) scale's when the format has one; () for plain tensors."""
    outputs: tuple[Output, ...]

    @property
    def role(self) -> str:
        return self.codec.role

    @property
    def scale(self) -> Cut | None:
        return self.scales[0] if self.scales else None

    @property
    def read_bytes(self) -> int:
        return self.weight.nbytes + sum(s.nbytes for s in self.scales)

    @property
    def cuts(self) -> list[Cut]:
        """The scales' cuts, then the weight's: the value checks need the scales first."""
        return [*self.scales, self.weight]

    def output(self, name: str) -> Output:
        """The served tensor named ``name`` (a packed weight's or scale's; a decode's)."""
        return next(o for o in self.outputs if o.name == name)


Box = tuple[tuple[int, int], tuple[int, int]]
"""A window of a stored tensor: (rows, byte columns) of its 2-D view."""


@dataclass(frozen=True, eq=False)
class RankPlan:
    """Everything one rank will do, decided before any byte is copied.

    Kept compact: each tensor's entry, the cuts it shares with every tensor of its class on this
    rank, and its arena offset. The items (named cuts and outputs) are made when first asked for,
    which only the rank that loads the plan does: a node's peers' plans are read for names and
    windows only, and 64 plans of a 92,000-tensor checkpoint stay cheap.
    """

    rank: int
    layout: Layout
    kind: str
    entries: Sequence[_Entry]
    shapes: Sequence[_Shaped]
    offsets: Sequence[int]
    """Arena offset of each entry's first output."""
    skipped: tuple[str, ...]
    deferred: tuple[str, ...]
    arena_bytes: int

    # Everything below is computed once, when first asked for.

    @functools.cached_property
    def items(self) -> tuple[Item, ...]:
        return tuple(map(_item, self.entries, self.shapes, self.offsets))

    @functools.cached_property
    def reads(self) -> dict[str, Box]:
        """Every official tensor this rank reads a window of (each item's scales, then its weight): its box."""
        out: dict[str, Box] = {}
        for e, s in zip(self.entries, self.shapes):
            f = e.fit
            if s.scale is not None:
                out[f.scale.name] = (s.scale[0], s.scale[1])
            if s.scale2 is not None:
                out[f.scale2.name] = (s.scale2[0], s.scale2[1])
            out[e.name] = (s.weight[0], s.weight[1])
        return out

    @functools.cached_property
    def used_tensors(self) -> list[str]:
        """Official tensors this rank reads a window of (each item's scales, then its weight), in plan order."""
        return list(self.reads)

    @functools.cached_property
    def read_bytes(self) -> int:
        return sum(s.read_bytes for s in self.shapes)

    @functools.cached_property
    def served(self) -> int:
        return sum(len(s.served) for s in self.shapes)

    @functools.cached_property
    def largest_transient(self) -> int:
        """Device bytes beyond the arena: one staged window plus, expanded, its fp32 decode rows."""
        if not self.shapes:
            return 0
        staged = max(s.read_bytes for s in self.shapes)
        if self.kind == "packed":
            return staged
        return staged + max(s.decode_bytes for s in self.shapes)


class _Entry(NamedTuple):
    """A classified official tensor (weight side; its scales are folded in). A named tuple: one
    per weight (46,000 for DeepSeek-V3), and a frozen dataclass takes three times as long to make."""

    name: str
    rule: Rule
    codec: Codec
    fit: Fit
    expert: tuple[str, int] | None = None
    """(expert set, index within it) for expert-parallel tensors."""
    stacked_experts: int = 0
    """Experts stacked in dimension 0 that expert parallelism shares out (0: not such a tensor)."""
    klass: int = 0
    """Tensors of one class (rule, codec, dtypes and shapes) are cut alike on every rank."""


class _Shaped(NamedTuple):
    """A tensor's cuts and served tensors on one rank, without the names: shared by every tensor of
    its class (the 256 experts of a layer cut alike)."""

    weight: tuple
    """The weight's Cut fields after its name."""
    scale: tuple | None
    scale2: tuple | None
    served: tuple[tuple[torch.dtype, tuple[int, ...], int], ...]
    """(dtype, shape, bytes) of each output: the weight's (or its decode's), then its scales'."""
    rule: str
    read_bytes: int
    arena: int
    """Arena bytes of the outputs, each rounded up to SLOT_ALIGN."""
    decode_bytes: int
    """fp32 rows of an expanded decode (0 for a plain tensor)."""


def _item(e: _Entry, s: _Shaped, offset: int) -> Item:
    """One tensor's item: its class's cuts and outputs, named, at its arena offset."""
    f = e.fit
    scales = (Cut(f.scale.name, *s.scale),) if s.scale is not None else ()
    if s.scale2 is not None:
        scales += (Cut(f.scale2.name, *s.scale2),)
    names = (e.name, *(c.name for c in scales))  # served() lists the weight, then its scales
    outputs = []
    for name, (dtype, shape, nbytes) in zip(names, s.served):
        outputs.append(Output(name, dtype, shape, offset, nbytes))
        offset += _slot(nbytes)
    return Item(e.name, e.codec, s.rule, f, Cut(e.name, *s.weight), scales, tuple(outputs))


def _slot(nbytes: int) -> int:
    return -(-nbytes // SLOT_ALIGN) * SLOT_ALIGN


class Planner:
    """Classifies a catalogue once against a config, then cuts plans for any layout."""

    def __init__(
        self, catalogue: Catalogue, config: Config, *, model: Mapping[str, object] | None = None
    ) -> None:
        """``model``: the checkpoint's config.json (rules that count heads read it; read from the
        checkpoint folder when not given and a rule needs it)."""
        self.catalogue, self.config = catalogue, config
        self._model = model
        self._units = {(r.index, r.match): self._resolve_units(r) for r in config.rules if r.units}
        self._fits: dict[tuple, Fit | str] = {}
        self._klasses: dict[tuple, int] = {}
        self._classes: dict[tuple, tuple[Fit | str, int, int]] = {}
        self._codecs = {role: codecs.for_role(role) for role in codecs.roles()}
        names = catalogue.tensors
        self.prefix = detect_prefix(
            names, wanted=config.rules_prefix, model=self._quiet_model(), where=catalogue.root
        )
        self.census = kv_census(names)
        self.activation_scales = [n for n in names if _activation_scale(n, names[n])]
        """Single-value ``*.input_scale`` tensors (ModelOpt NVFP4's activation scales), stored names."""
        # Deferred expert tensors are located only by the ep group holding the expert:
        # a locator of a remote expert would invite the model to read it.
        self.entries, self.skipped, self.deferred, self.deferred_experts = self._classify()
        self.expert_counts = self._count_experts()
        self._expert_pos = {
            k: {x: i for i, x in enumerate(v)} for k, v in self.expert_counts.items()
        }
        firsts: dict[int, _Entry] = {}
        for e in self.entries:
            firsts.setdefault(e.klass, e)
        self._firsts = list(firsts.values())
        """The first entry of each class, in order: the others cut as it does."""
        self._plans: dict[tuple[Layout, str, int], RankPlan] = {}
        self._owned: dict[
            tuple[int, int], tuple[list[_Entry], list[int], dict[int, _Entry], tuple[str, ...]]
        ] = {}
        self._held: dict[int, list[list[_Entry]]] = {}
        self._shapes: dict[tuple, _Shaped | str] = {}

    # -- classification ------------------------------------------------------------------------

    def _rules(
        self, tensors: Mapping[str, TensorMeta]
    ) -> tuple[dict[str, Rule | None], dict[str, str], dict[str, list[str]], set[int]]:
        """Each tensor's rule, ``auto`` ones resolved by the tensor's dtype and the scale tensors beside
        it; for tensors an ``auto`` rule could not resolve, why (said only if not a scale); the scales
        found for a weight an ``auto`` rule made scaled; and the ids of the rules that are some
        tensor's first match."""
        matched = self._matched(tensors)
        rules: dict[str, Rule | None] = {}
        unresolved: dict[str, str] = {}
        needs: dict[str, list[str]] = {}
        resolve, codec_of = self.config.resolve_scaled, self._codecs
        for (n, meta), r in zip(tensors.items(), matched):
            if r is not None and r.role == AUTO:
                got = resolve(r, n, meta.dtype, tensors)
                if isinstance(got, str):
                    unresolved[n] = f"{r.describe()}: {got}"
                    r = None
                else:
                    r, found = got
                    if found and codec_of[r.role].scaled:
                        needs[n] = found
            rules[n] = r
        return rules, unresolved, needs, set(map(id, matched))

    def _matched(self, tensors: Mapping[str, TensorMeta]) -> list[Rule | None]:
        """Each tensor's first rule: the config's rules see its name under the config's prefix
        (prefix.py), a rule given at run time (``--skip``) its stored name too; the activation-scale
        switch takes single-value tensors only."""
        rules, prefix = self.config.rules, self.prefix
        if not prefix.rewrites:
            matched = self.config.rules_for(tensors)
        else:
            matched = self.config.rules_for(map(prefix.rewrite, tensors))
            given = _alternatives_of([(i, r) for i, r in enumerate(rules) if r.origin])
            if given is not None:
                at = {id(r): i for i, r in enumerate(rules)}
                for k, n in enumerate(tensors):
                    if (m := given.match(n)) is not None:
                        i = int(m.lastgroup[1:])
                        if matched[k] is None or i < at[id(matched[k])]:
                            matched[k] = rules[i]
        act = [i for i, r in enumerate(rules) if r.origin == ACTIVATION_ORIGIN]
        if act:
            rest = None
            for k, n in enumerate(tensors):
                if matched[k] is rules[act[0]] and not _activation_scale(n, tensors[n]):
                    rest = rest or replace(self.config, rules=rules[: act[0]] + rules[act[0] + 1 :])
                    matched[k] = rest.rule_for(prefix.rewrite(n))
        return matched

    def _quiet_model(self) -> Mapping[str, object] | None:
        """config.json when there is a readable one (for the prefix's MTP note), else None."""
        if self._model is not None:
            return self._model
        try:
            return model_config(Path(self.catalogue.root))
        except LoadError:
            return None

    def notes(self) -> list[str]:
        """What ``plan`` prints and the report keeps: the prefix found, the KV-cache scale census, the
        activation scales."""
        out = [self.prefix.describe()] if self.prefix.found is not None else []
        out += self.census.describe()
        if self.census and self.config.kv_scales == "report":
            out += [
                f'{p} (reported: config {self.config.name} has kv_scales = "report")'
                for p in self.census.problems()
            ]
        if self.activation_scales:
            skipped = set(self.skipped)
            n, off = len(self.activation_scales), sum(a in skipped for a in self.activation_scales)
            out.append(
                f"activation scales: {n:,} single-value *.input_scale tensors (4 B stored, a {SLOT_ALIGN} B "
                f"arena slot, one tensor and one hash each when served: {n * SLOT_ALIGN / 2**20:,.2f} MiB of "
                f"slots per rank holding them all); "
                + (f"{off:,} skipped" if off else "served (--skip-activation-scales skips them)")
            )
        return out

    def _classify(self) -> tuple[list[_Entry], list[str], list[str], dict[str, tuple[str, int]]]:
        """Entries, skipped and deferred tensors (natural order), and the deferred experts; or a
        ConfigError listing every problem. Scales are found in the catalogue's own order, and only
        the rest is sorted: half the names of a quantized checkpoint are scales."""
        tensors = self.catalogue.tensors
        rules, unresolved, needs, matched = self._rules(tensors)
        scales = {
            m for needed in needs.values() for m in needed
        }  # auto's scales: found as it resolved
        scaled = {role for role, c in self._codecs.items() if c.scaled}
        first: list[tuple[str, str]] = []  # (weight, problem), in the catalogue's order
        broken: set[str] = set()
        for n, r in rules.items():
            if r is not None and r.role in scaled and n not in needs:
                needed = _scale_names(n, r)
                missing = [m for m in needed if m not in tensors]
                if not n.endswith(r.suffix):
                    first.append(
                        (
                            n,
                            f"tensor {escape_name(n)}: {r.describe()} is {r.role} but the name does not end "
                            f"in {r.suffix}",
                        )
                    )
                elif missing:
                    first.append(
                        (
                            n,
                            f"tensor {escape_name(n)}: {r.describe()} needs its scale "
                            f"{escape_name(missing[0])}, which the checkpoint lacks",
                        )
                    )
                else:
                    scales.update(needed)
                    needs[n] = needed
                    continue
                broken.add(n)
        problems = [why for _, why in sorted(first, key=lambda nw: natural_key(nw[0]))]
        if self.config.kv_scales == "strict":
            problems += [
                f'{p} (refused: set kv_scales = "report" in the config to load it anyway)'
                for p in self.census.problems()
            ]
        if any(r.role in ("skip", "defer") for r in self.config.rules):
            problems += _scale_globs(rules, needs)
        entries, skipped, deferred, unmatched = [], [], [], []
        deferred_experts: dict[str, tuple[str, int]] = {}
        grouped: dict[str, list[str]] = {}
        for n in sorted(
            (n for n in tensors if n not in scales and n not in broken), key=natural_key
        ):
            r = rules[n]
            if n in unresolved:
                grouped.setdefault(unresolved[n], []).append(tensors[n].describe())
            elif r is None:
                unmatched.append(escape_name(n))
            elif r.role == "skip":
                skipped.append(n)
            elif r.role == "defer":
                deferred.append(n)
                if x := self._expert_of(n, r):
                    deferred_experts[n] = x
            elif (e := self._entry(n, r, needs.get(n), grouped)) is not None:
                entries.append(e)
        for reason, listed in grouped.items():
            problems.append(f"{reason}: {_listing(listed)}")
        if unmatched:
            problems.append(
                f"{len(unmatched)} tensors match no rule of {self.config.name} (add a rule; a final "
                f'match = "*" with role = "auto" keeps the rest whole): {_grouped(unmatched)}'
            )
        # a rule no tensor matches first may still match one a rule before it took
        idle = [
            r.describe()
            for r in self.config.rules
            if r.origin
            and r.origin != ACTIVATION_ORIGIN
            and id(r) not in matched
            and not any(r.matches(n) or r.matches(self.prefix.rewrite(n)) for n in tensors)
        ]
        if idle:
            problems.append(
                f"{', '.join(idle)} matched no tensor of {escape_name(self.catalogue.root)} (a typo? "
                "the names are in the index)"
            )
        if (
            not problems and not entries and not deferred
        ):  # a load of nothing would pass every check
            problems.append(
                f"nothing to load: {_nothing(self.config.rules, skipped, self.catalogue.root)}; a load "
                "serves at least one tensor (narrow the skip globs)"
            )
        raise_all(
            ConfigError,
            problems,
            what=f"problems fitting config {self.config.name} to {escape_name(self.catalogue.root)}",
        )
        return entries, skipped, deferred, deferred_experts

    def _entry(
        self, name: str, rule: Rule, needed: list[str] | None, grouped: dict[str, list[str]]
    ) -> _Entry | None:
        """Classify one tensor under its rule (``needed``: its scales' names, for a scaled codec), or file
        why it does not fit under (rule, reason)."""
        tensors = self.catalogue.tensors
        meta = tensors[name]
        expert = self._expert_of(name, rule) if rule.experts and not rule.stacked else None
        if expert is None and rule.experts and not rule.stacked:
            grouped.setdefault(
                f"{rule.describe()}: experts = true but expert_pattern "
                f"{self.config.expert_pattern!r} finds no index in",
                [],
            ).append(meta.describe())
            return None
        scale = tensors[needed[0]] if needed else None
        scale2 = tensors[needed[1]] if needed and len(needed) > 1 else None
        # A class: what the cuts depend on (the rule, resolved once per pick, so its id is enough;
        # the formats and shapes): the 256 experts of a layer are one, fitted once.
        key = (
            id(rule),
            meta.dtype,
            meta.shape,
            scale and (scale.dtype, scale.shape),
            scale2 and (scale2.dtype, scale2.shape),
        )
        known = self._classes.get(key)
        if known is None:
            known = self._classes[key] = self._class(rule, meta, scale, scale2)
        fit, klass, stacked = known
        if isinstance(fit, str):
            detail = (
                f": scale {escape_name(scale.name)} is {scale.dtype} {list(scale.shape)}"
                if scale
                else ""
            )
            grouped.setdefault(f"{rule.describe()}: {fit}", []).append(meta.describe() + detail)
            return None
        if fit.weight is not meta:
            fit = Fit(meta, scale, fit.group, scale2, fit.stacked)
        return _Entry(name, rule, self._codecs[rule.role], fit, expert, stacked, klass)

    def _class(
        self, rule: Rule, meta: TensorMeta, scale: TensorMeta | None, scale2: TensorMeta | None
    ) -> tuple[Fit | str, int, int]:
        """The fit of a class's first tensor (or why it does not fit), the class's number and its stacked experts."""
        codec = self._codecs[rule.role]
        # A fit depends on the formats and shapes only (not on the rule's names): fitted once for all rules.
        key = (
            codec.name,
            rule.block,
            rule.split,
            rule.stacked,
            meta.dtype,
            meta.shape,
            scale and (scale.dtype, scale.shape),
            scale2 and (scale2.dtype, scale2.shape),
        )
        fit = self._fits.get(key)
        if fit is None:
            fit = self._fits[key] = codec.fit(
                meta, scale, block=rule.block, split=rule.split, scale2=scale2, stacked=rule.stacked
            )
        if isinstance(fit, str):
            return fit, -1, 0
        stacked = meta.shape[0] if rule.stacked and rule.experts else 0
        return fit, self._klasses.setdefault((id(rule), key, stacked), len(self._klasses)), stacked

    def _resolve_units(self, rule: Rule) -> int:
        """A rule's head count: the number it gives, or its config.json field's value."""
        if isinstance(rule.units, int):
            return rule.units
        if self._model is None:
            self._model = read_model_config(
                self.catalogue.root,
                why=f"{rule.describe()} counts heads by its field {rule.units!r}",
            )
        value = self._model.get(rule.units)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"{rule.describe()} counts heads by config.json's {rule.units!r}, which is "
                f"{'missing' if value is None else repr(value)} in {escape_name(self.catalogue.root)} "
                "(expected a positive integer)"
            )
        return value

    def _expert_of(self, name: str, rule: Rule | None) -> tuple[str, int] | None:
        """(expert set, index) of an expert-parallel tensor; None when the rule is not
        expert-parallel or the name has no expert index."""
        m = (
            self.config.expert_regex.search(name)
            if rule is not None and rule.experts and not rule.stacked
            else None
        )
        return (name[: m.start()], int(m.group(1))) if m and len(m.group(1)) < 19 else None

    def _count_experts(self) -> dict[str, list[int]]:
        sets: dict[str, set[int]] = {}
        for key, index in [e.expert for e in self.entries if e.expert] + list(
            self.deferred_experts.values()
        ):
            sets.setdefault(key, set()).add(index)
        return {k: sorted(v) for k, v in sets.items()}

    # -- windows -------------------------------------------------------------------------------

    def _cuts(self, e: _Entry, layout: Layout, rank: int) -> tuple[Cut, Cut | None] | str:
        """This rank's window of the weight (and scale), or why the layout cannot cut it."""
        group, tpr = layout.position(rank)
        align = e.rule.align or (self.config.channel_align if e.codec.tiled else 0)
        experts = (
            share(e.stacked_experts, layout.ep, group)
            if e.stacked_experts and layout.ep > 1
            else None
        )
        units = self._units.get((e.rule.index, e.rule.match), 0)
        if units and units < layout.tp and not e.rule.share_units:
            return f"{units} units / tp {layout.tp}: tp must divide them (they are not shared between ranks)"
        return e.codec.window(
            e.fit,
            e.rule.split,
            layout.tp,
            tpr,
            align=align,
            units=units,
            uneven=e.rule.uneven,
            experts=experts,
        )

    def owns(self, expert: tuple[str, int] | None, layout: Layout, group: int) -> bool:
        """Does expert-parallel group ``group`` hold this expert? (the last group takes the remainder)"""
        if expert is None or layout.ep == 1:
            return True
        positions = self._expert_pos[expert[0]]
        return part_of(positions[expert[1]], len(positions), layout.ep) == group

    # -- layouts -------------------------------------------------------------------------------

    def layout_problems(self, layout: Layout) -> list[str]:
        """Every reason this tp x ep layout cannot be cut (empty when it can)."""
        problems = []
        for key, experts in self.expert_counts.items():
            if len(experts) < layout.ep:
                problems.append(
                    f"expert set {escape_name(key)}* has {len(experts)} experts, fewer than ep {layout.ep}"
                )
        # A class's first entry stands for all of it: the others are cut alike, and the first entry
        # of a class that fails is the first entry that fails.
        for e in self._firsts:
            if 0 < e.stacked_experts < layout.ep:
                problems.append(
                    f"tensor {e.fit.weight.describe()} stacks {e.stacked_experts} experts, fewer than "
                    f"ep {layout.ep}"
                )
                break
        seen_rules: set[tuple[int, str]] = set()
        tried: set[tuple] = set()
        for e in self._firsts:
            # a tensor of the same rule, codec, shape and dtypes as one already tried cuts the same way
            like = (
                e.rule.index,
                e.rule.origin,
                e.codec.name,
                e.fit.group,
                e.fit.weight.shape,
                e.fit.weight.dtype,
                e.fit.scale.shape if e.fit.scale else None,
            )
            if like in tried:
                continue
            tried.add(like)
            why = self._cuts(e, Layout(layout.tp), 0)
            if isinstance(why, str) and (e.rule.index, why) not in seen_rules:
                seen_rules.add((e.rule.index, why))
                problems.append(
                    f"tensor {e.fit.weight.describe()} under {e.rule.describe()}: {why}"
                )
        return problems

    def working_tps(self, limit: int = SUGGEST_UP_TO) -> list[int]:
        """The tp values (up to ``limit``, itself bounded) that cut every tensor."""
        return [
            t
            for t in range(1, min(limit, SUGGEST_UP_TO) + 1)
            if not self.layout_problems(Layout(t))
        ]

    def check_layout(self, layout: Layout, world: int) -> None:
        """Raise a LayoutError naming what fails and which layouts would work."""
        problems = []
        if layout.world != world:
            problems.append(
                f"tp {layout.tp} x ep {layout.ep} = {layout.world} ranks, but the group has {world}"
            )
        problems += self.layout_problems(layout)
        if not problems:
            return
        tps = self.working_tps(max(world, min(layout.tp, SUGGEST_UP_TO)))
        splits = [
            f"--tp {t} --ep {world // t}"
            for t in tps
            if world % t == 0 and not self.layout_problems(Layout(t, world // t))
        ]
        hint = f"tp values that cut this checkpoint: {', '.join(map(str, tps)) or 'none'}"
        hint += f"; for {world} ranks use " + (
            " or ".join(splits) if splits else "another world size"
        )
        raise LayoutError(
            f"cannot load with tp {layout.tp} x ep {layout.ep} on {world} ranks:\n  - "
            + "\n  - ".join(problems)
            + f"\n{hint}"
        )

    # -- plans ---------------------------------------------------------------------------------

    def plan(self, layout: Layout, kind: str, rank: int) -> RankPlan:
        """Rank ``rank``'s plan (made once per layout, kind and rank; plans are immutable)."""
        key = (layout, kind, rank)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make(layout, kind, rank)
        return plan

    def _entries_of(
        self, layout: Layout, group: int
    ) -> tuple[list[_Entry], list[int], dict[int, _Entry], tuple[str, ...]]:
        """The entries expert-parallel group ``group`` holds, their classes, each class's first
        entry, and the deferred tensors it locates (found once per group, not per rank)."""
        key = (layout.ep, group)
        owned = self._owned.get(key)
        if owned is None:
            held = self._held.get(layout.ep)
            if held is None:
                held = self._held[layout.ep] = self._share_out(layout.ep)
            entries = held[group]
            klasses = [e.klass for e in entries]
            first: dict[int, _Entry] = {}
            for e in entries:
                first.setdefault(e.klass, e)
            deferred = tuple(
                n for n in self.deferred if self.owns(self.deferred_experts.get(n), layout, group)
            )
            owned = self._owned[key] = (entries, klasses, first, deferred)
        return owned

    def _share_out(self, ep: int) -> list[list[_Entry]]:
        """The entries each of ``ep`` groups holds, in order, from one pass over them all (an expert's group
        is arithmetic on its position: :meth:`owns` asked of every group would cost ``ep`` passes)."""
        held: list[list[_Entry]] = [[] for _ in range(ep)]
        for e in self.entries:
            if e.expert is None or ep == 1:
                for h in held:
                    h.append(e)
                continue
            positions = self._expert_pos[e.expert[0]]
            held[part_of(positions[e.expert[1]], len(positions), ep)].append(e)
        return held

    def _shaped(self, e: _Entry, layout: Layout, rank: int, kind: str) -> _Shaped | str:
        """The cuts and served tensors of ``e``'s class on this rank (or why the layout cannot cut it)."""
        group, tpr = layout.position(rank)
        experts = group if e.stacked_experts else None
        key = (e.klass, layout.tp, layout.ep if experts is not None else 1, tpr, experts, kind)
        shaped = self._shapes.get(key)
        if shaped is None:
            shaped = self._shapes[key] = self._shape(e, layout, rank, kind)
        return shaped

    def _shape(self, e: _Entry, layout: Layout, rank: int, kind: str) -> _Shaped | str:
        cuts = self._cuts(e, layout, rank)
        if isinstance(cuts, str):
            return cuts
        f = e.fit
        served = tuple(
            (dtype, shape, nbytes)
            for _, dtype, shape, nbytes in e.codec.served(f, cuts[0], cuts[1], kind)
        )
        scale2 = whole(f.scale2) if f.scale2 is not None else None
        read = (
            cuts[0].nbytes + (cuts[1].nbytes if cuts[1] else 0) + (scale2.nbytes if scale2 else 0)
        )
        return _Shaped(
            cuts[0][1:],
            cuts[1][1:] if cuts[1] else None,
            scale2[1:] if scale2 else None,
            served,
            e.rule.describe(),
            read,
            sum(_slot(n) for _, _, n in served),
            served[0][2] * 2 if e.codec.scaled else 0,
        )

    def _make(self, layout: Layout, kind: str, rank: int) -> RankPlan:
        if kind not in KINDS:
            raise ConfigError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        group = layout.position(rank)[0]
        entries, klasses, first, deferred = self._entries_of(layout, group)
        table, arenas = {}, {}
        for (
            k,
            e,
        ) in (
            first.items()
        ):  # classes in order of first appearance: the first tensor that fails is named
            shaped = self._shaped(e, layout, rank, kind)
            if isinstance(shaped, str):
                raise LayoutError(
                    f"rank {rank}: tensor {escape_name(e.name)} under {e.rule.describe()}: {shaped}"
                )
            table[k], arenas[k] = shaped, shaped.arena
        shapes = list(map(table.__getitem__, klasses))
        offsets = list(itertools.accumulate(map(arenas.__getitem__, klasses), initial=0))
        arena = offsets.pop()
        return RankPlan(
            rank, layout, kind, entries, shapes, offsets, tuple(self.skipped), deferred, arena
        )


def share(n: int, parts: int, k: int) -> tuple[int, int]:
    """Part ``k`` of ``n`` things shared by ``parts`` in order: equal parts, the last taking the remainder
    (how expert parallelism shares experts out)."""
    per = n // parts
    return k * per, (n if k == parts - 1 else (k + 1) * per)


def part_of(i: int, n: int, parts: int) -> int:
    """The part that thing ``i`` of ``n`` falls in when :func:`share` shares them out (its inverse)."""
    per = n // parts
    return min(i // per, parts - 1) if per else parts - 1


def read_model_config(root: Path, *, why: str) -> dict:
    """The checkpoint's config.json (model dimensions), or a ConfigError saying why it is needed."""
    doc = model_config(root)
    if doc is None:
        raise ConfigError(
            f"{why}, but {escape_name(root)} has no config.json (copy the model's config.json "
            "beside its shards)"
        )
    return doc


def _activation_scale(name: str, meta: TensorMeta) -> bool:
    """A ModelOpt activation scale: ``*.input_scale`` holding one value (0-d, or [1])."""
    return name.endswith(".input_scale") and math.prod(meta.shape) == 1


def _scale_globs(rules: Mapping[str, Rule | None], needs: Mapping[str, list[str]]) -> list[str]:
    """Skip or defer rules that are the first match of scale tensors whose weight is served: a scale
    goes wherever its weight goes, so such a rule would do nothing (and say "skipped 0")."""
    taken: dict[int, tuple[Rule, list[tuple[str, str]]]] = {}
    for weight, scales in needs.items():
        for m in scales:
            r = rules.get(m)
            if r is not None and r.role in ("skip", "defer"):
                taken.setdefault(id(r), (r, []))[1].append((m, weight))
    out = []
    for r, pairs in taken.values():
        pairs.sort(key=lambda mw: natural_key(mw[0]))
        m, w = pairs[0]
        out.append(
            f"{r.describe()} matches {len(pairs)} scale tensor(s) of weights it does not {r.role} (e.g. "
            f"{escape_name(m)}, the scale of {escape_name(w)}): scales follow their weights, so {r.role} the "
            f"weights instead (e.g. {escape_name(w)!r})"
        )
    return out


def _nothing(rules: tuple[Rule, ...], skipped: list[str], root: object) -> str:
    """Which rules left nothing to load, for the message."""
    globs = [r.describe() for r in rules if r.role == "skip"]
    if globs and skipped:
        return f"every tensor of {escape_name(root)} is skipped ({len(skipped)} tensors, by {', '.join(globs)})"
    return f"{escape_name(root)} has no tensor to serve"


def _scale_names(weight: str, rule: Rule) -> list[str]:
    """The scale tensors a scaled weight needs: its suffix replaced by the rule's ``scale`` (and ``scale2``)."""
    stem = weight[: -len(rule.suffix)] if weight.endswith(rule.suffix) else weight
    return [stem + rule.scale] + ([stem + rule.scale2] if rule.scale2 else [])


def _grouped(names: list[str]) -> str:
    """Names grouped by their shape with numbers as N (``model.layers.N.mlp.x.weight (58)``): a real
    checkpoint's thousands of unmatched tensors are a few classes."""
    groups: dict[str, int] = {}
    for n in names:
        key = re.sub(r"\d+", "N", n)
        groups[key] = groups.get(key, 0) + 1
    ranked = sorted(groups.items(), key=lambda kc: -kc[1])  # the biggest classes first
    return _listing([k if c == 1 else f"{k} ({c})" for k, c in ranked])


def _listing(names: list[str], limit: int = 12) -> str:
    """``a, b, c (and N more)``: long lists stay readable in one error line."""
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused (and restored, even on error). Planning makes about a
    million small acyclic objects for a 92,000-tensor checkpoint, and the collector's passes over
    them cost more than making them (64 plans of DeepSeek-V3: 21 s with it, 9 s without)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            _promote_survivors()
            gc.enable()


def _promote_survivors() -> None:
    """Move every tracked object to the oldest generation without a collection pass.

    Re-enabled as it was, the collector would start with one young pass over everything made while
    it was paused (25,000 tiny tensors: 550,000 objects, 0.3 s), only to promote the survivors, which
    live as long as the loaded weights. ``freeze`` then ``unfreeze`` moves them to the oldest
    generation in one step; cyclic garbage among them is still found by the next full collection.
    Skipped when the process froze objects itself (``unfreeze`` would thaw them too)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


@contextlib.contextmanager
def planning(root: str | os.PathLike, config: Config, layout: Layout) -> Iterator[Planner]:
    """An offline planner of ``root`` (its storage closed once the tensors are classified), the layout
    checked, the collector paused while it is used."""
    from .storage import open_storage

    with paused_gc():
        storage = open_storage(root, tp=layout.tp, ep=layout.ep, rank=0, world=layout.world)
        try:
            planner = Planner(storage.catalogue, config)
        finally:
            storage.close()
        planner.check_layout(layout, layout.world)
        yield planner
