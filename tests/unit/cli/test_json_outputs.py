"""``plan --json`` and ``verify --json``: the JSON, complete, on standard output and the text on
standard error; lists of problems capped on the terminal; ``plan``'s exit code when a layout does
not fit the GPU it is judged against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpload.cli import main
from tpload.cli.output import SHOWN_PROBLEMS

from ...helpers import edit_json, rewrite_header


def test_plan_json_and_its_exit_code_when_a_layout_does_not_fit(
    small_ckpt: Path, capfd: pytest.CaptureFixture
) -> None:
    assert main(["plan", str(small_ckpt), "--tp", "2", "--gpu-memory", "0.0001", "--json"]) == 3
    out, err = capfd.readouterr()
    doc = json.loads(out)  # all of standard output is the plan
    assert doc["gpu"] == {"bytes": 107374, "source": "--gpu-memory 0.0001", "fits": False,
                          "over": [0, 1]}  # fmt: skip
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["ranks"][0]["tensors"] > 0
    assert doc["ranks"][0]["device_peak"] > 107374 and "does not fit" in err and "plan for" in err
    assert main(["plan", str(small_ckpt), "--tp", "2", "--gpu-memory", "80"]) == 0
    out, _ = capfd.readouterr()
    assert "fits a GPU of 80.00 GiB" in out


def test_a_header_with_many_bad_entries_gives_a_screenful_and_the_json_every_one(
    ckpt_copy: Path, capfd: pytest.CaptureFixture
) -> None:
    shard = "model-00001-of-00002.safetensors"

    def bad_dtypes(header: dict) -> None:
        for name in header:
            if name != "__metadata__":
                header[name]["dtype"] = "Q9"

    rewrite_header(ckpt_copy, shard, bad_dtypes)
    assert main(["plan", str(ckpt_copy), "--tp", "2"]) == 1
    _, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == SHOWN_PROBLEMS + 2, err  # the error, 20 problems, the count
    assert lines[0].startswith("tpload: error: ") and "problems in the header" in lines[0]
    total = int(lines[0].split("error: ")[1].split()[0])
    assert lines[-1] == f"  ... and {total - SHOWN_PROBLEMS:,} more" and total >= 40
    assert main(["plan", str(ckpt_copy), "--tp", "2", "--json"]) == 1
    out, err = capfd.readouterr()
    doc = json.loads(out)
    assert doc["ok"] is False and len(doc["lines"]) == total  # every one
    assert all("dtype 'Q9' is not served" in line for line in doc["lines"])
    assert sum(line.startswith("  - ") for line in err.splitlines()) == SHOWN_PROBLEMS


def test_verify_json_lists_every_problem_and_the_terminal_the_first_ones(
    ckpt_copy: Path, capfd: pytest.CaptureFixture
) -> None:
    assert main(["verify", str(ckpt_copy), "--json"]) == 0
    out, err = capfd.readouterr()
    ok = json.loads(out)
    assert ok["ok"] is True and ok["problems"] == [] and ok["checked"].startswith("checked 62")
    assert err.strip().endswith(": OK")

    def wrong_digests(m: dict) -> None:
        for entry in list(m["tensors"].values())[:30]:
            entry["sha256"] = "0" * 64

    edit_json(ckpt_copy / "NATIVE_MANIFEST.json", wrong_digests)
    assert main(["verify", str(ckpt_copy), "--json"]) == 1
    out, err = capfd.readouterr()
    bad = json.loads(out)
    assert bad["ok"] is False and len(bad["problems"]) == 30
    shown = [line for line in err.splitlines() if line.startswith("BAD ")]
    assert len(shown) == SHOWN_PROBLEMS and "... and 10 more" in err and "30 problem(s)" in err


def test_a_failed_load_writes_every_problem_into_its_report(
    ckpt_copy: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    # 30 tensors whose manifest digest is wrong: the terminal shows 20 and counts the rest, the
    # report (--report FILE) holds the verdict whole, every rank's row and ok false
    def wrong_digests(m: dict) -> None:
        for entry in list(m["tensors"].values())[:30]:
            entry["sha256"] = "0" * 64

    edit_json(ckpt_copy / "NATIVE_MANIFEST.json", wrong_digests)
    report = tmp_path / "failed.json"
    assert main([str(ckpt_copy), "--no-progress", "--report", str(report)]) == 1
    _, err = capfd.readouterr()
    shown = [line for line in err.splitlines() if line.lstrip().startswith("- ")]
    assert len(shown) == SHOWN_PROBLEMS and "\n  ... and 10 more\n" in err  # all 30 counted
    doc = json.loads(report.read_text())
    assert doc["ok"] is False and doc["error"].startswith("load failed on rank 0 (1 of 1 ranks)")
    listed = [line for line in doc["problems"] if line.lstrip().startswith("- ")]
    assert len(listed) == 30 and all("does not match the manifest" in line for line in listed)
    assert doc["ranks"][0]["failed"] == 1 and doc["tp"] == 1
