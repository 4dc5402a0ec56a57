"""The bench's parts: refusing a method that disagrees, the table, page-cache fractions, the decode
measure (the end-to-end run is the slow tier's). Figures are never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tpload.bench import BenchOptions, MethodResult, check_agreement, decode_bandwidth, drop_cache, \
    resident_fraction, summarize, table


def _rank(digest: str, seconds: float = 1.0) -> dict:
    return {"digest": digest, "seconds": seconds, "window_bytes": 100, "largest_window": 50, "bytes_hashed": 0,
            "rss_peak": 1, "anon_peak": 1, "anon_before": 0, "device_peak": 0, "note": ""}


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


def test_resident_fraction_follows_reads_and_drops(tmp_path: Path) -> None:
    f = tmp_path / "x.bin"
    f.write_bytes(os.urandom(4 << 20))
    f.read_bytes()
    assert resident_fraction([f]) > 0.9
    drop_cache([f])
    assert resident_fraction([f]) < 0.1


def test_decode_measure_picks_tensors_by_codec_not_by_name(tmp_path: Path) -> None:
    # a checkpoint whose FP8 tensors are attention projections, not an eh_proj
    from tpload.synth import SynthSpec, write_checkpoint
    root = write_checkpoint(tmp_path / "c", SynthSpec(experts=2))
    for p in root.glob("*.safetensors"):
        p.write_bytes(p.read_bytes().replace(b"eh_proj", b"wq_proj"))
    for name in ("model.safetensors.index.json", "NATIVE_MANIFEST.json"):
        (root / name).write_text((root / name).read_text().replace("eh_proj", "wq_proj"))
    config = tmp_path / "c.toml"
    config.write_text((Path(__file__).parents[2] / "tpload/configs/deepseek-v4-mtp.toml").read_text()
                      .replace("eh_proj", "wq_proj"))
    d = decode_bandwidth(str(root), threads=1, reps=1, config=str(config))
    assert d["fp8_tensor"] == "mtp.0.ffn.shared_experts.w1.weight"  # the plan's first FP8 tensor
    assert d["fp4_gb_per_s"] > 0 and d["fp8_gb_per_s"] > 0 and d["memcpy_gb_per_s"] > 0
