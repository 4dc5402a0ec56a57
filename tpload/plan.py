"""Per-rank plans: which bytes of which tensor each rank reads, and where they land.

A plan is pure arithmetic on the checkpoint's headers and the config; it
touches no tensor data and no device, so any rank can compute any other
rank's plan (node verification and ``tpload plan --digest`` rely on that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .checkpoint import Checkpoint, TensorInfo, natural_key
from .config import Config, Rule
from .errors import ConfigError, LayoutError, raise_all
from .formats import (DTYPES, E8M0_SCALE_DTYPES, FP4_GROUP, FP4_WEIGHT_DTYPES, FP8_SCALE_DTYPES,
                      FP8_WEIGHT_DTYPES, PLAIN_DTYPES)

KINDS = ("packed", "expanded")
SLOT_ALIGN = 256  # every served tensor starts on a 256-byte boundary of the arena


@dataclass(frozen=True)
class Layout:
    """How the ranks of one group split a checkpoint: ``tp`` x ``ep``."""

    tp: int
    """Tensor-parallel degree: ranks that share every matrix, each a window."""
    ep: int = 1
    """Expert-parallel degree: groups of ``tp`` ranks that split the experts."""

    def __post_init__(self) -> None:
        if self.tp < 1 or self.ep < 1:
            raise LayoutError(f"tp and ep must be >= 1, got tp {self.tp}, ep {self.ep}")

    @property
    def world(self) -> int:
        return self.tp * self.ep

    def position(self, rank: int) -> tuple[int, int]:
        """(expert-parallel group, tensor-parallel rank) of a group rank: tp is innermost."""
        return divmod(rank, self.tp)


@dataclass(frozen=True)
class Cut:
    """The part of one stored tensor a rank reads: a box of its 2-D byte view."""

    name: str
    rows: tuple[int, int]
    """Row range of the tensor's ``[rows, row_bytes]`` view (1-D tensors are one row)."""
    cols: tuple[int, int]
    """Byte range within each row."""
    shape: tuple[int, ...]
    """The window's shape in stored elements."""
    dtype: str
    """Stored dtype (safetensors spelling)."""

    @property
    def nbytes(self) -> int:
        return (self.rows[1] - self.rows[0]) * (self.cols[1] - self.cols[0])


@dataclass(frozen=True)
class Output:
    """One served tensor: a slot of the rank's arena."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Item:
    """One unit of work: a weight (and its scale) becoming one or two served tensors."""

    name: str
    role: str
    rule: str
    weight: Cut
    scale: Cut | None
    block: int
    """fp8: the scale block B; fp4: the scale group (32); plain: 0."""
    outputs: tuple[Output, ...]

    @property
    def read_bytes(self) -> int:
        return self.weight.nbytes + (self.scale.nbytes if self.scale else 0)

    @property
    def cuts(self) -> list[Cut]:
        """The weight's cut, then the scale's (if any)."""
        return [self.weight] + ([self.scale] if self.scale else [])


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank will do, decided before any byte is copied."""

    rank: int
    layout: Layout
    kind: str
    items: tuple[Item, ...]
    skipped: tuple[str, ...]
    deferred: tuple[str, ...]
    arena_bytes: int

    @property
    def read_bytes(self) -> int:
        return sum(i.read_bytes for i in self.items)

    @property
    def used_tensors(self) -> list[str]:
        """Official tensors this rank reads a window of (weights and scales)."""
        names = [i.weight.name for i in self.items] + [i.scale.name for i in self.items if i.scale]
        return sorted(names, key=natural_key)

    @property
    def largest_transient(self) -> int:
        """Device bytes beyond the arena: one staged window plus, expanded, its fp32 decode rows."""
        if not self.items:
            return 0
        staged = max(i.read_bytes for i in self.items)
        if self.kind == "packed":
            return staged
        return staged + max((i.outputs[0].nbytes * 2 if i.role != "plain" else 0) for i in self.items)


@dataclass(frozen=True)
class _Entry:
    """A classified official tensor (weight side; its scale is folded in)."""

    name: str
    rule: Rule
    info: TensorInfo
    scale: TensorInfo | None = None
    block: int = 0
    expert: tuple[str, int] | None = None
    """(expert set, index within it) for expert-parallel tensors."""


def _infer_block(w: TensorInfo, s: TensorInfo, rule: Rule) -> int | str:
    """The fp8 block size that maps the weight's shape onto the scale's, or why none does."""
    (n, k), (sn, sk) = w.shape, s.shape
    candidates = [rule.block] if rule.block else sorted({1 << max(0, math.ceil(n / max(sn, 1)) - 1).bit_length(),
                                                         1 << max(0, math.ceil(k / max(sk, 1)) - 1).bit_length()})
    for b in candidates:
        if (-(-n // b), -(-k // b)) == (sn, sk):
            return b
    want = f"block {rule.block}" if rule.block else "any power-of-two block"
    return f"scale shape {list(s.shape)} does not tile weight shape {list(w.shape)} with {want}"


class Planner:
    """Classifies a checkpoint once against a config, then cuts plans for any layout."""

    def __init__(self, ckpt: Checkpoint, config: Config) -> None:
        self.ckpt, self.config = ckpt, config
        self.entries, self.skipped, self.deferred = self._classify()
        # Deferred expert tensors are located only by the ep group holding the expert:
        # a locator of a remote expert would invite the model to read it.
        self.deferred_experts = {n: x for n in self.deferred if (x := self._expert_of(n, config.rule_for(n)))}
        self.expert_counts = self._count_experts()

    # -- classification ------------------------------------------------------------------------

    def _classify(self) -> tuple[list[_Entry], list[str], list[str]]:
        names = self.ckpt.names()
        rules = {n: self.config.rule_for(n) for n in names}
        problems: list[str] = []
        scales: dict[str, str] = {}
        broken: set[str] = set()
        for n, r in rules.items():
            if r is not None and r.role in ("fp4", "fp8"):
                sname = n[: -len(".weight")] + r.scale
                if not n.endswith(".weight"):
                    problems.append(f"tensor {n}: {r.describe()} is {r.role} but the name does not end in .weight")
                elif sname not in self.ckpt.tensors:
                    problems.append(f"tensor {n}: {r.describe()} needs its scale {sname}, which the checkpoint lacks")
                else:
                    scales[sname] = n
                    continue
                broken.add(n)
        entries, skipped, deferred, unmatched = [], [], [], []
        grouped: dict[str, list[str]] = {}
        for n in names:
            r = rules[n]
            if n in scales or n in broken:
                continue
            if r is None:
                unmatched.append(n)
            elif r.role == "skip":
                skipped.append(n)
            elif r.role == "defer":
                deferred.append(n)
            else:
                e = self._entry(n, r, grouped)
                if e is not None:
                    entries.append(e)
        for reason, tensors in grouped.items():
            problems.append(f"{reason}: {_listing(tensors)}")
        if unmatched:
            problems.append(f"{len(unmatched)} tensors match no rule of {self.config.name} (add a rule; a final "
                            f"match = \"*\" with split = \"replicate\" is a common catch-all): {_listing(unmatched)}")
        raise_all(ConfigError, problems, what=f"problems fitting config {self.config.name} to {self.ckpt.root}")
        return entries, skipped, deferred

    def _entry(self, name: str, rule: Rule, grouped: dict[str, list[str]]) -> _Entry | None:
        """Classify one tensor under its rule, or file why it does not fit under (rule, reason)."""
        info = self.ckpt.tensors[name]
        tensor = f"{name} ({info.file}, {info.dtype} {list(info.shape)})"

        def refuse(reason: str, detail: str = "") -> None:
            grouped.setdefault(f"{rule.describe()}: {reason}", []).append(tensor + (f": {detail}" if detail else ""))

        expert = self._expert_of(name, rule)
        if rule.experts and expert is None:
            return refuse(f"experts = true but expert_pattern {self.config.expert_pattern!r} finds no index in")
        if rule.role == "plain":
            if info.dtype not in PLAIN_DTYPES:
                return refuse(f"plain tensors must be {'/'.join(PLAIN_DTYPES)}, and these are not")
            if rule.split == "cols" and len(info.shape) != 2:
                return refuse("split cols needs 2-D tensors")
            return _Entry(name, rule, info, expert=expert)
        scale = self.ckpt.tensors[name[: -len(".weight")] + rule.scale]
        wants = (FP4_WEIGHT_DTYPES, E8M0_SCALE_DTYPES) if rule.role == "fp4" else (FP8_WEIGHT_DTYPES, FP8_SCALE_DTYPES)
        if info.dtype not in wants[0] or scale.dtype not in wants[1] or len(info.shape) != 2 or len(scale.shape) != 2:
            return refuse(f"{rule.role} wants a 2-D {'/'.join(wants[0])} weight and a 2-D {'/'.join(wants[1])} scale",
                          f"scale {scale.name} is {scale.dtype} {list(scale.shape)}")
        if rule.role == "fp4":
            n, kb = info.shape
            if scale.shape != (n, 2 * kb // FP4_GROUP) or (2 * kb) % FP4_GROUP:
                return refuse(f"fp4 scales hold one E8M0 byte per {FP4_GROUP} elements",
                              f"scale {scale.name} is {list(scale.shape)}, expected [{n}, {2 * kb // FP4_GROUP}]")
            return _Entry(name, rule, info, scale, FP4_GROUP, expert)
        block = _infer_block(info, scale, rule)
        if isinstance(block, str):
            return refuse("fp8 scale shape does not fit", block)
        return _Entry(name, rule, info, scale, block, expert)

    def _expert_of(self, name: str, rule: Rule) -> tuple[str, int] | None:
        """(expert set, index) of an expert-parallel tensor; None when the rule is not
        expert-parallel or the name has no expert index."""
        m = self.config.expert_regex.search(name) if rule.experts else None
        return (name[: m.start()], int(m.group(1))) if m else None

    def _count_experts(self) -> dict[str, list[int]]:
        sets: dict[str, set[int]] = {}
        for key, index in [e.expert for e in self.entries if e.expert] + list(self.deferred_experts.values()):
            sets.setdefault(key, set()).add(index)
        return {k: sorted(v) for k, v in sets.items()}

    # -- windows -------------------------------------------------------------------------------

    def _cuts(self, e: _Entry, tp: int, r: int) -> tuple[Cut, Cut | None] | str:
        """This tp rank's window of the weight (and scale), or why tp cannot cut it."""
        w, s, split = e.info, e.scale, e.rule.split
        rows_all = w.shape[0] if len(w.shape) > 1 else 1
        row_bytes = w.nbytes // rows_all if rows_all else 0
        whole_w = Cut(w.name, (0, rows_all), (0, row_bytes), w.shape, w.dtype)
        whole_s = Cut(s.name, (0, s.shape[0]), (0, s.shape[1] * s.itemsize), s.shape, s.dtype) if s else None
        if split == "replicate" or tp == 1:
            return whole_w, whole_s
        role = e.rule.role
        if role == "plain":
            n = w.shape[0] if split == "rows" else w.shape[1]
            if n % tp:
                return f"{n} {split} / tp {tp} is not whole"
            step = n // tp
            if split == "rows":
                shape = (step,) + w.shape[1:]
                if len(w.shape) == 1:
                    return Cut(w.name, (0, 1), (r * step * w.itemsize, (r + 1) * step * w.itemsize), shape, w.dtype), None
                return Cut(w.name, (r * step, (r + 1) * step), (0, row_bytes), shape, w.dtype), None
            cb = step * w.itemsize
            return Cut(w.name, (0, rows_all), (r * cb, (r + 1) * cb), (rows_all, step), w.dtype), None
        if role == "fp4":
            n, kb = w.shape
            chans = n if split == "rows" else 2 * kb
            per, align = chans // tp, self.config.channel_align
            if chans % tp or per % align or per % FP4_GROUP:
                return f"{chans} channels / tp {tp} = {chans / tp:g}, not a multiple of {align}"
            if split == "rows":
                rows = (r * per, (r + 1) * per)
                return (Cut(w.name, rows, (0, kb), (per, kb), w.dtype),
                        Cut(s.name, rows, (0, s.shape[1]), (per, s.shape[1]), s.dtype))
            g = per // FP4_GROUP
            return (Cut(w.name, (0, n), (r * per // 2, (r + 1) * per // 2), (n, per // 2), w.dtype),
                    Cut(s.name, (0, n), (r * g, (r + 1) * g), (n, g), s.dtype))
        # fp8: whole scale blocks per rank
        b, (n, k), (sn, sk) = e.block, w.shape, s.shape
        blocks = sn if split == "rows" else sk
        if blocks % tp:
            return f"{blocks} scale blocks of {b} / tp {tp} is not whole"
        b0, b1 = r * blocks // tp, (r + 1) * blocks // tp
        if split == "rows":
            rows = (b0 * b, min(n, b1 * b))
            return (Cut(w.name, rows, (0, k), (rows[1] - rows[0], k), w.dtype),
                    Cut(s.name, (b0, b1), (0, sk * s.itemsize), (b1 - b0, sk), s.dtype))
        cols = (b0 * b, min(k, b1 * b))
        return (Cut(w.name, (0, n), cols, (n, cols[1] - cols[0]), w.dtype),
                Cut(s.name, (0, sn), (b0 * s.itemsize, b1 * s.itemsize), (sn, b1 - b0), s.dtype))

    def owns(self, e: _Entry, layout: Layout, group: int) -> bool:
        """Does expert-parallel group ``group`` hold this tensor? (last group takes the remainder)"""
        return self._owns_expert(e.expert, layout, group)

    def _owns_expert(self, expert: tuple[str, int] | None, layout: Layout, group: int) -> bool:
        if expert is None or layout.ep == 1:
            return True
        experts = self.expert_counts[expert[0]]
        per = len(experts) // layout.ep
        pos = experts.index(expert[1])
        lo, hi = group * per, (len(experts) if group == layout.ep - 1 else (group + 1) * per)
        return lo <= pos < hi

    # -- layouts -------------------------------------------------------------------------------

    def layout_problems(self, layout: Layout) -> list[str]:
        """Every reason this tp x ep layout cannot be cut (empty when it can)."""
        problems = []
        for key, experts in self.expert_counts.items():
            if len(experts) < layout.ep:
                problems.append(f"expert set {key}* has {len(experts)} experts, fewer than ep {layout.ep}")
        seen_rules: set[tuple[int, str]] = set()
        for e in self.entries:
            why = self._cuts(e, layout.tp, 0)
            if isinstance(why, str) and (e.rule.index, why) not in seen_rules:
                seen_rules.add((e.rule.index, why))
                problems.append(f"tensor {e.name} ({e.info.file}) under {e.rule.describe()}: {why}")
        return problems

    def working_tps(self, limit: int = 64) -> list[int]:
        return [t for t in range(1, limit + 1) if not self.layout_problems(Layout(t))]

    def check_layout(self, layout: Layout, world: int) -> None:
        """Raise a LayoutError naming what fails and which layouts would work."""
        problems = []
        if layout.world != world:
            problems.append(f"tp {layout.tp} x ep {layout.ep} = {layout.world} ranks, but the group has {world}")
        problems += self.layout_problems(layout)
        if not problems:
            return
        tps = self.working_tps(max(world, layout.tp))
        splits = [f"--tp {t} --ep {world // t}" for t in tps if world % t == 0
                  and not self.layout_problems(Layout(t, world // t))]
        hint = f"tp values that cut this checkpoint: {', '.join(map(str, tps)) or 'none'}"
        hint += f"; for {world} ranks use " + (" or ".join(splits) if splits else "another world size")
        raise LayoutError(f"cannot load with tp {layout.tp} x ep {layout.ep} on {world} ranks:\n  - "
                          + "\n  - ".join(problems) + f"\n{hint}")

    # -- plans ---------------------------------------------------------------------------------

    def plan(self, layout: Layout, kind: str, rank: int) -> RankPlan:
        if kind not in KINDS:
            raise ConfigError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        group, tpr = layout.position(rank)
        items, offset = [], 0
        for e in self.entries:
            if not self.owns(e, layout, group):
                continue
            cuts = self._cuts(e, layout.tp, tpr)
            if isinstance(cuts, str):
                raise LayoutError(f"rank {rank}: tensor {e.name} under {e.rule.describe()}: {cuts}")
            outputs = []
            for name, dtype, shape, nbytes in _served(e, cuts, kind):
                outputs.append(Output(name, dtype, shape, offset, nbytes))
                offset += -(-nbytes // SLOT_ALIGN) * SLOT_ALIGN
            items.append(Item(e.name, e.rule.role, e.rule.describe(), cuts[0], cuts[1], e.block, tuple(outputs)))
        deferred = tuple(n for n in self.deferred if self._owns_expert(self.deferred_experts.get(n), layout, group))
        return RankPlan(rank, layout, kind, tuple(items), tuple(self.skipped), deferred, offset)


def _listing(names: list[str], limit: int = 12) -> str:
    """``a, b, c (and N more)``: long lists stay readable in one error line."""
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _served(e: _Entry, cuts: tuple[Cut, Cut | None], kind: str) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    """(name, dtype, shape, bytes) of each tensor served for this entry."""
    w, s = cuts
    if e.rule.role == "plain":
        served = DTYPES[w.dtype].served
        return [(w.name, served, w.shape, math.prod(w.shape) * served.itemsize)]
    if kind == "packed":
        return [(w.name, DTYPES[w.dtype].served, w.shape, w.nbytes),
                (s.name, DTYPES[s.dtype].served, s.shape, s.nbytes)]
    rows = w.shape[0]
    cols = w.shape[1] * 2 if e.rule.role == "fp4" else w.shape[1]
    return [(w.name, torch.bfloat16, (rows, cols), rows * cols * 2)]
