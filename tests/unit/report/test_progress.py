"""Rank 0's progress: tensors counted as the report's table counts them, the ETA from bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpload.report.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_eta_comes_from_bytes_not_tensors(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    p = Progress(1000, 4, every_s=2.0, now=clock)
    # three tiny tensors in the first second, then most of the bytes: a count-based ETA would say
    # "1 tensor left, nearly done" after the third
    for _ in range(3):
        p.update(10)
    clock.t += 3.0
    with caplog.at_level("INFO", logger="tpload"):
        p.update(470)
    assert p.eta() == pytest.approx((1000 - 500) / (500 / 3.0))  # 3 s: half the bytes in 3 s
    assert "4/4 tensors, 0.00/0.00 GB" in caplog.text and "ETA 3 s" in caplog.text
    clock.t += 3.0
    with caplog.at_level("INFO", logger="tpload"):
        p.close()
    assert (
        "read 4 tensors (0.00 GB) in 6 s; finishing the last hashes, then the ranks' verdict"
        in caplog.text
    )


def test_a_load_counts_what_the_table_counts(small_ckpt: Path) -> None:
    from tpload import load

    class Count:
        tensors = nbytes = 0

        def update(self, nbytes: int) -> None:
            self.tensors += 1
            self.nbytes += nbytes

        def close(self) -> None:
            pass

    sink = Count()
    shards = load(small_ckpt, progress_sink=sink, kind="packed")
    try:
        rank = shards.report.ranks[0]
        assert sink.tensors == rank.tensors and sink.nbytes == rank.bytes_read
        assert rank.tensors > len(
            shards.plan.items
        )  # packed scales are served tensors of their own
    finally:
        shards.release()


def test_a_load_tells_a_batch_sink_each_batch_at_once(small_ckpt: Path) -> None:
    """A sink that takes a batch in one call (the load's own: the bar, Silent) is told each batch
    of small tensors once, with its bytes; the counts add up to the table's all the same."""
    from tpload import load
    from tpload.model.progress import BatchSink

    class Batches:
        tensors = nbytes = calls = 0

        def update(self, nbytes: int) -> None:
            self.update_many(nbytes, 1)

        def update_many(self, nbytes: int, tensors: int) -> None:
            self.calls += 1
            self.tensors += tensors
            self.nbytes += nbytes

        def close(self) -> None:
            pass

    sink = Batches()
    assert isinstance(sink, BatchSink)
    shards = load(small_ckpt, progress_sink=sink, kind="packed")
    try:
        rank = shards.report.ranks[0]
        assert sink.tensors == rank.tensors and sink.nbytes == rank.bytes_read
        assert sink.calls < rank.tensors / 4  # small tensors come in batches
    finally:
        shards.release()


def test_a_command_s_meter_labels_each_pass_and_counts_its_unit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tpload.report.progress import meter

    clock = Clock()
    sink = meter("verify")(3000, 3, "rank file 2 of 4", unit="file")
    sink._now = clock  # the pass's own clock, as Progress takes one
    sink.t0 = sink._last = clock.t
    with caplog.at_level("INFO", logger="tpload"):
        sink.update(1000)
        clock.t += 2.0
        sink.update(1000)
        clock.t += 2.0
        sink.close()  # a command prints its own result: no closing line
    assert [r.getMessage() for r in caplog.records] == [
        "verify rank file 2 of 4 2/3 files, 0.00/0.00 GB, 0.00 GB/s, ETA 1 s"
    ]


def test_a_pass_ended_by_an_exception_does_not_announce_what_follows_a_finished_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    p = Progress(1000, 4, every_s=2.0, now=clock)
    p.update(500)
    clock.t += 3.0
    with caplog.at_level("INFO", logger="tpload"), pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        finally:  # as the load loop closes its sink
            p.close()
    assert "finishing" not in caplog.text
    with caplog.at_level("INFO", logger="tpload"):
        p.close()  # the same pass, ended normally
    assert "read 1 tensor (0.00 GB) in 3 s; finishing the last hashes" in caplog.text
