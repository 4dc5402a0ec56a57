"""Progress while something long runs: a live bar on a terminal, a plain line every few seconds
otherwise. Rank 0 of a load shows the loop's; the offline commands (``verify``, ``manifest``,
``synth``, ``export``, ``attest verify``, ``plan --digest``) show theirs through a :class:`Meter`,
one pass at a time. Everything goes to stderr (tqdm's and the log's): a command's stdout stays its
own."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from ..model.progress import Meter, ProgressSink
from ..model.text import plural

log = logging.getLogger("tpload")

EVERY_S = 2.0
"""Seconds between plain lines (and before the first): a run shorter than this prints none."""
LOAD_DONE = "finishing the last hashes, then the ranks' verdict"
"""What a load does after its last byte is read (said at the end of its progress)."""
PHASES = ("start", "open", "plan", "handshake", "read", "exchange")
"""A load's phases, in order: the imports and the rendezvous (``start``); the checkpoint's index,
headers and pins (``open``); the config, the plans, the pre-flight and the gate's preparation
(``plan``); the wait for every rank's agreement (``handshake``); the copy loop with its hashes and
the rank's own checks (``read``); the wait for every rank's row (``exchange``)."""
DOING = {
    "start": "starting",
    "open": "opening the checkpoint",
    "plan": "planning",
    "handshake": "at the handshake",
    "read": "reading",
    "exchange": "waiting for the other ranks' rows",
}
"""Each phase as a clause (``interrupted while ...``)."""


class Phases:
    """Where one rank's load stands (its phase) and the nanoseconds each phase took, for the
    report's per-phase times and for what an interruption says it interrupted."""

    def __init__(self, *, now: Callable[[], int] = time.perf_counter_ns) -> None:
        self._now = now
        self.current = PHASES[0]
        self.ns = dict.fromkeys(PHASES, 0)
        self._since = now()

    def enter(self, phase: str) -> None:
        """The rank leaves its phase for ``phase`` (its time so far is counted to the one left)."""
        now = self._now()
        self.ns[self.current] += now - self._since
        self.current, self._since = phase, now

    def elapsed_s(self) -> float:
        """Seconds spent in the current phase so far."""
        return (self._now() - self._since) / 1e9


def meter(command: str) -> Meter:
    """The :class:`Meter` of the command ``command``: :class:`Progress` labelled with it (and the
    pass), and no closing line (the command prints its own result)."""

    def sink(
        total_bytes: int, total_tensors: int, what: str = "", unit: str = "tensor"
    ) -> ProgressSink:
        label = f"{command} {what}" if what else command
        return Progress(total_bytes, total_tensors, label=label, unit=unit, done=None)

    return sink


class Progress:
    """Progress of one pass: a tqdm bar on a terminal, lazy-``%s`` log lines every ``every_s``
    otherwise, each starting with ``label`` (a load's ``[rank 0]``, a command's name).

    ``total_tensors`` is the plan's served tensors (``RankPlan.served``), the count the report's
    table gives. The ETA is bytes left over the byte rate so far: tensors differ in size by 10,000x
    (a norm next to an expert's matrix), so a count says nothing about time left. It covers reading
    only: after the last byte a load still finishes its hashes and meets the other ranks, which
    close() says (``done``), so the silence after "ETA 0 s" has a name.
    """

    def __init__(
        self,
        total_bytes: int,
        total_tensors: int,
        *,
        label: str = "[rank 0]",
        unit: str = "tensor",
        done: str | None = LOAD_DONE,
        every_s: float | None = None,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total_bytes, self.total_tensors, self._now = total_bytes, total_tensors, now
        self.every_s = EVERY_S if every_s is None else every_s
        self.label, self.unit, self.done = label, unit, done
        self.bytes = self.tensors = 0
        self.t0 = self._last = now()
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                desc="tpload" if label == "[rank 0]" else label,
                leave=False,
            )

    def update(self, nbytes: int) -> None:
        self.update_many(nbytes, 1)

    def update_many(self, nbytes: int, tensors: int) -> None:
        """``tensors`` served tensors and their ``nbytes`` at once (a batch of small ones)."""
        self.bytes += nbytes
        self.tensors += tensors
        if self._bar is not None:
            self._bar.update(nbytes)
            return
        now = self._now()
        if now - self._last >= self.every_s:
            self._last = now
            log.info(
                "%s %s/%s, %.2f/%.2f GB, %.2f GB/s, ETA %.0f s",
                self.label,
                f"{self.tensors:,}",
                plural(self.total_tensors, self.unit),
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
        # The loop closes its sink in a `finally`: with an exception on its way (Ctrl-C, a failed
        # read) no hashes are finished and the exception's own message comes next, so nothing
        # here may announce what follows a finished read.
        interrupted = sys.exc_info()[1] is not None
        if self.done and not interrupted and self._now() - self.t0 >= self.every_s:
            log.info(
                "%s read %s (%.2f GB) in %.0f s; %s",
                self.label,
                plural(self.tensors, self.unit),
                self.bytes / 1e9,
                self._now() - self.t0,
                self.done,
            )
