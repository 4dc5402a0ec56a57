"""An independent reference: read with the safetensors library, decode with ml_dtypes,
cut windows with the formulas of format.md written out plainly. Shares no code with tpload."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import safe_open


def read_all(root: Path) -> dict[str, np.ndarray]:
    """Every tensor as raw bytes shaped [rows, row_bytes] (safetensors' own reader)."""
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for file in sorted(set(index.values())):
        with safe_open(str(root / file), "pt") as f:
            for name in f.keys():  # noqa: SIM118  a safe_open handle is no mapping: keys() is how it lists its tensors
                t = f.get_tensor(name)
                b = t.contiguous().view(-1).view(__import__("torch").uint8).numpy()
                rows = t.shape[0] if t.dim() > 1 else 1
                out[name] = b.reshape(rows, -1)
    return out


def fp4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes + [N, K/32] E8M0 -> float32 [N, K]; low nibble is the even element."""
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    vals = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    s = scale.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    with np.errstate(over="ignore"):  # scale 254 x |v| >= 2 overflows fp32 too
        return vals * np.repeat(s, 32, axis=1)


def fp8(w: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    vals = w.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s = scale.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[: w.shape[0], : w.shape[1]]
    return vals * full


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def expert_window(name: str, full: np.ndarray, tp: int, r: int) -> np.ndarray:
    """format.md: w1/w3 rows [r*I/tp, (r+1)*I/tp); w2 the same channels on columns."""
    if ".w2." in name:
        k = full.shape[1]
        return full[:, r * k // tp : (r + 1) * k // tp]
    n = full.shape[0]
    return full[r * n // tp : (r + 1) * n // tp]


def expected(root: Path, tp: int, r: int, kind: str, block: int = 32) -> dict[str, np.ndarray]:
    """{name: expected bytes or bf16 bits} for rank r of tp, reference layout, ep 1."""
    raw = read_all(root)
    out: dict[str, np.ndarray] = {}
    for name, b in raw.items():
        if name.endswith(".scale"):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        if ".experts." in name or "shared_experts" in name or "eh_proj" in name:
            s = raw[base + ".scale"]
            full = fp4(b, s) if ".experts." in name else fp8(b, s, block)
            win = (
                expert_window(name, full, tp, r)
                if "eh_proj" not in name
                else full[r * full.shape[0] // tp : (r + 1) * full.shape[0] // tp]
            )
            if kind == "expanded":
                out[name] = bf16_bits(win)
            else:
                # packed: the same windows of the stored bytes
                if ".w2." in name:
                    kb, ks = b.shape[1], s.shape[1]
                    out[name] = b[:, r * kb // tp : (r + 1) * kb // tp]
                    out[base + ".scale"] = s[:, r * ks // tp : (r + 1) * ks // tp]
                else:
                    nb, ns = b.shape[0], s.shape[0]
                    out[name] = b[r * nb // tp : (r + 1) * nb // tp]
                    out[base + ".scale"] = s[r * ns // tp : (r + 1) * ns // tp]
        elif name == "head.weight":
            out[name] = b[r * b.shape[0] // tp : (r + 1) * b.shape[0] // tp]
        elif name.endswith("norm.weight") and name.startswith("mtp.") and ".norm." in name:
            out[name] = bf16_bits(b.view(np.float16).astype(np.float32))  # F16 served as BF16
        else:
            out[name] = b
    return out
