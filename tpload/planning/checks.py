"""Whether a tp x ep layout cuts a classified checkpoint, and which layouts would."""

from __future__ import annotations

from ..model.errors import LayoutError
from ..model.text import escape_name, plural
from ..model.values import Layout
from .classify import Classified
from .cutting import cuts

SUGGEST_UP_TO = 64  # the layout suggestions try tp values up to this (or the world size)


def layout_problems(classified: Classified, layout: Layout, *, channel_align: int) -> list[str]:
    """Every reason this tp x ep layout cannot be cut (empty when it can)."""
    problems = [
        f"expert set {escape_name(key)}* has {len(experts)} experts, fewer than ep {layout.ep}"
        for key, experts in classified.expert_counts.items()
        if len(experts) < layout.ep
    ]
    # A class's first entry stands for all of it: the others are cut alike, and the first entry
    # of a class that fails is the first entry that fails.
    firsts = classified.firsts
    for e in firsts:
        if 0 < e.stacked_experts < layout.ep:
            problems.append(
                f"tensor {e.fit.weight.describe()} stacks {e.stacked_experts} experts, fewer "
                f"than ep {layout.ep}"
            )
            break
    seen_rules: set[tuple[int, str]] = set()
    tried: set[tuple[object, ...]] = set()
    for e in firsts:
        # a tensor of the same rule, codec, shape and dtypes as one already tried cuts the same way
        f = e.fit
        like: tuple[object, ...] = (
            e.rule.index,
            e.rule.origin,
            e.codec.name,
            f.group,
            f.weight.shape,
            f.weight.dtype,
        )
        like += (f.scale.shape if f.scale else None,)
        if like in tried:
            continue
        tried.add(like)
        why = cuts(e, Layout(layout.tp), 0, units=classified.units, channel_align=channel_align)
        if isinstance(why, str) and (e.rule.index, why) not in seen_rules:
            seen_rules.add((e.rule.index, why))
            problems.append(f"tensor {f.weight.describe()} under {e.rule.describe()}: {why}")
    return problems


def working_tps(
    classified: Classified, *, channel_align: int, limit: int = SUGGEST_UP_TO
) -> list[int]:
    """The tp values (up to ``limit``, itself bounded) that cut every tensor."""
    return [
        t
        for t in range(1, min(limit, SUGGEST_UP_TO) + 1)
        if not layout_problems(classified, Layout(t), channel_align=channel_align)
    ]


def check_layout(classified: Classified, layout: Layout, world: int, *, channel_align: int) -> None:
    """Raise a LayoutError naming what fails and which layouts would work."""
    problems = []
    if layout.world != world:
        problems.append(
            f"tp {layout.tp} x ep {layout.ep} = {plural(layout.world, 'rank')}, but the group "
            f"has {world}"
        )
    problems += layout_problems(classified, layout, channel_align=channel_align)
    if not problems:
        return
    tps = working_tps(
        classified, channel_align=channel_align, limit=max(world, min(layout.tp, SUGGEST_UP_TO))
    )
    splits = [
        f"--tp {t} --ep {world // t}"
        for t in tps
        if world % t == 0
        and not layout_problems(classified, Layout(t, world // t), channel_align=channel_align)
    ]
    hint = f"tp values that cut this checkpoint: {', '.join(map(str, tps)) or 'none'}"
    hint += f"; for {plural(world, 'rank')} use " + (
        " or ".join(splits) if splits else "another world size"
    )
    if layout.world != world and len(problems) == 1:  # the layout cuts: the launch is short of it
        hint = (
            f"launch {plural(layout.world, 'rank')} for it (torchrun --nproc-per-node "
            f"{layout.world}), or {hint}"
        )
    # the way on first: the problems can be many (one a rule that fails), the terminal caps them
    raise LayoutError(
        f"cannot load with tp {layout.tp} x ep {layout.ep} on {plural(world, 'rank')}: {hint}\n  - "
        + "\n  - ".join(problems)
    )
