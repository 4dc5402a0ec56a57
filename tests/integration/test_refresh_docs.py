"""docs/refresh.md's trainer and engine examples, run as written: the trainer's block in one process
(a torch.distributed world of one rank) and the engine's in another (tp 1), with the refresh key
the doc says how to make. The names the doc leaves to the reader (``train()``, ``model_dir``,
``tp_rank``, ``tp``, ``tp_cpu_group``, ``rounds``, ``commit``) are given by a short prelude; after
two rounds the engine's committed tensors must be the second version's, byte for byte."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from tpload.tools.published import write_published

from ..ckpt_tools import whole
from ..helpers import free_port

DOC = Path(__file__).parents[2] / "docs" / "refresh.md"
REPO = Path(__file__).parents[2]


def _block(after: str) -> str:
    text = DOC.read_text()
    at = text.index(after)
    return re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)  # type: ignore[union-attr]


TRAINER_PRELUDE = """
import torch
from safetensors.torch import load_file
import glob, sys
def train():
    for folder in sys.argv[1:]:
        weights = {}
        for path in sorted(glob.glob(folder + "/*.safetensors")):
            weights.update(load_file(path))
        yield weights
"""

ENGINE_PRELUDE = """
import os, sys, time, torch
model_dir, tp_rank, tp, tp_cpu_group, rounds = sys.argv[1], 0, 1, None, 2
served = {}
def commit(name, window):
    served[name] = window.clone()
while not os.path.exists("rendezvous.json"):
    time.sleep(0.05)
"""

ENGINE_AFTER = """
torch.save({"served": served, "version": r.served_version}, "served.pt")
"""


def test_the_docs_refresh_examples_run_as_written(tmp_path: Path) -> None:
    v1 = write_published(tmp_path / "v1", "llama-tiny", seed=11)
    v2 = write_published(tmp_path / "v2", "llama-tiny", seed=12)
    work = tmp_path / "work"
    work.mkdir()
    key = work / "refresh.key"
    key.write_bytes(os.urandom(32))  # what (umask 077; head -c 32 /dev/urandom > ...) makes
    key.chmod(0o600)
    (work / "trainer.py").write_text(TRAINER_PRELUDE + _block("## The trainer's code"))
    (work / "engine.py").write_text(
        ENGINE_PRELUDE + _block("The engine side, for an integration") + ENGINE_AFTER
    )
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    started = time.monotonic()
    engine = subprocess.Popen(
        [sys.executable, "engine.py", str(v1)], cwd=work, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    trainer = subprocess.run(
        [sys.executable, "trainer.py", str(v1), str(v2)], cwd=work, env=env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    out, _ = engine.communicate(timeout=180)
    assert trainer.returncode == 0, trainer.stdout + trainer.stderr
    assert engine.returncode == 0, out
    assert "refresh refused" not in trainer.stdout + out, trainer.stdout + out
    got = torch.load(work / "served.pt")
    assert got["version"] == 2
    want = whole(v2)
    assert got["served"].keys() == want.keys()
    assert all(torch.equal(got["served"][n], want[n]) for n in want)  # tp 1: whole tensors
    assert time.monotonic() - started < 180
