"""The first-call measure's pure parts (tools/first_call.py): the reduction of every rank-run's row
to the figures, the lines the bench and the launch script print, and the launch script's options.
The measure itself (fresh torchrun processes) is the slow tier's bench test."""

from __future__ import annotations

import pytest

from tpload.tools.first_call import (
    bench_line,
    option_value,
    report_figure,
    summarize,
    summary_lines,
)


def _row(repeat: int, rank: int, first: float, **more: object) -> dict[str, object]:
    return {
        "repeat": repeat,
        "rank": rank,
        "to_first_read": first,
        "to_first_read_second": first / 10,
        "before_first_load": 0.01,
        "first_load": 1.0 + first,
        "second_load": 0.5,
        "numba_at_first_read": False,
        "kernels": "ahead",
        "report_first_call": None,  # not measured: left out, not counted as 0
    } | more


ROWS = [_row(0, 0, 0.2), _row(0, 1, 0.4), _row(1, 0, 0.1), _row(1, 1, 0.3), _row(2, 0, 0.9)]


def test_the_slowest_rank_of_each_repeat_then_the_median_over_repeats() -> None:
    s = summarize(ROWS)
    first = s["figures"]["to_first_read"]
    assert first["slowest"] == pytest.approx(0.4)  # repeats' slowest: 0.4, 0.3, 0.9
    assert first["median"] == pytest.approx(0.3)  # over the five rank-runs
    assert (first["min"], first["max"], first["rank_runs"]) == (0.1, 0.9, 5)
    assert s["figures"]["once"]["slowest"] == pytest.approx(0.9)  # first - second: 0.9, 0.8, 1.4
    assert "report_first_call" not in s["figures"]
    assert (s["repeats"], s["rank_runs"], s["numba_at_first_read"], s["kernels"]) == (
        3,
        5,
        0,
        ["ahead"],
    )


def test_the_bench_line_says_the_slowest_rank_numba_and_the_kernels() -> None:
    line = bench_line(summarize(ROWS[:2]))
    assert line.startswith("first call: 0.40 s beyond import torch to the first weight byte")
    assert "second load 0.04 s" in line and "report's" not in line
    assert "numba imported: no; kernels: ahead)" in line
    mixed = [ROWS[0], _row(0, 1, 0.5, numba_at_first_read=True, report_first_call=0.25)]
    line = bench_line(summarize(mixed))
    assert "the report's first_call_seconds 0.25 s" in line
    assert "numba imported: on 1 of 2 rank-runs" in line
    assert (
        summary_lines(summarize(mixed))[-2]
        == "numba imported by the first read: on 1 of 2 rank-runs"
    )


def test_the_launch_scripts_lines_keep_its_medians() -> None:
    lines = summary_lines(summarize(ROWS))
    assert lines[0].startswith("to_first_read: median 0.300 s (min 0.100, max 0.900, 5 rank-runs")
    assert "first_load - second_load: median 0.800 s" in lines


def test_options_and_the_reports_figure() -> None:
    assert [option_value(v) for v in ("2", "false", "node", "1.5")] == [2, False, "node", 1.5]
    report = {"ranks": [{"rank": 0, "x": 1.0}, {"rank": 1, "x": 2.0}], "y": 3}
    assert report_figure(report, "x", 1) == 2.0
    assert report_figure(report, "y", 1) == 3  # the report's own, where no rank row has it
    assert report_figure(report, "z", 0) is None
