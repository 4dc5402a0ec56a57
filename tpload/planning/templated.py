"""A config's rules matched once per name template, not once per name.

A checkpoint's names are a few templates once their digit runs are parameters (DeepSeek-V3's 91,991
names are 43: model/table.py's :class:`Templates`). A glob with no digit, no ``[class]`` and no
``?`` cannot tell two names of one template apart: its literals are not digits, so each digit run
of a name it matches falls to its ``*``s whatever the run's digits and length, and the same
``*``s take any other run in that place. Such globs are matched on one name of each template; the
others (``model.layers.61.*``, ``w[13]``, ``?``) name by name, and the first rule either part finds
wins, as :meth:`Config.rule_for` would find it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model.table import Templates, templates
from ..selection.config import Rule, alternatives, rule_index

SIGHTED = frozenset("0123456789[?")
"""A glob holding one of these may match one name of a template and not another."""


def blind(rule: Rule) -> bool:
    """Whether the rule's glob answers alike for every name of a template."""
    return not SIGHTED.intersection(rule.match)


def first_rules(names: Sequence[str], rules: Sequence[Rule], tpl: Templates) -> np.ndarray:
    """Each name's first matching rule, as its index (``len(rules)``: none); ``tpl``: the names'
    templates."""
    none = len(rules)
    _, reps = np.unique(tpl.ids, return_index=True)  # each template's first name (ids 0..T-1)
    firsts: np.ndarray = np.full(len(reps), none, np.int64)
    whole = alternatives((i, r) for i, r in enumerate(rules) if blind(r))
    if whole is not None:
        for t, k in enumerate(reps.tolist()):
            if (m := whole.match(names[k])) is not None:
                firsts[t] = rule_index(m)
    out: np.ndarray = firsts[tpl.ids]
    each = alternatives((i, r) for i, r in enumerate(rules) if not blind(r))
    if each is not None:
        hits = [none if m is None else rule_index(m) for m in map(each.match, names)]
        out = np.minimum(out, np.asarray(hits, np.int64))
    return out


class Join:
    """Names found by template and parameters: ``x.7.w`` and ``x.7.s`` share their digit runs, so
    the scale of each weight of a template is the row of the scale's template with the same
    parameters, found for all of them at once in numpy (no name looked up)."""

    def __init__(self, tpl: Templates, names: Sequence[str]) -> None:
        self.tpl, self.names = tpl, names
        self.ids = {text: t for t, text in enumerate(tpl.texts)}
        order = np.argsort(tpl.ids, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(tpl.ids, minlength=len(tpl.texts)))))
        self._order, self._bounds = order, bounds
        self._runs = tpl.run_counts()

    def rows(self, t: int) -> np.ndarray:
        """The rows of template ``t``, in the table's order."""
        rows: np.ndarray = self._order[self._bounds[t] : self._bounds[t + 1]]
        return rows

    def renamed(self, rows: np.ndarray, t: int, suffix: str, replacement: str) -> np.ndarray:
        """For each row of template ``t``, the row of its name with ``suffix`` replaced by
        ``replacement`` (``name[: -len(suffix)] + replacement``), -1 where the name does not end in
        ``suffix`` or no tensor has that name. Where ``suffix`` holds no digit (a template's names
        all end in it or none does) and ``replacement`` adds whole runs, the new names' template
        and parameters are ``t``'s, its last text part changed and the replacement's runs after
        its own; otherwise (a literal template, a suffix holding a digit, a replacement whose
        digits join the stem's last run, new names read whole) they are read off the new names."""
        texts, tpl = self.tpl.texts[t], self.tpl
        out: np.ndarray = np.full(len(rows), -1, np.int64)
        add = templates([replacement])
        stem = texts[-1][: len(texts[-1]) - len(suffix)]
        r = add.texts[0]
        joins = not stem and len(texts) > 1 and len(r) > 1 and not r[0]  # a run onto the stem's
        if (
            not tpl.literal[t]
            and not any(c.isdigit() for c in suffix)
            and add.whole
            and not joins
            and len(texts) + len(r) - 2 <= _MAX_RUNS
        ):
            if not texts[-1].endswith(suffix):
                return out
            new = (*texts[:-1], stem + r[0], *r[1:])
            k, more = len(texts) - 1, len(r) - 1
            values, zeros = tpl.values[rows, :k], tpl.zeros[rows, :k]
            if more:
                values = np.hstack((values, np.repeat(add.values[:, :more], len(rows), 0)))
                zeros = np.hstack((zeros, np.repeat(add.zeros[:, :more], len(rows), 0)))
            return self._find(self.ids.get(new), values, zeros, out)
        names = self.names
        ends = np.fromiter((names[k].endswith(suffix) for k in rows.tolist()), bool, len(rows))
        cut = [names[k][: len(names[k]) - len(suffix)] + replacement for k in rows[ends].tolist()]
        got = templates(cut)
        at = np.flatnonzero(ends)
        for u, text in enumerate(got.texts):
            mine = np.flatnonzero(got.ids == u)
            found = self._find(self.ids.get(text), got.values[mine], got.zeros[mine], None)
            out[at[mine]] = found
        return out

    def _find(
        self, t: int | None, values: np.ndarray, zeros: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        """The row of template ``t`` (None: no tensor has it) with each row of parameters
        (``values``, ``zeros``: its runs'), -1 where none has them; into ``out`` when given."""
        if out is None:
            out = np.full(len(values), -1, np.int64)
        if t is None or not len(values):
            return out
        k = int(self._runs[t])
        have = self.rows(t)
        both_v = np.vstack((self.tpl.values[have, :k], values[:, :k])) + 1
        both_z = np.vstack((self.tpl.zeros[have, :k], zeros[:, :k]))
        cols = [c[:, j] for c in (both_v, both_z) for j in range(k)]
        _, at = keyed([(c, int(c.max()) + 1) for c in cols], len(have) + len(values))
        where: np.ndarray = np.full(int(at.max()) + 1, -1, np.int64)
        where[at[: len(have)]] = have
        out[:] = where[at[len(have) :]]
        return out


_MAX_RUNS = 16
"""The runs a name read by templates has at most (model/table.py's bound)."""


def keyed(parts: list[tuple[np.ndarray, int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows alike in every part (a column and its width): each distinct one's first row, and each
    row's distinct one. One mixed-radix number a row, or the parts side by side where their
    widths' product would not fit."""
    key: np.ndarray = np.zeros(n, np.int64)
    span = 1
    for col, width in parts:
        if span > (1 << 62) // max(width, 1):
            stacked = np.stack([col for col, _ in parts], axis=1)
            _, firsts, at = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
            return firsts, at.reshape(-1)
        key, span = key * width + col, span * width
    _, firsts, at = np.unique(key, return_index=True, return_inverse=True)
    return firsts, at
