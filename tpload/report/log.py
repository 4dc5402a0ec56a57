"""A rank's log lines, vLLM-style: lazy ``%s`` logging with the rank in the prefix."""

from __future__ import annotations

import logging

log = logging.getLogger("tpload")


class RankLog(logging.LoggerAdapter):
    """vLLM-style: lazy ``%s`` logging with the rank in the prefix."""

    def process(self, msg, kwargs):  # type: ignore[override]
        return f"[rank {self.extra['rank']}] {msg}", kwargs


def rank_log(rank: int) -> RankLog:
    return RankLog(log, {"rank": rank})
