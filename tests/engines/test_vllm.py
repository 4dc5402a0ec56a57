"""``--load-format tpload`` in a real vLLM (the CPU build), against vLLM's own default loader.

For a random tiny Llama and a tiny BF16 DeepSeek-V3 (MLA, MoE, and an MTP layer the engine never
loads), at TP 1 and 2: the same greedy tokens from fixed prompt ids, every worker's parameters
byte-identical after loading (sha256 of each, through the engine's worker RPC), each worker
reading its share of the split tensors and the whole of the replicated ones (counted here from
the tensor names, independently of tpload's rules), and a worker's RSS rising by at most its
windows + 256 MiB. A flipped byte fails the start on both workers with the tensor named.

Engine tier (``python -m pytest -q -m engine``): 9 engine starts, each 40-90 s on 2 cores.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tpload.storage.catalogue import read_native
from tpload.tools.bench_engine import disagreement, engine_env
from tpload.tools.published import write_published

from ..helpers import poke

pytestmark = pytest.mark.engine
MIB = 1 << 20
MODELS = {"llama": "llama-tiny", "deepseek-v3": "deepseek-v3-bf16-tiny"}
# Tensors every worker holds whole (norms, DeepSeek's low-rank down-projections, the router); the
# rest is split over the TP workers. Written from vLLM's layers, not from tpload's configs.
REPLICATED = re.compile(
    r"(norm\.weight|q_a_proj\.weight|kv_a_proj_with_mqa\.weight|mlp\.gate\.weight|"
    r"e_score_correction_bias)$"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("engine-models")
    return {name: write_published(base / name, preset) for name, preset in MODELS.items()}


def served_bytes(root: Path, tp: int) -> int:
    """What one worker should read: the replicated tensors whole, 1/tp of the others; none of the
    MTP layers (``model.layers.{num_hidden_layers}`` on), which vLLM's main model never loads."""
    layers = json.loads((root / "config.json").read_text())["num_hidden_layers"]
    total = 0
    for name, info in read_native(root)[0].tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= layers:
            continue
        total += info.nbytes if REPLICATED.search(name) else info.nbytes // tp
    return total


def bench(python: Path, model: Path, tp: int, out: Path) -> dict:
    """``tpload bench --engine vllm``: both formats in one engine process, compared before
    figures."""
    cmd = [
        str(python),
        "-m",
        "tpload",
        "bench",
        "--engine",
        "vllm",
        str(model),
        "--tp",
        str(tp),
        "--vllm-python",
        str(python),
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "vllm-default" in proc.stdout and "vllm-tpload" in proc.stdout
    return json.loads(out.read_text())


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_tpload_serves_what_the_default_loader_serves(
    python: Path, models: dict[str, Path], name: str, tp: int, tmp_path: Path
) -> None:
    doc = bench(python, models[name], tp, tmp_path / "bench.json")
    default, ours = doc["runs"]["vllm-default"][0], doc["runs"]["vllm-tpload"][0]
    assert ours["tokens"] == default["tokens"] and len(ours["tokens"][0]) == 8
    assert disagreement([default, ours]) == ""
    assert len(ours["parameters"]) == tp and all(len(w) > 10 for w in ours["parameters"])
    for w in range(tp):
        assert ours["parameters"][w] == default["parameters"][w], f"worker {w}"
    report = ours["report"]
    want = served_bytes(models[name], tp)
    assert [r["bytes_read"] for r in report["ranks"]] == [want] * tp
    assert report["verify"] == "node" and len({r["digest"] for r in report["ranks"]}) == tp
    for r in report["engine"]["ranks"]:
        assert r["problem"] == "" and r["handed"] == report["ranks"][r["rank"]]["tensors"]
        assert r["rss_rise"] <= r["windows_bytes"] + 256 * MIB, r
    rows = {row["method"]: row for row in doc["rows"]}
    assert rows["vllm-tpload"]["bytes_read_per_worker"] == [want] * tp


def test_the_plugin_registers_the_format_and_imports_nothing_heavy(python: Path) -> None:
    probe = (
        "import sys; from vllm.plugins import load_general_plugins; load_general_plugins(); from "
        "vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER as f; "
        "print(f['tpload'].__name__, 'numba' in sys.modules, sorted(m for m in sys.modules if "
        "m.startswith('tpload')))"
    )
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert (
        last
        == "TploadModelLoader False ['tpload', 'tpload.integrations', 'tpload.integrations.vllm']"
    ), last


def test_a_flipped_byte_fails_the_start_on_both_workers(
    python: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "llama"
    shutil.copytree(models["llama"], bad)
    tensor = "model.layers.1.mlp.down_proj.weight"  # split by columns: each worker reads half of it
    poke(bad, tensor, 1000)
    cmd = [
        str(python),
        "-m",
        "tpload.integrations.vllm_run",
        str(bad),
        "--tp",
        "2",
        "--formats",
        "tpload",
        "--out",
        str(tmp_path / "out.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=engine_env())
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not (tmp_path / "out.json").exists()
    said = [
        line
        for line in text.splitlines()
        if tensor in line and "does not match the manifest" in line
    ]
    workers = {m.group(1) for line in said for m in [re.match(r"\((Worker_TP\d)", line)] if m}
    assert workers == {"Worker_TP0", "Worker_TP1"}, text[-4000:]
    assert "no rank returned weights" in text
