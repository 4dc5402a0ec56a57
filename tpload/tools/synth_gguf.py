"""GGUF presets (``synth --preset deepseek-v3-gguf-tiny``, ``qwen3-moe-gguf-tiny``, and
``deepseek-r1-gguf-full --headers-only``), their tensors and key-values read from
``tpload/configs/presets/gguf.toml`` (families.py). The tiny ones are written with the ``gguf``
package's writer as a split set of 2 files, block bytes random with every f16 super-scale
overwritten by a small finite value, so every block is valid; the full one with our own writer as
sparse files (real headers, holes for data).
"""

from __future__ import annotations

import functools
import math
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..codecs.gguf import BLOCKS as GGUF_BLOCKS
from ..codecs.gguf import SCALE_OFFSETS as GGUF_SCALE_OFFSETS
from ..model.errors import CheckpointError, OptionsError
from ..model.text import escape_name
from ..storage.files import atomic_file
from ..storage.gguf import HEADERS_ONLY_KEY as GGUF_HEADERS_ONLY_KEY
from . import families

Listed = tuple[str, dict[str, object], list[tuple[str, str, tuple[int, ...]]]]
"""A preset: (architecture, key-values, [(name, ggml type, torch-order shape)])."""


_PRESET_KEYS = {"arch", "tensors", "dims", "headers_only", "parts"}


def _preset(name: str) -> Listed:
    """Preset ``name`` of gguf.toml: its architecture's key-values from its dimensions, and its
    tensor list (each ggml type a name of the list's expressions: ``Q6_K if ... else Q4_K``)."""
    doc = families.read("gguf")
    preset = families.preset(name, doc["presets"][name], _PRESET_KEYS)
    arch = preset["arch"]
    scope: dict[str, object] = {t: t for t in ("F32", *GGUF_BLOCKS)} | preset["dims"]
    kv = {f"{arch}.{k}": families.evaluate(v, scope) for k, v in doc["archs"][arch]["kv"].items()}
    lists = doc["lists"]
    tensors = families.expand(lists[preset["tensors"]], scope, lists)
    return arch, kv, [(t.name, t.form, t.shape) for t in tensors]


def _presets(headers_only: bool) -> dict[str, Callable[[], Listed]]:
    presets = families.read("gguf")["presets"]
    return {
        name: functools.partial(_preset, name)
        for name, preset in presets.items()
        if preset.get("headers_only", False) == headers_only
    }


HEADERS_ONLY: Mapping[str, tuple[Callable[[], Listed], int]] = families.Lazy(
    lambda: {
        name: (make, families.read("gguf")["presets"][name]["parts"])
        for name, make in _presets(True).items()
    }
)
"""Full-size presets written as headers only (sparse files, for ``plan``): (tensors, parts)."""


def _nbytes(ggml: str, shape: tuple[int, ...]) -> int:
    per, size = GGUF_BLOCKS.get(ggml, (1, 4))  # F32 is the only other type written here
    return math.prod(shape) // per * size


def write_headers_only(out_dir: str | os.PathLike[str], name: str) -> Path:
    """A full-size GGUF split set whose data are holes: real headers (our own writer, GGUF v3,
    alignment 32, llama.cpp's split keys), each file extended to its size without writing
    (sparse)."""
    from ..storage.gguf import TYPES as GGUF_TYPES

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
        with atomic_file(root / f"{name}-{k + 1:05d}-of-{len(groups):05d}.gguf") as f:
            f.write(head)
            f.truncate(len(head) + offset)
    return root


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


GGUF_PRESETS: Mapping[str, Callable[[], Listed]] = families.Lazy(lambda: _presets(False))
"""Presets with data, written with the ``gguf`` package."""


def _data(rng: np.random.Generator, ggml: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random but valid stored data: F32 values, or blocks whose f16 super-scales are small and
    finite."""
    if ggml == "F32":
        result: np.ndarray = rng.standard_normal(shape, dtype=np.float32)
        return result
    per, size = GGUF_BLOCKS[ggml]
    blocks = rng.integers(0, 256, (math.prod(shape) // per, size), dtype=np.uint8)
    for off in GGUF_SCALE_OFFSETS[ggml]:
        d = rng.uniform(1e-4, 1e-2, blocks.shape[0]).astype(np.float16)
        blocks[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    result = blocks.reshape(shape[:-1] + (shape[-1] // per * size,))
    return result


def write_gguf_preset(
    out_dir: str | os.PathLike[str], name: str, *, seed: int = 0, parts: int = 2
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
