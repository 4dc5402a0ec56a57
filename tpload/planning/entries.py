"""The classified weights as columns: one row per weight (its name, class, scales' names and
expert), the rule, codec and fit once per class. A row becomes an :class:`Entry` only when asked
for, which the rank that loads a plan does for its own rows: 64 plans of a 92,000-tensor
checkpoint are cut from the columns without making an object per weight (nor leaving the
collector any to walk)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..codecs.base import Codec, Fit
from ..model.meta import TensorMeta
from ..selection.config import Rule


class Entry(NamedTuple):
    """A classified stored tensor (weight side; its scales are folded in)."""

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


class Klass(NamedTuple):
    """What the weights of one class share: they are cut as its first one is."""

    rule: Rule
    codec: Codec
    fit: Fit
    """The first weight's fit."""
    stacked_experts: int


class Columns:
    """Rows appended one weight at a time while classifying, then frozen into arrays."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.klass: list[int] = []
        self.scales: list[str | None] = []
        self.scales2: list[str | None] = []
        self.expert_set: list[int] = []
        """Each row's expert set (its place in ``sets``), -1 for none."""
        self.expert_index: list[int] = []
        self.sets: dict[str, int] = {}
        """Each expert set's name (the text before the index), numbered as first seen."""

    def add(
        self, name: str, klass: int, needed: tuple[str, ...] | None, expert: tuple[str, int] | None
    ) -> None:
        self.names.append(name)
        self.klass.append(klass)
        self.scales.append(needed[0] if needed else None)
        self.scales2.append(needed[1] if needed and len(needed) > 1 else None)
        if expert is None:
            self.expert_set.append(-1)
            self.expert_index.append(0)
        else:
            self.expert_set.append(self.sets.setdefault(expert[0], len(self.sets)))
            self.expert_index.append(expert[1])

    def extend_columns(
        self,
        names: list[str],
        klass: list[int],
        scales: list[str | None],
        scales2: list[str | None],
        sets: list[str | None],
        index: list[int],
    ) -> None:
        """:meth:`extend` from columns: each row's scales' names (None: none) and expert set's
        name (None: no expert) and index (0 for none); sets numbered as first seen, as
        :meth:`add` numbers them."""
        known = self.sets
        for key in dict.fromkeys(sets):
            if key is not None:
                known.setdefault(key, len(known))
        self.names += names
        self.klass += klass
        self.scales += scales
        self.scales2 += scales2
        self.expert_set += [-1 if key is None else known[key] for key in sets]
        self.expert_index += [
            i if key is not None else 0 for key, i in zip(sets, index, strict=True)
        ]


class Entries(Sequence[Entry]):
    """Every classified weight, natural order, as columns (an :class:`Entry` made per access)."""

    def __init__(
        self, rows: Columns, classes: Sequence[Klass], tensors: Mapping[str, TensorMeta]
    ) -> None:
        self.names, self.scales, self.scales2 = rows.names, rows.scales, rows.scales2
        self.klass = np.asarray(rows.klass, dtype=np.int64)
        self.expert_set = np.asarray(rows.expert_set, dtype=np.int64)
        self.expert_index = np.asarray(rows.expert_index, dtype=np.int64)
        self.set_names = list(rows.sets)
        self.classes, self.tensors = classes, tensors

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, k: int) -> Entry:  # type: ignore[override]  # an index only, no slices
        name, c = self.names[k], self.classes[self.klass[k]]
        meta, fit = self.tensors[name], c.fit
        if fit.weight is not meta:
            scale, scale2 = self.scales[k], self.scales2[k]
            fit = Fit(
                meta,
                self.tensors[scale] if scale else None,
                fit.group,
                self.tensors[scale2] if scale2 else None,
                fit.stacked,
            )
        s = self.expert_set[k]
        expert = (self.set_names[s], int(self.expert_index[k])) if s >= 0 else None
        return Entry(name, c.rule, c.codec, fit, expert, c.stacked_experts, int(self.klass[k]))

    def __iter__(self) -> Iterator[Entry]:
        return map(self.__getitem__, range(len(self.names)))

    def firsts(self) -> list[Entry]:
        """The first entry of each class, in order: the others cut as it does."""
        _, first = np.unique(self.klass, return_index=True)
        return [self[k] for k in np.sort(first).tolist()]

    def experts(
        self, deferred: Mapping[str, tuple[str, int]]
    ) -> tuple[dict[str, list[int]], np.ndarray]:
        """Each expert set's indices, ascending (``deferred``: the deferred experts' sets and
        indices count too); and per row, its expert's position in its set and the set's size
        (columns 0, 1; (0, 0) for a row every ep group holds)."""
        counts: dict[str, list[int]] = {}
        at: np.ndarray = np.zeros((len(self.names), 2), dtype=np.int64)
        for s, key in enumerate(self.set_names):
            rows = np.flatnonzero(self.expert_set == s)
            indices = np.unique(self.expert_index[rows])
            counts[key] = indices.tolist()
            at[rows, 0] = np.searchsorted(indices, self.expert_index[rows])
            at[rows, 1] = len(indices)
        extra: dict[str, set[int]] = {}
        for key, index in deferred.values():
            extra.setdefault(key, set()).add(index)
        for key, more in extra.items():
            known = counts.get(key, [])
            if not more <= set(known):
                counts[key] = sorted(more | set(known))
                merged = np.asarray(counts[key])
                if key in self.set_names:
                    rows = np.flatnonzero(self.expert_set == self.set_names.index(key))
                    at[rows, 0] = np.searchsorted(merged, self.expert_index[rows])
                    at[rows, 1] = len(merged)
        return counts, at
