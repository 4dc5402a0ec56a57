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
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..codecs import registry
from ..codecs.base import Codec
from ..codecs.plain import KV_SCALE, PLAIN
from ..model.errors import ConfigError, raise_all
from ..model.meta import HeaderFields, TensorMeta
from ..model.modes import Role
from ..model.table import Templates, TensorTable, templates
from ..model.templates import natural_key, natural_sorted
from ..model.text import escape_name, plural
from ..selection.config import (
    ACTIVATION_ORIGIN,
    AUTO,
    READS_NOTHING,
    Config,
    Rule,
    alternatives,
    rule_index,
)
from ..selection.kvscales import Census
from ..selection.kvscales import census as kv_census
from ..selection.prefix import Prefix
from .entries import Columns, Entries, Entry, Klass
from .templated import Join, first_rules


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


def activation_scale(name: str, meta: TensorMeta) -> bool:
    """A ModelOpt activation scale: ``*.input_scale`` holding one value (0-d, or [1])."""
    return name.endswith(".input_scale") and math.prod(meta.shape) == 1


def classify(
    tensors: Mapping[str, TensorMeta],
    config: Config,
    *,
    prefix: Prefix,
    problems: list[str],
    model: Mapping[str, object] | None,
    root: object,
    order: Sequence[str] | None = None,
    table: TensorTable | None = None,
) -> Classified:
    """Entries, skipped and deferred tensors (natural order), the expert columns and the KV-cache
    scale census; or a ConfigError listing every problem (``problems``: those found before).
    ``model``: the checkpoint's config.json, for rules that count heads by one of its fields;
    ``order``: every name of ``tensors`` in natural order, when the caller has it (a table's
    permutation: natural_sorted otherwise); ``table``: the same tensors as columns, when the
    caller has them (dtypes and class keys read from columns: no record made a name)."""
    units = {(r.index, r.match): _units(r, model, root) for r in config.rules if r.units}
    aligned = _aligned(tensors, table)
    usual = (
        _by_columns(tensors, config, prefix, aligned, root)
        if aligned is not None and not problems
        else None
    )
    found = (
        usual
        if usual is not None
        else _walk(
            tensors, config, prefix=prefix, problems=problems, root=root, order=order, table=table
        )
    )
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


def _walk(
    tensors: Mapping[str, TensorMeta],
    config: Config,
    *,
    prefix: Prefix,
    problems: list[str],
    root: object,
    order: Sequence[str] | None,
    table: TensorTable | None,
) -> _Parts:
    """Classification name by name (dicts keyed by name): what :func:`_by_columns` does not take,
    and every problem worded, in order."""
    dtype_of, sig_of = _readers(tensors, table)
    ruled = _rules(tensors, config, prefix, dtype_of)
    rules, unresolved, needs = ruled.rules, ruled.unresolved, ruled.needs
    # the census counts what will be served: a skipped vision tower's or MTP layer's attention is
    # no layer without scales. It reads only attention layers' names, each of which holds "attn"
    # (selection/kvscales.py's patterns: ``self_attn.`` or ``attn_``): the others are left out here
    census = kv_census(
        [n for n, r in rules.items() if "attn" in n and (r is None or r.role != Role.SKIP)]
    )
    problems += _refused(config, census)
    kv = census.engine_names()
    broken = _scales(tensors, rules, needs, problems)
    if any(r.role in READS_NOTHING for r in config.rules):
        problems += _scale_globs(rules, needs)
    scales = {m for needed in needs.values() for m in needed}
    expert_rx = config.expert_regex
    rows, fitted = Columns(), _Fitted()
    skipped: list[str] = []
    deferred: list[str] = []
    unmatched: list[str] = []
    deferred_experts: dict[str, tuple[str, int]] = {}
    grouped: dict[str, list[str]] = {}
    codec_of = registry.by_role()
    leave = scales | broken
    ordered = natural_sorted(tensors) if order is None else order
    walked = [n for n in ordered if n not in leave] if leave else ordered
    for n in walked:
        r = rules[n]
        if n in unresolved:
            grouped.setdefault(unresolved[n], []).append(tensors[n].describe())
            continue
        if _set_aside(n, r, expert_rx, unmatched, skipped, deferred, deferred_experts) or r is None:
            continue  # "or r is None" only narrows the type: _set_aside filed it as unmatched
        need = needs.get(n)
        expert = _expert_of(expert_rx, n, r) if r.experts and not r.stacked else None
        if expert is None and r.experts and not r.stacked:
            grouped.setdefault(
                f"{r.describe()}: experts = true but expert_pattern "
                f"{expert_rx.pattern!r} finds no index in",
                [],
            ).append(tensors[n].describe())
        elif (
            k := _class(
                n,
                r,
                tensors,
                need,
                _codec(n, r, codec_of, kv),
                fitted,
                grouped,
                sig_of,
            )
        ) >= 0:
            rows.add(n, k, need, expert)
    for reason, listed in grouped.items():
        problems.append(f"{reason}: {_listing(listed)}")
    if unmatched:
        problems.append(
            f"{plural(len(unmatched), 'tensor')} {'matches' if len(unmatched) == 1 else 'match'} "
            f"no rule of {config.name} (add a rule; a final "
            f'match = "*" with role = "auto" keeps the rest whole): {_grouped(unmatched)}'
        )
    problems += _idle(config, tensors, prefix, ruled.matched, root)
    if not problems and not rows.names and not deferred:  # a load of nothing would pass every check
        problems.append(
            f"nothing to load: {_nothing(config.rules, skipped, root)}; a load serves at least "
            "one tensor (narrow the skip globs)"
        )
    _raise(problems, config, root)
    return _Parts(rows, fitted, skipped, deferred, deferred_experts, census)


def _refused(config: Config, census: Census) -> list[str]:
    """What a strict config refuses in the KV-cache scale census, worded (none for another)."""
    if config.kv_scales != "strict":
        return []
    return [
        f'{p} (refused: set kv_scales = "report" in the config to load it anyway)'
        for p in census.problems()
    ]


def _raise(problems: list[str], config: Config, root: object) -> None:
    """A ConfigError listing every problem, if there is one."""
    raise_all(
        ConfigError,
        problems,
        what=f"problems fitting config {config.name} to {escape_name(root)}",
    )


def _by_columns(
    tensors: Mapping[str, TensorMeta],
    config: Config,
    prefix: Prefix,
    table: TensorTable,
    root: object,
) -> _Parts | None:
    """The usual classification as columns, once per name template where it can be: each row's
    first rule (planning/templated.py), its ``auto`` rule resolved and its scales found by template
    and parameters (one join a template and way), the class keys as numbers. None for what it
    does not take, which :func:`_walk` then classifies (and words every problem of): names the
    templates cannot read (stored or rewritten into the config's prefix), a tensor no rule matches
    or no way resolves, a problem of any kind but a strict config's KV-cache refusals (raised here
    as the walk words them when they are the only ones)."""
    tpl = table.templates
    if tpl is None:
        return None
    rules = config.rules
    names, shapes = table.names, table.shapes
    first = _first_rules(
        config,
        prefix,
        names,
        tpl,
        lambda k: names[k].endswith(".input_scale") and math.prod(shapes[k]) == 1,
    )  # activation_scale(name, meta), read off the columns
    if first is None:
        return None  # rewritten names the templates cannot read
    if (first == len(rules)).any():
        return None  # unmatched: the walk words it
    scaled = registry.scaled_roles()
    n = len(table)
    made = _Made()
    rule_of: np.ndarray = np.asarray([made.code(r) for r in rules], np.int64)[first]
    s1: np.ndarray = np.full(n, -1, np.int64)
    s2: np.ndarray = np.full(n, -1, np.int64)
    unresolved = _resolved(config, table, tpl, first, made, rule_of, (s1, s2), scaled)
    if not _outright(table, tpl, made, rule_of, (s1, s2), scaled):
        return None  # a weight of a scaled rule given outright lacks a scale: the walk words it
    roles = [r.role for r in made.rules]
    # the census of what is served or deferred, from the attention layers' templates only (every
    # name selection/kvscales.py's patterns read holds "attn", which no digit run can split)
    attn = np.asarray([any("attn" in part for part in text) for text in tpl.texts], bool)
    skip = np.asarray([role == Role.SKIP for role in roles], bool)
    counted = np.flatnonzero(attn[tpl.ids] & ~skip[rule_of])
    census = kv_census(list(map(names.__getitem__, counted.tolist())))
    scale: np.ndarray = np.zeros(n, bool)
    scale[s1[s1 >= 0]] = True
    scale[s2[s2 >= 0]] = True
    if not scale[unresolved].all():
        return None  # a tensor no way resolves, not a scale: the walk words it
    aside = np.asarray([role in READS_NOTHING for role in roles], bool)
    if aside[rule_of[scale]].any():
        return None  # a skip or defer rule takes a served weight's scale: the walk words it
    walked = table.order[~scale[table.order]]
    kind = rule_of[walked]
    skipped = list(map(names.__getitem__, walked[_kind_in(kind, roles, Role.SKIP)].tolist()))
    deferred = list(map(names.__getitem__, walked[_kind_in(kind, roles, Role.DEFER)].tolist()))
    expert_rx = config.expert_regex
    deferred_experts = {}
    for d in deferred:  # a rule of their own: few names
        x = _expert_of(expert_rx, d, made.rules[int(rule_of[table.row[d]])])
        if x:
            deferred_experts[d] = x
    served = walked[~aside[kind]]
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
    )
    if rows is None:
        return None
    given = [r for r in rules if r.origin and r.origin != ACTIVATION_ORIGIN]
    if given:
        matched = list(map([*rules, None].__getitem__, first.tolist()))
        if _idle(config, tensors, prefix, matched, root):
            return None
    # the walk's problems, had it walked: a strict config's KV-cache refusals (which are then the
    # only ones: any other has declined above), else nothing to load (which the walk words)
    _raise(_refused(config, census), config, root)
    if not rows.names and not deferred:
        return None
    return _Parts(rows, fitted, skipped, deferred, deferred_experts, census)


def _kind_in(kind: np.ndarray, roles: Sequence[str], role: str) -> np.ndarray:
    """Which rows' rules (``kind``: each row's rule code) have ``role``."""
    result: np.ndarray = np.asarray([r == role for r in roles], bool)[kind]
    return result


def _first_rules(
    config: Config,
    prefix: Prefix,
    names: Sequence[str],
    tpl: Templates | None,
    single: Callable[[int], bool],
) -> np.ndarray | None:
    """Each name's first rule as its index (``len(rules)``: none): the config's rules see the name
    rewritten into the config's prefix (selection/prefix.py), a rule given at run time
    (``--skip``) its stored name too, and the activation-scale switch's rule takes single-value
    tensors only (``single``: whether the name at that place holds one value); the others it
    matched are matched again without it, name by name (few). By template where ``tpl`` (the
    names' templates) is given, None there where the rewritten names' templates cannot be read;
    name by name otherwise (the walk's)."""
    rules = config.rules
    none = len(rules)
    rewrites = prefix.rewrites
    seen = list(map(prefix.rewrite, names)) if rewrites else names
    first: np.ndarray
    if tpl is None:
        at = {id(r): i for i, r in enumerate(rules)}
        found = [none if r is None else at[id(r)] for r in config.rules_for(seen)]
        first = np.asarray(found, np.int64)
    else:
        seen_tpl = templates(seen) if rewrites else tpl
        if seen_tpl is None:
            return None
        first = first_rules(seen, rules, seen_tpl)
    given = [i for i, r in enumerate(rules) if r.origin] if rewrites else []
    if given:
        some = [rules[i] for i in given]
        if tpl is not None:
            got = first_rules(names, some, tpl)
        else:
            rx = alternatives(enumerate(some))
            assert rx is not None  # (some rules)
            hits = [len(some) if m is None else rule_index(m) for m in map(rx.match, names)]
            got = np.asarray(hits, np.int64)
        first = np.minimum(first, np.asarray([*given, none], np.int64)[got])
    act = [i for i, r in enumerate(rules) if r.origin == ACTIVATION_ORIGIN]
    if act:
        a = act[0]
        others = [k for k in np.flatnonzero(first == a).tolist() if not single(k)]
        if others:
            rest = replace(config, rules=rules[:a] + rules[a + 1 :])
            at = {id(r): i for i, r in enumerate(rules)}
            for k in others:
                r = rest.rule_for(seen[k])
                first[k] = none if r is None else at[id(r)]
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
    tpl: Templates,
    made: _Made,
    rule_of: np.ndarray,
    scales: tuple[np.ndarray, np.ndarray],
    scaled: frozenset[str],
) -> bool:
    """The scales' rows of the weights of scaled rules given outright, into ``scales``, by the join
    once per (rule, template): the rows whose rule (matched, or an ``auto`` one resolved by a way
    with no scale tensors) is scaled and has no scales yet, as :func:`_scales` takes them. False
    where a weight's name lacks the rule's suffix or a scale is missing (its problems, which the
    walk words)."""
    s1, s2 = scales
    outright = np.asarray([r.role in scaled for r in made.rules], bool)
    rows = np.flatnonzero(outright[rule_of] & (s1 < 0))
    if not len(rows):
        return True
    join = Join(tpl)
    width_t = len(tpl.texts)
    groups, at = np.unique(rule_of[rows] * width_t + tpl.ids[rows], return_inverse=True)
    for g, k in enumerate(groups.tolist()):
        mine, rule, t = rows[at == g], made.rules[k // width_t], k % width_t
        if not _ends(table.names, mine, rule.suffix).all():
            return False
        one = _renamed(join, table, mine, t, rule.suffix, rule.scale)
        two = _renamed(join, table, mine, t, rule.suffix, rule.scale2) if rule.scale2 else None
        if (one < 0).any() or (two is not None and (two < 0).any()):
            return False
        s1[mine] = one
        if two is not None:
            s2[mine] = two
    return True


def _resolved(
    config: Config,
    table: TensorTable,
    tpl: Templates,
    first: np.ndarray,
    made: _Made,
    rule_of: np.ndarray,
    scales: tuple[np.ndarray, np.ndarray],
    scaled: frozenset[str],
) -> np.ndarray:
    """Each ``auto`` row's rule resolved (Config.resolve_scaled's ways, in its order) into
    ``rule_of`` and its scales' rows into ``scales``, once per (rule, dtype, template): a scale
    found by the join. Returns the rows that resolve to nothing (they keep their ``auto`` rule:
    the walk names them None, which counts as it does)."""
    auto = np.asarray([r.role == AUTO for r in config.rules], bool)
    rows = np.flatnonzero(auto[first])
    left: list[np.ndarray] = [np.zeros(0, np.int64)]
    if not len(rows):
        return left[0]
    join = Join(tpl)
    width_d, width_t = len(table.dtypes), len(tpl.texts)
    key = (first[rows] * width_d + table.dtype_code[rows]) * width_t + tpl.ids[rows]
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
                one = _renamed(join, table, open_, t, p.suffix, p.scale)
                take = one >= 0
                two = _renamed(join, table, open_, t, p.suffix, p.scale2) if p.scale2 else None
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
                left.append(open_)
            else:
                rule_of[open_] = made.code(plain)
    result: np.ndarray = np.concatenate(left)
    return result


def _ends(names: list[str], rows: np.ndarray, suffix: str) -> np.ndarray:
    """Which rows' names end in ``suffix``."""
    result: np.ndarray = np.fromiter(
        (names[k].endswith(suffix) for k in rows.tolist()), bool, len(rows)
    )
    return result


def _renamed(
    join: Join, table: TensorTable, rows: np.ndarray, t: int, suffix: str, replacement: str
) -> np.ndarray:
    """For rows of template ``t``: the row of the name with ``suffix`` replaced by
    ``replacement`` (``name[: -len(suffix)] + replacement``, as resolve_scaled spells it), -1
    where the name does not end in ``suffix`` or no tensor has that name: by the join, or name by
    name where it cannot say."""
    got = join.renamed(rows, t, suffix, replacement)
    if got is not None:
        return got
    names, row = table.names, table.row
    result: np.ndarray = np.fromiter(
        (
            row.get(names[k][: -len(suffix)] + replacement, -1) if names[k].endswith(suffix) else -1
            for k in rows.tolist()
        ),
        np.int64,
        len(rows),
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
) -> Columns | None:
    """The served rows, their classes (into ``fitted``: each distinct key fitted once, at its first
    row, as :func:`_class` keys them), scales and experts; None where any has a problem."""
    names = table.names
    s1, s2 = scales
    codec_of = registry.by_role()
    codecs = [codec_of.get(r.role) for r in made.rules]  # None: a rule no served row has
    kinds = {id(c): k for k, c in enumerate(dict.fromkeys([*codecs, KV_SCALE]))}
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
    key: np.ndarray = np.zeros(len(served), np.int64)
    span = 1
    for col, width in parts:
        if span > (1 << 62) // max(width, 1):
            return None
        key, span = key * width + col, span * width
    _, firsts, at = np.unique(key, return_index=True, return_inverse=True)
    _, sig_of = _readers(tensors, table)
    klass: np.ndarray = np.zeros(len(firsts), np.int64)
    all_codecs = list(dict.fromkeys([*codecs, KV_SCALE]))
    for u in np.argsort(firsts, kind="stable").tolist():  # in order of first appearance
        j = int(firsts[u])
        k = int(served[j])
        need = _need(names, int(s1[j]), int(s2[j]))
        got = _class(
            names[k],
            made.rules[int(rule_of[j])],
            tensors,
            need,
            all_codecs[int(codec[j])],  # type: ignore[arg-type]  # a served row's: a codec
            fitted,
            {},
            sig_of,
        )
        if got < 0:
            return None
        klass[u] = got
    at_set, index = _experts(table, made, rule_of, served, expert_rx)
    if at_set is None or index is None:  # (both or neither)
        return None
    rows = Columns()
    rows.extend_columns(
        list(map(names.__getitem__, served.tolist())),
        klass[at].tolist(),
        [names[k] if k >= 0 else None for k in s1.tolist()],
        [names[k] if k >= 0 else None for k in s2.tolist()],
        at_set,
        index,
    )
    return rows


def _need(names: list[str], one: int, two: int) -> tuple[str, ...] | None:
    """A row's scales' names, as the walk keeps them (None: no scales)."""
    if one < 0:
        return None
    return (names[one],) if two < 0 else (names[one], names[two])


def _experts(
    table: TensorTable,
    made: _Made,
    rule_of: np.ndarray,
    served: np.ndarray,
    expert_rx: re.Pattern[str],
) -> tuple[list[str | None], list[int]] | tuple[None, None]:
    """Each served row's expert set (None: not an expert) and index, as :func:`_expert_of` reads
    them; (None, None) where an expert-parallel row has no index."""
    names = table.names
    wanted = np.asarray([r.experts and not r.stacked for r in made.rules], bool)[rule_of]
    sets: list[str | None] = [None] * len(served)
    index = [0] * len(served)
    at = np.flatnonzero(wanted)
    if not len(at):
        return sets, index
    rows = served[at]
    got = _experts_by_template(table, rows, expert_rx)
    if got is not None:
        cut, numbers = got
    else:
        held = list(map(names.__getitem__, rows.tolist()))
        found = list(map(expert_rx.search, held))
        if None in found:
            return None, None
        digits = list(map(_GROUP_1, found))
        if max(map(len, digits)) >= 19:
            return None, None
        cut = list(map(str.__getitem__, held, map(slice, map(_START, found))))
        numbers = list(map(int, digits))
    for k, x, i in zip(at.tolist(), cut, numbers, strict=True):
        sets[k], index[k] = x, i
    return sets, index


DEFAULT_EXPERTS = r"experts\.(\d+)\."
"""The shipped configs' expert pattern: its literals are not digits and its group is a whole digit
run between two of them, so it finds the same run of every name of a template."""
_POW10: np.ndarray = 10 ** np.arange(1, 19, dtype=np.int64)


def _experts_by_template(
    table: TensorTable, rows: np.ndarray, expert_rx: re.Pattern[str]
) -> tuple[list[str], list[int]] | None:
    """:func:`_expert_of` of each row (all expert-parallel) read off the templates: the pattern
    searched once a template, its group a digit run whose value is each row's index and whose
    place gives each row's set (the name before the match). None where it cannot say (another
    pattern, names the templates cannot read, a template the pattern finds no index in, an
    index of 19 digits or more): the caller searches name by name."""
    tpl = table.templates
    if tpl is None or expert_rx.pattern != DEFAULT_EXPERTS:
        return None
    names = table.names
    # each run's length: its leading zeros and its significant digits (none for the value 0)
    lengths = tpl.zeros + np.where(
        tpl.values > 0, np.searchsorted(_POW10, tpl.values, "right") + 1, 0
    )
    ids = tpl.ids[rows]
    starts: np.ndarray = np.zeros(len(rows), np.int64)
    numbers: np.ndarray = np.zeros(len(rows), np.int64)
    for t in np.unique(ids).tolist():
        mine = np.flatnonzero(ids == t)
        first = int(rows[mine[0]])
        m = expert_rx.search(names[first])
        if m is None:
            return None
        text = tpl.texts[t]
        place = [len(text[0])]  # each run's first character in the template's first name
        for j in range(1, len(text) - 1):
            place.append(place[-1] + int(lengths[first, j - 1]) + len(text[j]))
        if m.start(1) not in place:
            return None
        j = place.index(m.start(1))
        if m.end(1) != place[j] + int(lengths[first, j]):
            return None
        here = rows[mine]
        if (lengths[here, j] >= 19).any():
            return None
        shift = (lengths[here, :j] - lengths[first, :j]).sum(axis=1)
        starts[mine] = m.start() + shift
        numbers[mine] = tpl.values[here, j]
    cut = list(
        map(str.__getitem__, map(names.__getitem__, rows.tolist()), map(slice, starts.tolist()))
    )
    return cut, numbers.tolist()


_GROUP_1 = operator.methodcaller("group", 1)
_START = operator.methodcaller("start")


def _codec(name: str, rule: Rule, codec_of: Mapping[str, Codec], kv: Mapping[str, object]) -> Codec:
    """The rule's codec for this tensor: a KV-cache scale served plain has its values checked."""
    codec = codec_of[rule.role]
    return KV_SCALE if codec is PLAIN and name in kv else codec


def _readers(
    tensors: Mapping[str, TensorMeta], table: TensorTable | None
) -> tuple[Callable[[str], str], Callable[[str], object]]:
    """Each tensor's dtype, and a key that two tensors share when their dtypes and shapes are the
    same: from the table's columns when there is one (a dict lookup and a list index, no record
    made), from the records otherwise."""
    if table is None:
        return (lambda n: tensors[n].dtype), (lambda n: (tensors[n].dtype, tensors[n].shape))
    row, dtypes, sigs = table.row, table.dtype_names, table.signatures
    return (lambda n: dtypes[row[n]]), (lambda n: sigs[row[n]])


def _aligned(tensors: Mapping[str, TensorMeta], table: TensorTable | None) -> TensorTable | None:
    """The table when its rows are the tensors, in the tensors' order (a catalogue's table is;
    a table passed beside other tensors is not used for the columns path)."""
    if table is None or len(table) != len(tensors) or table.names != list(tensors):
        return None
    return table


@dataclass(frozen=True)
class _Ruled:
    """The walk's rules of a catalogue's tensors, by name."""

    rules: dict[str, Rule | None]
    """Each tensor's rule, ``auto`` ones resolved (None: no rule matches, or none resolves)."""
    unresolved: dict[str, str]
    """The tensors an ``auto`` rule could not resolve: why."""
    needs: dict[str, tuple[str, ...]]
    """The scales found for each weight an ``auto`` rule made scaled (:func:`_scales` adds those
    of the rules given outright)."""
    matched: list[Rule | None]
    """Each tensor's first rule, in the tensors' order."""


def _rules(
    tensors: Mapping[str, TensorMeta],
    config: Config,
    prefix: Prefix,
    dtype_of: Callable[[str], str],
) -> _Ruled:
    """Each tensor's rule, ``auto`` ones resolved, found name by name."""
    matched = _matched(tensors, config, prefix)
    rules = dict(zip(tensors, matched, strict=True))
    unresolved: dict[str, str] = {}
    needs: dict[str, tuple[str, ...]] = {}  # tuples: the collector untracks them
    resolve = config.resolve_scaled
    scaled = registry.scaled_roles()
    for n, r in [(n, r) for n, r in rules.items() if r is not None and r.role == AUTO]:
        got = resolve(r, n, dtype_of(n), tensors)
        if isinstance(got, str):
            unresolved[n] = f"{r.describe()}: {got}"
            rules[n] = None
        else:
            resolved, found = got
            rules[n] = resolved
            if found and resolved.role in scaled:
                needs[n] = tuple(found)
    return _Ruled(rules, unresolved, needs, matched)


def _matched(
    tensors: Mapping[str, TensorMeta], config: Config, prefix: Prefix
) -> list[Rule | None]:
    """Each tensor's first rule (:func:`_first_rules`), name by name."""
    names = list(tensors)
    first = _first_rules(
        config, prefix, names, None, lambda k: activation_scale(names[k], tensors[names[k]])
    )
    assert first is not None  # (name by name: always an answer)
    return list(map([*config.rules, None].__getitem__, first.tolist()))


def _scales(
    tensors: Mapping[str, TensorMeta],
    rules: Mapping[str, Rule | None],
    needs: dict[str, tuple[str, ...]],
    problems: list[str],
) -> set[str]:
    """The weights of a scaled rule given outright (not ``auto``) whose scales are missing or whose
    name lacks the rule's suffix (each a problem, in natural order); the scales of the others are
    filed in ``needs``."""
    scaled = registry.scaled_roles()
    first: list[tuple[str, str]] = []  # (weight, problem), in the catalogue's order
    for n, r in rules.items():
        if r is None or r.role not in scaled or n in needs:
            continue
        needed = _scale_names(n, r)
        missing = [m for m in needed if m not in tensors]
        if not n.endswith(r.suffix):
            why = f"{r.describe()} is {r.role} but the name does not end in {r.suffix}"
        elif missing:
            why = (
                f"{r.describe()} needs its scale {escape_name(missing[0])}, which the "
                "checkpoint lacks"
            )
        else:
            needs[n] = tuple(needed)
            continue
        first.append((n, f"tensor {escape_name(n)}: {why}"))
    problems[:0] = [why for _, why in sorted(first, key=lambda nw: natural_key(nw[0]))]
    return {n for n, _ in first}


def _class(
    name: str,
    rule: Rule,
    tensors: Mapping[str, TensorMeta],
    needed: tuple[str, ...] | None,
    codec: Codec,
    known: _Fitted,
    grouped: dict[str, list[str]],
    sig_of: Callable[[str], object],
) -> int:
    """The class of one tensor under its rule (``needed``: its scales' names, for a scaled codec),
    or -1, filing why it does not fit under (rule, reason). ``known``: the classes so far, and
    what each key gave."""
    fits, classes = known.by_key, known.classes
    # a KV-cache scale is no class with a plain scalar under the same rule: the codec is in the key
    # rules and codecs by identity (a config's rules are distinct objects; Rule's hash is Python's)
    key = (id(rule), id(codec), sig_of(name), tuple(map(sig_of, needed)) if needed else None)
    klass = fits.get(key)
    if klass is not None and not isinstance(klass, str):
        return klass  # the usual tensor: its class known, no record made
    meta = tensors[name]
    scale = tensors[needed[0]] if needed else None
    scale2 = tensors[needed[1]] if needed and len(needed) > 1 else None
    if klass is None:
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
        grouped.setdefault(f"{rule.describe()}: {klass}", []).append(meta.describe() + detail)
        return -1
    return klass


def _set_aside(
    n: str,
    r: Rule | None,
    expert_rx: re.Pattern[str],
    unmatched: list[str],
    skipped: list[str],
    deferred: list[str],
    deferred_experts: dict[str, tuple[str, int]],
) -> bool:
    """Files ``n`` by its rule as unmatched (no rule), skipped or deferred (with its expert, for
    the deferred's positions); False for a name to serve."""
    if r is None:
        unmatched.append(escape_name(n))
    elif r.role == Role.SKIP:
        skipped.append(n)
    elif r.role == Role.DEFER:
        deferred.append(n)
        if x := _expert_of(expert_rx, n, r):
            deferred_experts[n] = x
    else:
        return False
    return True


def _expert_of(rx: re.Pattern[str], name: str, rule: Rule | None) -> tuple[str, int] | None:
    """(expert set, index) of an expert-parallel tensor; None when the rule is not
    expert-parallel or the name has no expert index."""
    m = rx.search(name) if rule is not None and rule.experts and not rule.stacked else None
    return (name[: m.start()], int(m.group(1))) if m and len(m.group(1)) < 19 else None


def _units(rule: Rule, model: Mapping[str, object] | None, root: object) -> int:
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


def _source(model: Mapping[str, object], field: str, root: object) -> str:
    """Where the model config's ``field`` was read, in words: a GGUF header's stand-in for
    config.json says which key of which file (``storage/gguf.py``, ``HeaderConfig.source``);
    config.json otherwise."""
    if isinstance(model, HeaderFields):
        return model.source(field)
    return f"config.json's {field!r} in {escape_name(root)}"


def _idle(
    config: Config,
    tensors: Mapping[str, TensorMeta],
    prefix: Prefix,
    matched: list[Rule | None],
    root: object,
) -> list[str]:
    """Rules given at run time that match no tensor (a rule no tensor matches first may still match
    one a rule before it took)."""
    given = [r for r in config.rules if r.origin and r.origin != ACTIVATION_ORIGIN]
    first = set(matched) if given else set()
    idle = [
        r.describe()
        for r in given
        if r not in first and not any(r.matches(n) or r.matches(prefix.rewrite(n)) for n in tensors)
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


def _nothing(rules: tuple[Rule, ...], skipped: list[str], root: object) -> str:
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
