"""Classification: each stored tensor of a catalogue under a config's rules, once for every layout.

A tensor's first matching rule (``auto`` ones resolved by its dtype and the scale tensors beside
it) makes it an entry (a weight, its scales folded in), a skipped or a deferred tensor; every
problem found is raised at once. Entries cut alike on every rank (the rule, the codec, the dtypes
and the shapes) share a class: the 256 experts of a layer are one, fitted once. The expert-parallel
columns say which expert set each entry belongs to and where in it, so a layout shares them out in
one pass over arrays.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..codecs import registry
from ..codecs.base import Codec
from ..codecs.plain import KV_SCALE, PLAIN
from ..model.errors import ConfigError, raise_all
from ..model.meta import HeaderFields, TensorMeta
from ..model.modes import Role
from ..model.table import Templates, TensorTable, templates
from ..model.templates import natural_key
from ..model.text import escape_name, plural
from ..selection.config import (
    ACTIVATION_ORIGIN,
    AUTO,
    READS_NOTHING,
    Config,
    Rule,
)
from ..selection.kvscales import Census
from ..selection.kvscales import census as kv_census
from ..selection.prefix import Prefix
from .entries import Columns, Entries, Entry, Klass
from .templated import Join, first_rules, keyed


@dataclass(frozen=True, eq=False)
class Classified:
    """A catalogue classified under a config."""

    entries: Entries
    skipped: tuple[str, ...]
    deferred: tuple[str, ...]
    deferred_experts: dict[str, tuple[str, int]]
    """Deferred expert tensors: located only by the ep group holding the expert."""
    units: dict[tuple[int, str], int]
    """Each rule that counts heads (by its place and glob, which an ``auto`` rule's resolved forms
    keep): its head count."""
    expert_counts: dict[str, list[int]]
    """Each expert set: its expert indices, ascending."""
    expert_at: np.ndarray
    """Per entry: its expert's position in its set, and the set's size (columns 0, 1); (0, 0) for
    an entry every ep group holds."""
    deferred_at: np.ndarray
    """The same for each deferred tensor: a deferred expert is located only by its ep group."""
    census: Census
    """The KV-cache scale census of what the load serves or defers (not of what it skips)."""

    @functools.cached_property
    def firsts(self) -> list[Entry]:
        """The first entry of each class, in order: the others cut as it does."""
        return self.entries.firsts()


def classify(
    tensors: Mapping[str, TensorMeta],
    config: Config,
    *,
    prefix: Prefix,
    model: Mapping[str, object] | None,
    root: os.PathLike[str],
    table: TensorTable,
) -> Classified:
    """Entries, skipped and deferred tensors (natural order), the expert columns and the KV-cache
    scale census; or a ConfigError listing every problem.
    ``model``: the checkpoint's config.json, for rules that count heads by one of its fields;
    ``table``: the same tensors as columns (its rows taken in the tensors' order if they are
    not)."""
    units = {(r.index, r.match): _units(r, model, root) for r in config.rules if r.units}
    found = _sorted(tensors, config, prefix, _aligned(tensors, table), root)
    entries = Entries(found.rows, found.fitted.classes, tensors)
    deferred, deferred_experts = found.deferred, found.deferred_experts
    counts, at = entries.experts(deferred_experts)
    positions = {k: {x: i for i, x in enumerate(v)} for k, v in counts.items()}
    deferred_at: np.ndarray = np.zeros((len(deferred), 2), dtype=np.int64)
    for k, n in enumerate(deferred):
        if (x := deferred_experts.get(n)) is not None:
            deferred_at[k] = positions[x[0]][x[1]], len(counts[x[0]])
    return Classified(
        entries,
        tuple(found.skipped),
        tuple(deferred),
        deferred_experts,
        units,
        counts,
        at,
        deferred_at,
        found.census,
    )


@dataclass
class _Fitted:
    """The classes found so far, and what each class key gave: its class's number, or why it does
    not fit. A key is what the cuts depend on (:func:`_class`'s: the rule and codec, by identity,
    and the dtypes and shapes of the weight and its scales)."""

    classes: list[Klass] = field(default_factory=list)
    by_key: dict[tuple[object, ...], int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Parts:
    """What a classification finds before its entries are made."""

    rows: Columns
    """The served rows."""
    fitted: _Fitted
    """Their classes."""
    skipped: list[str]
    deferred: list[str]
    deferred_experts: dict[str, tuple[str, int]]
    census: Census


def _refused(config: Config, census: Census) -> list[str]:
    """What a strict config refuses in the KV-cache scale census, worded (none for another)."""
    if config.kv_scales != "strict":
        return []
    return [
        f'{p} (refused: set kv_scales = "report" in the config to load it anyway)'
        for p in census.problems()
    ]


def _raise(problems: list[str], config: Config, root: os.PathLike[str]) -> None:
    """A ConfigError listing every problem, if there is one."""
    raise_all(
        ConfigError,
        problems,
        what=f"problems fitting config {config.name} to {escape_name(root)}",
    )


def _sorted(
    tensors: Mapping[str, TensorMeta],
    config: Config,
    prefix: Prefix,
    table: TensorTable,
    root: os.PathLike[str],
) -> _Parts:
    """The classification as columns, once per name template (a name the templates cannot read is
    one of its own): each row's first rule (planning/templated.py), its ``auto``
    rule resolved and its scales found by template and parameters (one join a template and way),
    the class keys as numbers. Then every problem, worded name by name for the rows flagged with
    one only, in this order: weights of a scaled rule lacking their suffix or a scale (natural
    order), a strict config's KV-cache refusals, skip or defer rules taking a served
    weight's scale, the flagged rows' reasons (grouped, in order of first appearance in natural
    order: no way resolves them, an expert with no index, a class that does not fit), tensors no
    rule matches, idle run-time rules, nothing to load."""
    tpl = table.templates
    rules = config.rules
    names, shapes = table.names, table.shapes
    n = len(table)
    first = _first_rules(
        config,
        prefix,
        names,
        tpl,
        lambda k: names[k].endswith(".input_scale") and math.prod(shapes[k]) == 1,
    )  # a ModelOpt activation scale: *.input_scale holding one value (0-d, or [1])
    scaled = registry.scaled_roles()
    made = _Made()
    # each row's rule as a code into made.rules; -1 where no rule matches, which the last place
    # of each per-rule column (_per_rule's) answers
    rule_of: np.ndarray = np.asarray([*[made.code(r) for r in rules], -1], np.int64)[first]
    s1: np.ndarray = np.full(n, -1, np.int64)
    s2: np.ndarray = np.full(n, -1, np.int64)
    join = Join(tpl, names)
    unresolved = _resolved(config, table, join, first, made, rule_of, (s1, s2), scaled)
    broken = _outright(table, join, made, rule_of, (s1, s2), scaled)
    roles = [r.role for r in made.rules]
    problems = [_lacking(names[k], made.rules[int(rule_of[k])], table.row) for k in broken]
    # the census of what is served or deferred, from the attention layers' names only (every name
    # selection/kvscales.py's patterns read holds "attn", which no digit run can split)
    attn = np.asarray([any("attn" in part for part in text) for text in tpl.texts], bool)
    in_attn = attn[tpl.ids]
    skip = _per_rule(role == Role.SKIP for role in roles)
    census = kv_census(
        list(map(names.__getitem__, np.flatnonzero(in_attn & ~skip[rule_of]).tolist()))
    )
    problems += _refused(config, census)
    scale: np.ndarray = np.zeros(n, bool)
    scale[s1[s1 >= 0]] = True
    scale[s2[s2 >= 0]] = True
    aside = _per_rule(role in READS_NOTHING for role in roles)
    if aside[rule_of[scale]].any():
        problems += _taken_scales(
            table, config, made, first, rule_of, (s1, s2), scale & aside[rule_of]
        )
    leave = scale.copy()  # the rest: each row but the scales and the weights lacking theirs
    leave[broken] = True
    rest = table.order[~leave[table.order]]
    kind = rule_of[rest]
    skipped = list(map(names.__getitem__, rest[skip[kind]].tolist()))
    put = rest[_per_rule(r == Role.DEFER for r in roles)[kind]]
    deferred = list(map(names.__getitem__, put.tolist()))
    expert_rx = config.expert_regex
    sets, index, lost = _experts(table, made, rule_of[put], put, expert_rx)
    deferred_experts = {
        d: (x, i)
        for d, x, i, gone in zip(deferred, sets, index, lost.tolist(), strict=True)
        if x is not None and not gone
    }
    unmatched = first[rest] == len(rules)
    unsure: np.ndarray = np.zeros(n, bool)
    unsure[unresolved] = True
    flagged: dict[int, tuple[str, str]] = {  # each flagged row: its reason and its words
        k: (
            f"{rules[int(first[k])].describe()}: {config.declined(table.dtype_names[k])}",
            tensors[names[k]].describe(),
        )
        for k in unresolved
        if not scale[k]  # a scale no way resolves goes with its weight
    }
    served = rest[~aside[kind] & ~unmatched & ~unsure[rest]]
    fitted = _Fitted()
    rows = _served_columns(
        tensors,
        table,
        made,
        rule_of[served],
        served,
        (s1[served], s2[served]),
        census,
        expert_rx,
        fitted,
        flagged,
    )
    if flagged:
        grouped: dict[str, list[str]] = {}
        for k in rest.tolist():
            if (got := flagged.get(k)) is not None:
                grouped.setdefault(got[0], []).append(got[1])
        problems += [f"{reason}: {_listing(listed)}" for reason, listed in grouped.items()]
    if unmatched.any():
        off = [escape_name(names[k]) for k in rest[unmatched].tolist()]
        problems.append(
            f"{plural(len(off), 'tensor')} {'matches' if len(off) == 1 else 'match'} "
            f"no rule of {config.name} (add a rule; a final "
            f'match = "*" with role = "auto" keeps the rest whole): {_grouped(off)}'
        )
    problems += _idle(config, names, prefix, first, root)
    if not problems and not rows.names and not deferred:  # a load of nothing would pass every check
        problems.append(
            f"nothing to load: {_nothing(rules, skipped, root)}; a load serves at least "
            "one tensor (narrow the skip globs)"
        )
    _raise(problems, config, root)
    return _Parts(rows, fitted, skipped, deferred, deferred_experts, census)


def _per_rule(values: Iterable[bool]) -> np.ndarray:
    """A column over made.rules' codes, indexed by ``rule_of``: False for -1 (no rule matches)."""
    result: np.ndarray = np.asarray([*values, False], bool)
    return result


def _lacking(name: str, rule: Rule, row: Mapping[str, int]) -> str:
    """A weight of a scaled rule given outright (:func:`_outright` flags it): its problem."""
    if not name.endswith(rule.suffix):
        why = f"{rule.describe()} is {rule.role} but the name does not end in {rule.suffix}"
    else:
        missing = [m for m in _scale_names(name, rule) if m not in row]
        why = (
            f"{rule.describe()} needs its scale {escape_name(missing[0])}, which the "
            "checkpoint lacks"
        )
    return f"tensor {escape_name(name)}: {why}"


def _taken_scales(
    table: TensorTable,
    config: Config,
    made: _Made,
    first: np.ndarray,
    rule_of: np.ndarray,
    scales: tuple[np.ndarray, np.ndarray],
    taken: np.ndarray,
) -> list[str]:
    """The skip or defer rules that take served weights' scales (``taken``: those scales' rows),
    worded by :func:`_scale_globs` over the weights in the order it reads them: those an ``auto``
    rule resolved, then those of rules given outright, each in the table's order."""
    names = table.names
    s1, s2 = scales
    weights = np.flatnonzero(
        ((s1 >= 0) & taken[np.maximum(s1, 0)]) | ((s2 >= 0) & taken[np.maximum(s2, 0)])
    )
    auto = np.asarray([*[r.role == AUTO for r in config.rules], False], bool)[first]
    weights = weights[np.argsort(~auto[weights], kind="stable")]
    needs = {
        names[w]: (names[s1[w]],) if s2[w] < 0 else (names[s1[w]], names[s2[w]])
        for w in weights.tolist()
    }
    rules = {names[m]: made.rules[int(rule_of[m])] for m in np.flatnonzero(taken).tolist()}
    return _scale_globs(rules, needs)


def _first_rules(
    config: Config,
    prefix: Prefix,
    names: Sequence[str],
    tpl: Templates,
    single: Callable[[int], bool],
) -> np.ndarray:
    """Each name's first rule as its index (``len(rules)``: none), by template (``tpl``: the
    names'; the rewritten names have their own): the config's rules see the name rewritten into
    the config's prefix (selection/prefix.py), a rule given at run time (``--skip``) its stored
    name too, and the activation-scale switch's rule takes single-value tensors only (``single``:
    whether the name at that place holds one value); the others it matched are matched again
    without it."""
    rules = config.rules
    none = len(rules)
    rewrites = prefix.rewrites
    seen = list(map(prefix.rewrite, names)) if rewrites else names
    first = first_rules(seen, rules, templates(seen) if rewrites else tpl)
    given = [i for i, r in enumerate(rules) if r.origin] if rewrites else []
    if given:
        got = first_rules(names, [rules[i] for i in given], tpl)
        first = np.minimum(first, np.asarray([*given, none], np.int64)[got])
    act = [i for i, r in enumerate(rules) if r.origin == ACTIVATION_ORIGIN]
    if act:
        a = act[0]
        others = np.asarray(
            [k for k in np.flatnonzero(first == a).tolist() if not single(k)], np.int64
        )
        if len(others):
            again = [seen[k] for k in others.tolist()]
            got = first_rules(again, rules[:a] + rules[a + 1 :], templates(again))
            first[others] = got + (got >= a)  # the places after the switch's rule, and none
    return first


class _Made:
    """The distinct rules a classification gives its rows (matched or resolved), numbered."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self._codes: dict[int, int] = {}

    def code(self, rule: Rule) -> int:
        c = self._codes.get(id(rule))
        if c is None:
            c = self._codes[id(rule)] = len(self.rules)
            self.rules.append(rule)
        return c


def _outright(
    table: TensorTable,
    join: Join,
    made: _Made,
    rule_of: np.ndarray,
    scales: tuple[np.ndarray, np.ndarray],
    scaled: frozenset[str],
) -> np.ndarray:
    """The scales' rows of the weights of scaled rules given outright, into ``scales``, once per
    (rule, template): the rows whose rule (matched, or an ``auto``
    one resolved by a way with no scale tensors) is scaled and has no scales yet. Returns the rows
    whose name lacks the rule's suffix or whose scale is missing (their problems), in natural
    order; they get no scales."""
    s1, s2 = scales
    outright = _per_rule(r.role in scaled for r in made.rules)
    rows = np.flatnonzero(outright[rule_of] & (s1 < 0))
    bad: np.ndarray = np.zeros(len(table), bool)
    if len(rows):
        ids, width_t = join.tpl.ids, len(join.tpl.texts)
        groups, at = np.unique(rule_of[rows] * width_t + ids[rows], return_inverse=True)
        for g, k in enumerate(groups.tolist()):
            mine, rule, t = rows[at == g], made.rules[k // width_t], k % width_t
            fine = _ends(table.names, mine, rule.suffix)
            one = join.renamed(mine, t, rule.suffix, rule.scale)
            fine &= one >= 0
            two = None
            if rule.scale2:
                two = join.renamed(mine, t, rule.suffix, rule.scale2)
                fine &= two >= 0
            bad[mine[~fine]] = True
            s1[mine[fine]] = one[fine]
            if two is not None:
                s2[mine[fine]] = two[fine]
    got: np.ndarray = table.order[bad[table.order]]
    return got


def _resolved(
    config: Config,
    table: TensorTable,
    join: Join,
    first: np.ndarray,
    made: _Made,
    rule_of: np.ndarray,
    scales: tuple[np.ndarray, np.ndarray],
    scaled: frozenset[str],
) -> list[int]:
    """Each ``auto`` row's rule resolved (Config.ways, in their order: the first way whose suffix
    the name ends in and whose scales exist; plain for a plain dtype) into ``rule_of`` and its
    scales' rows into ``scales``, once per (rule, dtype, template): a scale found by the join.
    Returns the rows that resolve to nothing (they keep their ``auto`` rule)."""
    auto = np.asarray([*[r.role == AUTO for r in config.rules], False], bool)  # last: no rule
    rows = np.flatnonzero(auto[first])
    left: list[int] = []
    if not len(rows):
        return left
    ids, width_d, width_t = join.tpl.ids, len(table.dtypes), len(join.tpl.texts)
    key = (first[rows] * width_d + table.dtype_code[rows]) * width_t + ids[rows]
    groups, at = np.unique(key, return_inverse=True)
    s1, s2 = scales
    for g, k in enumerate(groups.tolist()):
        open_ = rows[at == g]
        rule = config.rules[k // width_t // width_d]
        dtype, t = table.dtypes[(k // width_t) % width_d], k % width_t
        ways, plain = config.ways(rule, dtype)
        for p, m in ways:
            if not len(open_):
                break
            if not p.scaled:
                take = _ends(table.names, open_, p.suffix)
                one = two = None
            else:
                one = join.renamed(open_, t, p.suffix, p.scale)
                take = one >= 0
                two = join.renamed(open_, t, p.suffix, p.scale2) if p.scale2 else None
                if two is not None:
                    take &= two >= 0
            rule_of[open_[take]] = made.code(m)
            if one is not None and m.role in scaled:
                s1[open_[take]] = one[take]
                if two is not None:
                    s2[open_[take]] = two[take]
            open_ = open_[~take]
        if len(open_):
            if plain is None:
                left += open_.tolist()
            else:
                rule_of[open_] = made.code(plain)
    return left


def _ends(names: list[str], rows: np.ndarray, suffix: str) -> np.ndarray:
    """Which rows' names end in ``suffix``."""
    result: np.ndarray = np.fromiter(
        (names[k].endswith(suffix) for k in rows.tolist()), bool, len(rows)
    )
    return result


def _served_columns(
    tensors: Mapping[str, TensorMeta],
    table: TensorTable,
    made: _Made,
    rule_of: np.ndarray,
    served: np.ndarray,
    scales: tuple[np.ndarray, np.ndarray],
    census: Census,
    expert_rx: re.Pattern[str],
    fitted: _Fitted,
    flagged: dict[int, tuple[str, str]],
) -> Columns:
    """The served rows, their classes (into ``fitted``: each distinct key fitted once, at its first
    row, as :func:`_class` keys them), scales and experts. A row with a problem (an expert with
    no index, a class that does not fit) is filed in ``flagged`` with its reason and words."""
    names = table.names
    s1, s2 = scales
    codec_of = registry.by_role()
    codecs = [codec_of.get(r.role) for r in made.rules]  # None: a rule no served row has
    every = list(dict.fromkeys([*codecs, KV_SCALE]))
    kinds = {id(c): k for k, c in enumerate(every)}
    codec = np.asarray([kinds[id(c)] for c in codecs], np.int64)[rule_of]
    kv = census.engine_names()
    if kv:  # a KV-cache scale served plain has its values checked
        on = np.isin(served, [table.row[m] for m in kv if m in table.row])
        plain = np.asarray([c is PLAIN for c in codecs], bool)[rule_of]
        codec[on & plain] = kinds[id(KV_SCALE)]
    sigs: np.ndarray = np.asarray(table.signatures, np.int64)
    top = int(sigs.max()) + 2 if len(sigs) else 1
    parts = [
        (rule_of, len(made.rules)),
        (codec, len(kinds)),
        (sigs[served], top),
        (np.where(s1 >= 0, sigs[s1], -1) + 1, top),
        (np.where(s2 >= 0, sigs[s2], -1) + 1, top),
    ]
    firsts, at = keyed(parts, len(served))
    row, signature = table.row, table.signatures
    sig_of = lambda x: signature[row[x]]  # noqa: E731
    sets, index, lost = _experts(table, made, rule_of, served, expert_rx)
    klass: np.ndarray = np.zeros(len(firsts), np.int64)
    for u in np.argsort(firsts, kind="stable").tolist():  # in order of first appearance
        j = int(firsts[u])
        k = int(served[j])
        got = _class(
            names[k],
            made.rules[int(rule_of[j])],
            tensors,
            _need(names, int(s1[j]), int(s2[j])),
            every[int(codec[j])],  # type: ignore[arg-type]  # a served row's: a codec
            fitted,
            sig_of,
        )
        klass[u] = got if isinstance(got, int) else -1
    per_row = klass[at]
    for j in np.flatnonzero(lost | (per_row < 0)).tolist():  # the flagged rows only
        k, rule = int(served[j]), made.rules[int(rule_of[j])]
        if lost[j]:
            flagged[k] = (
                f"{rule.describe()}: experts = true but expert_pattern "
                f"{expert_rx.pattern!r} finds no index in",
                tensors[names[k]].describe(),
            )
            continue
        why = _class(
            names[k],
            rule,
            tensors,
            _need(names, int(s1[j]), int(s2[j])),
            every[int(codec[j])],  # type: ignore[arg-type]  # a served row's: a codec
            fitted,
            sig_of,
        )
        assert not isinstance(why, int)  # (its key's fit failed)
        flagged[k] = why
    rows = Columns()
    rows.extend_columns(
        list(map(names.__getitem__, served.tolist())),
        per_row.tolist(),
        [names[k] if k >= 0 else None for k in s1.tolist()],
        [names[k] if k >= 0 else None for k in s2.tolist()],
        sets,
        index,
    )
    return rows


def _need(names: list[str], one: int, two: int) -> tuple[str, ...] | None:
    """A row's scales' names (None: no scales)."""
    if one < 0:
        return None
    return (names[one],) if two < 0 else (names[one], names[two])


def _experts(
    table: TensorTable,
    made: _Made,
    rule_of: np.ndarray,
    rows: np.ndarray,
    expert_rx: re.Pattern[str],
) -> tuple[list[str | None], list[int], np.ndarray]:
    """Each row's expert set (None: not an expert) and index, and which expert-parallel rows have
    none (``lost``); ``rule_of``: the rows' rules. The pattern's group is the index, the name
    before its match the set (:func:`_expert_in`); the shipped pattern is read off the templates
    (:func:`_by_template`), another, which may read a run's digits, name by name."""
    wanted = np.asarray([r.experts and not r.stacked for r in made.rules], bool)[rule_of]
    sets: list[str | None] = [None] * len(rows)
    index = [0] * len(rows)
    lost: np.ndarray = np.zeros(len(rows), bool)
    at = np.flatnonzero(wanted)
    if not len(at):
        return sets, index, lost
    if expert_rx.pattern == DEFAULT_EXPERTS:
        cut, numbers, lost[at] = _by_template(table, rows[at], expert_rx)
    else:
        found = [_expert_in(expert_rx, table.names[k]) for k in rows[at].tolist()]
        lost[at] = [x is None for x in found]
        cut = [x[0] if x else "" for x in found]
        numbers = [x[1] if x else 0 for x in found]
    for k, x, i in zip(at.tolist(), cut, numbers, strict=True):
        sets[k], index[k] = x, i
    return sets, index, lost


DEFAULT_EXPERTS = r"experts\.(\d+)\."
"""The shipped configs' expert pattern: its literals are not digits and its group is a whole digit
run between two of them, so it finds the same run of every name of a template (one read whole:
its one name)."""
_POW10: np.ndarray = 10 ** np.arange(1, 19, dtype=np.int64)


def _by_template(
    table: TensorTable, rows: np.ndarray, expert_rx: re.Pattern[str]
) -> tuple[list[str], list[int], np.ndarray]:
    """:func:`_expert_in` of each row read off the templates: the pattern searched once a
    template, its group a digit run whose value is each row's index and whose place gives each
    row's set (the name before the match); and which rows have none (no match in the template, an
    index of 19 digits or more)."""
    tpl, names = table.templates, table.names
    # each run's length: its leading zeros and its significant digits (none for the value 0)
    lengths = tpl.zeros + np.where(
        tpl.values > 0, np.searchsorted(_POW10, tpl.values, "right") + 1, 0
    )
    ids = tpl.ids[rows]
    starts: np.ndarray = np.zeros(len(rows), np.int64)
    numbers: np.ndarray = np.zeros(len(rows), np.int64)
    lost: np.ndarray = np.zeros(len(rows), bool)
    for t in np.unique(ids).tolist():
        mine = np.flatnonzero(ids == t)
        first = int(rows[mine[0]])
        m = expert_rx.search(names[first])
        if m is None or tpl.literal[t]:  # a literal template: one name, its digits text
            x = None if m is None else _expert_in(expert_rx, names[first])
            lost[mine] = x is None
            starts[mine], numbers[mine] = (m.start(), x[1]) if m and x else (0, 0)
            continue
        text = tpl.texts[t]
        place = [len(text[0])]  # each run's first character in the template's first name
        for j in range(1, len(text) - 1):
            place.append(place[-1] + int(lengths[first, j - 1]) + len(text[j]))
        j = place.index(m.start(1))  # the group is a whole run (no other digit is read)
        here = rows[mine]
        shift = (lengths[here, :j] - lengths[first, :j]).sum(axis=1)
        long = lengths[here, j] >= 19
        lost[mine] = long
        starts[mine] = np.where(long, 0, m.start() + shift)
        numbers[mine] = np.where(long, 0, tpl.values[here, j])
    cut = list(
        map(str.__getitem__, map(names.__getitem__, rows.tolist()), map(slice, starts.tolist()))
    )
    return cut, numbers.tolist(), lost


def _class(
    name: str,
    rule: Rule,
    tensors: Mapping[str, TensorMeta],
    needed: tuple[str, ...] | None,
    codec: Codec,
    known: _Fitted,
    sig_of: Callable[[str], object],
) -> int | tuple[str, str]:
    """The class of one tensor under its rule (``needed``: its scales' names, for a scaled codec),
    or why it does not fit: (the rule and reason, the tensor in words). ``known``: the classes so
    far, and what each key gave."""
    fits, classes = known.by_key, known.classes
    # a KV-cache scale is no class with a plain scalar under the same rule: the codec is in the key
    # rules and codecs by identity (a config's rules are distinct objects; Rule's hash is Python's)
    key = (id(rule), id(codec), sig_of(name), tuple(map(sig_of, needed)) if needed else None)
    klass = fits.get(key)
    meta = tensors[name]
    scale = tensors[needed[0]] if needed else None
    if klass is None:
        scale2 = tensors[needed[1]] if needed and len(needed) > 1 else None
        fit = codec.fit(
            meta, scale, block=rule.block, split=rule.split, scale2=scale2, stacked=rule.stacked
        )
        if isinstance(fit, str):
            klass = fits[key] = fit
        else:
            stacked = meta.shape[0] if rule.stacked and rule.experts else 0
            klass = fits[key] = len(classes)
            classes.append(Klass(rule, codec, fit, stacked))
    if isinstance(klass, str):
        detail = (
            f": scale {escape_name(scale.name)} is {scale.dtype} {list(scale.shape)}"
            if scale
            else ""
        )
        return f"{rule.describe()}: {klass}", meta.describe() + detail
    return klass


def _expert_in(rx: re.Pattern[str], name: str) -> tuple[str, int] | None:
    """(expert set, index) that ``rx`` finds in ``name`` (the name before the match, its group's
    digits); None where it finds none, or an index of 19 digits or more."""
    m = rx.search(name)
    return (name[: m.start()], int(m.group(1))) if m and len(m.group(1)) < 19 else None


def _aligned(tensors: Mapping[str, TensorMeta], table: TensorTable) -> TensorTable:
    """The table with its rows in the tensors' order (a catalogue's table already is)."""
    if len(table) == len(tensors) and table.names == list(tensors):
        return table
    return table.take(np.asarray([table.row[n] for n in tensors], np.int64))


def _units(rule: Rule, model: Mapping[str, object] | None, root: os.PathLike[str]) -> int:
    """A rule's head count: the number it gives, or its config.json field's value."""
    if isinstance(rule.units, int):
        return rule.units
    why = f"{rule.describe()} counts heads by its field {rule.units!r}"
    if model is None:
        raise ConfigError(
            f"{why}, but {escape_name(root)} has no config.json (copy the model's config.json "
            "beside its shards)"
        )
    value = model.get(rule.units)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"{rule.describe()} counts heads by {_source(model, rule.units, root)}, which is "
            f"{'missing' if value is None else repr(value)} (expected a positive integer)"
        )
    return value


def _source(model: Mapping[str, object], field: str, root: os.PathLike[str]) -> str:
    """Where the model config's ``field`` was read, in words: a GGUF header's stand-in for
    config.json says which key of which file (``storage/gguf.py``, ``HeaderConfig.source``);
    config.json otherwise."""
    if isinstance(model, HeaderFields):
        return model.source(field)
    return f"config.json's {field!r} in {escape_name(root)}"


def _idle(
    config: Config, names: list[str], prefix: Prefix, first: np.ndarray, root: os.PathLike[str]
) -> list[str]:
    """Rules given at run time that match no tensor (``first``: each name's first rule, by index;
    a rule no tensor matches first may still match one a rule before it took)."""
    given = [
        (i, r) for i, r in enumerate(config.rules) if r.origin and r.origin != ACTIVATION_ORIGIN
    ]
    if not given:
        return []
    hit = set(np.unique(first).tolist())
    idle = [
        r.describe()
        for i, r in given
        if i not in hit and not any(r.matches(n) or r.matches(prefix.rewrite(n)) for n in names)
    ]
    if not idle:
        return []
    return [
        f"{', '.join(idle)} matched no tensor of {escape_name(root)} (a typo? the names are in "
        "the index)"
    ]


def _scale_globs(
    rules: Mapping[str, Rule | None], needs: Mapping[str, tuple[str, ...]]
) -> list[str]:
    """Skip or defer rules that are the first match of scale tensors whose weight is served: a
    scale goes wherever its weight goes, so such a rule would do nothing (and say "skipped 0")."""
    taken: dict[Rule, list[tuple[str, str]]] = {}
    for weight, scales in needs.items():
        for m in scales:
            r = rules.get(m)
            if r is not None and r.role in READS_NOTHING:
                taken.setdefault(r, []).append((m, weight))
    out = []
    for r, pairs in taken.items():
        pairs.sort(key=lambda mw: natural_key(mw[0]))
        m, w = pairs[0]
        out.append(
            f"{r.describe()} matches {len(pairs)} scale tensor(s) of weights it does not {r.role} "
            f"(e.g. {escape_name(m)}, the scale of {escape_name(w)}): scales follow their "
            f"weights, so {r.role} the weights instead (e.g. {escape_name(w)!r})"
        )
    return out


def _nothing(rules: tuple[Rule, ...], skipped: list[str], root: os.PathLike[str]) -> str:
    """Which rules left nothing to load, for the message."""
    globs = [r.describe() for r in rules if r.role == Role.SKIP]
    if globs and skipped:
        return (
            f"every tensor of {escape_name(root)} is skipped ({len(skipped)} tensors, by "
            f"{', '.join(globs)})"
        )
    return f"{escape_name(root)} has no tensor to serve"


def _scale_names(weight: str, rule: Rule) -> list[str]:
    """The scale tensors a scaled weight needs: its suffix replaced by the rule's ``scale`` (and
    ``scale2``)."""
    stem = weight[: -len(rule.suffix)] if weight.endswith(rule.suffix) else weight
    return [stem + rule.scale] + ([stem + rule.scale2] if rule.scale2 else [])


def _grouped(names: list[str]) -> str:
    """Names grouped by their shape with numbers as N (``model.layers.N.mlp.x.weight (58)``): a
    real checkpoint's thousands of unmatched tensors are a few classes."""
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
