"""The weight-transfer backend ``tpload`` in a real vLLM (the CPU build) at TP 1 and TP 2, driven by
a 2-rank trainer process group (tests/engines/refresh_driver.py: one engine per TP size for every
case, then one fresh engine on a checkpoint of the last version).

- After an update the greedy tokens equal a fresh vLLM's on a checkpoint of the new weights, and
  vLLM's weight_version names the version.
- A byte flipped in transit, a missing tensor, a trainer rank killed mid-update, and a repeated or
  older version each leave the old tokens and version served, with one line on every trainer rank
  and the same line on every engine worker, and the next update succeeds.
- The update's per-rank digests equal tpload.load's on a checkpoint of the same weights.

Engine tier (``python -m pytest -q -m engine``): two engine starts per TP size, 40-90 s each.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tpload.tools.bench_engine import engine_env
from tpload.tools.published import write_published

from ..ckpt_tools import ec_keypair
from ..helpers import free_port, tpload_cli
from .vllm_env import REPO

pytestmark = pytest.mark.engine
DRIVER = Path(__file__).with_name("refresh_driver.py")
FAILURES = ("flipped byte", "missing tensor", "repeated version", "older version", "trainer killed")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published(tmp_path_factory.mktemp("refresh-model") / "llama", "llama-tiny")


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def run(request: pytest.FixtureRequest, python: Path, llama: Path, tmp_path_factory) -> dict:
    """The driver's account of every round at one TP size (one engine for all of them)."""
    tp = request.param
    work = tmp_path_factory.mktemp(f"refresh-tp{tp}")
    out = work / "result.json"
    cmd = [
        str(python),
        str(DRIVER),
        "--model",
        str(llama),
        "--tp",
        str(tp),
        "--work",
        str(work),
        "--out",
        str(out),
    ]
    code, text = drive(cmd, work / "driver.log")
    assert code == 0 and out.exists(), text[-6000:]
    doc = json.loads(out.read_text())
    doc["log"], doc["work"] = text, work
    return doc


def drive(cmd: list[str], log: Path, timeout: float = 900) -> tuple[int, str]:
    """Run a driver in a session of its own, its output to ``log``; then end every process of
    that session: vLLM's engine processes can outlive the driver, holding its pipes open."""
    env = {**engine_env(), "PYTHONPATH": str(REPO)}
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, log.read_text()


def rounds(run: dict, kind: str) -> list[dict]:
    return [r for r in run["rounds"] if r["kind"] == kind]


def test_an_update_serves_what_a_fresh_engine_on_its_checkpoint_serves(run: dict) -> None:
    good = rounds(run, "good")
    assert [r["version"] for r in good] == [1, 2, 3] and all(r["error"] == "" for r in good)
    assert good[0]["tokens"] != run["v0"] and good[1]["tokens"] != good[0]["tokens"]
    assert good[-1]["tokens"] == run["fresh_v3"], (good[-1]["tokens"], run["fresh_v3"])
    for r in good:
        assert r["weight_version"] == str(r["version"])
        for w in r["workers"]:
            assert w["served_version"] == r["version"] and w["refused"] == "" and not w["failed"]
            assert not w["session_active"] and w["staged_bytes"] == 0
    for n in (0, 1):
        assert run[f"rank1_{n}"] is not None
    assert [r["error"] for r in run["rank1_1"]] == [""]  # the last good round, on trainer rank 1


@pytest.mark.parametrize("kind", FAILURES)
def test_a_failed_round_leaves_the_old_version_and_says_so_on_every_rank(
    run: dict, kind: str
) -> None:
    (bad,) = rounds(run, kind)
    before = run["rounds"][run["rounds"].index(bad) - 1]
    served = 2  # the rounds before the failures: v1, v2
    assert bad["error"], f"{kind}: no error"
    assert "\n" not in bad["error"]
    assert bad["tokens"] == before["tokens"] == rounds(run, "good")[1]["tokens"]
    assert bad["weight_version"] == str(served)
    lines = {w["refused"] for w in bad["workers"]}
    assert len(lines) == 1 and lines != {""}, bad["workers"]  # one line, on every engine worker
    (line,) = lines
    assert line in bad["error"] or bad["error"] in line, (line, bad["error"])
    for w in bad["workers"]:
        assert w["served_version"] == served and not w["session_active"] and not w["failed"]
        assert w["staged_bytes"] == 0
    # trainer rank 1 raised the same line (unless it was the rank killed)
    if kind != "trainer killed":
        (mine,) = [r for r in run["rank1_0"] if r["kind"] == kind]
        assert mine["error"] == bad["error"]
    else:
        assert run["rank1_exit_0"] == -9
    expected = {
        "flipped byte": "model.layers.0.self_attn.o_proj.weight",
        "missing tensor": "model.layers.1.mlp.up_proj.weight",
        "repeated version": "version 2",
        "older version": "version 1",
        "trainer killed": "trainer rank 1",
    }[kind]
    assert expected in bad["error"], bad["error"]


def test_the_update_digests_equal_a_load_of_its_checkpoint(run: dict, tmp_path: Path) -> None:
    (last,) = [r for r in rounds(run, "good") if r["version"] == 3]
    digests = last["digests"]
    tp = run["tp"]
    assert len(digests) == tp and all(len(d) == 64 for d in digests)
    ckpt = Path(run["work"]) / "v3"
    report = tmp_path / "report.json"
    made = subprocess.run(
        [sys.executable, "-m", "tpload", "manifest", str(ckpt)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-2000:]
    r = tpload_cli(
        tp, str(ckpt), "--tp", str(tp), "--kind", "packed", "--report", str(report), timeout=300
    )
    assert r.rc == 0, r.err[-3000:]
    loaded = [rank["digest"] for rank in json.loads(report.read_text())["ranks"]]
    assert digests == loaded


def test_the_http_server_takes_a_signed_refresh_and_refuses_what_it_must(
    python: Path, llama: Path, tmp_path: Path
) -> None:
    """The OpenAI server at TP 2 (``python -m vllm.entrypoints.openai.api_server``, dev mode),
    requiring the sha256 strength and a signature by the trainer's key, driven by vLLM's
    HTTPVLLMWeightSyncClient: a signed round; a flipped byte (HTTP 500, the engine's one line on
    the trainer, v1 still served); a trainer with no key (refused: the manifest is not signed);
    a signed round; with the refresh key on both sides, an init from a process without it (refused,
    the live group kept), an oversized frame from a member (refused, the engine alive), a good
    round. /weight_info follows, and generation is resumed after each."""
    key, pub = ec_keypair(tmp_path, "trainer")
    refresh_key = tmp_path / "refresh.key"
    refresh_key.write_bytes(os.urandom(32))
    refresh_key.chmod(0o600)
    out = tmp_path / "http.json"
    cmd = [
        str(python),
        str(DRIVER.with_name("refresh_http_driver.py")),
        "--model",
        str(llama),
        "--tp",
        "2",
        "--port",
        str(free_port()),
        "--work",
        str(tmp_path),
        "--out",
        str(out),
        "--signer-key",
        str(key),
        "--public-key",
        str(pub),
        "--refresh-key",
        str(refresh_key),
    ]
    code, text = drive(cmd, tmp_path / "driver.log")
    server = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() else ""
    assert code == 0 and out.exists(), text[-4000:]
    doc = json.loads(out.read_text())
    assert "error" not in doc, doc.get("error", "") + server[-4000:]
    v1, bad, weak, v2, unproven, oversized, v3 = doc["rounds"]
    assert v1["error"] == "" and v1["tokens"] != doc["v0"]["tokens"]
    assert v1["weight_info"] == {"weight_version": "1"}
    assert "model.layers.0.self_attn.o_proj.weight" in bad["error"] and "\n" not in bad["error"]
    assert "not signed" in weak["error"] and "\n" not in weak["error"], weak["error"]
    for r in (bad, weak):
        assert r["tokens"] == v1["tokens"] and r["weight_info"] == {"weight_version": "1"}
    assert v2["error"] == "" and v2["tokens"] != v1["tokens"]
    assert v2["weight_info"] == {"weight_version": "2"}
    assert "not proven by a refresh key" in unproven["error"], unproven["error"]
    assert "announced" in oversized["error"] or "protocol" in oversized["error"], oversized
    for r in (unproven, oversized):
        assert r["tokens"] == v2["tokens"] and r["weight_info"] == {"weight_version": "2"}
    assert v3["error"] == "" and v3["tokens"] != v2["tokens"]
    assert v3["weight_info"] == {"weight_version": "3"}
    assert refresh_key.read_bytes().hex() not in server
    assert all(r["is_paused"] == {"is_paused": False} for r in doc["rounds"])


def test_the_plugin_registers_the_backend_on_both_sides_once_and_lazily(python: Path) -> None:
    """vLLM's plugins, tpload's register() again and the trainer module's import: no "already
    registered" error, ``tpload`` known to both factories, and the worker engine's module not
    imported until vLLM creates one."""
    probe = (
        "import sys; from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "import tpload.integrations.vllm as v; v.register(); v.register(); "
        "from vllm.distributed.weight_transfer import WeightTransferEngineFactory as W, "
        "WeightTransferTrainerFactory as T; "
        "lazy = sorted(m for m in sys.modules if m.startswith('tpload')); "
        "import tpload.integrations.vllm_trainer as t; t.register_trainer(); "
        "print(lazy, 'tpload' in W._registry, T._registry['tpload']().__name__, "
        "W._registry['tpload']().__name__)"
    )
    env = {**engine_env(), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "['tpload', 'tpload.integrations', 'tpload.integrations.vllm'] True TploadTrainerEngine "
        "TploadWeightTransferEngine"
    ), last
