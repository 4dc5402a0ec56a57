"""The windows of one class of tensors on one rank: the rule's split gives a channel window, and
the tensor's codec turns it into byte cuts of the weight and its scales (codecs/), and the
tensors it serves from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from ..codecs.base import Cut, whole
from ..model.modes import Kind
from ..model.values import Layout
from .entries import Entry
from .layout import share

SLOT_ALIGN = 256  # every served tensor starts on a 256-byte boundary of the arena


CutFields = tuple[tuple[int, int], tuple[int, int], tuple[int, ...], str, tuple[int, int], int]
"""A Cut's fields after its name (codecs/base.py): rows, byte columns, shape, dtype, view, group."""


class Shaped(NamedTuple):
    """A tensor's cuts and served tensors on one rank, without the names: shared by every tensor of
    its class (the 256 experts of a layer cut alike)."""

    weight: CutFields
    """The weight's Cut fields after its name."""
    scale: CutFields | None
    scale2: CutFields | None
    served: tuple[tuple[torch.dtype, tuple[int, ...], int], ...]
    """(dtype, shape, bytes) of each output: the weight's (or its decode's), then its scales'."""
    rule: str
    read_bytes: int
    arena: int
    """Arena bytes of the outputs, each rounded up to SLOT_ALIGN."""
    decode_bytes: int
    """fp32 rows of an expanded decode (0 for a plain tensor)."""


def slot(nbytes: int) -> int:
    """Arena bytes of a served tensor of ``nbytes``: rounded up to SLOT_ALIGN."""
    return -(-nbytes // SLOT_ALIGN) * SLOT_ALIGN


def cuts(
    e: Entry, layout: Layout, rank: int, *, units: Mapping[tuple[int, str], int], channel_align: int
) -> tuple[Cut, Cut | None] | str:
    """This rank's window of the weight (and scale), or why the layout cannot cut it."""
    group, tpr = layout.position(rank)
    align = e.rule.align or (channel_align if e.codec.tiled else 0)
    experts = (
        share(e.stacked_experts, layout.ep, group) if e.stacked_experts and layout.ep > 1 else None
    )
    n = units.get((e.rule.index, e.rule.match), 0)
    if n and n < layout.tp and not e.rule.share_units:
        return (
            f"{n} units / tp {layout.tp}: tp must divide them (they are not shared between ranks)"
        )
    return e.codec.window(
        e.fit,
        e.rule.split,
        layout.tp,
        tpr,
        align=align,
        units=n,
        uneven=e.rule.uneven,
        experts=experts,
    )


def shaped(
    e: Entry,
    layout: Layout,
    rank: int,
    kind: Kind,
    *,
    units: Mapping[tuple[int, str], int],
    channel_align: int,
) -> Shaped | str:
    """The cuts and served tensors of ``e``'s class on this rank (or why the layout cannot cut
    it)."""
    got = cuts(e, layout, rank, units=units, channel_align=channel_align)
    if isinstance(got, str):
        return got
    weight, scale = got
    f = e.fit
    served = tuple(
        (dtype, shape, nbytes) for _, dtype, shape, nbytes in e.codec.served(f, weight, scale, kind)
    )
    scale2 = whole(f.scale2) if f.scale2 is not None else None
    read = weight.nbytes + (scale.nbytes if scale else 0) + (scale2.nbytes if scale2 else 0)
    return Shaped(
        weight[1:],
        scale[1:] if scale else None,
        scale2[1:] if scale2 else None,
        served,
        e.rule.describe(),
        read,
        sum(slot(n) for _, _, n in served),
        served[0][2] * 2 if e.codec.scaled else 0,
    )
