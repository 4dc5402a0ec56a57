"""While a rank loads, where it stands, seen by rank 0: every rank puts its phase and bytes read on
the board (the rendezvous store) every second; rank 0 reads every rank's, names the slowest in its
progress (the copy loop's lines, and a line every few seconds for the other phases, the wait at the
exchange among them), so an operator sees which rank holds the load while it holds it."""

from __future__ import annotations

from types import TracebackType

from ..distributed.board import Board
from ..distributed.world import DistContext
from ..report.progress import Phases, Ticker, straggler


class Watch:
    """One call's watch on one rank, from its open to the end of its exchange (a context)."""

    def __init__(
        self, phases: Phases, ctx: DistContext, seq: int, *, show: bool, publish: bool
    ) -> None:
        """``show``: this rank shows progress (rank 0's); ``publish``: every rank puts its standing
        (progress is on: rank 0 reads them)."""
        self.phases, self.show = phases, show
        self.board = Board(ctx, seq)
        self.clause = ""
        """The straggler clause rank 0 read last (empty: ranks together, or not rank 0)."""
        runs = show or (publish and self.board.open)
        self._ticker = (
            Ticker(phases, clause=lambda: self.clause, each=self._each, show=show) if runs else None
        )

    def _each(self) -> None:
        self.board.put(self.phases.standing())
        if self.show:
            self.clause = straggler(self.board.read())

    def __enter__(self) -> Watch:
        if self._ticker is not None:
            self._ticker.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ticker is not None:
            self._ticker.stop()
