"""Handing a rank's verified windows to a serving engine's own weight loaders, engine-independent.

Engines load a checkpoint by giving each parameter's ``weight_loader`` the *whole* stored tensor,
which narrows it to this rank's part (``loaded_weight.narrow(dim, tp_rank * size, size)``).
tpload reads only the window, so it hands over a :class:`WindowTensor`: a tensor with the
stored tensor's full shape and dtype whose only readable bytes are the window. It is an
allow-list: shape queries, and ``narrow`` or basic slicing inside the window (which return those
verified bytes) are served; every other access raises :class:`HandoffError` naming the tensor, the
rank and the access. That covers a range outside the window, arithmetic, a copy of the whole,
any torch function with a window anywhere in its arguments (``torch.cat([w, x])``), and every way
to its memory (DLPack, ``__array__``, ``numpy()``, storages, ``data_ptr``), including C code that
bypasses ``__torch_function__``: the window has no storage of its own, and its sizes and strides
are answered only to Python (C callers such as ``torch.utils.dlpack.to_dlpack`` ask the
dispatcher for them, and are refused there). So the engine's own name mapping, fusing (q/k/v,
gate/up) and sharding logic run unchanged, host memory stays at the windows, and a sharding rule
that disagrees with the engine's fails the start instead of serving bytes never verified.

Tensors handed whole (replicated, or unsplit at this TP size) are :class:`WholeTensor`: real
tensors on which every op is served. Both kinds record what the engine read, in a
:class:`Handoff`; after the engine's ``load_weights`` returns, every handed tensor must have been
read whole (a window: narrows that together cover it; a whole tensor: any op other than a
metadata query) unless the engine integration declared it skipped on purpose (:class:`Skip`).
That closes the class of bug where a loader silently drops weights (a name it does not map, an
iteration cut short), whatever the engine checks itself: vLLM, for one, checks nothing for
quantized models.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..codecs.base import Cut
from ..model.errors import LoadError
from ..model.meta import TensorMeta
from ..model.templates import natural_key
from ..planning.items import Item
from .handed import ElementRanges, Handed, ranges_text
from .skips import Skip
from .window_tensor import WindowTensor, whole_tensor


def element_ranges(cut: Cut, meta: TensorMeta) -> ElementRanges:
    """The window of ``cut`` as an element range per dimension of the stored tensor ``meta``.

    The cut is a box of a 2-D byte view; a tensor-parallel window is a range of one dimension, so
    its first element's position in the whole tensor says where the range starts."""
    full, size = tuple(meta.shape), meta.itemsize
    if tuple(cut.shape) == full:
        return tuple((0, n) for n in full)
    view_row = cut.view[1]
    first = (cut.rows[0] * view_row + cut.cols[0]) // size
    index, rest = [], first
    for n in reversed(full):
        rest, i = divmod(rest, n)
        index.append(i)
    index.reverse()
    held = tuple((i, i + w) for i, w in zip(index, cut.shape, strict=False))
    cut_dims = [d for d, (w, n) in enumerate(zip(cut.shape, full, strict=False)) if w != n]
    if (
        len(cut.shape) != len(full)
        or any(index[d] for d in range(len(full)) if d not in cut_dims)
        or math.prod(cut.shape) * size != cut.nbytes
    ):
        raise LoadError(
            f"{meta.name}: its window {ranges_text(held)} of {full} is not a range of one "
            "dimension; an engine hand-off takes tensor-parallel windows only"
        )
    return held


def checkpoint_order(file: str, name: str) -> tuple[tuple[str | tuple[int, str, str], ...], str]:
    """Where a tensor comes in vLLM's default loader: files in natural order (``-00002-`` before
    ``-00010-``), names sorted within a file (safetensors' ``keys()``)."""
    return natural_key(file), name


class Handoff:
    """Everything one rank hands to an engine, in the order the engine's own loader would (files in
    natural order, names sorted within a file), and what the engine read of it.

    :meth:`tensors` yields (stored name, tensor): a private copy of each window (engines' loaders
    may write into what they are handed), as a :class:`WindowTensor` of the full shape where the
    window is a part, a :class:`WholeTensor` where it is the whole. :meth:`unconsumed` then says
    which were never read whole. Every tensor is registered before the first is yielded, so one
    the engine never took from the iterator counts too."""

    def __init__(
        self,
        state: Mapping[str, torch.Tensor],
        plan_items: Sequence[Item],
        *,
        rank: int,
        rename: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """``rename``: {stored name: the names the engine expects it under} (the KV-cache scales'
        canonical names, selection/kvscales.py); each name gets its own copy, and any of them being
        read counts."""
        self.state, self.rank, self.rename = state, rank, dict(rename or {})
        cuts = []
        for item in plan_items:
            metas = {
                m.name: m
                for m in (item.fit.weight, item.fit.scale, item.fit.scale2)
                if m is not None
            }
            cuts += [
                (checkpoint_order(metas[c.name].file, c.name), c, metas[c.name]) for c in item.cuts
            ]
        cuts.sort(key=lambda x: x[0])
        self.cuts = [(c, m) for _, c, m in cuts]
        self.handed: dict[str, Handed] = {}
        for cut, meta in self.cuts:
            whole = tuple(cut.shape) == tuple(meta.shape)
            held = tuple((0, n) for n in meta.shape) if whole else element_ranges(cut, meta)
            self.handed[cut.name] = Handed(cut.name, held, whole=whole)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for cut, meta in self.cuts:
            handed = self.handed[cut.name]
            window = self.state[cut.name].clone()
            handed.taken = True
            if handed.whole:
                for name in self.rename.get(cut.name, (cut.name,)):
                    yield name, whole_tensor(window if name == cut.name else window.clone(), handed)
            else:
                yield (
                    cut.name,
                    WindowTensor(
                        window,
                        meta.shape,
                        handed.held,
                        f"{cut.name} (rank {self.rank})",
                        handed=handed,
                    ),
                )

    def unconsumed(self, skips: Sequence[Skip] = ()) -> tuple[list[Handed], dict[str, list[str]]]:
        """(tensors not read whole and not declared, {declared skip's glob: the tensors it
        excused})."""
        missing: list[Handed] = []
        excused: dict[str, list[str]] = {}
        for h in self.handed.values():
            if h.consumed:
                continue
            skip = next((s for s in skips if s.read and s.matches(h.name)), None)
            if skip is None:
                missing.append(h)
            else:
                excused.setdefault(skip.glob, []).append(h.name)
        return missing, excused


def unconsumed_message(missing: Sequence[Handed], engine: str) -> str:
    """One line naming the tensors ``engine``'s loaders left unread (the first 8, then a count)."""
    shown = ", ".join(f"{h.name} ({h.what()})" for h in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    return (
        f"{len(missing)} tensor(s) tpload handed over were not consumed by {engine}'s weight "
        f"loaders: {shown}{more}; every handed tensor must be read, or be declared skipped on "
        "purpose by the engine integration (docs/engines.md)"
    )


def windows(
    state: Mapping[str, torch.Tensor], plan_items: Sequence[Item], *, rank: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """:meth:`Handoff.tensors` of a hand-off whose reads nobody checks (tests, tools)."""
    return Handoff(state, plan_items, rank=rank).tensors()
