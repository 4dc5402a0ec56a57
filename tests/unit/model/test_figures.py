"""The exchange row: every figure survives the wire; 'not measured' is None (null in JSON), never
-1."""

from __future__ import annotations

import json

from tpload.model.figures import MESSAGE_BYTES, RankFigures
from tpload.report.render import LoadReport


def test_a_row_round_trips_every_field() -> None:
    f = RankFigures(
        rank=3,
        node=1,
        seq=7,
        failed=1,
        tensors=62,
        bytes_read=10**12,
        ns=5 * 10**9,
        device_alloc_peak=None,
        page_cache_before=123,
        prediction=2,
        digest="ab" * 32,
        message="rank 3: bad ✓",
        claims=[bytes([i]) * 32 for i in range(8)],
        seen=[b"\1" * 32] * 8,
    )
    row = f.to_row()
    assert row.numel() == RankFigures.row_size()
    back = RankFigures.from_row(row)
    assert back == f


def test_rows_have_one_size_whatever_a_rank_knows() -> None:
    assert (
        RankFigures().to_row().numel()
        == RankFigures(claims=[b"x" * 32] * 3, message="m" * 9999).to_row().numel()
    )


def test_a_long_message_is_cut_on_a_character_boundary() -> None:
    f = RankFigures(message="é" * MESSAGE_BYTES)
    back = RankFigures.from_row(f.to_row())
    assert back.message == "é" * (MESSAGE_BYTES // 2)


def test_json_says_null_for_what_was_not_measured_and_to_json_is_text() -> None:
    ranks = [
        RankFigures(rank=0, page_cache_before=5, tensors=2, digest="cd" * 32),
        RankFigures(rank=1, tensors=2),
    ]
    report = LoadReport("/ckpt", "packed", 2, 1, "node", "cpu", ranks)
    doc = report.to_dict()
    assert (
        doc["ranks"][1]["page_cache_before"] is None
        and doc["ranks"][0]["device_alloc_peak"] is None
    )
    assert json.loads(report.to_json()) == json.loads(json.dumps(doc))
    table = report.table()
    row = next(line for line in table.splitlines() if line.startswith("   0 "))
    assert "0.000>-" in row and row.split()[8] == "-"  # dev GiB shown as "-" on the CPU, not 0.00
    assert max(len(line) for line in table.splitlines()[:5]) <= 100  # the table fits 100 columns


def test_predictions_word_needs_every_rank() -> None:
    def mk(*states: int) -> LoadReport:
        figures = [RankFigures(rank=i, prediction=s) for i, s in enumerate(states)]
        return LoadReport("c", "packed", 2, 1, "node", "cpu", figures)

    assert mk(1, 1).predictions == "matched" and mk(0, 0).predictions == "none stored"
    assert mk(1, 2).predictions == "differs" and mk(1, 0).predictions == "partly stored"


def test_the_table_escapes_what_the_checkpoint_named() -> None:
    report = LoadReport(
        "/ckpt/\x1b[2J", "packed", 1, 1, "node", "cpu", [RankFigures()], notes=["x\x07"]
    )
    assert "\x1b" not in report.table() and "\x07" not in report.table()


def test_the_report_names_the_hash_every_rank_used() -> None:
    both = [RankFigures(rank=0, blake3=1, hashed=3), RankFigures(rank=1, blake3=1, hashed=2)]
    assert LoadReport("/c", "packed", 2, 1, "node", "cpu", both).to_dict()["hash"] == "blake3"
    mixed = LoadReport("/c", "packed", 2, 1, "rank", "cpu", [both[0], RankFigures(rank=1)])
    assert mixed.to_dict()["hash"] == "mixed" and [
        r["blake3"] for r in mixed.to_dict()["ranks"]
    ] == [1, 0]
    assert "by blake3 on rank 0 and sha256 on rank 1" in mixed.table()
    assert LoadReport("/c", "packed", 2, 1, "digest", "cpu", [RankFigures(rank=0)]).hash is None
