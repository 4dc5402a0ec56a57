"""The bench's parts: refusing a method that disagrees, the table, page-cache fractions, the decode
measure (the end-to-end run is the slow tier's). Figures are never asserted."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import pytest

from tpload.loading.pick import choose
from tpload.loading.planner import planner_of
from tpload.planning.layout import Layout
from tpload.storage.sharded import ShardedStorage
from tpload.tools.bench import (
    OPTIONAL,
    BenchOptions,
    MethodResult,
    available_methods,
    check_agreement,
    cmd_bench,
    drop_cache,
    measure_first_call,
    preset_checkpoint,
    resident_fraction,
    summarize,
    table,
)
from tpload.tools.bench_bandwidth import decode_bandwidth, decode_lines
from tpload.tools.published import write_published


def _rank(digest: str, seconds: float = 1.0) -> dict:
    return {
        "digest": digest,
        "seconds": seconds,
        "window_bytes": 100,
        "largest_window": 50,
        "bytes_hashed": 0,
        "rss_peak": 1,
        "anon_peak": 1,
        "anon_before": 0,
        "device_peak": 0,
        "note": "",
    }


def test_a_method_that_disagrees_is_refused() -> None:
    results = {
        "floor": MethodResult("floor", [[_rank("a"), _rank("b")]]),
        "tpload": MethodResult("tpload", [[_rank("a"), _rank("b")], [_rank("a"), _rank("b")]]),
        "safetensors": MethodResult(
            "safetensors", [[_rank("a"), _rank("b")], [_rank("a"), _rank("X")]]
        ),
        "tpload-expanded": MethodResult(
            "tpload-expanded", [[_rank("e"), _rank("f")], [_rank("e"), _rank("g")]]
        ),
    }
    check_agreement(results)
    assert results["floor"].refused == results["tpload"].refused == ""
    assert "rank 1 in round 2" in results["safetensors"].refused
    assert "rank 1 in round 2" in results["tpload-expanded"].refused  # held to its own first run
    shown = [summarize(r) for r in results.values() if not r.refused]
    text = table(
        shown, {m: r.refused for m, r in results.items() if r.refused}, BenchOptions("ckpt")
    )
    line = next(ln for ln in text.splitlines() if ln.startswith("safetensors"))
    assert "REFUSED" in line and "1.00" not in line  # no figures for it


def test_resident_fraction_follows_reads_and_drops(tmp_path: Path) -> None:
    f = tmp_path / "x.bin"
    f.write_bytes(os.urandom(4 << 20))
    f.read_bytes()
    assert resident_fraction([f]) > 0.9
    drop_cache([f])
    assert resident_fraction([f]) < 0.1


def test_decode_measure_picks_the_biggest_tensor_of_each_format(tmp_path: Path) -> None:
    from tpload.tools.synth import SynthSpec, write_checkpoint

    root = write_checkpoint(tmp_path / "c", SynthSpec(experts=2))
    d = decode_bandwidth(str(root), threads=1, reps=1)
    assert set(d["codecs"]) == {"fp8-block F8_E4M3/F8_E8M0", "fp4-e8m0 I8/F8_E8M0", "plain F16"}
    storage = ShardedStorage(root)
    plan = planner_of(storage.catalogue, choose("auto", root)[0]).plan(Layout(1), "expanded", 0)
    storage.close()
    fp8 = [i for i in plan.items if i.codec.role == "fp8"]
    biggest = max(fp8, key=lambda i: i.outputs[0].nbytes)
    assert d["codecs"]["fp8-block F8_E4M3/F8_E8M0"]["tensor"] == biggest.name
    assert d["codecs"]["fp8-block F8_E4M3/F8_E8M0"]["bytes_out"] == biggest.outputs[0].nbytes
    assert all(c["gb_per_s"] > 0 and c["memcpy_gb_per_s"] > 0 for c in d["codecs"].values())


def test_decode_measure_takes_fp8_attention_projections_of_a_published_layout(
    tmp_path: Path,
) -> None:
    # Qwen3-FP8: the FP8 tensors are attention projections and experts; no eh_proj anywhere
    root = write_published(tmp_path / "q", "qwen3-fp8-tiny")
    names = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any("eh_proj" in n for n in names)
    d = decode_bandwidth(str(root), threads=1, reps=1)
    assert list(d["codecs"]) == ["fp8-block F8_E4M3/BF16"]  # its scales are BF16 values
    assert ".self_attn." in d["codecs"]["fp8-block F8_E4M3/BF16"]["tensor"]
    assert d["codecs"]["fp8-block F8_E4M3/BF16"]["gb_per_s"] > 0
    assert "fp8-block F8_E4M3/BF16" in decode_lines(d)[0]


def test_decode_measure_of_a_checkpoint_with_nothing_to_decode(tmp_path: Path) -> None:
    d = decode_bandwidth(str(write_published(tmp_path / "l", "llama-tiny")), threads=1, reps=1)
    assert d["codecs"] == {} and "nothing to decode" in decode_lines(d)[0]


def test_table_shows_import_seconds_tensors_and_what_each_method_reads() -> None:
    floor = _rank("a") | {"import_seconds": 1.25, "startup_seconds": 3.0, "tensors": 40}
    runai = _rank("a") | {
        "import_seconds": 0.04,
        "startup_seconds": 3.0,
        "tensors": 40,
        "reads": "whole tensors",
        "bytes_read": 300,
    }
    shown = [
        summarize(MethodResult("floor", [[floor]])),
        summarize(MethodResult("runai", [[runai]])),
    ]
    lines = table(shown, {}, BenchOptions("ckpt")).splitlines()
    head = next(ln for ln in lines if ln.startswith("method"))
    rows = {ln.split()[0]: ln for ln in lines if ln.startswith(("floor ", "runai "))}

    def cell(method: str, label: str) -> str:  # columns are right-aligned under their labels
        return rows[method][: head.index(label) + len(label)].split()[-1]

    assert cell("floor", "import s") == "1.25" and cell("runai", "import s") == "0.04"
    assert cell("floor", "reads") == "windows" and cell("runai", "reads") == "tensors"
    assert cell("floor", "tensors") == cell("runai", "tensors") == "40"
    assert cell("floor", "us/tensor") == f"{1e6 / 40:.1f}"  # 1 s over 40 tensors
    assert summarize(MethodResult("runai", [[runai]]))["bytes_read_per_rank"] == 300
    assert summarize(MethodResult("floor", [[floor]]))["bytes_read_per_rank"] == 100  # its windows
    assert any("the whole tensor (tensors)" in ln for ln in lines) and any(
        "3.00 s" in ln for ln in lines
    )


def test_a_peer_that_is_not_installed_or_needs_cuda_is_dropped_with_the_reason(monkeypatch) -> None:
    monkeypatch.setitem(OPTIONAL, "runai", ("no_such_package_tpload", False))
    methods, notes = available_methods(("floor", "runai", "instanttensor"), cuda=False)
    assert methods == ["floor"]
    assert any(n.startswith("runai: no_such_package_tpload is not installed") for n in notes)
    assert any(n.startswith("instanttensor:") for n in notes)


def test_many_tensors_preset_is_written_once_with_its_count(capsys: pytest.CaptureFixture) -> None:
    root = preset_checkpoint("many-tensors", tensors=30)
    names = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(names) == 30 and preset_checkpoint("many-tensors", tensors=30) == root
    with pytest.raises(SystemExit) as e:
        cmd_bench(["--preset", "small", "--tensors", "5"])
    assert e.value.code == 2 and "--tensors N" in capsys.readouterr().err


@pytest.mark.parametrize(
    "preset", ["gpt-oss-tiny", "nvfp4-tiny"]
)  # stacked experts; a 0-D global scale
def test_every_peer_serves_the_floors_windows_of_a_published_layout(
    preset: str, tmp_path: Path
) -> None:
    # each method's job on one rank, in this process (no process group needed): the same bytes as
    # the floor's
    import torch

    from tpload.tools.bench_job import Job
    from tpload.tools.bench_worker import METHODS, window_digest

    root = write_published(tmp_path / "c", preset)
    peers = ["safetensors", "seed"] + (
        ["runai"] if importlib.util.find_spec("runai_model_streamer") else []
    )
    for rank in range(2):
        job = functools.partial(Job, str(root), "auto", 2, rank, 2, torch.device("cpu"))
        want = window_digest(METHODS["floor"](job()))
        for m in peers:
            assert window_digest(METHODS[m](job())) == want, (m, rank)
    if "runai" in peers:
        j = job()
        METHODS["runai"](j)
        assert j.reads == "whole tensors" and j.bytes_read > sum(c.nbytes for _, c in j.cuts())


def test_decode_lines_name_the_device_and_its_copy() -> None:
    MIB = 1 << 20
    """On a GPU the decode is judged against a device copy (the HBM figure), on the CPU against a
    memcpy."""
    c = {
        "x": {
            "tensor": "t",
            "bytes_out": MIB,
            "gb_per_s": 100.0,
            "memcpy_gb_per_s": 200.0,
            "vs_memcpy": 0.5,
        }
    }
    gpu = decode_lines({"threads": 1, "device": "cuda:0", "codecs": c})[0]
    cpu = decode_lines({"threads": 2, "device": "cpu", "codecs": c})[0]
    assert (
        gpu.startswith("decode on cuda:0, x: 100.00 GB/s") and "50% of a device copy (HBM)" in gpu
    )
    assert cpu.startswith("decode on CPU (2 thread(s)), x:") and "of a memcpy" in cpu


def test_the_replicas_arm_counts_storage_from_the_reports_and_says_how() -> None:
    from tpload.tools.bench_replicas import ReplicaBench, figures, summarize, table

    def row(storage: int | None, peers: int | None, digest: str) -> dict:
        return {
            "bytes_from_storage": storage,
            "bytes_from_peers": peers,
            "bytes_read": 100,
            "bytes_hashed": 10,
            "ns": 2_000_000_000,
            "rss_peak": 1 << 30,
            "anon_peak": 1 << 29,
            "digest": digest,
        }

    shared = figures(
        {
            "wall": 3.0,
            "ranks": [row(60, 40, "a"), row(30, 70, "b"), row(40, 60, "a"), row(70, 30, "b")],
        }
    )
    assert shared["storage_bytes"] == 200 and shared["peer_bytes"] == 200
    assert shared["window_bytes"] == 400 and shared["load_s"] == 2.0
    alone = figures({"wall": 2.0, "ranks": [row(None, None, d) for d in "abab"]})
    assert alone["storage_bytes"] is None  # a load without replicas does not count its reads
    res = {"shared": summarize([shared]), "alone": summarize([alone])}
    res["alone"]["storage_bytes"] = 400  # run_bench: the shared arm's storage plus peers
    text = table(ReplicaBench("ckpt"), res)
    assert "200 shared (1.00 x one replica's reads), 400 alone (2 x; derived" in text


def test_the_kernels_read_bytes_are_what_came_from_storage() -> None:
    from tpload.tools.bench_worker import storage_read_bytes

    proc = Path("/proc/self/io")
    if not proc.exists():
        assert storage_read_bytes() is None or isinstance(storage_read_bytes(), int)
        return
    before = storage_read_bytes()
    fields = dict(line.split(": ") for line in proc.read_text().splitlines())
    after = storage_read_bytes()
    assert isinstance(before, int) and isinstance(after, int)
    # read_bytes, not rchar (what the process read, page cache hits included)
    assert before <= int(fields["read_bytes"]) <= after


def test_bytes_from_storage_are_shown_per_rank_against_the_floors() -> None:
    def ranks(method: str, *per_rank: int | None) -> MethodResult:
        return MethodResult(
            method, [[_rank("a") | {"storage_read_bytes": b} for b in per_rank]] * 3
        )

    mib = 1 << 20
    shown = [
        summarize(ranks("floor", 800 * mib, 900 * mib)),
        summarize(ranks("tpload", 1500 * mib, 200 * mib)),
        summarize(ranks("safetensors", None, None)),  # the kernel did not count
    ]
    assert shown[1]["storage_read_ranks"] == [1500 * mib, 200 * mib]
    assert shown[1]["storage_read_per_rank"] == 850 * mib
    assert shown[1]["storage_read_max_rank"] == 1500 * mib
    assert shown[1]["storage_read_node"] == 1700 * mib
    assert shown[2]["storage_read_per_rank"] is None
    lines = table(shown, {}, BenchOptions("ckpt")).splitlines()
    assert any(
        ln.split()[:2] == ["tpload", "1,500"]
        and "the most a rank 1,500 (1.76x the floor's share, 1.67x its most); "
        "the node 1,700 (1.00x the floor's)"
        in ln
        for ln in lines
    )
    head = next(ln for ln in lines if ln.startswith("method"))
    row = next(ln for ln in lines if ln.startswith("safetensors "))
    assert row[: head.index("disk MiB") + len("disk MiB")].split()[-1] == "-"
    assert not any(ln.split()[:1] == ["safetensors"] and "MiB" in ln for ln in lines[2:])


def test_the_first_call_is_measured_on_the_benchs_layout_or_says_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tpload.tools import bench
    from tpload.tools.first_call import FirstCallFailed

    asked: list[dict] = []
    row = {"to_first_read": 0.2, "first_load": 0.5, "second_load": 0.1, "kernels": "ahead"}

    def fake(ckpt: str, **kw: object) -> list[dict]:
        asked.append({"ckpt": ckpt, **kw})
        return [row | {"rank": r, "repeat": 0} for r in range(4)]

    monkeypatch.setattr(bench, "measure", fake)
    got = measure_first_call(BenchOptions("ckpt", nproc=4, tp=2, cold=True, config="x"))
    assert asked[0]["options"] == {"tp": 2, "ep": 2, "config": "x"} and asked[0]["nproc"] == 4
    assert asked[0]["warm_run"] is True  # a cold bench's cache is warmed by a job first
    assert got["rank_runs"] == 4 and len(got["rows"]) == 4
    assert got["figures"]["to_first_read"]["slowest"] == 0.2

    def fails(ckpt: str, **kw: object) -> list[dict]:
        raise FirstCallFailed("torchrun failed (1)")

    monkeypatch.setattr(bench, "measure", fails)
    assert measure_first_call(BenchOptions("ckpt")) == {"failed": "torchrun failed (1)"}
