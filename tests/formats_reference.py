"""An independent reference for the published families: what each rank must serve, written from
the families' public rules (vLLM's model files, the models' inference code; docs/formats/) with
the safetensors library and ml_dtypes. Shares no code with tpload, nor with its TOML configs.

A rule says how a tensor class is cut: along which axis of its 2-D view, in how many units (heads
or output groups; channels otherwise), whether the units may be shared between ranks (vLLM's
kv-head replication), and whether an uneven split rounds to 32 channels (vLLM's gpt-oss MXFP4).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import safe_open

BLOCK = 128
EXPERT = re.compile(r"\.experts\.(\d+)\.")


@dataclass(frozen=True)
class Split:
    axis: str = ""  # "rows", "cols" or "" (whole)
    units: str = ""  # config.json key counting the units (heads); channels when empty
    share: bool = True  # fewer units than ranks: rank r takes unit r // (tp / units)
    uneven: int = 0  # gpt-oss: per-rank share rounded up to this many channels, last rank the rest
    rows_per_channel: int = 1  # gpt-oss gate_up: two interleaved rows per channel
    expert: str = ""  # "named" (experts.N.), "stacked" (dimension 0), or "" (not an expert)


ROWS, COLS = Split("rows"), Split("cols")
NAMED_ROWS, NAMED_COLS = Split("rows", expert="named"), Split("cols", expert="named")

# Per family: (regex on the name, split); first match wins; no match means whole on every rank.
_DEEPSEEK_V3 = [
    (r"^model\.embed_tokens\.weight$|^lm_head\.weight$", ROWS),
    (r"\.embed_tokens\.weight$|\.shared_head\.head\.weight$", ROWS),  # the MTP layer's own
    (r"self_attn\.(q_b_proj|kv_b_proj)\.weight$", Split("rows", "num_attention_heads")),
    (r"self_attn\.o_proj\.weight$", Split("cols", "num_attention_heads")),
    (r"\.experts\.\d+\.(gate|up)_proj\.weight$", NAMED_ROWS),
    (r"\.experts\.\d+\.down_proj\.weight$", NAMED_COLS),
    (r"mlp\.(shared_experts\.)?(gate|up)_proj\.weight$", ROWS),
    (r"mlp\.(shared_experts\.)?down_proj\.weight$", COLS),
]
_DEEPSEEK_V4 = [
    (r"^(embed|head)\.weight$", ROWS),
    (r"attn\.wq_b\.weight$|attn\.attn_sink$", Split("rows", "num_attention_heads")),
    (r"attn\.wo_a\.weight$", Split("rows", "o_groups", share=False)),
    (r"attn\.wo_b\.weight$", Split("cols", "o_groups", share=False)),
    (r"ffn\.experts\.\d+\.w[13]\.weight$", NAMED_ROWS),
    (r"ffn\.experts\.\d+\.w2\.weight$", NAMED_COLS),
    (r"ffn\.shared_experts\.w[13]\.weight$", ROWS),
    (r"ffn\.shared_experts\.w2\.weight$", COLS),
]
_GPT_OSS = [
    (r"^model\.embed_tokens\.weight$|^lm_head\.weight$", ROWS),
    (r"self_attn\.q_proj\.|self_attn\.sinks$", Split("rows", "num_attention_heads")),
    (r"self_attn\.[kv]_proj\.", Split("rows", "num_key_value_heads")),
    (r"self_attn\.o_proj\.weight$", Split("cols", "num_attention_heads")),
    (
        r"experts\.gate_up_proj_(blocks|scales|bias)$",
        Split("rows", uneven=32, rows_per_channel=2, expert="stacked"),
    ),
    (r"experts\.down_proj_(blocks|scales)$", Split("cols", uneven=32, expert="stacked")),
    (r"experts\.down_proj_bias$", Split(expert="stacked")),
]
_QWEN3 = [
    (r"^model\.embed_tokens\.weight$|^lm_head\.weight$", ROWS),
    (r"self_attn\.q_proj\.weight$", Split("rows", "num_attention_heads")),
    (r"self_attn\.[kv]_proj\.weight$", Split("rows", "num_key_value_heads")),
    (r"self_attn\.o_proj\.weight$", Split("cols", "num_attention_heads")),
    (r"\.experts\.\d+\.(gate|up)_proj\.weight$", NAMED_ROWS),
    (r"\.experts\.\d+\.down_proj\.weight$", NAMED_COLS),
    (r"mlp\.(gate|up)_proj\.weight$", ROWS),
    (r"mlp\.down_proj\.weight$", COLS),
]
RULES = {
    "deepseek-v3": _DEEPSEEK_V3,
    "nvfp4": _DEEPSEEK_V3,
    "deepseek-v4": _DEEPSEEK_V4,
    "gpt-oss": _GPT_OSS,
    "qwen3-fp8": _QWEN3,
    "llama": _QWEN3,
}

# The scale tensors beside a weight, by suffix: (weight suffix, scale suffix, second scale suffix).
_SCALES = [
    (".weight", ".weight_scale_inv", ""),
    (".weight", ".scale", ""),
    (".weight", ".weight_scale", ".weight_scale_2"),
    ("_blocks", "_scales", ""),
]


def split_of(family: str, name: str) -> Split:
    for pattern, split in RULES[family]:
        if re.search(pattern, name):
            return split
    return Split()


def read_all(root: Path) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, list[int]]]:
    """Every tensor's stored bits (unsigned ints of the element's width), dtype and shape; names
    from the index, headers as safetensors writes them (length, JSON)."""
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    arrays, dtypes, shapes = {}, {}, {}
    for file in sorted(set(index.values())):
        with open(root / file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        with safe_open(str(root / file), "np") as f:  # the library agrees on the names
            names = list(f.keys())
        for name in names:
            dtypes[name], shapes[name] = header[name]["dtype"], header[name]["shape"]
            arrays[name] = _raw(root / file, header, name)
    return arrays, dtypes, shapes


_WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def _raw(path: Path, header: dict, name: str) -> np.ndarray:
    """The tensor's stored bytes, shaped (elements of 1, 2, 4 or 8 bytes as unsigned ints)."""
    h = header[name]
    b, e = h["data_offsets"]
    with open(path, "rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
        f.seek(8 + hlen + b)
        data = f.read(e - b)
    width = _WIDTH[h["dtype"]]
    return np.frombuffer(data, dtype=f"<u{width}").reshape(h["shape"] or (1,))


def channel_window(n: int, tp: int, r: int, split: Split, model: dict) -> tuple[int, int] | None:
    """Channels [lo, hi) of n that rank r holds, or None where the family's rule refuses tp."""
    units = int(model[split.units]) if split.units else n
    if split.uneven:
        per = (
            -(-(n // split.rows_per_channel) // tp // split.uneven)
            * split.uneven
            * split.rows_per_channel
        )
        lo = min(r * per, n)
        return (lo, n) if r == tp - 1 else (lo, min(lo + per, n))
    if units < tp:
        if not split.share or tp % units:
            return None
        u = r // (tp // units)
        return u * n // units, (u + 1) * n // units
    if units % tp:
        return None
    return r * n // tp, (r + 1) * n // tp


def _decode_fp8(w: np.ndarray, scale: np.ndarray, scale_dtype: str) -> np.ndarray:
    vals = w.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s = _floats(scale, scale_dtype)
    full = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)[: w.shape[0], : w.shape[1]]
    return vals * full


def _codes(packed: np.ndarray) -> np.ndarray:
    codes = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def _decode_mxfp4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[..., K/2] bytes (or gpt-oss [E, N, K/32, 16] blocks) with [..., K/32] E8M0 -> f32 [...,
    K]."""
    packed = packed.reshape(scale.shape[:-1] + (-1,))
    s = scale.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    with np.errstate(over="ignore"):
        return _codes(packed) * np.repeat(s, 32, axis=-1)


def _decode_nvfp4(packed: np.ndarray, scale: np.ndarray, scale2: np.ndarray) -> np.ndarray:
    s = scale.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    g = scale2.view(np.float32).reshape(())
    with np.errstate(over="ignore"):
        return (_codes(packed) * np.repeat(s, 16, axis=-1)) * g


def _floats(a: np.ndarray, dtype: str) -> np.ndarray:
    view = {
        "F32": np.float32,
        "BF16": ml_dtypes.bfloat16,
        "F16": np.float16,
        "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    }
    return a.view(view[dtype]).astype(np.float32)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def _cut(a: np.ndarray, axis: int, lo: int, hi: int) -> np.ndarray:
    index = [slice(None)] * a.ndim
    index[axis] = slice(lo, hi)
    return a[tuple(index)]


@dataclass
class Family:
    """One miniature read once: its tensors, dtypes, model config, and which names are scales."""

    family: str
    root: Path

    def __post_init__(self) -> None:
        self.arrays, self.dtypes, self.shapes = read_all(self.root)
        self.model = json.loads((self.root / "config.json").read_text())
        self.scales_of: dict[str, tuple[str, ...]] = {}
        for name in self.arrays:
            for suffix, s1, s2 in _SCALES:
                stem = name[: -len(suffix)] if name.endswith(suffix) else None
                if (
                    stem is not None
                    and stem + s1 in self.arrays
                    and (not s2 or stem + s2 in self.arrays)
                ):
                    self.scales_of[name] = (stem + s1,) + ((stem + s2,) if s2 else ())
                    break
        self.scale_names = {s for v in self.scales_of.values() for s in v}

    def held(self, name: str, ep: int, group: int) -> bool:
        """Does ep group ``group`` serve this (named) expert? Group g holds share(E, ep, g)."""
        m = EXPERT.search(name)
        if m is None or ep == 1:
            return True
        count = len({int(x.group(1)) for n in self.arrays if (x := EXPERT.search(n))})
        lo, hi = _share(count, ep, group)
        return lo <= int(m.group(1)) < hi

    def expected(self, tp: int, ep: int, rank: int, kind: str) -> dict[str, np.ndarray]:
        """{served name: expected bits} on ``rank`` of tp x ep (ranks are ep-group major)."""
        group, r = divmod(rank, tp)
        out: dict[str, np.ndarray] = {}
        for name, a in self.arrays.items():
            if name in self.scale_names or not self.held(name, ep, group):
                continue
            split = split_of(self.family, name)
            scales = self.scales_of.get(name, ())
            if split.expert == "stacked" and ep > 1:
                a = a[slice(*_share(a.shape[0], ep, group))]
            out.update(self._served(name, a, scales, split, tp, ep, group, r, kind))
        return out

    def _served(
        self,
        name: str,
        a: np.ndarray,
        scales: tuple[str, ...],
        split: Split,
        tp: int,
        ep: int,
        group: int,
        r: int,
        kind: str,
    ) -> dict[str, np.ndarray]:
        stacked = split.expert == "stacked"
        sc = [self.arrays[s] for s in scales]
        if stacked and ep > 1:
            sc = [s[slice(*_share(s.shape[0], ep, group))] for s in sc]
        base = 1 if stacked else 0  # the 2-D view's first axis
        axis = base + (0 if split.axis == "rows" else 1)
        view_cols = a.shape[base + 1] if a.ndim > base + 1 else 1
        if self.dtypes[name] in ("U8", "I8") and scales:
            view_cols = sc[0].shape[-1] * (16 if len(scales) == 2 else 32)  # elements, not bytes
        n = a.shape[base] if split.axis == "rows" else view_cols
        win = channel_window(n, tp, r, split, self.model) if split.axis else (0, n)
        assert win is not None, f"{name}: the family's rule refuses tp {tp}"
        lo, hi = win
        if kind == "expanded" and scales:
            full = self._decode(name, a, scales, sc)
            return {name: _bf16_bits(_cut(full, axis, lo, hi) if split.axis else full)}
        if not split.axis:
            return {name: a, **{s: x for s, x in zip(scales, sc, strict=True)}}
        served = {name: self._cut_stored(name, a, axis, lo, hi, n)}
        for s, x in zip(scales, sc, strict=True):
            if not self.shapes[s]:
                served[s] = x  # a scalar (NVFP4's weight_scale_2): whole on every rank
                continue
            per = self._scale_group(name, scales, s, axis - base)
            served[s] = _cut(x, axis, lo // per, -(-hi // per))
        return served

    def _cut_stored(
        self, name: str, a: np.ndarray, axis: int, lo: int, hi: int, n: int
    ) -> np.ndarray:
        """A window of the stored elements (packed FP4: bytes of two codes; gpt-oss blocks: 32 a
        block)."""
        if self.dtypes[name] in ("U8", "I8") and axis == a.ndim - 1 and name.endswith(".weight"):
            return _cut(a, axis, lo // 2, hi // 2)
        if name.endswith("_blocks") and axis == 2:
            return _cut(a, axis, lo // 32, hi // 32)
        return _cut(a, axis, lo, hi)

    def _scale_group(self, name: str, scales: tuple[str, ...], scale: str, view_axis: int) -> int:
        if (
            scale.endswith("_scales")
            or scale.endswith(".scale")
            and self.dtypes[name] in ("I8", "U8")
        ):
            return 1 if view_axis == 0 else 32
        if scale.endswith(".weight_scale"):
            return 1 if view_axis == 0 else 16
        return BLOCK

    def _decode(
        self, name: str, a: np.ndarray, scales: tuple[str, ...], sc: list[np.ndarray]
    ) -> np.ndarray:
        if len(scales) == 2:
            return _decode_nvfp4(a.astype(np.uint8), sc[0].astype(np.uint8), sc[1])
        if self.dtypes[name] in ("U8", "I8"):
            return _decode_mxfp4(a.astype(np.uint8), sc[0].astype(np.uint8))
        return _decode_fp8(a.astype(np.uint8), sc[0], self.dtypes[scales[0]])


def _share(n: int, parts: int, k: int) -> tuple[int, int]:
    per = n // parts
    return k * per, n if k == parts - 1 else (k + 1) * per
