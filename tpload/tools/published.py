"""Synthetic checkpoints in the layouts the model hub publishes (docs/formats/): every name, dtype,
scale layout and config.json field of a family, at any size.

Three sizes per family (``synth --preset NAME-SIZE``):

* ``tiny``: small dimensions that every tp of 1, 2 and 4 cuts, the real tensor classes;
* ``full``: the published dimensions, written ``--headers-only`` as sparse files (real headers and
  index, holes for data: no disk used); ``plan`` reads them, load/verify/manifest refuse them;
* ``deep`` (DeepSeek-V3 only): every tensor of the real checkpoint (all layers, all 256 experts)
  with dimensions shrunk to the smallest that the 128-block rules allow at tp 2.

Values are random but legal for their format, a pure function of (seed, name), as in synth.py.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..model.errors import CheckpointError
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME
from ..toolkit import HEADERS_ONLY_KEY, pins_doc, write_safetensors

if TYPE_CHECKING:  # annotations only: report/ imports torch, which synth does not need
    from ..model.progress import Meter
from .synth import (
    Planned,
    bf16_bytes,
    cache_folder,
    cache_root,
    cached,
    chunks,
    e4m3_bytes,
    e8m0_bytes,
    f32_bytes,
    fp4_bytes,
    split_shards,
)

B = 128  # the FP8 block of every published FP8 family


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pos_f32(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Positive F32 scales (2^-10 .. 2^-5): legal block scales that never overflow a decode."""
    return rng.uniform(2.0**-10, 2.0**-5, rows * cols).astype(np.float32).view(np.uint8)


def _pos_bf16(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    n = rows * cols
    return (
        (rng.integers(117, 123, n, dtype=np.uint16) << 7) | rng.integers(0, 128, n, dtype=np.uint16)
    ).view(np.uint8)


def _e4m3_scale(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Positive, finite E4M3 block scales (no NaN code, no sign)."""
    return rng.integers(0x20, 0x70, rows * cols, dtype=np.uint8)


def _global_scale(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return rng.uniform(1e-4, 1e-2, rows * cols).astype(np.float32).view(np.uint8)


def _i64(high: int) -> Callable[[np.random.Generator, int, int], np.ndarray]:
    return lambda rng, rows, cols: rng.integers(0, high, rows * cols, dtype=np.int64).view(np.uint8)


class _Tensors:
    """A family's tensor list under construction, with one helper per stored format."""

    def __init__(self, scale_dtype: str = "F32") -> None:
        self.out: list[Planned] = []
        self.scale_dtype = scale_dtype

    def add(self, name: str, dtype: str, shape: tuple[int, ...], fill=None) -> None:
        fill = (
            fill or {"BF16": bf16_bytes, "F32": f32_bytes, "U8": fp4_bytes, "I8": fp4_bytes}[dtype]
        )
        self.out.append(Planned(name, dtype, tuple(shape), fill))

    def bf16(self, name: str, *shape: int) -> None:
        self.add(name, "BF16", shape)

    def fp8(
        self,
        stem: str,
        n: int,
        k: int,
        *,
        scale: str = ".weight_scale_inv",
        dtype: str | None = None,
    ) -> None:
        """An F8_E4M3 ``[n, k]`` weight and its 128x128 block scale (F32, BF16, or E8M0 bytes)."""
        dtype = dtype or self.scale_dtype
        self.add(f"{stem}.weight", "F8_E4M3", (n, k), e4m3_bytes)
        fill = {"F32": _pos_f32, "BF16": _pos_bf16, "F8_E8M0": e8m0_bytes}[dtype]
        self.add(f"{stem}{scale}", dtype, (_cdiv(n, B), _cdiv(k, B)), fill)

    def mxfp4(self, stem: str, n: int, k: int) -> None:
        """DeepSeek-V4's FP4 experts: I8 ``[n, k/2]`` and E8M0 ``[n, k/32]``."""
        self.add(f"{stem}.weight", "I8", (n, k // 2), fp4_bytes)
        self.add(f"{stem}.scale", "F8_E8M0", (n, k // 32), e8m0_bytes)

    def nvfp4(self, stem: str, n: int, k: int) -> None:
        """ModelOpt NVFP4: U8 ``[n, k/2]``, E4M3 ``[n, k/16]``, two F32 scalars."""
        self.add(f"{stem}.weight", "U8", (n, k // 2), fp4_bytes)
        self.add(f"{stem}.weight_scale", "F8_E4M3", (n, k // 16), _e4m3_scale)
        self.add(f"{stem}.weight_scale_2", "F32", (), _global_scale)
        self.add(f"{stem}.input_scale", "F32", (), _global_scale)


# -- DeepSeek-V3 (and R1-FP4, its NVFP4 release) --------------------------------------------------


def _deepseek_v3(c: dict, *, nvfp4: bool = False) -> list[Planned]:
    t = _Tensors()
    h, nh, v = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    nope, rope, vd, qr, kr = (
        c["qk_nope_head_dim"],
        c["qk_rope_head_dim"],
        c["v_head_dim"],
        c["q_lora_rank"],
        c["kv_lora_rank"],
    )
    layers, mtp, dense = (
        c["num_hidden_layers"],
        c["num_nextn_predict_layers"],
        c["first_k_dense_replace"],
    )
    experts, mi, shared = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"]
    fp8 = (
        "quantization_config" in c and not nvfp4
    )  # neither: a BF16 checkpoint (the -bf16 conversions)
    attn = None if fp8 else t.bf16  # R1-FP4 keeps attention in BF16

    def linear(stem: str, n: int, k: int, *, quantized_in_fp4: bool = True) -> None:
        if nvfp4 and quantized_in_fp4:
            t.nvfp4(stem, n, k)
        elif fp8:
            t.fp8(stem, n, k)
        else:
            t.bf16(f"{stem}.weight", n, k)

    t.bf16("model.embed_tokens.weight", v, h)
    for layer in range(layers + mtp):
        p = f"model.layers.{layer}"
        is_mtp = layer >= layers
        # the MTP layer's own tensors (BF16: the NVFP4 release leaves the whole layer unquantized)
        if is_mtp:
            t.bf16(f"{p}.embed_tokens.weight", v, h)
            t.bf16(f"{p}.enorm.weight", h)
            t.bf16(f"{p}.hnorm.weight", h)
            t.bf16(f"{p}.eh_proj.weight", h, 2 * h)
            t.bf16(f"{p}.shared_head.norm.weight", h)
            t.bf16(f"{p}.shared_head.head.weight", v, h)
        q4 = not is_mtp  # what NVFP4 quantizes: the MLPs of the main layers
        t.bf16(f"{p}.input_layernorm.weight", h)
        t.bf16(f"{p}.post_attention_layernorm.weight", h)
        s = f"{p}.self_attn"
        for stem, n, k in (
            (f"{s}.q_a_proj", qr, h),
            (f"{s}.q_b_proj", nh * (nope + rope), qr),
            (f"{s}.kv_a_proj_with_mqa", kr + rope, h),
            (f"{s}.kv_b_proj", nh * (nope + vd), kr),
            (f"{s}.o_proj", h, nh * vd),
        ):
            if attn is not None:
                attn(f"{stem}.weight", n, k)
            else:
                t.fp8(stem, n, k)
        t.bf16(f"{s}.q_a_layernorm.weight", qr)
        t.bf16(f"{s}.kv_a_layernorm.weight", kr)
        if c.get("index_topk"):  # V3.2's lightning indexer (replicated)
            ih, idim = c["index_n_heads"], c["index_head_dim"]
            t.fp8(f"{s}.indexer.wq_b", ih * idim, qr)
            t.fp8(f"{s}.indexer.wk", idim, h)
            t.add(f"{s}.indexer.k_norm.weight", "F32", (idim,))
            t.add(f"{s}.indexer.k_norm.bias", "F32", (idim,))
            t.bf16(f"{s}.indexer.weights_proj.weight", ih, h)
        m = f"{p}.mlp"
        if layer < dense:
            inter = c["intermediate_size"]
            linear(f"{m}.gate_proj", inter, h, quantized_in_fp4=q4)
            linear(f"{m}.up_proj", inter, h, quantized_in_fp4=q4)
            linear(f"{m}.down_proj", h, inter, quantized_in_fp4=q4)
            continue
        t.bf16(f"{m}.gate.weight", experts, h)
        t.add(f"{m}.gate.e_score_correction_bias", "F32", (experts,))
        for e in range(experts):
            linear(f"{m}.experts.{e}.gate_proj", mi, h, quantized_in_fp4=q4)
            linear(f"{m}.experts.{e}.up_proj", mi, h, quantized_in_fp4=q4)
            linear(f"{m}.experts.{e}.down_proj", h, mi, quantized_in_fp4=q4)
        linear(f"{m}.shared_experts.gate_proj", shared * mi, h, quantized_in_fp4=q4)
        linear(f"{m}.shared_experts.up_proj", shared * mi, h, quantized_in_fp4=q4)
        linear(f"{m}.shared_experts.down_proj", h, shared * mi, quantized_in_fp4=q4)
    t.bf16("model.norm.weight", h)
    t.bf16("lm_head.weight", v, h)
    return t.out


_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "first_k_dense_replace": 3,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}


# -- DeepSeek-V4 ---------------------------------------------------------------------------------


def _deepseek_v4(c: dict) -> list[Planned]:
    t = _Tensors("F8_E8M0")
    h, nh, hd, qr, v = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["head_dim"],
        c["q_lora_rank"],
        c["vocab_size"],
    )
    og, olr, hc = c["o_groups"], c["o_lora_rank"], c["hc_mult"]
    experts, mi, shared = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"]
    ih, idim, ratios = c["index_n_heads"], c["index_head_dim"], c["compress_ratios"]
    fp8 = lambda stem, n, k: t.fp8(stem, n, k, scale=".scale")  # noqa: E731

    def hc_mixers(p: str, parts: tuple[str, ...]) -> None:
        for part in parts:
            t.add(f"{p}.hc_{part}_fn", "F32", ((2 + hc) * hc, hc * h))
            t.add(f"{p}.hc_{part}_base", "F32", ((2 + hc) * hc,))
            t.add(f"{p}.hc_{part}_scale", "F32", (3,))

    def block(p: str, ratio: int, hashed: bool) -> None:
        t.bf16(f"{p}.attn_norm.weight", h)
        t.bf16(f"{p}.ffn_norm.weight", h)
        hc_mixers(p, ("attn", "ffn"))
        a = f"{p}.attn"
        t.add(f"{a}.attn_sink", "F32", (nh,))
        fp8(f"{a}.wq_a", qr, h)
        t.bf16(f"{a}.q_norm.weight", qr)
        fp8(f"{a}.wq_b", nh * hd, qr)
        fp8(f"{a}.wkv", hd, h)
        t.bf16(f"{a}.kv_norm.weight", hd)
        fp8(f"{a}.wo_a", og * olr, nh * hd // og)
        fp8(f"{a}.wo_b", h, og * olr)
        if ratio:
            coff = 2 if ratio == 4 else 1
            t.add(f"{a}.compressor.ape", "F32", (ratio, coff * hd))
            t.bf16(f"{a}.compressor.wkv.weight", coff * hd, h)
            t.bf16(f"{a}.compressor.wgate.weight", coff * hd, h)
            t.bf16(f"{a}.compressor.norm.weight", hd)
        if ratio == 4:
            fp8(f"{a}.indexer.wq_b", ih * idim, qr)
            t.bf16(f"{a}.indexer.weights_proj.weight", ih, h)
            t.add(f"{a}.indexer.compressor.ape", "F32", (4, 2 * idim))
            t.bf16(f"{a}.indexer.compressor.wkv.weight", 2 * idim, h)
            t.bf16(f"{a}.indexer.compressor.wgate.weight", 2 * idim, h)
            t.bf16(f"{a}.indexer.compressor.norm.weight", idim)
        f = f"{p}.ffn"
        t.bf16(f"{f}.gate.weight", experts, h)
        if hashed:
            t.add(f"{f}.gate.tid2eid", "I64", (v, c["num_experts_per_tok"]), _i64(experts))
        else:
            t.add(f"{f}.gate.bias", "F32", (experts,))
        for e in range(experts):
            t.mxfp4(f"{f}.experts.{e}.w1", mi, h)
            t.mxfp4(f"{f}.experts.{e}.w2", h, mi)
            t.mxfp4(f"{f}.experts.{e}.w3", mi, h)
        fp8(f"{f}.shared_experts.w1", shared * mi, h)
        fp8(f"{f}.shared_experts.w2", h, shared * mi)
        fp8(f"{f}.shared_experts.w3", shared * mi, h)

    t.bf16("embed.weight", v, h)
    layers = c["num_hidden_layers"]
    for layer in range(layers):
        block(f"layers.{layer}", ratios[layer], layer < c["num_hash_layers"])
    for k in range(c["num_nextn_predict_layers"]):
        p = f"mtp.{k}"
        block(p, ratios[layers + k], False)
        fp8(f"{p}.e_proj", h, h)
        fp8(f"{p}.h_proj", h, h)
        for norm in ("enorm", "hnorm", "norm"):
            t.bf16(f"{p}.{norm}.weight", h)
        t.add(f"{p}.hc_head_fn", "F32", (hc, hc * h))
        t.add(f"{p}.hc_head_base", "F32", (hc,))
        t.add(f"{p}.hc_head_scale", "F32", (1,))
    t.bf16("norm.weight", h)
    t.add("hc_head_fn", "F32", (hc, hc * h))
    t.add("hc_head_base", "F32", (hc,))
    t.add("hc_head_scale", "F32", (1,))
    t.bf16("head.weight", v, h)
    return t.out


_V4_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "q_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "hc_mult": 4,
    "num_hash_layers": 3,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "num_experts_per_tok": 6,
    "vocab_size": 129280,
    "num_nextn_predict_layers": 1,
    "expert_dtype": "fp4",
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
}


# -- gpt-oss ---------------------------------------------------------------------------------------


def _gpt_oss(c: dict) -> list[Planned]:
    t = _Tensors()
    h, v, e, i = c["hidden_size"], c["vocab_size"], c["num_local_experts"], c["intermediate_size"]
    nq, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    t.bf16("model.embed_tokens.weight", v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        t.bf16(f"{p}.input_layernorm.weight", h)
        t.bf16(f"{p}.post_attention_layernorm.weight", h)
        for proj, rows in (("q_proj", nq * d), ("k_proj", nkv * d), ("v_proj", nkv * d)):
            t.bf16(f"{p}.self_attn.{proj}.weight", rows, h)
            t.bf16(f"{p}.self_attn.{proj}.bias", rows)
        t.bf16(f"{p}.self_attn.o_proj.weight", h, nq * d)
        t.bf16(f"{p}.self_attn.o_proj.bias", h)
        t.bf16(f"{p}.self_attn.sinks", nq)
        m = f"{p}.mlp"
        t.bf16(f"{m}.router.weight", e, h)
        t.bf16(f"{m}.router.bias", e)
        t.add(f"{m}.experts.gate_up_proj_blocks", "U8", (e, 2 * i, h // 32, 16))
        t.add(f"{m}.experts.gate_up_proj_scales", "U8", (e, 2 * i, h // 32), e8m0_bytes)
        t.bf16(f"{m}.experts.gate_up_proj_bias", e, 2 * i)
        t.add(f"{m}.experts.down_proj_blocks", "U8", (e, h, i // 32, 16))
        t.add(f"{m}.experts.down_proj_scales", "U8", (e, h, i // 32), e8m0_bytes)
        t.bf16(f"{m}.experts.down_proj_bias", e, h)
    t.bf16("model.norm.weight", h)
    t.bf16("lm_head.weight", v, h)
    return t.out


_GPT_OSS_CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "attention_bias": True,
    "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}


# -- Qwen3(-MoE) FP8 and Llama ---------------------------------------------------------------------


def _qwen3(c: dict, *, scale_dtype: str = "F32") -> list[Planned]:
    t = _Tensors(scale_dtype)
    h, v, nq, nkv, d = (
        c["hidden_size"],
        c["vocab_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )
    quantized = "quantization_config" in c
    lin = (
        (lambda stem, n, k: t.fp8(stem, n, k))
        if quantized
        else (lambda stem, n, k: t.bf16(f"{stem}.weight", n, k))
    )
    t.bf16("model.embed_tokens.weight", v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        t.bf16(f"{p}.input_layernorm.weight", h)
        t.bf16(f"{p}.post_attention_layernorm.weight", h)
        a = f"{p}.self_attn"
        lin(f"{a}.q_proj", nq * d, h)
        lin(f"{a}.k_proj", nkv * d, h)
        lin(f"{a}.v_proj", nkv * d, h)
        lin(f"{a}.o_proj", h, nq * d)
        if c["model_type"].startswith("qwen3"):
            t.bf16(f"{a}.q_norm.weight", d)
            t.bf16(f"{a}.k_norm.weight", d)
        m = f"{p}.mlp"
        if c.get("num_experts"):
            t.bf16(f"{m}.gate.weight", c["num_experts"], h)
            for e in range(c["num_experts"]):
                lin(f"{m}.experts.{e}.gate_proj", c["moe_intermediate_size"], h)
                lin(f"{m}.experts.{e}.up_proj", c["moe_intermediate_size"], h)
                lin(f"{m}.experts.{e}.down_proj", h, c["moe_intermediate_size"])
        else:
            lin(f"{m}.gate_proj", c["intermediate_size"], h)
            lin(f"{m}.up_proj", c["intermediate_size"], h)
            lin(f"{m}.down_proj", h, c["intermediate_size"])
    t.bf16("model.norm.weight", h)
    if not c.get("tie_word_embeddings"):
        t.bf16("lm_head.weight", v, h)
    return t.out


_QWEN3_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1536,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}


_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


# -- many tiny tensors (per-tensor cost)
# ------------------------------------------------------------


def _many(c: dict) -> list[Planned]:
    """``tpload_tensors`` tiny 8x8 BF16 tensors, whole on every rank (the catch-all rule), in layers
    of 100 like a real model's names: what per-tensor bookkeeping costs, apart from bytes."""
    t = _Tensors()
    for k in range(c["tpload_tensors"]):
        t.bf16(f"model.layers.{k // 100}.extra.{k % 100}.weight", 8, 8)
    return t.out


# -- presets ---------------------------------------------------------------------------------------

NVFP4_QUANT = {
    "producer": {"name": "modelopt"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": 16,
        "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.61*"],
    },
}


@dataclass(frozen=True)
class Published:
    """One family at one size: its config.json, its tensors, and how its files are named."""

    family: str
    config: dict
    tensors: Callable[[dict], list[Planned]]
    shards: int = 2
    shard_name: str = "model-{k:05d}-of-{n:05d}.safetensors"
    extra: dict[str, dict] = field(default_factory=dict)
    """Other JSON files beside config.json (``hf_quant_config.json``)."""
    headers_only: bool = False
    """Only headers and index; the data are holes (a ``full`` size)."""

    def planned(self) -> list[Planned]:
        return self.tensors(self.config)


_V3_TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=512,
    num_hidden_layers=2,
    first_k_dense_replace=1,
    n_routed_experts=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    q_lora_rank=128,
    kv_lora_rank=128,
    vocab_size=512,
    index_topk=64,
    index_n_heads=4,
    index_head_dim=128,
    architectures=["DeepseekV32ForCausalLM"],
    model_type="deepseek_v32",
)
_V3_DEEP = dict(
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=128,
    vocab_size=1024,
)


# A BF16 DeepSeek-V3 that vLLM's CPU build runs: MLA at the dimensions its CPU attention takes
# (kv_lora_rank 512, rope 64), one expert group, and the MTP layer vLLM skips.
_V3_VLLM = dict(
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=256,
    num_hidden_layers=2,
    first_k_dense_replace=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=512,
    qk_nope_head_dim=64,
    qk_rope_head_dim=64,
    v_head_dim=64,
    vocab_size=512,
    max_position_embeddings=256,
)


def _config(base: dict, **dims: object) -> dict:
    """A family's config.json with some dimensions changed (a fresh copy: presets never share
    one)."""
    return {**copy.deepcopy(base), **dims}


def _bf16_config(base: dict, **dims: object) -> dict:
    """``base`` with some dimensions changed and no ``quantization_config``."""
    c = _config(base, **dims)
    del c["quantization_config"]
    return c


def _v3_nvfp4_config(**dims: object) -> dict:
    return _bf16_config(
        _V3_CONFIG, **dims
    )  # the NVFP4 release says its quantization in hf_quant_config.json


PUBLISHED: dict[str, Callable[[], Published]] = {
    "deepseek-v3-tiny": lambda: Published(
        "deepseek-v3", _config(_V3_CONFIG, **_V3_TINY), _deepseek_v3
    ),
    "deepseek-v3-bf16-tiny": lambda: Published(
        "deepseek-v3", _bf16_config(_V3_CONFIG, **_V3_VLLM), _deepseek_v3
    ),
    "deepseek-v3-deep": lambda: Published(
        "deepseek-v3", _config(_V3_CONFIG, **_V3_DEEP), _deepseek_v3, shards=8
    ),
    "deepseek-v3-full": lambda: Published(
        "deepseek-v3",
        _config(_V3_CONFIG),
        _deepseek_v3,
        shards=163,
        shard_name="model-{k:05d}-of-{n:06d}.safetensors",
        headers_only=True,
    ),
    "deepseek-v4-tiny": lambda: Published(
        "deepseek-v4",
        _config(
            _V4_CONFIG,
            hidden_size=256,
            num_hidden_layers=3,
            num_attention_heads=8,
            head_dim=128,
            q_lora_rank=128,
            o_groups=4,
            o_lora_rank=128,
            index_n_heads=4,
            index_head_dim=128,
            hc_mult=4,
            num_hash_layers=1,
            n_routed_experts=8,
            moe_intermediate_size=512,
            num_experts_per_tok=2,
            vocab_size=512,
            compress_ratios=[0, 4, 128, 0],
        ),
        _deepseek_v4,
    ),
    "deepseek-v4-full": lambda: Published(
        "deepseek-v4", _config(_V4_CONFIG), _deepseek_v4, shards=46, headers_only=True
    ),
    "gpt-oss-tiny": lambda: Published(
        "gpt-oss",
        _config(
            _GPT_OSS_CONFIG,
            hidden_size=256,
            intermediate_size=352,
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            vocab_size=512,
        ),
        _gpt_oss,
    ),
    "gpt-oss-full": lambda: Published(
        "gpt-oss",
        _config(_GPT_OSS_CONFIG),
        _gpt_oss,
        shards=15,
        shard_name="model-{k0:05d}-of-{n_minus_1:05d}.safetensors",
        headers_only=True,
    ),
    "qwen3-fp8-tiny": lambda: Published(
        "qwen3-fp8",
        _config(
            _QWEN3_CONFIG,
            hidden_size=256,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=128,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=512,
            vocab_size=512,
        ),
        lambda c: _qwen3(c, scale_dtype="BF16"),
    ),
    "qwen3-fp8-full": lambda: Published(
        "qwen3-fp8", _config(_QWEN3_CONFIG), _qwen3, shards=48, headers_only=True
    ),
    "nvfp4-tiny": lambda: Published(
        "nvfp4",
        _v3_nvfp4_config(**{**_V3_TINY, "index_topk": 0}),
        lambda c: _deepseek_v3(c, nvfp4=True),
        extra={"hf_quant_config.json": NVFP4_QUANT},
    ),
    "nvfp4-full": lambda: Published(
        "nvfp4",
        _v3_nvfp4_config(),
        lambda c: _deepseek_v3(c, nvfp4=True),
        shards=163,
        extra={"hf_quant_config.json": NVFP4_QUANT},
        headers_only=True,
    ),
    "llama-tiny": lambda: Published(
        "llama",
        _config(
            _LLAMA_CONFIG,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            vocab_size=512,
        ),
        _qwen3,
    ),
    "many-tensors": lambda: Published(
        "llama", _config(_LLAMA_CONFIG, tpload_tensors=10_000), _many, shards=4
    ),
}
"""Every published-layout preset, by name (``synth --preset NAME``)."""


def write_published(
    out_dir: str | os.PathLike,
    name: str,
    *,
    seed: int = 0,
    manifest: bool = True,
    tensors: int | None = None,
    progress: Meter | None = None,
) -> Path:
    """Write preset ``name`` into ``out_dir`` (new or empty): shards, index, config.json (and any
    quantization file), and NATIVE_MANIFEST.json when ``manifest`` (never for a headers-only one).
    ``tensors``: how many tiny tensors ``many-tensors`` has (default 10,000); ``progress``: the
    command's meter, told of each tensor as it is written."""
    pub = PUBLISHED[name]()
    if tensors is not None:
        if "tpload_tensors" not in pub.config:
            raise CheckpointError(
                f"preset {name} has a fixed tensor count (only many-tensors takes one)"
            )
        pub = replace(pub, config={**pub.config, "tpload_tensors": tensors})
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(
            f"{escape_name(root)}: not an empty folder; synth writes only into a new or empty one"
        )
    root.mkdir(parents=True, exist_ok=True)
    planned = pub.planned()
    groups = split_shards(planned, pub.shards)
    sink = (  # headers-only: no data written, nothing to wait for
        progress(sum(t.nbytes for t in planned), len(planned), "writing")
        if progress and not pub.headers_only
        else None
    )
    weight_map, entries, total = {}, {}, 0
    for k, group in enumerate(groups, 1):
        file = pub.shard_name.format(
            k=k, k0=k - 1, n=len(groups), n_minus_1=len(groups) - 1
        )  # gpt-oss counts from 0
        digests = (
            _write_headers_only(root / file, group)
            if pub.headers_only
            else write_safetensors(
                root / file,
                [(t.name, t.dtype, t.shape) for t in group],
                lambda n, by={t.name: t for t in group}: chunks(by[n], seed),
                {"format": "pt", "writer": "tpload.synth"},
                sink,
            )
        )
        for t in group:
            weight_map[t.name] = file
            entries[t.name] = {
                "file": file,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "sha256": digests.get(t.name),
            }
            total += t.nbytes
    if sink is not None:
        sink.close()
    index = {
        "metadata": {"total_size": total} | ({HEADERS_ONLY_KEY: "1"} if pub.headers_only else {}),
        "weight_map": weight_map,
    }
    (root / INDEX_NAME).write_text(json.dumps(index, indent=1))
    (root / "config.json").write_text(json.dumps(pub.config, indent=1))
    for file, doc in pub.extra.items():
        (root / file).write_text(json.dumps(doc, indent=1))
    if manifest and not pub.headers_only:  # pinning the JSON files as `tpload manifest` does
        doc = {"format": 1, **pins_doc(root), "tensors": entries}
        (root / MANIFEST_NAME).write_text(json.dumps(doc, indent=1))
    return root


def _write_headers_only(path: Path, tensors: list[Planned]) -> dict[str, str]:
    """A safetensors file whose header is real and whose data are a hole of the right size."""
    header: dict[str, object] = {
        "__metadata__": {"format": "pt", "writer": "tpload.synth", HEADERS_ONLY_KEY: "1"}
    }
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)  # sparse: no block is written for the data
    return {}


def cached_published(
    name: str, *, tensors: int | None = None, cache_dir: str | os.PathLike | None = None
) -> Path:
    """Preset ``name``'s checkpoint (with its manifest) under the user cache, written once (the
    bench's ``--preset``; ``tensors`` as in :func:`write_published`). Only presets with data: not a
    ``full`` one."""
    if PUBLISHED[name]().headers_only:
        raise CheckpointError(
            f"preset {name} is headers only (no data to load); use a tiny or deep preset"
        )
    base = Path(cache_dir) if cache_dir else cache_root()
    key = f"published-{name}" + (f"-tensors{tensors}" if tensors is not None else "")
    return cached(
        cache_folder(base, key), lambda tmp: write_published(tmp, name, tensors=tensors), what=name
    )


def loadable_presets() -> list[str]:
    """The published presets with data (tiny, deep, many-tensors): the ones a load or the bench can
    read."""
    return [name for name, make in PUBLISHED.items() if not make().headers_only]


def tensor_count(name: str) -> tuple[int, int]:
    """(tensors, bytes) of a preset, from its plan alone (no file written)."""
    planned = PUBLISHED[name]().planned()
    return len(planned), sum(t.nbytes for t in planned)


__all__ = [
    "PUBLISHED",
    "Published",
    "cached_published",
    "loadable_presets",
    "tensor_count",
    "write_published",
]
