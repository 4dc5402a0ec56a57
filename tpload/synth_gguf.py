"""GGUF miniatures (``synth --preset deepseek-v3-gguf-tiny``), written with the ``gguf`` package's writer.

DeepSeek-V3 as llama.cpp names it (architecture ``deepseek2``), shrunk: Q4_K routed, shared and dense
experts (Q6_K down projections where Q4_K_M puts them on the dense and shared ones), a Q6_K output
head, Q8_0 attention and embeddings, F32 norms and router; a split set of 2 files. Block bytes are
random, with every f16 super-scale overwritten by a small finite value, so every block is valid.
Dimensions let tp 2 cut every innermost dimension on whole blocks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .codecs.gguf import BLOCKS, SCALE_OFFSETS
from .errors import CheckpointError, OptionsError
from .text import escape_name

HIDDEN, INTER, MOE_INTER, EXPERTS, HEADS, VOCAB = 256, 512, 512, 4, 4, 512
NOPE, ROPE, V, Q_LORA, KV_LORA = 32, 16, 32, 64, 64


def _deepseek_v3() -> tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]:
    """(architecture, key-values, [(name, ggml type, torch-order shape)])."""
    t: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "Q8_0", (VOCAB, HIDDEN))]
    for i in range(2):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", "F32", (HIDDEN,)), (b + "attn_q_a.weight", "Q8_0", (Q_LORA, HIDDEN)),
              (b + "attn_q_a_norm.weight", "F32", (Q_LORA,)),
              (b + "attn_q_b.weight", "Q8_0", (HEADS * (NOPE + ROPE), Q_LORA)),
              (b + "attn_kv_a_mqa.weight", "Q8_0", (KV_LORA + ROPE, HIDDEN)),
              (b + "attn_kv_a_norm.weight", "F32", (KV_LORA,)),
              (b + "attn_kv_b.weight", "Q8_0", (HEADS * (NOPE + V), KV_LORA)),
              (b + "attn_output.weight", "Q8_0", (HIDDEN, HEADS * V)), (b + "ffn_norm.weight", "F32", (HIDDEN,))]
        if i == 0:  # the leading dense layer
            t += [(b + "ffn_gate.weight", "Q4_K", (INTER, HIDDEN)), (b + "ffn_up.weight", "Q4_K", (INTER, HIDDEN)),
                  (b + "ffn_down.weight", "Q6_K", (HIDDEN, INTER))]
        else:
            t += [(b + "ffn_gate_inp.weight", "F32", (EXPERTS, HIDDEN)), (b + "exp_probs_b.bias", "F32", (EXPERTS,)),
                  (b + "ffn_gate_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
                  (b + "ffn_up_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
                  (b + "ffn_down_exps.weight", "Q4_K", (EXPERTS, HIDDEN, MOE_INTER)),
                  (b + "ffn_gate_shexp.weight", "Q4_K", (MOE_INTER, HIDDEN)),
                  (b + "ffn_up_shexp.weight", "Q4_K", (MOE_INTER, HIDDEN)),
                  (b + "ffn_down_shexp.weight", "Q6_K", (HIDDEN, MOE_INTER))]
    t += [("output_norm.weight", "F32", (HIDDEN,)), ("output.weight", "Q6_K", (VOCAB, HIDDEN))]
    a = "deepseek2"
    kv = {f"{a}.block_count": 2, f"{a}.expert_count": EXPERTS, f"{a}.expert_used_count": 2,
          f"{a}.attention.head_count": HEADS, f"{a}.attention.head_count_kv": HEADS,
          f"{a}.embedding_length": HIDDEN, f"{a}.feed_forward_length": INTER,
          f"{a}.expert_feed_forward_length": MOE_INTER, f"{a}.leading_dense_block_count": 1,
          f"{a}.attention.q_lora_rank": Q_LORA, f"{a}.attention.kv_lora_rank": KV_LORA,
          f"{a}.attention.key_length": NOPE + ROPE, f"{a}.attention.value_length": V,
          f"{a}.rope.dimension_count": ROPE, f"{a}.context_length": 4096}
    return a, kv, t


def _qwen3_moe() -> tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]:
    """Qwen3-MoE as llama.cpp names it (``qwen3moe``): GQA attention with q/k norms, every layer MoE."""
    kv_heads, head_dim = 2, 64
    t: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "Q4_K", (VOCAB, HIDDEN))]
    for i in range(2):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", "F32", (HIDDEN,)), (b + "attn_q.weight", "Q8_0", (HEADS * head_dim, HIDDEN)),
              (b + "attn_k.weight", "Q8_0", (kv_heads * head_dim, HIDDEN)),
              (b + "attn_v.weight", "Q6_K", (kv_heads * head_dim, HIDDEN)),
              (b + "attn_q_norm.weight", "F32", (head_dim,)), (b + "attn_k_norm.weight", "F32", (head_dim,)),
              (b + "attn_output.weight", "Q8_0", (HIDDEN, HEADS * head_dim)), (b + "ffn_norm.weight", "F32", (HIDDEN,)),
              (b + "ffn_gate_inp.weight", "F32", (EXPERTS, HIDDEN)),
              (b + "ffn_gate_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
              (b + "ffn_up_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
              (b + "ffn_down_exps.weight", "Q6_K", (EXPERTS, HIDDEN, MOE_INTER))]
    t += [("output_norm.weight", "F32", (HIDDEN,)), ("output.weight", "Q6_K", (VOCAB, HIDDEN))]
    a = "qwen3moe"
    kv = {f"{a}.block_count": 2, f"{a}.expert_count": EXPERTS, f"{a}.expert_used_count": 2,
          f"{a}.attention.head_count": HEADS, f"{a}.attention.head_count_kv": kv_heads,
          f"{a}.attention.key_length": head_dim, f"{a}.attention.value_length": head_dim,
          f"{a}.embedding_length": HIDDEN, f"{a}.expert_feed_forward_length": MOE_INTER, f"{a}.context_length": 4096}
    return a, kv, t


GGUF_PRESETS: dict[str, Callable[[], tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]]] = {
    "deepseek-v3-gguf-tiny": _deepseek_v3,
    "qwen3-moe-gguf-tiny": _qwen3_moe,
}


def _data(rng: np.random.Generator, ggml: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random but valid stored data: F32 values, or blocks whose f16 super-scales are small and finite."""
    if ggml == "F32":
        return rng.standard_normal(shape, dtype=np.float32)
    per, size = BLOCKS[ggml]
    blocks = rng.integers(0, 256, (math.prod(shape) // per, size), dtype=np.uint8)
    for off in SCALE_OFFSETS[ggml]:
        d = rng.uniform(1e-4, 1e-2, blocks.shape[0]).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[:-1] + (shape[-1] // per * size,))


def write_gguf_preset(out_dir: str | os.PathLike, name: str, *, seed: int = 0, parts: int = 2) -> Path:
    """Write preset ``name`` into ``out_dir`` (new or empty) as a split set of ``parts`` GGUF files."""
    try:
        import gguf
    except ImportError:
        raise OptionsError(f"preset {name} is written with the gguf package, which is not installed "
                           "(pip install 'tpload[gguf]')") from None
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(f"{escape_name(root)}: not an empty folder; synth writes only into a new or empty one")
    root.mkdir(parents=True, exist_ok=True)
    arch, kv, tensors = GGUF_PRESETS[name]()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(root / "model.gguf", arch, split_max_tensors=-(-len(tensors) // parts))
    writer.add_name(name)
    for key, value in kv.items():
        writer.add_uint32(key, value)
    for tname, ggml, shape in tensors:
        data = _data(rng, ggml, shape)
        writer.add_tensor(tname, data, raw_dtype=None if ggml == "F32" else gguf.GGMLQuantizationType[ggml])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return root
