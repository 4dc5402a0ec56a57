"""Each rank's :class:`~tpload.model.progress.Standing` in the rendezvous store, where rank 0's
progress reads them to name the slowest rank: no collective, so a stalled rank is seen while it is
stalled. Never raises: without a store (or once it is gone) nothing is put or read."""

from __future__ import annotations

from ..model.progress import Standing
from .exchange import Flags
from .world import DistContext


class Board:
    """The standings of one ``load()`` call's ranks (``seq``: the call, as the exchange counts)."""

    def __init__(self, ctx: DistContext, seq: int) -> None:
        self.world = ctx.world
        self._flags = Flags(ctx, seq, "standing")

    @property
    def open(self) -> bool:
        """Whether there is a store to put to (a group of several ranks under a launcher)."""
        return self.world > 1 and self._flags.store is not None

    def put(self, standing: Standing) -> None:
        if self.open:
            self._flags.put(standing.rank, standing.encode())

    def read(self) -> list[Standing]:
        """Every rank's last standing, of those that put one."""
        out: list[Standing] = []
        for r in range(self.world) if self.open else []:
            raw = self._flags.get(r)
            standing = Standing.decode(r, raw) if raw is not None else None
            if standing is not None:
                out.append(standing)
        return out
