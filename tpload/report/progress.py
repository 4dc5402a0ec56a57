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

from ..model.progress import MEASURED_S, Meter, ProgressSink, Silent, Standing
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


METERED = ("read", "hash")
"""Phases whose lines are their :class:`Progress`'s (bytes, rate, ETA), not the ticker's."""


class Phases:
    """Where one rank's load stands (its phase), the nanoseconds each phase took (the report's
    per-phase times) and the bytes its copy loop has read (``counter``: the sink that counts them),
    for what an interruption says it interrupted and for its :class:`Standing`."""

    def __init__(self, *, rank: int = 0, now: Callable[[], int] = time.perf_counter_ns) -> None:
        self._now = now
        self.rank = rank
        self.current = PHASES[0]
        self.ns = dict.fromkeys(PHASES, 0)
        self._since = now()
        self.counter: ProgressSink | None = None
        """The read phase's sink: the load's own (:class:`Progress`, :class:`Tally`) counts the
        bytes read so far; a caller's sink counts none."""
        self.total = 0
        """The bytes the rank's plan reads."""

    def enter(self, phase: str) -> None:
        """The rank leaves its phase for ``phase`` (its time so far is counted to the one left)."""
        now = self._now()
        self.ns[self.current] = self.ns.get(self.current, 0) + now - self._since
        self.current, self._since = phase, now

    def elapsed_s(self) -> float:
        """Seconds spent in the current phase so far."""
        return (self._now() - self._since) / 1e9

    def standing(self) -> Standing:
        done = self.counter.bytes if isinstance(self.counter, Tally | Progress) else 0
        reading = self.ns["read"] + (self._now() - self._since if self.current == "read" else 0)
        return Standing(self.rank, self.current, done, self.total, reading / 1e9)


class Tally(Silent):
    """The sink of a rank that shows nothing but whose bytes read its peers see (its
    :class:`Standing`)."""

    def __init__(self) -> None:
        self.bytes = 0

    def update(self, nbytes: int) -> None:
        self.bytes += nbytes

    def update_many(self, nbytes: int, tensors: int) -> None:
        self.bytes += nbytes


BEHIND = 0.10
"""How far behind the leading rank (a share of its plan's bytes) the slowest rank must be, or in
an earlier phase, before progress names it: ranks a few tensors apart are not stragglers."""


def _reached(s: Standing) -> float:
    """How far a standing is along the load: its phase's place, and within the read its share."""
    at = PHASES.index(s.phase) if s.phase in PHASES else 0
    if s.phase == "read":
        return at + (s.done / s.total if s.total else 0.0)
    return float(at)


def _where(s: Standing) -> str:
    if s.phase == "exchange":
        return "done reading"
    if s.phase == "read":
        return f"read {100 * s.done / max(s.total, 1):.0f}%"
    return DOING.get(s.phase, s.phase)


def straggler(standings: list[Standing]) -> str:
    """A clause naming the slowest rank and how far behind the leading one it is (empty: the ranks
    are together, or fewer than two stand): ``slowest: rank 3, read 12% (rank 0 read 80%), about 14
    s behind``. In seconds only where both have a measured rate (or the leader is done reading)."""
    if len(standings) < 2:
        return ""
    slow = min(standings, key=lambda s: (_reached(s), -s.rank))
    lead = max(standings, key=lambda s: (_reached(s), -s.rank))
    if _reached(lead) - _reached(slow) < BEHIND or slow.phase == "exchange":
        return ""
    clause = f"slowest: rank {slow.rank}, {_where(slow)} (rank {lead.rank} {_where(lead)})"
    slow_left = slow.left_s() if slow.phase == "read" else None
    lead_left = 0.0 if _reached(lead) >= PHASES.index("exchange") else lead.left_s()
    if slow_left is not None and lead_left is not None:
        clause += f", about {max(slow_left - lead_left, 0):.0f} s behind"
    return clause


JOIN_S = 5.0
"""How long a stopped :class:`Ticker` is waited for."""


class Ticker:
    """A line every ``every_s`` for the phases that have no progress of their own (all but the
    copy loop's, which :class:`Progress` shows): ``[rank 0] plan: 6 s`` and, when ``clause``
    names a straggler, that too; silent for a phase shorter than ``every_s``. Runs on a daemon
    thread of its own (the phase's work holds the main one) from ``start`` to ``stop``."""

    def __init__(
        self,
        phases: Phases,
        *,
        label: str = "[rank 0]",
        every_s: float | None = None,
        clause: Callable[[], str] = lambda: "",
        each: Callable[[], None] = lambda: None,
        show: bool = True,
    ) -> None:
        import threading

        self.phases, self.label, self.clause, self.each, self.show = (
            phases,
            label,
            clause,
            each,
            show,
        )
        self.every_s = EVERY_S if every_s is None else every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpload-progress", daemon=True)

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        # bounded: a store call of the thread's may wait on a launcher that is gone (it is a
        # daemon thread, and says nothing once stopped)
        self._thread.join(timeout=JOIN_S)

    def _run(self) -> None:
        tick = min(max(self.every_s, 0.1), 1.0)  # standings put every second, lines every every_s
        last = time.perf_counter()
        while not self._stop.wait(tick):
            self.each()
            now = time.perf_counter()
            phase = self.phases.current
            if not self.show or now - last < max(self.every_s, 0.5) or phase in METERED:
                continue
            if self.phases.elapsed_s() < self.every_s:
                continue
            last = now
            clause = self.clause()
            if self._stop.is_set():
                return
            seconds = f"{self.phases.elapsed_s():.0f} s"
            if phase == "exchange":
                log.info(
                    "%s exchange: waiting %s for the other ranks%s",
                    self.label,
                    seconds,
                    f"; {clause}" if clause else "",
                )
            else:
                log.info("%s %s: %s%s", self.label, phase, seconds, f"; {clause}" if clause else "")


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
        label: str = "[rank 0] read",
        unit: str = "tensor",
        done: str | None = LOAD_DONE,
        every_s: float | None = None,
        now: Callable[[], float] = time.perf_counter,
        clause: Callable[[], str] = lambda: "",
    ) -> None:
        self.total_bytes, self.total_tensors, self._now = total_bytes, total_tensors, now
        self.every_s = EVERY_S if every_s is None else every_s
        self.label, self.unit, self.done, self.clause = label, unit, done, clause
        self.bytes = self.tensors = 0
        self.t0 = self._last = now()
        self.first: float | None = None
        """When the first byte came: the rate is measured from there (what comes before it, the
        arena's allocation, is no reading)."""
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                desc="tpload" if label == "[rank 0] read" else label,
                leave=False,
            )

    def update(self, nbytes: int) -> None:
        self.update_many(nbytes, 1)

    def update_many(self, nbytes: int, tensors: int) -> None:
        """``tensors`` served tensors and their ``nbytes`` at once (a batch of small ones)."""
        if self.first is None and nbytes > 0:
            self.first = self._now()
        self.bytes += nbytes
        self.tensors += tensors
        if self._bar is not None:
            self._bar.update(nbytes)
        now = self._now()
        if now - self._last < self.every_s:
            return
        self._last = now
        clause = self.clause()
        if self._bar is not None:  # the bar's own rate and time left; a straggler beside them
            self._bar.set_postfix_str(clause, refresh=False)
            return
        eta = self.eta()
        log.info(
            "%s %s/%s, %.2f/%.2f GB, %s, %s%s",
            self.label,
            f"{self.tensors:,}",
            plural(self.total_tensors, self.unit),
            self.bytes / 1e9,
            self.total_bytes / 1e9,
            "rate: measuring" if eta is None else f"{self.rate() / 1e9:.2f} GB/s",
            "ETA: measuring" if eta is None else f"ETA {eta:.0f} s",
            f"; {clause}" if clause else "",
        )

    def rate(self) -> float:
        """Bytes per second since the first byte came."""
        return self.bytes / max(self._now() - (self.first or self._now()), 1e-9)

    def eta(self) -> float | None:
        """Seconds until the last byte is read, at the byte rate measured so far; None until a
        rate is measured (:data:`MEASURED_S` of reading)."""
        if self.first is None or self._now() - self.first < MEASURED_S:
            return None
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
                "%s done: %s (%.2f GB) in %.0f s; %s",
                self.label,
                plural(self.tensors, self.unit),
                self.bytes / 1e9,
                self._now() - self.t0,
                self.done,
            )
