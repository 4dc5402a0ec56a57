"""Each rank's :class:`~tpload.model.progress.Standing` in the rendezvous store, where rank 0's
progress reads them to name the slowest rank: no collective, so a stalled rank is seen while it is
stalled. Never raises: without a store (or once it is gone) nothing is put or read."""

from __future__ import annotations

from ..model.progress import Standing
from .exchange import _store, group_id
from .world import DistContext


class Board:
    """The standings of one ``load()`` call's ranks (``seq``: the call, as the exchange counts)."""

    def __init__(self, ctx: DistContext, seq: int) -> None:
        self.world = ctx.world
        self.store = _store() if ctx.group is not None and ctx.world > 1 else None
        self.prefix = f"tpload/{group_id(ctx)}/{seq}/standing" if self.store is not None else ""

    def put(self, standing: Standing) -> None:
        if self.store is not None:
            try:
                self.store.set(f"{self.prefix}/{standing.rank}", standing.encode())
            except (RuntimeError, OSError):  # the store gone with the launcher: stop putting
                self.store = None

    def read(self) -> list[Standing]:
        """Every rank's last standing, of those that put one."""
        out: list[Standing] = []
        for r in range(self.world) if self.store is not None else []:
            key = f"{self.prefix}/{r}"
            try:
                if not self.store.check([key]):
                    continue
                raw = self.store.get(key).decode(errors="replace")
            except (RuntimeError, OSError):
                self.store = None
                return out
            standing = Standing.decode(r, raw)
            if standing is not None:
                out.append(standing)
        return out
