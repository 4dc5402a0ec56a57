"""What a long pass reports its progress to: a sink per pass (:class:`ProgressSink`: one call per
served tensor or per unit, with its bytes; :class:`BatchSink`: a batch of them in one call too), a
command's :class:`Meter` that makes one sink a pass, and the sink of a caller that shows nothing
(:class:`Silent`). The bars and lines themselves: report/progress.py."""

from __future__ import annotations

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
