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

from ..model.table import Templates
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
    parameters, found for all of them at once in numpy (no name made or looked up)."""

    def __init__(self, tpl: Templates) -> None:
        self.tpl = tpl
        self.ids = {text: t for t, text in enumerate(tpl.texts)}
        order = np.argsort(tpl.ids, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(tpl.ids, minlength=len(tpl.texts)))))
        self._order, self._bounds = order, bounds
        self.keys = _keys(tpl)
        """Each row's parameters (every run's value and leading zeros) as one number; None when
        they do not fit in one."""

    def rows(self, t: int) -> np.ndarray:
        """The rows of template ``t``, in the table's order."""
        rows: np.ndarray = self._order[self._bounds[t] : self._bounds[t + 1]]
        return rows

    def renamed(self, rows: np.ndarray, t: int, suffix: str, replacement: str) -> np.ndarray | None:
        """For each row of template ``t`` (whose names end in ``suffix``), the row of its name with
        ``suffix`` replaced by ``replacement``, -1 where no tensor has that name; None where this
        cannot be read off the templates (a digit in either text, an empty suffix, parameters
        that do not fit one number): the caller asks name by name."""
        texts = self.tpl.texts[t]
        if (
            self.keys is None
            or not suffix
            or not texts[-1].endswith(suffix)
            or any(c.isdigit() for c in suffix + replacement)
        ):
            return None
        # with no digit in either, the new name keeps every run: the same parameters, and the
        # template whose last text part has its suffix replaced
        other = self.ids.get((*texts[:-1], texts[-1][: -len(suffix)] + replacement))
        out: np.ndarray = np.full(len(rows), -1, np.int64)
        if other is None:
            return out
        candidates = self.rows(other)
        keys = self.keys[candidates]
        order = np.argsort(keys, kind="stable")
        want = self.keys[rows]
        at = np.searchsorted(keys[order], want)
        at = np.minimum(at, len(order) - 1)
        hit = keys[order][at] == want
        out[hit] = candidates[order][at][hit]
        return out


def _keys(tpl: Templates) -> np.ndarray | None:
    """Each row's runs (value and leading zeros, -1 and 0 past its last) as one int64, equal
    exactly when all are; None when the mixed radix would not fit."""
    cols = [tpl.values + 1, tpl.zeros]  # values: -1 past the last run
    key: np.ndarray = np.zeros(len(tpl.ids), np.int64)
    span = 1
    for col in (c[:, j] for c in cols for j in range(c.shape[1])):
        top = int(col.max()) + 1 if len(col) else 1
        if span > (1 << 62) // top:
            return None
        key = key * top + col
        span *= top
    return key
