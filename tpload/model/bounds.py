"""The kinds of numbers options hold (seconds, GiB, threads, ranks, seeds, counts): each its type
and range, checked where a flag is parsed and where ``load()`` is given the number."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from .values import MAX_WORLD


@dataclass(frozen=True)
class Bound:
    """One kind of number an option holds, and its one rule: the type and the range, checked where
    the number is parsed (a flag of any subcommand: ``type=SECONDS``) and where it is given
    (``load()``'s keywords, :func:`validate`). The limits are far beyond any real use and small
    enough that what consumes the number (a ``timedelta``, a socket timeout, a thread pool built up
    front, a seed) takes it."""

    kind: type
    """int or float."""
    low: float
    high: float
    above: bool = False
    """True: ``low`` itself is refused (a number > low)."""
    note: str = ""
    """Why the upper limit, said with the problem."""

    def problem(self, v: float) -> str | None:
        """Why ``v`` (a number of this kind: the options' coercion, the flag's parse come first) is
        out of this kind's range, or None."""
        if self.kind is float and not math.isfinite(v):
            return f"must be a finite number {self._range()}, got {v}"
        ok = (v > self.low if self.above else v >= self.low) and v <= self.high
        return None if ok else f"must be {self._range()}, got {v}"

    def _range(self) -> str:
        low = f"> {_num(self.low)} and at most" if self.above else f"between {_num(self.low)} and"
        return f"{low} {_num(self.high)}{self.note}"

    def __call__(self, text: str) -> int | float:
        """argparse's ``type``: the number, or an ArgumentTypeError saying what was expected."""
        try:
            v: int | float = self.kind(text)
        except ValueError:
            what = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if why := self.problem(v):
            raise argparse.ArgumentTypeError(why)
        return v


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


SECONDS = Bound(float, 0, 7 * 86400, above=True, note=" (7 days)")
"""Timeouts: a wait longer than a week is a typo, and 1e300 s overflows timedelta and socket
timeouts."""
GIB = Bound(float, 0, 1 << 20, note=" (a PiB)")
"""Memory sizes in GiB."""
THREADS = Bound(int, 0, 1024)
"""Threads per process (0: the work runs on the calling thread); pools are built up front."""
RANKS = Bound(int, 1, MAX_WORLD)
"""Ranks: tp, ep, processes per node, processes."""
SEED = Bound(int, 0, 2**32 - 1)
"""Random seeds (numpy takes non-negative 32-bit words)."""
COUNT = Bound(int, 0, 1 << 24)
"""How many of something (samples, rounds, tensors, synthetic dimensions)."""
