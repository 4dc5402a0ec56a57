"""The windows ranks read of stored tensors: the one map of which ranks read each stored tensor
(node hashing, whole-file hashing and ``tpload plan``'s figures share it; a window itself is a
:data:`~tpload.model.values.Box`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def readers(reads: Mapping[int, Iterable[str]]) -> dict[str, list[int]]:
    """Each stored tensor some rank reads (``reads``: rank -> the tensors it reads a window of),
    and the ranks that read it, ascending; tensors in the order the lowest rank reads them."""
    out: dict[str, list[int]] = {}
    for rank in sorted(reads):
        for name in reads[rank]:
            out.setdefault(name, []).append(rank)
    return out
