"""Rank-0 progress while a load runs: a live bar on a terminal, a plain line every few seconds otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Protocol

log = logging.getLogger("tpload")


class ProgressSink(Protocol):
    """What the load loop reports to: one call per tensor, one at the end."""

    def update(self, nbytes: int) -> None: ...

    def close(self) -> None: ...


class Silent:
    """The sink of every rank but 0, and of ``progress=False``."""

    def update(self, nbytes: int) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    """Rank-0 progress: a tqdm bar on a terminal, lazy-``%s`` log lines every ``every_s`` otherwise."""

    def __init__(self, total_bytes: int, total_items: int, *, every_s: float = 2.0) -> None:
        self.total_bytes, self.total_items, self.every_s = total_bytes, total_items, every_s
        self.bytes = self.items = 0
        self.t0 = self._last = time.perf_counter()
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tpload", leave=False)

    def update(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.items += 1
        if self._bar is not None:
            self._bar.update(nbytes)
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            rate = self.bytes / max(now - self.t0, 1e-9)
            eta = (self.total_bytes - self.bytes) / max(rate, 1.0)
            log.info("[rank 0] %d/%d tensors, %.2f/%.2f GB, %.2f GB/s, ETA %.0fs", self.items, self.total_items,
                     self.bytes / 1e9, self.total_bytes / 1e9, rate / 1e9, eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
