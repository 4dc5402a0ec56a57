"""The bench end to end on the small preset: every method a real torchrun job, and they all
agree."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import HERE

pytestmark = pytest.mark.slow


def test_bench_runs_every_method_and_they_agree(ckpt_copy: Path, tmp_path: Path) -> None:
    small_ckpt = ckpt_copy  # tpload-digest writes TPLOAD_DIGESTS.json into it
    out = tmp_path / "bench.json"
    env = dict(
        os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpload",
            "bench",
            "--checkpoint",
            str(small_ckpt),
            "--nproc",
            "2",
            "--tp",
            "2",
            "--rounds",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    names = [m["method"] for m in doc["methods"]]
    assert {
        "floor",
        "tpload",
        "tpload-digest",
        "tpload-noverify",
        "tpload-expanded",
        "safetensors",
        "seed",
    } <= set(names)
    if importlib.util.find_spec("runai_model_streamer") is None:
        assert any(
            n.startswith("runai: runai_model_streamer is not installed") for n in doc["notes"]
        )
    else:  # it reads whole tensors and says so, and serves the floor's windows (checked below)
        assert "runai" in names
    assert any(
        n.startswith("instanttensor: ") for n in doc["notes"]
    )  # no CUDA here: dropped, with the reason
    assert doc["refused"] == {}
    packed = [m for m in doc["methods"] if m["method"] != "tpload-expanded"]
    assert all(
        m["digests"] == packed[0]["digests"] for m in packed
    )  # the same window bytes on every rank
    assert len(set(packed[0]["digests"])) == 2  # two ranks, two different windows
    for m in doc["methods"]:
        assert (
            m["rounds"] == 1
            and m["seconds"] > 0
            and m["cpu_seconds"] > 0
            and m["window_bytes_per_rank"] > 0
        )
        assert m["page_cache_before"] > 0.5  # warm: the bench read it before the rounds
        assert m["transient_limit"] == 2 * m["largest_window"] + (64 << 20)
        assert m["import_seconds"] >= 0 and m["startup_seconds"] > 0 and m["tensors_per_rank"] > 0
    by = {m["method"]: m for m in doc["methods"]}
    assert (
        by["seed"]["bytes_hashed_per_rank"] > by["tpload"]["bytes_hashed_per_rank"] > 0
    )  # node split halves it
    assert (
        by["floor"]["bytes_hashed_per_rank"] == by["tpload-noverify"]["bytes_hashed_per_rank"] == 0
    )
    assert (
        by["tpload-digest"]["bytes_hashed_per_rank"] == 0
        and not (small_ckpt / "TPLOAD_DIGESTS.json").exists()
    )
    assert {"fp8-block F8_E4M3/F8_E8M0", "fp4-e8m0 I8/F8_E8M0"} <= set(doc["decode"]["codecs"])
    if "runai" in by:
        assert by["runai"]["reads"] == "whole tensors"
        assert (
            by["runai"]["bytes_read_per_rank"]
            > by["floor"]["bytes_read_per_rank"]
            == by["floor"]["window_bytes_per_rank"]
        )
    if (
        "tpload-blake3" in by
    ):  # blake3 installed: the same node share hashed, by blake3 (the worker refuses sha256)
        assert by["tpload-blake3"]["bytes_hashed_per_rank"] == by["tpload"]["bytes_hashed_per_rank"]
    for name in names:
        assert name in p.stdout  # one table line per method
    assert "x floor" in p.stdout and "import s" in p.stdout and "REFUSED" not in p.stdout
    # a process's first call, once after the rounds (fresh processes, the bench's 2 ranks)
    first = doc["first_call"]
    assert "failed" not in first and first["rank_runs"] == 2, first
    for row in first["rows"]:
        # the first weight byte is read inside the first load (after tpload's imports before it)
        assert 0 < row["to_first_read"] < row["before_first_load"] + row["first_load"], row
        assert 0 < row["to_first_read_second"] < row["second_load"], row
        assert row["report_first_call"] > 0 and row["report_first_call_second"] is None, row
        assert row["kernels"] in ("ahead", "numba"), row
        assert not (row["kernels"] == "ahead" and row["numba_at_first_read"]), row
    slowest = first["figures"]["to_first_read"]["slowest"]
    assert slowest == max(r["to_first_read"] for r in first["rows"])
    assert f"first call: {slowest:.2f} s beyond import torch to the first weight byte" in p.stdout
