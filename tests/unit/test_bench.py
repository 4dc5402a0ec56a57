"""The bench end to end on the small preset (real torchrun runs), and its refusal of a method that disagrees.

Figures are never asserted: only the structure, and that every method served the same windows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tpload.bench import MethodResult, check_agreement, resident_fraction, table, BenchOptions, summarize

from .helpers import HERE


def _rank(digest: str, seconds: float = 1.0) -> dict:
    return {"digest": digest, "seconds": seconds, "window_bytes": 100, "largest_window": 50, "bytes_hashed": 0,
            "rss_peak": 1, "anon_peak": 1, "anon_before": 0, "device_peak": 0, "note": ""}


def test_bench_runs_every_method_and_they_agree(ckpt_copy: Path, tmp_path: Path) -> None:
    small_ckpt = ckpt_copy  # tpload-digest writes TPLOAD_DIGESTS.json into it
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-m", "tpload", "bench", "--checkpoint", str(small_ckpt), "--nproc", "2",
                        "--tp", "2", "--rounds", "1", "--json", str(out)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    names = [m["method"] for m in doc["methods"]]
    assert {"floor", "tpload", "tpload-digest", "tpload-noverify", "tpload-expanded", "safetensors", "seed"} <= set(names)
    assert doc["refused"] == {}
    packed = [m for m in doc["methods"] if m["method"] != "tpload-expanded"]
    assert all(m["digests"] == packed[0]["digests"] for m in packed)  # the same window bytes on every rank
    assert len(set(packed[0]["digests"])) == 2  # two ranks, two different windows
    for m in doc["methods"]:
        assert m["rounds"] == 1 and m["seconds"] > 0 and m["cpu_seconds"] > 0 and m["window_bytes_per_rank"] > 0
        assert 0.0 <= m["page_cache_before"] <= 1.0
        assert m["transient_limit"] == 2 * m["largest_window"] + (64 << 20)
    by = {m["method"]: m for m in doc["methods"]}
    assert by["seed"]["bytes_hashed_per_rank"] > by["tpload"]["bytes_hashed_per_rank"] > 0  # node split halves it
    assert by["floor"]["bytes_hashed_per_rank"] == by["tpload-noverify"]["bytes_hashed_per_rank"] == 0
    assert by["tpload-digest"]["bytes_hashed_per_rank"] == 0 and (small_ckpt / "TPLOAD_DIGESTS.json").exists()
    assert {"fp4_gb_per_s", "fp8_gb_per_s", "memcpy_gb_per_s"} <= set(doc["decode"])
    for name in names:
        assert name in p.stdout  # one table line per method
    assert "x floor" in p.stdout and "REFUSED" not in p.stdout


def test_a_method_that_disagrees_is_refused() -> None:
    results = {"floor": MethodResult("floor", [[_rank("a"), _rank("b")]]),
               "tpload": MethodResult("tpload", [[_rank("a"), _rank("b")], [_rank("a"), _rank("b")]]),
               "safetensors": MethodResult("safetensors", [[_rank("a"), _rank("b")], [_rank("a"), _rank("X")]]),
               "tpload-expanded": MethodResult("tpload-expanded", [[_rank("e"), _rank("f")], [_rank("e"), _rank("g")]])}
    check_agreement(results)
    assert results["floor"].refused == results["tpload"].refused == ""
    assert "rank 1 in round 2" in results["safetensors"].refused
    assert "rank 1 in round 2" in results["tpload-expanded"].refused  # held to its own first run
    shown = [summarize(r) for r in results.values() if not r.refused]
    text = table(shown, {m: r.refused for m, r in results.items() if r.refused}, BenchOptions("ckpt"))
    line = next(ln for ln in text.splitlines() if ln.startswith("safetensors"))
    assert "REFUSED" in line and "1.00" not in line  # no figures for it


def test_resident_fraction_of_a_file_just_written(tmp_path: Path) -> None:
    f = tmp_path / "x.bin"
    f.write_bytes(os.urandom(1 << 20))
    assert 0.0 <= resident_fraction([f]) <= 1.0
