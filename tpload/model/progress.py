"""What a long pass reports its progress to: a sink per pass (:class:`ProgressSink`: one call per
served tensor or per unit, with its bytes; :class:`BatchSink`: a batch of them in one call too), a
command's :class:`Meter` that makes one sink a pass, the sink of a caller that shows nothing
(:class:`Silent`), and a rank's :class:`Standing` as its peers see it. The bars and lines
themselves: report/progress.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class ProgressSink(Protocol):
    """What the load loop reports to: one call per served tensor (a packed weight and its scale are
    two, as the report's table counts them) with the bytes read for it, one call at the end."""

    def update(self, nbytes: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class BatchSink(ProgressSink, Protocol):
    """A sink that also takes a batch of served tensors in one call (the load's own: the report's
    bar and lines, :class:`Silent`): a batch of small tensors is one call with its bytes, not one a
    tensor. A caller's sink without it is called once a tensor, as before."""

    def update_many(self, nbytes: int, tensors: int) -> None: ...


class Meter(Protocol):
    """An offline command's progress: one sink per pass over the bytes (``what`` names the pass when
    a command makes several: each rank of ``plan --digest``, each rank file of an export; ``unit``
    what each update counts)."""

    def __call__(
        self, total_bytes: int, total_tensors: int, what: str = "", unit: str = "tensor"
    ) -> ProgressSink: ...


class Silent:
    """The sink of every rank but 0, and of ``progress=False``."""

    def update(self, nbytes: int) -> None:
        pass

    def update_many(self, nbytes: int, tensors: int) -> None:
        pass

    def close(self) -> None:
        pass


def silent(
    total_bytes: int, total_tensors: int, what: str = "", unit: str = "tensor"
) -> ProgressSink:
    """The :class:`Meter` of a caller that shows no progress (the library's, the tests')."""
    return Silent()


@dataclass(frozen=True)
class Standing:
    """Where one rank's load stands, as its peers see it (the rendezvous store's copy, put every
    second): its phase, the bytes its copy loop has read of its plan's, and the seconds it has read
    for (its rate, so how long it still needs)."""

    rank: int
    phase: str
    done: int = 0
    total: int = 0
    read_s: float = 0.0

    def encode(self) -> str:
        return f"{self.phase} {self.done} {self.total} {self.read_s:.3f}"

    @classmethod
    def decode(cls, rank: int, text: str) -> Standing | None:
        """The standing ``text`` says (None: not one, e.g. another tpload's)."""
        try:
            phase, done, total, read_s = text.split()
            return cls(rank, phase, int(done), int(total), float(read_s))
        except ValueError:
            return None

    def left_s(self) -> float | None:
        """Seconds its reading still takes at its rate so far (None: no rate measured yet)."""
        if self.done <= 0 or self.read_s < MEASURED_S:
            return None
        return max(self.total - self.done, 0) / (self.done / self.read_s)


MEASURED_S = 1.0
"""Seconds of reading before a rate (and an ETA from it) is shown: a first second of reads is the
arena's allocation and cold caches, and a rate from it gives ETAs of hours."""
