"""GGUF miniatures (``synth --preset deepseek-v3-gguf-tiny``), written with the ``gguf`` package's
writer.

DeepSeek-V3 as llama.cpp names it (architecture ``deepseek2``), shrunk: Q4_K routed, shared and
dense experts (Q6_K down projections where Q4_K_M puts them on the dense and shared ones), a Q6_K
output head, Q8_0 attention and embeddings, F32 norms and router; a split set of 2 files. Block
bytes are random, with every f16 super-scale overwritten by a small finite value, so every block is
valid. Dimensions let tp 2 cut every innermost dimension on whole blocks.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..model.errors import CheckpointError, OptionsError
from ..model.text import escape_name
from ..toolkit import GGUF_BLOCKS, GGUF_HEADERS_ONLY_KEY, GGUF_SCALE_OFFSETS

HIDDEN, INTER, MOE_INTER, EXPERTS, HEADS, VOCAB = 256, 512, 512, 4, 4, 512
NOPE, ROPE, V, Q_LORA, KV_LORA = 32, 16, 32, 64, 64


def _deepseek_v3() -> tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]:
    """(architecture, key-values, [(name, ggml type, torch-order shape)])."""
    t: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "Q8_0", (VOCAB, HIDDEN))]
    for i in range(2):
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", "F32", (HIDDEN,)),
            (b + "attn_q_a.weight", "Q8_0", (Q_LORA, HIDDEN)),
            (b + "attn_q_a_norm.weight", "F32", (Q_LORA,)),
            (b + "attn_q_b.weight", "Q8_0", (HEADS * (NOPE + ROPE), Q_LORA)),
            (b + "attn_kv_a_mqa.weight", "Q8_0", (KV_LORA + ROPE, HIDDEN)),
            (b + "attn_kv_a_norm.weight", "F32", (KV_LORA,)),
            (b + "attn_kv_b.weight", "Q8_0", (HEADS * (NOPE + V), KV_LORA)),
            (b + "attn_output.weight", "Q8_0", (HIDDEN, HEADS * V)),
            (b + "ffn_norm.weight", "F32", (HIDDEN,)),
        ]
        if i == 0:  # the leading dense layer
            t += [
                (b + "ffn_gate.weight", "Q4_K", (INTER, HIDDEN)),
                (b + "ffn_up.weight", "Q4_K", (INTER, HIDDEN)),
                (b + "ffn_down.weight", "Q6_K", (HIDDEN, INTER)),
            ]
        else:
            t += [
                (b + "ffn_gate_inp.weight", "F32", (EXPERTS, HIDDEN)),
                (b + "exp_probs_b.bias", "F32", (EXPERTS,)),
                (b + "ffn_gate_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
                (b + "ffn_up_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
                (b + "ffn_down_exps.weight", "Q4_K", (EXPERTS, HIDDEN, MOE_INTER)),
                (b + "ffn_gate_shexp.weight", "Q4_K", (MOE_INTER, HIDDEN)),
                (b + "ffn_up_shexp.weight", "Q4_K", (MOE_INTER, HIDDEN)),
                (b + "ffn_down_shexp.weight", "Q6_K", (HIDDEN, MOE_INTER)),
            ]
    t += [("output_norm.weight", "F32", (HIDDEN,)), ("output.weight", "Q6_K", (VOCAB, HIDDEN))]
    a = "deepseek2"
    kv = {
        f"{a}.block_count": 2,
        f"{a}.expert_count": EXPERTS,
        f"{a}.expert_used_count": 2,
        f"{a}.attention.head_count": HEADS,
        f"{a}.attention.head_count_kv": HEADS,
        f"{a}.embedding_length": HIDDEN,
        f"{a}.feed_forward_length": INTER,
        f"{a}.expert_feed_forward_length": MOE_INTER,
        f"{a}.leading_dense_block_count": 1,
        f"{a}.attention.q_lora_rank": Q_LORA,
        f"{a}.attention.kv_lora_rank": KV_LORA,
        f"{a}.attention.key_length": NOPE + ROPE,
        f"{a}.attention.value_length": V,
        f"{a}.rope.dimension_count": ROPE,
        f"{a}.context_length": 4096,
    }
    return a, kv, t


def _qwen3_moe() -> tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]:
    """Qwen3-MoE as llama.cpp names it (``qwen3moe``): GQA attention with q/k norms, every layer
    MoE."""
    kv_heads, head_dim = 2, 64
    t: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "Q4_K", (VOCAB, HIDDEN))]
    for i in range(2):
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", "F32", (HIDDEN,)),
            (b + "attn_q.weight", "Q8_0", (HEADS * head_dim, HIDDEN)),
            (b + "attn_k.weight", "Q8_0", (kv_heads * head_dim, HIDDEN)),
            (b + "attn_v.weight", "Q6_K", (kv_heads * head_dim, HIDDEN)),
            (b + "attn_q_norm.weight", "F32", (head_dim,)),
            (b + "attn_k_norm.weight", "F32", (head_dim,)),
            (b + "attn_output.weight", "Q8_0", (HIDDEN, HEADS * head_dim)),
            (b + "ffn_norm.weight", "F32", (HIDDEN,)),
            (b + "ffn_gate_inp.weight", "F32", (EXPERTS, HIDDEN)),
            (b + "ffn_gate_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
            (b + "ffn_up_exps.weight", "Q4_K", (EXPERTS, MOE_INTER, HIDDEN)),
            (b + "ffn_down_exps.weight", "Q6_K", (EXPERTS, HIDDEN, MOE_INTER)),
        ]
    t += [("output_norm.weight", "F32", (HIDDEN,)), ("output.weight", "Q6_K", (VOCAB, HIDDEN))]
    a = "qwen3moe"
    kv = {
        f"{a}.block_count": 2,
        f"{a}.expert_count": EXPERTS,
        f"{a}.expert_used_count": 2,
        f"{a}.attention.head_count": HEADS,
        f"{a}.attention.head_count_kv": kv_heads,
        f"{a}.attention.key_length": head_dim,
        f"{a}.attention.value_length": head_dim,
        f"{a}.embedding_length": HIDDEN,
        f"{a}.expert_feed_forward_length": MOE_INTER,
        f"{a}.context_length": 4096,
    }
    return a, kv, t


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's llama-quant.cpp: which layers Q4_K_M gives Q6_K ``ffn_down`` tensors."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _deepseek_r1_full() -> tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]:
    """DeepSeek-R1 (V3's shapes) Q4_K_M as llama.cpp's quantizer types it (docs/formats/gguf.md)."""
    h, vocab, layers, dense, inter, moe, experts, heads = 7168, 129280, 61, 3, 18432, 2048, 256, 128
    q_lora, kv_lora, nope, rope, v = 1536, 512, 128, 64, 128
    t: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "Q4_K", (vocab, h))]
    for i in range(layers):
        b, down = f"blk.{i}.", "Q6_K" if _use_more_bits(i, layers) else "Q4_K"
        t += [
            (b + "attn_norm.weight", "F32", (h,)),
            (b + "attn_q_a_norm.weight", "F32", (q_lora,)),
            (b + "attn_kv_a_norm.weight", "F32", (kv_lora,)),
            (b + "attn_q_a.weight", "Q4_K", (q_lora, h)),
            (b + "attn_q_b.weight", "Q4_K", (heads * (nope + rope), q_lora)),
            (b + "attn_kv_a_mqa.weight", "Q4_K", (kv_lora + rope, h)),
            (b + "attn_kv_b.weight", "Q4_K", (heads * (nope + v), kv_lora)),
            (b + "attn_output.weight", "Q4_K", (h, heads * v)),
            (b + "ffn_norm.weight", "F32", (h,)),
        ]
        if i < dense:
            t += [
                (b + "ffn_gate.weight", "Q4_K", (inter, h)),
                (b + "ffn_up.weight", "Q4_K", (inter, h)),
                (b + "ffn_down.weight", down, (h, inter)),
            ]
        else:
            t += [
                (b + "ffn_gate_inp.weight", "F32", (experts, h)),
                (b + "exp_probs_b.bias", "F32", (experts,)),
                (b + "ffn_gate_exps.weight", "Q4_K", (experts, moe, h)),
                (b + "ffn_up_exps.weight", "Q4_K", (experts, moe, h)),
                (b + "ffn_down_exps.weight", down, (experts, h, moe)),
                (b + "ffn_gate_shexp.weight", "Q4_K", (moe, h)),
                (b + "ffn_up_shexp.weight", "Q4_K", (moe, h)),
                (b + "ffn_down_shexp.weight", down, (h, moe)),
            ]
    t += [("output_norm.weight", "F32", (h,)), ("output.weight", "Q6_K", (vocab, h))]
    a = "deepseek2"
    kv = {
        f"{a}.block_count": layers,
        f"{a}.expert_count": experts,
        f"{a}.expert_used_count": 8,
        f"{a}.attention.head_count": heads,
        f"{a}.attention.head_count_kv": heads,
        f"{a}.embedding_length": h,
        f"{a}.feed_forward_length": inter,
        f"{a}.expert_feed_forward_length": moe,
        f"{a}.leading_dense_block_count": dense,
        f"{a}.attention.q_lora_rank": q_lora,
        f"{a}.attention.kv_lora_rank": kv_lora,
        f"{a}.attention.key_length": nope + rope,
        f"{a}.attention.value_length": v,
        f"{a}.rope.dimension_count": rope,
        f"{a}.context_length": 163840,
    }
    return a, kv, t


HEADERS_ONLY = {"deepseek-r1-gguf-full": (_deepseek_r1_full, 9)}
"""Full-size presets written as headers only (sparse files, for ``plan``): (tensors, parts)."""


def _nbytes(ggml: str, shape: tuple[int, ...]) -> int:
    per, size = GGUF_BLOCKS.get(ggml, (1, 4))  # F32 is the only other type written here
    return math.prod(shape) // per * size


def write_headers_only(out_dir: str | os.PathLike, name: str) -> Path:
    """A full-size GGUF split set whose data are holes: real headers (our own writer, GGUF v3,
    alignment 32, llama.cpp's split keys), each file extended to its size without writing
    (sparse)."""
    from ..toolkit import GGUF_TYPES

    type_id = {v[0]: k for k, v in GGUF_TYPES.items()}
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(
            f"{escape_name(root)}: not an empty folder; synth writes only into a new or empty one"
        )
    root.mkdir(parents=True, exist_ok=True)
    make, parts = HEADERS_ONLY[name]
    arch, kv, tensors = make()
    total = sum(_nbytes(g, s) for _, g, s in tensors)
    groups: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    done = 0
    for t in tensors:  # consecutive tensors, a new part every total/parts bytes
        if done >= len(groups) * total / parts and len(groups) < parts:
            groups.append([])
        groups[-1].append(t)
        done += _nbytes(t[1], t[2])
    for k, group in enumerate(groups):
        keys: list[tuple[str, int, bytes]] = [
            ("general.architecture", 8, _string(arch)),
            ("general.name", 8, _string(name)),
            (GGUF_HEADERS_ONLY_KEY, 7, b"\1"),
            ("split.no", 2, struct.pack("<H", k)),
            ("split.count", 2, struct.pack("<H", len(groups))),
            ("split.tensors.count", 5, struct.pack("<i", len(tensors))),
        ]
        keys += [(key, 4, struct.pack("<I", value)) for key, value in kv.items()] if k == 0 else []
        head = b"GGUF" + struct.pack("<IQQ", 3, len(group), len(keys))
        head += b"".join(_string(key) + struct.pack("<I", vt) + raw for key, vt, raw in keys)
        offset = 0
        for tname, ggml, shape in group:
            head += _string(tname) + struct.pack(f"<I{len(shape)}Q", len(shape), *reversed(shape))
            head += struct.pack("<IQ", type_id[ggml], offset)
            offset += -(-_nbytes(ggml, shape) // 32) * 32
        head += b"\0" * (-len(head) % 32)
        with open(root / f"{name}-{k + 1:05d}-of-{len(groups):05d}.gguf", "wb") as f:
            f.write(head)
            f.truncate(len(head) + offset)
    return root


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


GGUF_PRESETS: dict[
    str, Callable[[], tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]]
] = {
    "deepseek-v3-gguf-tiny": _deepseek_v3,
    "qwen3-moe-gguf-tiny": _qwen3_moe,
}


def _data(rng: np.random.Generator, ggml: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random but valid stored data: F32 values, or blocks whose f16 super-scales are small and
    finite."""
    if ggml == "F32":
        return rng.standard_normal(shape, dtype=np.float32)
    per, size = GGUF_BLOCKS[ggml]
    blocks = rng.integers(0, 256, (math.prod(shape) // per, size), dtype=np.uint8)
    for off in GGUF_SCALE_OFFSETS[ggml]:
        d = rng.uniform(1e-4, 1e-2, blocks.shape[0]).astype(np.float16)
        blocks[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[:-1] + (shape[-1] // per * size,))


def write_gguf_preset(
    out_dir: str | os.PathLike, name: str, *, seed: int = 0, parts: int = 2
) -> Path:
    """Write preset ``name`` into ``out_dir`` (new or empty) as a split set of ``parts`` GGUF
    files."""
    try:
        import gguf
    except ImportError:
        raise OptionsError(
            f"preset {name} is written with the gguf package, which is not installed "
            "(pip install gguf, or in tpload's clone pip install -e '.[gguf]')"
        ) from None
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(
            f"{escape_name(root)}: not an empty folder; synth writes only into a new or empty one"
        )
    root.mkdir(parents=True, exist_ok=True)
    arch, kv, tensors = GGUF_PRESETS[name]()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(root / "model.gguf", arch, split_max_tensors=-(-len(tensors) // parts))
    writer.add_name(name)
    for key, value in kv.items():
        writer.add_uint32(key, value)
    for tname, ggml, shape in tensors:
        data = _data(rng, ggml, shape)
        writer.add_tensor(
            tname, data, raw_dtype=None if ggml == "F32" else gguf.GGMLQuantizationType[ggml]
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return root
