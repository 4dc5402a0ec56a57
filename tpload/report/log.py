"""A rank's log lines, vLLM-style: lazy ``%s`` logging with the rank in the prefix."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

log = logging.getLogger("tpload")


class RankLog(logging.LoggerAdapter[logging.Logger]):
    """vLLM-style: lazy ``%s`` logging with the rank in the prefix."""

    def __init__(self, logger: logging.Logger, rank: int) -> None:
        super().__init__(logger, {"rank": rank})
        self.rank = rank

    def process(
        self, msg: object, kwargs: MutableMapping[str, Any]
    ) -> tuple[object, MutableMapping[str, Any]]:
        return f"[rank {self.rank}] {msg}", kwargs


def rank_log(rank: int) -> RankLog:
    return RankLog(log, rank)
