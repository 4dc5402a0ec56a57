"""The KV-cache scale census against vLLM's own ``maybe_remap_kv_scale_name``, in-process in vLLM's
venv (its CPU build cannot start an FP8-KV model here): every scale the hand-off passes lands on the
attention layer's parameter vLLM names it by; the stored output_scale spelling would not.

Engine tier (``python -m pytest -q -m engine``): one subprocess, seconds once the venv exists.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.engines.vllm_env import VLLM_VENV
from tpload.tools.published import write_published

from ..ckpt_tools import renamed

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import json, sys
import tpload
from tpload.integrations.handoff import Handoff
from tpload.selection.kvscales import census
from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name

shards = tpload.load(sys.argv[1], progress=False, device="cpu")
state = shards.state_dict()
c = census(state)
# the parameters of vLLM's Llama attention layers: each layer's attn.k_scale and attn.v_scale
params = {s.canonical(w): None for s in c.layers.values() for w in "kv"}
handoff = Handoff(state, shards.plan.items, rank=0, rename=c.engine_names())
landed = {}
for name, t in handoff.tensors():
    if name in params or any(name in v for v in c.engine_names().values()):
        landed[name] = maybe_remap_kv_scale_name(name, params)
    t.float().sum()  # read, as a loader would
stored = {n: maybe_remap_kv_scale_name(n, params) for n in c.engine_names()}
unread = [h.name for h in handoff.unconsumed()[0]]
print(json.dumps({"landed": landed, "stored": stored, "unread": unread, "params": sorted(params)}))
"""


def test_the_handoff_passes_every_spelling_under_vllms_names(tmp_path: Path) -> None:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VLLM_VENV} (tests/engines/vllm_env.py makes it)")
    plain = write_published(tmp_path / "plain", "llama-tiny")
    L = "model.layers.{}.self_attn."
    spelled = [
        L.format(0) + "k_proj.output_scale",
        L.format(0) + "v_proj.output_scale",
        L.format(1) + "k_proj.k_scale",
        L.format(1) + "v_proj.v_scale",
    ]
    root = renamed(
        plain, tmp_path / "kv", lambda n: n, extra={n: torch.tensor(0.5) for n in spelled}
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
    }  # this checkout's tpload, whatever the venv installed
    proc = subprocess.run(
        [str(python), "-c", SCRIPT, str(root)], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(doc["landed"]) == doc["params"] and len(doc["params"]) == 4
    assert all(
        doc["landed"][n] == n for n in doc["params"]
    )  # vLLM takes each handed name as its parameter's
    # the stored compressed-tensors spelling is not one vLLM remaps: it would be dropped without the
    # hand-off
    assert doc["stored"][L.format(0) + "k_proj.output_scale"] not in doc["params"]
    assert doc["stored"][L.format(1) + "k_proj.k_scale"] == L.format(1) + "attn.k_scale"
    assert doc["unread"] == []
