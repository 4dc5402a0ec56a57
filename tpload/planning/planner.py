"""Per-rank plans: which bytes of which tensor each rank reads, and where they land.

A plan is pure arithmetic on the catalogue (names, dtypes, shapes), the config and the model's
config.json, each given as an argument; it reads no file and touches no tensor data and no device,
so any rank can compute any other rank's plan (node verification, the pre-flight and ``tpload plan
--digest`` rely on that). The parts are in planning/; a plan is held as columns (each entry's index,
class and arena offset in arrays), and its named items are made only by the rank that loads it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..model.errors import ConfigError, LayoutError
from ..model.modes import Kind
from ..model.table import TensorTable
from ..model.text import escape_name
from ..model.values import Box, Layout
from ..selection.config import Config
from ..selection.prefix import detect as detect_prefix
from . import checks
from .classify import Classified, classify
from .cutting import SLOT_ALIGN, Shaped, shaped, slot
from .entries import Entries, Entry
from .items import Item, Outputs, item_of
from .layout import parts_of
from .view import CatalogueView


@dataclass(frozen=True, eq=False)
class RankPlan:
    """Everything one rank will do, decided before any byte is copied, as columns: the index of
    each entry it holds, its class (whose cuts it shares with every tensor of the class on this
    rank) and its arena offset. Named items are made when first asked for, which only the rank
    that loads the plan does: a node's peers' plans are read for names and windows only."""

    rank: int
    layout: Layout
    kind: Kind
    index: np.ndarray
    """Each held entry's position among the planner's entries."""
    klass: np.ndarray
    """Each held entry's class."""
    table: Mapping[int, Shaped]
    """Each held class's cuts and served tensors on this rank."""
    offsets: np.ndarray
    """Arena offset of each entry's first output."""
    all_entries: Entries
    skipped: tuple[str, ...]
    deferred: tuple[str, ...]
    arena_bytes: int

    @property
    def entries(self) -> Iterator[Entry]:
        """Each held entry, made as it is reached (kept by nobody: the items are what the load
        keeps)."""
        return map(self.all_entries.__getitem__, self.index.tolist())

    @functools.cached_property
    def shapes(self) -> list[Shaped]:
        """Each entry's class's cuts: the same object for entries cut alike."""
        return list(map(self.table.__getitem__, self.klass.tolist()))

    @functools.cached_property
    def items(self) -> tuple[Item, ...]:
        """Every entry's item (what a tool, an engine's hand-off or a test reads; the load makes
        only the items it needs, with :meth:`item`)."""
        return tuple(map(item_of, self.entries, self.shapes, self.offsets.tolist()))

    def item(self, t: int) -> Item:
        """The named item of the ``t``-th held entry, made alone (as :attr:`items` holds it)."""
        return item_of(
            self.all_entries[int(self.index[t])],
            self.table[int(self.klass[t])],
            int(self.offsets[t]),
        )

    @functools.cached_property
    def names(self) -> list[str]:
        """Each held entry's weight name, in plan order."""
        return list(map(self.all_entries.names.__getitem__, self.index.tolist()))

    @property
    def class_count(self) -> int:
        """One more than the largest class number the plan names (its table's or its entries':
        a plan cut down to some entries keeps its whole table)."""
        top = max(self.table, default=-1)
        return max(top, int(self.klass.max()) if len(self.klass) else -1) + 1

    def cut_names(self) -> list[str]:
        """The stored tensor of each item's each cut, in plan order (its scales, then its weight,
        as :attr:`Item.cuts`), from the columns."""
        rows, table = self.all_entries, self.table
        scales, scales2, names = rows.scales, rows.scales2, rows.names
        out: list[str] = []
        for k, c in zip(self.index.tolist(), self.klass.tolist(), strict=True):
            s = table[c]
            if s.scale is not None:
                out.append(scales[k])
            if s.scale2 is not None:
                out.append(scales2[k])
            out.append(names[k])
        return out

    @functools.cached_property
    def outputs(self) -> Outputs:
        """Every served tensor, in plan order (each item's outputs, as :func:`item_of` names and
        places them), as columns: no item is made."""
        size = self.class_count
        count: np.ndarray = np.zeros(size, np.int64)
        column: np.ndarray = np.zeros(
            (size, 3), np.int64
        )  # 0: the weight's name, 1: the scale's, 2: scale2's
        after: np.ndarray = np.zeros((size, 3), np.int64)  # each output's offset after its entry's
        nbytes: np.ndarray = np.zeros((size, 3), np.int64)
        code: np.ndarray = np.zeros((size, 3), np.int64)
        layouts: list[tuple[torch.dtype, tuple[int, ...]]] = []
        for c, s in self.table.items():
            name_cols = [0] + [1] * (s.scale is not None) + [2] * (s.scale2 is not None)
            at = 0
            for j, (col, (dtype, shape, n)) in enumerate(zip(name_cols, s.served, strict=False)):
                column[c, j], after[c, j], nbytes[c, j], code[c, j] = col, at, n, len(layouts)
                layouts.append((dtype, shape))
                at += slot(n)
                count[c] = j + 1
        per = count[self.klass]
        rep: np.ndarray = np.repeat(np.arange(len(self.klass)), per)
        j = np.arange(len(rep)) - np.repeat(np.cumsum(per) - per, per)
        k = self.klass[rep]
        rows = self.all_entries
        if len(rep) == len(self.klass):  # one output an entry: the weight's names
            names = self.names
        else:
            cols = (rows.names, rows.scales, rows.scales2)
            names = [
                cols[c][e]
                for c, e in zip(column[k, j].tolist(), self.index[rep].tolist(), strict=True)
            ]
        return Outputs(
            names, self.offsets[rep] + after[k, j], nbytes[k, j], code[k, j], tuple(layouts)
        )

    @functools.cached_property
    def reads(self) -> dict[str, Box]:
        """Every stored tensor this rank reads a window of (each item's scales, then its weight):
        its box."""
        boxes = {k: _boxes(s) for k, s in self.table.items()}  # one tuple per class, shared
        rows = self.all_entries
        names, scales, scales2 = rows.names, rows.scales, rows.scales2
        out: dict[str, Box] = {}
        for k, c in zip(self.index.tolist(), self.klass.tolist(), strict=True):
            weight, scale, scale2 = boxes[c]
            if scale is not None:
                out[scales[k]] = scale
            if scale2 is not None:
                out[scales2[k]] = scale2
            out[names[k]] = weight
        return out

    def views(self) -> dict[str, tuple[int, int]]:
        """Each stored tensor this rank reads a window of: the 2-D byte view (rows, row bytes) its
        window is a box of."""
        rows, table = self.all_entries, self.table
        scales, scales2, names = rows.scales, rows.scales2, rows.names
        out: dict[str, tuple[int, int]] = {}
        for k, c in zip(self.index.tolist(), self.klass.tolist(), strict=True):
            s = table[c]  # a Cut's fields after its name: the view is the fifth
            if s.scale is not None:
                out[scales[k]] = s.scale[4]
            if s.scale2 is not None:
                out[scales2[k]] = s.scale2[4]
            out[names[k]] = s.weight[4]
        return out

    @property
    def used_tensors(self) -> list[str]:
        """Stored tensors this rank reads a window of (each item's scales, then its weight)."""
        return list(self.reads)

    @functools.cached_property
    def _counts(self) -> dict[int, int]:
        """How many held entries each class has."""
        classes, counts = np.unique(self.klass, return_counts=True)
        return dict(zip(classes.tolist(), counts.tolist(), strict=True))

    @functools.cached_property
    def read_bytes(self) -> int:
        return sum(n * self.table[k].read_bytes for k, n in self._counts.items())

    @functools.cached_property
    def served(self) -> int:
        return sum(n * len(self.table[k].served) for k, n in self._counts.items())

    @functools.cached_property
    def largest_transient(self) -> int:
        """Device bytes beyond the arena: one staged window plus, expanded, its fp32 decode rows."""
        if not self.table:
            return 0
        staged = max(s.read_bytes for s in self.table.values())
        if self.kind == Kind.PACKED:
            return staged
        return staged + max(s.decode_bytes for s in self.table.values())


def _boxes(s: Shaped) -> tuple[Box, Box | None, Box | None]:
    """The boxes of a class's weight, scale and second scale."""
    return (
        (s.weight[0], s.weight[1]),
        (s.scale[0], s.scale[1]) if s.scale is not None else None,
        (s.scale2[0], s.scale2[1]) if s.scale2 is not None else None,
    )


def _in_table_order(names: Iterable[str], table: TensorTable) -> bool:
    """Whether ``names`` are the table's, in its order (its templates' rows are then theirs)."""
    return names is table.names or table.names == list(names)


def _activation_scales(names: Iterable[str], table: TensorTable) -> list[str]:
    """The single-value ``*.input_scale`` tensors of ``names`` (the table's, in its order): the
    names read off the templates that end so (the suffix has no digit: a template's names all end
    in it or none does), each candidate's shape checked."""
    tpl = table.templates
    if not _in_table_order(names, table):
        rows = [table.row[n] for n in names if n.endswith(".input_scale")]
    else:
        ends = np.asarray([text[-1].endswith(".input_scale") for text in tpl.texts], bool)
        rows = np.flatnonzero(ends[tpl.ids]).tolist()
    shapes, every = table.shapes, table.names
    return [every[k] for k in rows if math.prod(shapes[k]) == 1]


class Planner:
    """Classifies a catalogue once against a config, then cuts plans for any layout."""

    def __init__(
        self, catalogue: CatalogueView, config: Config, *, model: Mapping[str, object] | None = None
    ) -> None:
        """``model``: the checkpoint's config.json (None: it has none); rules that count heads
        read it, and the prefix's note counts MTP layers by it."""
        self.catalogue, self.config = catalogue, config
        names = catalogue.tensors
        table = catalogue.table
        ordered = _in_table_order(names, table)  # then the prefix is read off the templates
        self.prefix = detect_prefix(
            table.names if ordered else names,
            wanted=config.rules_prefix,
            model=model,
            where=catalogue.root,
            templates=table.templates if ordered else None,
        )
        self.activation_scales = _activation_scales(names, table)
        """Single-value ``*.input_scale`` tensors (ModelOpt NVFP4's activation scales)."""
        self.classified: Classified = classify(
            names,
            config,
            prefix=self.prefix,
            model=model,
            root=catalogue.root,
            table=table,
        )
        c = self.classified
        self.census = c.census  # of what is served or deferred: skipped layers are not counted
        self.entries, self.skipped, self.deferred = c.entries, list(c.skipped), c.deferred
        self.expert_counts = c.expert_counts
        self._klass = c.entries.klass
        self._plans: dict[tuple[Layout, Kind, int], RankPlan] = {}

    def notes(self) -> list[str]:
        """What ``plan`` prints and the report keeps: the prefix found, the KV-cache scale census,
        the activation scales."""
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
                f"activation scales: {n:,} single-value *.input_scale tensors (4 B stored, a "
                f"{SLOT_ALIGN} B arena slot, one tensor and one hash each when served: "
                f"{n * SLOT_ALIGN / 2**20:,.2f} MiB of slots per rank holding them all); "
                + (f"{off:,} skipped" if off else "served (--skip-activation-scales skips them)")
            )
        return out

    def layout_problems(self, layout: Layout) -> list[str]:
        """Every reason this tp x ep layout cannot be cut (empty when it can)."""
        return checks.layout_problems(
            self.classified, layout, channel_align=self.config.channel_align
        )

    def working_tps(self, limit: int = checks.SUGGEST_UP_TO) -> list[int]:
        """The tp values (up to ``limit``, itself bounded) that cut every tensor."""
        return checks.working_tps(
            self.classified, channel_align=self.config.channel_align, limit=limit
        )

    def check_layout(self, layout: Layout, world: int) -> None:
        """Raise a LayoutError naming what fails and which layouts would work."""
        checks.check_layout(self.classified, layout, world, channel_align=self.config.channel_align)

    def plan(self, layout: Layout, kind: str, rank: int) -> RankPlan:
        """Rank ``rank``'s plan (made once per layout, kind and rank; plans are immutable)."""
        if kind not in tuple(Kind):
            raise ConfigError(f"kind {kind!r} is not one of {', '.join(Kind)}")
        key = (layout, Kind(kind), rank)
        if key not in self._plans:
            self._plans[key] = self._make(layout, Kind(kind), rank)
        return self._plans[key]

    @staticmethod
    def _held(at: np.ndarray, layout: Layout, group: int) -> np.ndarray:
        """The rows that expert-parallel group ``group`` holds, given each row's expert position
        and set size ``at`` (one pass over the columns: a row of no expert set is everyone's)."""
        if layout.ep == 1 or not len(at):
            return np.arange(len(at))
        everyone = at[:, 1] == 0
        return np.flatnonzero(everyone | (parts_of(at[:, 0], at[:, 1], layout.ep) == group))

    def _make(self, layout: Layout, kind: Kind, rank: int) -> RankPlan:
        group = layout.position(rank)[0]
        index = self._held(self.classified.expert_at, layout, group)
        klass = self._klass[index]
        classes, first = np.unique(klass, return_index=True)
        table: dict[int, Shaped] = {}
        arena: np.ndarray = np.zeros(int(classes[-1]) + 1 if len(classes) else 0, dtype=np.int64)
        # classes in order of first appearance: the first tensor that fails is named
        for at in np.sort(first).tolist():
            e = self.entries[int(index[at])]
            got = shaped(
                e,
                layout,
                rank,
                kind,
                units=self.classified.units,
                channel_align=self.config.channel_align,
            )
            if isinstance(got, str):
                raise LayoutError(
                    f"rank {rank}: tensor {escape_name(e.name)} under {e.rule.describe()}: {got}"
                )
            table[e.klass], arena[e.klass] = got, got.arena
        ends = np.cumsum(arena[klass])
        offsets = ends - arena[klass]
        held = self._held(self.classified.deferred_at, layout, group).tolist()
        deferred = tuple(map(self.deferred.__getitem__, held))
        total = int(ends[-1]) if len(ends) else 0
        return RankPlan(
            rank,
            layout,
            kind,
            index,
            klass,
            table,
            offsets,
            self.entries,
            tuple(self.skipped),
            deferred,
            total,
        )
