"""Synthetic checkpoints in the layouts the model hub publishes (docs/formats/): every name, dtype,
scale layout and config.json field of a family, at any size.

The families are data beside the configs, ``tpload/configs/presets/*.toml`` (families.py reads
them): each one's published config.json, its tensor list, and its presets. Three sizes per family
(``synth --preset NAME-SIZE``):

* ``tiny``: small dimensions that every tp of 1, 2 and 4 cuts, the real tensor classes;
* ``full``: the published dimensions, written ``--headers-only`` as sparse files (real headers and
  index, holes for data: no disk used); ``plan`` reads them, load/verify/manifest refuse them;
* ``deep`` (DeepSeek-V3 only): every tensor of the real checkpoint (all layers, all 256 experts)
  with dimensions shrunk to the smallest that the 128-block rules allow at tp 2.

This module is the writer: each stored format a list names (``bf16``, ``fp8``, ``nvfp4``...) as the
tensors it stores, their values random but legal for their format, a pure function of (seed, name),
as in synth.py.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..codecs.fp4_e8m0 import GROUP as FP4_GROUP
from ..codecs.nvfp4 import GROUP as NVFP4_GROUP
from ..model.errors import CheckpointError, ConfigError
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME
from ..storage.catalogue import HEADERS_ONLY as HEADERS_ONLY_KEY
from ..storage.files import atomic_file, atomic_write
from ..storage.pins import pins_doc
from ..storage.safetensors import write_safetensors
from . import families

if TYPE_CHECKING:  # annotations only: report/ imports torch, which synth does not need
    from ..model.progress import Meter
from .synth import (
    Fill,
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

FAMILIES = ("deepseek-v3", "deepseek-v4", "gpt-oss", "qwen3-fp8", "nvfp4", "llama")
"""The safetensors families' files under ``tpload/configs/presets/``, in the presets' order."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pos_f32(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Positive F32 scales (2^-10 .. 2^-5): legal block scales that never overflow a decode."""
    result: np.ndarray = (
        rng.uniform(2.0**-10, 2.0**-5, rows * cols).astype(np.float32).view(np.uint8)
    )
    return result


def _pos_bf16(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    n = rows * cols
    result: np.ndarray = (
        (rng.integers(117, 123, n, dtype=np.uint16) << 7) | rng.integers(0, 128, n, dtype=np.uint16)
    ).view(np.uint8)
    return result


def _e4m3_scale(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Positive, finite E4M3 block scales (no NaN code, no sign)."""
    result: np.ndarray = rng.integers(0x20, 0x70, rows * cols, dtype=np.uint8)
    return result


def _global_scale(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    result: np.ndarray = rng.uniform(1e-4, 1e-2, rows * cols).astype(np.float32).view(np.uint8)
    return result


def _i64(high: int) -> Fill:
    return lambda rng, rows, cols: rng.integers(0, high, rows * cols, dtype=np.int64).view(np.uint8)


_SCALE_FILLS = {"F32": _pos_f32, "BF16": _pos_bf16, "F8_E8M0": e8m0_bytes}
"""An FP8 weight's block scales by their dtype: legal, positive, never overflowing a decode."""

_ONE: dict[str, Callable[[dict[str, Any]], tuple[str, Fill]]] = {
    "bf16": lambda scope: ("BF16", bf16_bytes),
    "f32": lambda scope: ("F32", f32_bytes),
    "u8": lambda scope: ("U8", fp4_bytes),  # random bytes: packed FP4
    "e8m0_u8": lambda scope: ("U8", e8m0_bytes),  # E8M0 scales stored as U8 (gpt-oss)
    "i64": lambda scope: ("I64", _i64(scope["below"])),  # indices below ``below``
}
"""Formats of one named tensor: its dtype and values, from the names in its scope."""


def _fp8(stem: str, n: int, k: int, scope: dict[str, Any]) -> list[Planned]:
    """An F8_E4M3 ``[n, k]`` weight and its block scales: the block from config.json's
    ``weight_block_size``, the scale's name and dtype from the family's ``scale_name`` and
    ``scale_dtype``."""
    rows, cols = scope["quantization_config"]["weight_block_size"]
    dtype = scope["scale_dtype"]
    scale = (_cdiv(n, rows), _cdiv(k, cols))
    return [
        Planned(f"{stem}.weight", "F8_E4M3", (n, k), e4m3_bytes),
        Planned(f"{stem}{scope['scale_name']}", dtype, scale, _SCALE_FILLS[dtype]),
    ]


def _mxfp4(stem: str, n: int, k: int, scope: dict[str, Any]) -> list[Planned]:
    """DeepSeek-V4's FP4 experts: I8 ``[n, k/2]`` and E8M0 ``[n, k/group]`` (the codec's group)."""
    return [
        Planned(f"{stem}.weight", "I8", (n, k // 2), fp4_bytes),
        Planned(f"{stem}.scale", "F8_E8M0", (n, k // FP4_GROUP), e8m0_bytes),
    ]


def _nvfp4(stem: str, n: int, k: int, scope: dict[str, Any]) -> list[Planned]:
    """ModelOpt NVFP4: U8 ``[n, k/2]``, E4M3 ``[n, k/group]`` (the codec's group), two F32
    scalars."""
    return [
        Planned(f"{stem}.weight", "U8", (n, k // 2), fp4_bytes),
        Planned(f"{stem}.weight_scale", "F8_E4M3", (n, k // NVFP4_GROUP), _e4m3_scale),
        Planned(f"{stem}.weight_scale_2", "F32", (), _global_scale),
        Planned(f"{stem}.input_scale", "F32", (), _global_scale),
    ]


_LINEAR: dict[str, Callable[..., list[Planned]]] = {"fp8": _fp8, "mxfp4": _mxfp4, "nvfp4": _nvfp4}
"""Formats of a linear (a ``stem``): its weight and scales; a linear in ``bf16`` is its
``.weight``."""
FORMATS = (*_ONE, *_LINEAR)
"""The formats a list may name (each bound to its own name in a list's expressions)."""


def _data_of(group: Sequence[Planned], seed: int) -> Callable[[str], Iterator[np.ndarray]]:
    """Each of ``group``'s tensors' bytes, by name (write_safetensors asks one name at a time)."""
    by = {t.name: t for t in group}
    return lambda n: chunks(by[n], seed)


def stored(t: families.Tensor) -> list[Planned]:
    """The tensors a listed one stores, by its format."""
    if t.stem and t.form in _LINEAR:
        return _LINEAR[t.form](t.name, *t.shape, t.scope)
    if t.stem and t.form == "bf16":
        return [Planned(f"{t.name}.weight", "BF16", t.shape, bf16_bytes)]
    if not t.stem and t.form in _ONE:
        dtype, fill = _ONE[t.form](t.scope)
        return [Planned(t.name, dtype, t.shape, fill)]
    what = "a linear's stem" if t.stem else "a tensor"
    raise ConfigError(f"preset data: {t.name}: no format {t.form!r} for {what}")


@dataclass(frozen=True)
class Published:
    """One family at one size: its config.json, its tensors, and how its files are named."""

    family: str
    config: dict[str, Any]
    tensors: str = "tensors"
    """Which of the family's lists (``many``: many-tensors')."""
    shards: int = 2
    deal: bool = False
    """Tensors dealt to the files in turn (tensor k to file k % shards: natural order alternates
    between files), not in contiguous runs."""
    shard_name: str = "model-{k:05d}-of-{n:05d}.safetensors"
    extra: dict[str, dict[str, Any]] = field(default_factory=dict[str, Any])
    """Other JSON files beside config.json (``hf_quant_config.json``)."""
    headers_only: bool = False
    """Only headers and index; the data are holes (a ``full`` size)."""
    knobs: dict[str, Any] = field(default_factory=dict)
    """The preset's writer knobs (``set``), over the family's ``defaults``."""

    def planned(self) -> list[Planned]:
        doc = families.read(self.family)
        scope: dict[str, Any] = {f: f for f in FORMATS} | {"fp4_group": FP4_GROUP}
        scope |= doc.get("defaults", {}) | self.config | self.knobs
        scope["quantized"] = "quantization_config" in self.config
        for key, value in doc.get("let", {}).items():
            scope[key] = families.evaluate(value, scope)
        lists = doc["lists"]
        return [p for t in families.expand(lists[self.tensors], scope, lists) for p in stored(t)]


@functools.cache
def _index() -> dict[str, tuple[str, dict[str, Any]]]:
    """{preset: (its family, its table)} of every family file, in :data:`FAMILIES`' order."""
    return {
        name: (family, preset)
        for family in FAMILIES
        for name, preset in families.read(family).get("presets", {}).items()
    }


_PRESET_KEYS = {
    *("base", "config", "drop", "set", "tensors"),  # its config.json and its tensors
    *("shards", "deal", "shard_name", "files", "headers_only"),  # its files
}
"""What a preset of a safetensors family may say (docs/tools.md, "The presets' data")."""


def _published(name: str) -> Published:
    family, table = _index()[name]
    preset = families.preset(name, table, _PRESET_KEYS)
    doc = families.read(family)
    presets = {n: p for n, (_, p) in _index().items()}
    files = doc.get("files", {})
    return Published(
        family,
        families.published_config(doc, preset, presets),
        tensors=preset.get("tensors", "tensors"),
        shards=preset.get("shards", 2),
        deal=preset.get("deal", False),
        shard_name=preset.get("shard_name", Published.shard_name),
        extra={f: json.loads(files[f]) for f in preset.get("files", ())},
        headers_only=preset.get("headers_only", False),
        knobs=preset.get("set", {}),
    )


PUBLISHED: Mapping[str, Callable[[], Published]] = families.Lazy(
    lambda: {name: functools.partial(_published, name) for name in _index()}
)
"""Every published-layout preset, by name (``synth --preset NAME``): ``PUBLISHED[name]()`` is its
:class:`Published`."""


def write_published(
    out_dir: str | os.PathLike[str],
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
                f"preset {name} has a fixed tensor count (only many-tensors and "
                "many-tensors-alternating take one)"
            )
        pub = replace(pub, config={**pub.config, "tpload_tensors": tensors})
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(
            f"{escape_name(root)}: not an empty folder; synth writes only into a new or empty one"
        )
    root.mkdir(parents=True, exist_ok=True)
    planned = pub.planned()
    groups = (
        [planned[k :: pub.shards] for k in range(min(pub.shards, len(planned)))]
        if pub.deal
        else split_shards(planned, pub.shards)
    )
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
                _data_of(group, seed),
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
    atomic_write(root / INDEX_NAME, json.dumps(index, indent=1))
    atomic_write(root / "config.json", json.dumps(pub.config, indent=1))
    for file, doc in pub.extra.items():
        atomic_write(root / file, json.dumps(doc, indent=1))
    if manifest and not pub.headers_only:  # pinning the JSON files as `tpload manifest` does
        doc = {"format": 1, **pins_doc(root), "tensors": entries}
        atomic_write(root / MANIFEST_NAME, json.dumps(doc, indent=1))
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
    with atomic_file(path) as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)  # sparse: no block is written for the data
    return {}


def cached_published(
    name: str, *, tensors: int | None = None, cache_dir: str | os.PathLike[str] | None = None
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
