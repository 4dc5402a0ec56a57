"""Rank-0 progress while a load runs: a live bar on a terminal, a plain line every few seconds
otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("tpload")


class ProgressSink(Protocol):
    """What the load loop reports to: one call per served tensor (a packed weight and its scale are
    two, as the report's table counts them) with the bytes read for it, one call at the end."""

    def update(self, nbytes: int) -> None: ...

    def close(self) -> None: ...


class Silent:
    """The sink of every rank but 0, and of ``progress=False``."""

    def update(self, nbytes: int) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    """Rank-0 progress: a tqdm bar on a terminal, lazy-``%s`` log lines every ``every_s`` otherwise.

    ``total_tensors`` is the plan's served tensors (``RankPlan.served``), the count the report's
    table gives. The ETA is bytes left over the byte rate so far: tensors differ in size by 10,000x
    (a norm next to an expert's matrix), so a count says nothing about time left. It covers reading
    only: after the last byte the load still finishes its hashes and meets the other ranks, which
    close() says, so the silence after "ETA 0 s" has a name.
    """

    def __init__(
        self,
        total_bytes: int,
        total_tensors: int,
        *,
        every_s: float = 2.0,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total_bytes, self.total_tensors, self.every_s, self._now = (
            total_bytes,
            total_tensors,
            every_s,
            now,
        )
        self.bytes = self.tensors = 0
        self.t0 = self._last = now()
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes, unit="B", unit_scale=True, desc="tpload", leave=False
            )

    def update(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.tensors += 1
        if self._bar is not None:
            self._bar.update(nbytes)
            return
        now = self._now()
        if now - self._last >= self.every_s:
            self._last = now
            log.info(
                "[rank 0] %d/%d tensors, %.2f/%.2f GB, %.2f GB/s, ETA %.0f s",
                self.tensors,
                self.total_tensors,
                self.bytes / 1e9,
                self.total_bytes / 1e9,
                self.rate() / 1e9,
                self.eta(),
            )

    def rate(self) -> float:
        """Bytes per second so far."""
        return self.bytes / max(self._now() - self.t0, 1e-9)

    def eta(self) -> float:
        """Seconds until the last byte is read, at the byte rate so far."""
        return (self.total_bytes - self.bytes) / max(self.rate(), 1.0)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            return
        if self._now() - self.t0 >= self.every_s:  # a load long enough to have shown progress
            log.info(
                "[rank 0] read %d tensors (%.2f GB) in %.0f s; finishing the last hashes, then "
                "the ranks' verdict",
                self.tensors,
                self.bytes / 1e9,
                self._now() - self.t0,
            )
