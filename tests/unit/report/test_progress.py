"""Rank 0's progress: tensors counted as the report's table counts them, the ETA from bytes."""

from __future__ import annotations

import re
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
        "[rank 0] read done: 4 tensors (0.00 GB) in 6 s; finishing the last hashes, then the "
        "ranks' verdict" in caplog.text
    )


def test_no_eta_until_a_rate_is_measured(caplog: pytest.LogCaptureFixture) -> None:
    # the first bytes come 2 s after the pass began (the arena's allocation): a rate over those 2 s
    # gave "ETA 47562 s"; the rate runs from the first byte, and no ETA comes before a second of it
    clock = Clock()
    p = Progress(10**9, 100, every_s=2.0, now=clock)
    clock.t += 2.0
    with caplog.at_level("INFO", logger="tpload"):
        p.update(10)  # the first byte, every_s after the start: a line, but no rate yet
        clock.t += 0.5
        p.update(10)
    assert p.eta() is None
    assert caplog.messages == [
        "[rank 0] read 1/100 tensors, 0.00/1.00 GB, rate: measuring, ETA: measuring"
    ]
    clock.t += 2.0
    with caplog.at_level("INFO", logger="tpload"):
        p.update(10**8 - 20)  # 0.1 GB in 2.5 s since the first byte
    assert p.eta() == pytest.approx(0.9e9 / (1e8 / 2.5))
    assert caplog.messages[-1].endswith("0.04 GB/s, ETA 22 s")


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
    assert "read done: 1 tensor (0.00 GB) in 3 s; finishing the last hashes" in caplog.text


def test_the_slowest_rank_is_named_with_how_far_behind_it_is() -> None:
    from tpload.model.progress import Standing
    from tpload.report.progress import straggler

    gb = 10**9
    lead = Standing(0, "read", 8 * gb, 10 * gb, 4.0)  # 2 GB/s: 1 s left
    slow = Standing(3, "read", 1 * gb, 10 * gb, 4.0)  # 0.25 GB/s: 36 s left
    assert straggler([lead, Standing(1, "read", 7 * gb, 10 * gb, 4.0), slow]) == (
        "slowest: rank 3, read 10% (rank 0 read 80%), about 35 s behind"
    )
    # a rank still planning is behind one reading; no seconds without its rate
    assert straggler([lead, Standing(2, "plan")]) == "slowest: rank 2, planning (rank 0 read 80%)"
    done = Standing(0, "exchange", 10 * gb, 10 * gb, 5.0)
    assert straggler([done, slow]) == (
        "slowest: rank 3, read 10% (rank 0 done reading), about 36 s behind"
    )
    # together (a few percent apart), or alone: nothing named
    assert straggler([lead, Standing(1, "read", int(7.5 * gb), 10 * gb, 4.0)]) == ""
    assert straggler([lead]) == ""
    # no rate in the first second of reading: named, but no seconds
    assert straggler([done, Standing(1, "read", 10, 10 * gb, 0.5)]) == (
        "slowest: rank 1, read 0% (rank 0 done reading)"
    )
    assert Standing.decode(1, Standing(1, "read", 5, 9, 1.25).encode()) == Standing(
        1, "read", 5, 9, 1.25
    )
    assert Standing.decode(1, "garbage") is None


def test_a_phase_without_progress_of_its_own_gets_a_line_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import time

    from tpload.report.progress import Phases, Ticker

    phases = Phases()
    phases.enter("plan")
    ticker = Ticker(phases, every_s=0.2, clause=lambda: "slowest: rank 1, opening the checkpoint")
    with caplog.at_level("INFO", logger="tpload"):
        ticker.start()
        time.sleep(0.7)
        phases.enter("read")  # the copy loop's lines are Progress's: the ticker says nothing
        n = len(caplog.messages)
        time.sleep(0.5)
        ticker.stop()
    assert n >= 1 and len(caplog.messages) == n, caplog.messages
    assert re.fullmatch(
        r"\[rank 0\] plan: \d s; slowest: rank 1, opening the checkpoint", caplog.messages[0]
    )
    assert phases.ns["plan"] > 0.6e9


def test_the_copy_loop_s_lines_carry_the_straggler(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    said = "slowest: rank 3, planning (rank 0 read 50%)"
    p = Progress(1000, 4, every_s=2.0, now=clock, clause=lambda: said)
    p.update(10)
    clock.t += 3.0
    with caplog.at_level("INFO", logger="tpload"):
        p.update(490)
    assert caplog.messages[-1].endswith(f"ETA 3 s; {said}"), caplog.messages
