"""What a load reports: one rank's figures and their wire form (:mod:`.figures`), the table and
JSON every rank can render after the exchange (:mod:`.render`), rank-0 progress (:mod:`.progress`)
and host memory peaks (:mod:`.memory`)."""

from __future__ import annotations

import logging

from .figures import RankFigures
from .render import LoadReport

log = logging.getLogger("tpload")


class RankLog(logging.LoggerAdapter):
    """vLLM-style: lazy ``%s`` logging with the rank in the prefix."""

    def process(self, msg, kwargs):  # type: ignore[override]
        return f"[rank {self.extra['rank']}] {msg}", kwargs


def rank_log(rank: int) -> RankLog:
    return RankLog(log, {"rank": rank})


__all__ = ["LoadReport", "RankFigures", "RankLog", "rank_log"]
