"""README's first command under real torchrun: the built-in checkpoint, made once, loaded on 2
ranks."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import tpload

from ..helpers import SLOW_WORKER, interrupted_run, torchrun, torchrun_cmd, tpload_cli


def test_readme_default_loads_the_builtin_checkpoint(tmp_path: Path) -> None:
    # --report -: rank 0 alone writes standard output (the JSON), the table goes to standard error
    run = tpload_cli(2, "--report", "-", env={"TPLOAD_CACHE": str(tmp_path / "cache")})
    assert run.rc == 0, run.text
    assert "verified:" in run.err and "rank node" in run.err
    assert (
        "using the built-in synthetic checkpoint" in run.err
    )  # said before the silent first seconds
    doc = json.loads(run.out)  # the whole of standard output: one report, from rank 0 only
    assert len(doc["ranks"]) == 2 and doc["tp"] == 2 and doc["verify"] == "node"
    assert all(r["failed"] == 0 and r["tensors"] > 0 for r in doc["ranks"])
    assert any((tmp_path / "cache").glob("synth-*/NATIVE_MANIFEST.json"))  # made once, cached
    # tpload's own checkpoint pins what its load checks: no stale-manifest note on the first run
    assert "pins none of" not in run.text and not any("pins none" in n for n in doc["notes"])
    assert not Path("-").exists()
    assert_matches_readme(run.err)


def assert_matches_readme(out: str) -> None:
    """README's sample of this run ("The first load"): the same header, the same verified line,
    and per rank the same counts, bytes and digest (times and memory differ from run to run)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## The first load", 1)[1]
    sample = re.search(r"\n```\n(rank node.*?)\n```", section, re.S).group(1).splitlines()
    lines = out.splitlines()
    head = lines.index(sample[0])  # the header, verbatim
    assert sample[-1].startswith("verified: ") and sample[-1] in lines, (sample[-1], out)
    fixed = lambda row: row.split()[:6] + row.split()[-1:]  # noqa: E731  rank..served, digest
    rows = lines[head + 1 : head + len(sample) - 2]
    assert [fixed(r) for r in rows] == [fixed(r) for r in sample[1:-2]], (rows, sample)
    assert fixed(sample[1])[-1] == "70e17cbcd71a5fc6" and fixed(sample[2])[-1] == "42c10de7a592cd9a"


def test_a_failed_load_prints_its_message_once_and_torchrun_names_it(tmp_path: Path) -> None:
    run = tpload_cli(2, str(tmp_path))  # a folder with no checkpoint: found by the load itself
    assert run.rc != 0
    lines = run.text.splitlines()
    head = (
        "[rank 0] tpload: error: load failed on rank 0, 1 (2 of 2 ranks); no rank returned weights"
    )
    assert (
        lines.count(head) == 1 and "[rank 1] tpload: load failed (see rank 0)" in lines
    )  # each a line of its own
    assert run.text.count("tpload: error:") == 2  # rank 0's line, and torchrun's summary quoting it
    summary = run.err.split("Root Cause (first observed failure):", 1)[1]
    assert f"traceback : {head}" in summary and "rank      : 0 " in summary
    assert "To enable traceback see" not in run.err  # both ranks left torchrun an error file
    # What the ranks print before torchrun's own traceback and summary (its log lines aside): the
    # message (2 lines) once, rank 1's pointer, perhaps the first-run compile note; 4 lines before
    # this (the message per rank, two of them run together), and N x 2 at N ranks.
    ours = [
        line
        for line in lines[: lines.index("Traceback (most recent call last):")]
        if not re.match(r"[WEI]\d{4} ", line)
    ]
    assert len(ours) <= 4 and len(lines) <= 50, (
        run.text
    )  # torchrun's summary and traceback: ~40 lines


def test_a_mistyped_flag_under_torchrun_is_said_once_with_the_closest() -> None:
    run = tpload_cli(2, "--tpp", "2")
    said = (
        "tpload: error: unrecognized arguments: --tpp 2; did you mean --tp? (usage: python -m "
        "tpload --help)"
    )
    assert run.rc != 0 and said in run.err.splitlines()
    assert run.err.count("did you mean --tp?") == 2  # once from the ranks, once in the summary
    # the speaker exits first (the others wait a moment): torchrun names its line the root cause
    summary = run.err.split("Root Cause (first observed failure):", 1)[1]
    assert f"traceback : {said}" in summary and "exitcode  : 2" in summary, run.err


def test_ctrl_c_mid_load_exits_130_with_one_line(small_ckpt: Path, tmp_path: Path) -> None:
    # python -m tpload, its copy loop slowed (1 s a tensor): Ctrl-C once it reads
    run = interrupted_run(
        [sys.executable, str(SLOW_WORKER), str(small_ckpt), "--no-progress"],
        tmp_path / "reading",
        env={"SLOW_S": "1"},
    )
    assert run.rc == 130, run.text
    assert run.err.strip().splitlines()[-1:] == [
        "[rank 0] tpload: interrupted (Ctrl-C) while reading; nothing was loaded"
    ], run.err
    assert "Traceback" not in run.err and "rank 0: interrupted" not in run.err


def test_ctrl_c_under_torchrun_is_one_line_from_the_ranks(small_ckpt: Path, tmp_path: Path) -> None:
    # a terminal's Ctrl-C reaches torchrun and both ranks; torchrun's own traceback (its agent's
    # SignalException) is torchrun's: the ranks print one line, no traceback of theirs
    run = interrupted_run(
        [*torchrun_cmd(2), str(SLOW_WORKER), str(small_ckpt), "--no-progress"],
        tmp_path / "reading",
        env={"SLOW_S": "1"},
    )
    assert run.rc != 0
    ours = [line for line in run.text.splitlines() if "tpload" in line and "[rank" in line]
    assert len(ours) == 1, run.text  # the phase: reading, unless torchrun's second SIGINT won
    assert re.fullmatch(
        r"\[rank 0\] tpload: interrupted \(Ctrl-C\)( while [a-z' ]+)?; nothing was loaded", ours[0]
    ), run.text
    assert "KeyboardInterrupt" not in run.text and run.text.count("Traceback") <= 1, run.text


def test_a_slow_rank_is_named_in_rank_0_s_progress_and_its_phases_in_the_report(
    small_ckpt: Path, tmp_path: Path
) -> None:
    # rank 1's copy loop stalls (2 s a tensor or batch: 4 runs a rank here, so ~8 s): rank 0,
    # done reading, waits at the exchange and says for whom; the report's phase times show who
    # held the load
    report = tmp_path / "load.json"
    run = torchrun(
        2,
        [str(SLOW_WORKER), str(small_ckpt), "--report", str(report)],
        env={"SLOW_RANK": "1", "SLOW_S": "2"},
    )
    assert run.rc == 0, run.text
    first = next(line for line in run.err.splitlines() if not re.match(r"[WEI]\d{4} ", line))
    assert first.endswith(
        f"tpload INFO tpload {tpload.__version__}: loading {small_ckpt} at tp 2 x ep 1 on 2 "
        "ranks, kind packed, verify node (torch's import first)"
    ), run.err
    waits = [line for line in run.err.splitlines() if "[rank 0] exchange: waiting" in line]
    assert any(
        re.search(r"slowest: rank 1, read \d+% \(rank 0 done reading\)", line) for line in waits
    ), run.err
    doc = json.loads(report.read_text())
    assert doc["slowest_rank"] == 1
    fast, slow = (r["phase_seconds"] for r in doc["ranks"])
    assert set(fast) == {"open", "plan", "handshake", "read", "exchange"}
    assert slow["read"] > 4 > fast["read"] and fast["exchange"] > 4 > slow["exchange"]


def test_a_failed_load_s_report_holds_every_rank_s_problems_whole(
    small_ckpt: Path, tmp_path: Path
) -> None:
    # every manifest digest wrong: each rank hashes about half the tensors, a message of 6 KiB or
    # so, more than the exchanged row's 4 KiB; the report has every line of both
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(small_ckpt, ckpt)
    manifest = json.loads((ckpt / "NATIVE_MANIFEST.json").read_text())
    for entry in manifest["tensors"].values():
        entry["sha256"] = "0" * 64
    (ckpt / "NATIVE_MANIFEST.json").write_text(json.dumps(manifest))
    report = tmp_path / "failed.json"
    run = tpload_cli(2, str(ckpt), "--report", str(report))
    assert run.rc != 0
    doc = json.loads(report.read_text())
    assert doc["ok"] is False and doc["error"].startswith("load failed on rank 0, 1 (2 of 2")
    listed = [line for line in doc["problems"] if "does not match the manifest" in line]
    assert len(listed) == len(manifest["tensors"]), doc["problems"]
    assert "... and" in run.err  # the terminal: the first 20 of each list
