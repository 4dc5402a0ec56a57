"""Synthetic native checkpoints (format.md, bit-exact) for tests, the demo and the bench.

The writer is our own, not safetensors', because it must stream: a seed-size
checkpoint is gigabytes, and each tensor is generated, hashed for the
manifest and written one row chunk at a time. Values are random but legal
(no E8M0 0x00/0xFF, no E4M3 NaN codes, no bf16 overflow on decode) and a
pure function of (seed, tensor name), so the same spec always gives the same
bytes whatever the shard count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..codecs.fp4_e8m0 import GROUP as FP4_GROUP
from ..model.bounds import SEED
from ..model.errors import CheckpointError, OptionsError
from ..model.meta import ITEMSIZE
from ..model.text import escape_name
from ..model.values import INDEX_NAME, MANIFEST_NAME
from ..options.rules import not_a_folder
from ..storage.files import atomic_write
from ..storage.pins import pins_doc
from ..storage.safetensors import write_safetensors

if TYPE_CHECKING:  # annotations only: report/ imports torch, which synth does not need
    from ..model.progress import Meter, ProgressSink

CHUNK_BYTES = 32 << 20
log = logging.getLogger("tpload")


@dataclass(frozen=True)
class SynthSpec:
    """The shape of a synthetic checkpoint of the reference (DeepSeek-V4 MTP) layout."""

    hidden: int = 256
    """H: model width (K of w1/w3, N of w2)."""
    inter: int = 256
    """I: expert intermediate size (the tensor-parallel channel dimension)."""
    experts: int = 8
    """Routed experts per MTP stage."""
    stages: int = 1
    """MTP stages (``mtp.{stage}``)."""
    vocab: int = 512
    """Rows of ``head.weight`` (vocabulary-parallel)."""
    block: int = 32
    """Dense FP8 scale block B (32: V4.1 style; 128: V4-Flash / V3 style)."""
    shards: int = 2
    """How many ``*.safetensors`` files the tensors are spread over."""
    seed: int = 0
    """Seed of every tensor's values."""

    def __post_init__(self) -> None:
        if self.hidden % (2 * FP4_GROUP) or self.inter % (2 * FP4_GROUP):
            raise ValueError(
                f"hidden {self.hidden} and inter {self.inter} must be multiples of {2 * FP4_GROUP}"
            )
        counts = ("experts", self.experts), ("stages", self.stages), ("vocab", self.vocab)
        for field, n in (*counts, ("block", self.block), ("shards", self.shards)):
            if n < 1:
                raise ValueError(f"{field} must be >= 1, got {n}")
        if why := SEED.problem(self.seed):
            raise ValueError(f"seed {why}")


PRESETS: dict[str, SynthSpec] = {
    "small": SynthSpec(),
    # The reference layout with fewer experts and a short vocabulary: ~1.8 GB.
    "medium": SynthSpec(hidden=5120, inter=2304, experts=80, vocab=16384, shards=4),
    # One full MTP stage of the seed model: 128 experts (~2.4 GB packed), full head.
    "seed": SynthSpec(hidden=5120, inter=2304, experts=128, vocab=129280, shards=8),
}

# A generator fills a [rows, cols] block of one tensor given an rng; returns raw bytes.
Fill = Callable[[np.random.Generator, int, int], np.ndarray]


def fp4_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    result: np.ndarray = np.frombuffer(rng.bytes(rows * cols), dtype=np.uint8)
    return result


def e8m0_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    # 2^-9 .. 2^3: a realistic range that can never overflow bf16 on decode.
    result: np.ndarray = rng.integers(118, 131, rows * cols, dtype=np.uint8)
    return result


def e4m3_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    b = np.frombuffer(rng.bytes(rows * cols), dtype=np.uint8).copy()
    b[(b & 0x7F) == 0x7F] ^= 1  # NaN codes 0x7F/0xFF -> 0x7E/0xFE (448 / -448)
    result: np.ndarray = b
    return result


def bf16_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    # Random sign, exponent 2^-7..2^-1, random mantissa: built as bits, no float math.
    n = rows * cols
    bits = (
        (rng.integers(0, 2, n, dtype=np.uint16) << 15)
        | (rng.integers(120, 127, n, dtype=np.uint16) << 7)
        | rng.integers(0, 128, n, dtype=np.uint16)
    )
    result: np.ndarray = bits.view(np.uint8)
    return result


def f32_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    result: np.ndarray = rng.standard_normal(rows * cols, dtype=np.float32).view(np.uint8)
    return result


def _f16_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    result: np.ndarray = (
        (1.0 + 0.1 * rng.standard_normal(rows * cols)).astype(np.float16).view(np.uint8)
    )
    return result


@dataclass(frozen=True)
class Planned:
    name: str
    dtype: str
    shape: tuple[int, ...]
    fill: Fill

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


def planned_tensors(spec: SynthSpec) -> list[Planned]:
    """Every tensor of the reference layout, in a stable order."""
    h, i, e, b = spec.hidden, spec.inter, spec.experts, spec.block
    cdiv: Callable[[int, int], int] = lambda a, d: -(-a // d)  # noqa: E731
    out: list[Planned] = []

    def fp8(name: str, n: int, k: int) -> None:
        out.append(Planned(f"{name}.weight", "F8_E4M3", (n, k), e4m3_bytes))
        out.append(Planned(f"{name}.scale", "F8_E8M0", (cdiv(n, b), cdiv(k, b)), e8m0_bytes))

    def fp4(name: str, n: int, k: int) -> None:
        out.append(Planned(f"{name}.weight", "I8", (n, k // 2), fp4_bytes))
        out.append(Planned(f"{name}.scale", "F8_E8M0", (n, k // FP4_GROUP), e8m0_bytes))

    for s in range(spec.stages):
        p = f"mtp.{s}"
        out.append(Planned(f"{p}.enorm.weight", "BF16", (h,), bf16_bytes))
        out.append(Planned(f"{p}.hnorm.weight", "BF16", (h,), bf16_bytes))
        fp8(f"{p}.eh_proj", h, 2 * h)
        out.append(Planned(f"{p}.norm.weight", "F16", (h,), _f16_bytes))
        out.append(Planned(f"{p}.ffn.gate.weight", "BF16", (e, h), bf16_bytes))
        out.append(Planned(f"{p}.ffn.gate.bias", "F32", (e,), f32_bytes))
        for x in range(e):
            fp4(f"{p}.ffn.experts.{x}.w1", i, h)
            fp4(f"{p}.ffn.experts.{x}.w2", h, i)
            fp4(f"{p}.ffn.experts.{x}.w3", i, h)
        fp8(f"{p}.ffn.shared_experts.w1", i, h)
        fp8(f"{p}.ffn.shared_experts.w2", h, i)
        fp8(f"{p}.ffn.shared_experts.w3", i, h)
    out.append(Planned("head.weight", "BF16", (spec.vocab, h), bf16_bytes))
    return out


def chunks(t: Planned, seed: int) -> Iterator[np.ndarray]:
    """The tensor's bytes, a few row blocks at a time (bounded memory)."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    rows = t.shape[0] if len(t.shape) > 1 else 1
    cols = math.prod(t.shape) // rows if rows else 0
    step = max(1, CHUNK_BYTES // max(1, cols * ITEMSIZE[t.dtype]))
    for r0 in range(0, rows, step):
        yield t.fill(rng, min(step, rows - r0), cols)


def split_shards(tensors: list[Planned], shards: int) -> list[list[Planned]]:
    """Contiguous runs of tensors with about equal bytes each."""
    total = sum(t.nbytes for t in tensors)
    out: list[list[Planned]] = [[] for _ in range(shards)]
    done = 0
    for t in tensors:
        out[min(shards - 1, done * shards // max(total, 1))].append(t)
        done += t.nbytes
    return [s for s in out if s]


def write_shard(
    path: Path, tensors: list[Planned], seed: int, progress: ProgressSink | None = None
) -> dict[str, str]:
    """Write one safetensors file; return {name: sha256 of its stored bytes}."""
    by_name = {t.name: t for t in tensors}
    return write_safetensors(
        path,
        [(t.name, t.dtype, t.shape) for t in tensors],
        lambda name: chunks(by_name[name], seed),
        {"format": "pt", "writer": "tpload.synth"},
        progress,
    )


def write_checkpoint(
    out_dir: str | os.PathLike[str], spec: SynthSpec, *, progress: Meter | None = None
) -> Path:
    """Write shards, index and NATIVE_MANIFEST.json for ``spec`` into ``out_dir`` (new or empty).
    ``progress``: the command's meter, told of each tensor as it is written."""
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(
            f"{escape_name(root)}: not an empty folder; synth writes only into a new or empty one"
        )
    root.mkdir(parents=True, exist_ok=True)
    planned = planned_tensors(spec)
    groups = split_shards(planned, spec.shards)
    sink = progress(sum(t.nbytes for t in planned), len(planned), "writing") if progress else None
    weight_map, manifest, total = {}, {}, 0
    for k, group in enumerate(groups, 1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        digests = write_shard(root / file, group, spec.seed, sink)
        for t in group:
            weight_map[t.name] = file
            manifest[t.name] = {
                "file": file,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "sha256": digests[t.name],
            }
            total += t.nbytes
    if sink is not None:  # (a failed write leaves it to the collector: tqdm's bar closes then)
        sink.close()
    atomic_write(
        root / INDEX_NAME,
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1),
    )
    # pinning what the load checks (the index), as `tpload manifest` does (storage/pins.py)
    doc = {"format": 1, **pins_doc(root), "tensors": manifest}
    atomic_write(root / MANIFEST_NAME, json.dumps(doc, indent=1))
    atomic_write(root / "tpload_synth.json", json.dumps(asdict(spec)))
    return root


HUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
"""A hub repository id, ORG/NAME (no other slash, no leading dot: it names a folder of the
cache)."""


def write_hub(cache: str | os.PathLike[str], repo: str, write: Callable[[Path], Path]) -> Path:
    """A checkpoint laid out as a hub cache of ``repo`` under ``cache`` (blobs, snapshots/REV, refs;
    no manifest): ``write(folder)`` writes it into a temporary folder, then it moves in. Returns the
    snapshot folder. A cache that holds ``repo`` already is refused before anything is written
    (it would mix two writes' blobs under one snapshot)."""
    from ..storage.hub import to_hub_cache

    if not HUB_REPO.fullmatch(repo) or ".." in repo:
        raise OptionsError(
            f"--hub {escape_name(repo)!r}: expected a repository id ORG/NAME (letters, digits, "
            "'.', '_', '-'; one slash)"
        )
    root = Path(cache)
    if why := not_a_folder(str(root)):
        raise CheckpointError(f"{escape_name(root)}: {why}; --hub writes a hub cache into a folder")
    top = root / f"models--{repo.replace('/', '--')}"
    if top.exists() or top.is_symlink():
        raise CheckpointError(
            f"{escape_name(top)}: this cache already holds {repo}; write it into another folder "
            "(or give another --hub name)"
        )
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".synth-") as tmp:
        return to_hub_cache(write(Path(tmp) / "ckpt"), root, repo)


CACHE_FORMAT = 2
"""The format of the checkpoints cached under :func:`cache_root`, in their folder names: raised
whenever the writers change what a cached folder holds (2: manifests pin the JSON files), so a
folder an older tpload wrote is never reused (:func:`cached` takes any folder that holds a manifest
as done). Older folders are left alone (another install may still use them); delete them at will."""


def cache_folder(base: Path, key: str) -> Path:
    """Where checkpoint ``key`` is cached under ``base``, in this :data:`CACHE_FORMAT`."""
    return base / f"{key}-format{CACHE_FORMAT}"


def write_local_dir(
    out_dir: str | os.PathLike[str], name: str, write: Callable[[Path], Path]
) -> Path:
    """A checkpoint laid out as ``hf download ORG/NAME --local-dir OUT_DIR`` leaves it: ``write``
    writes the files into ``out_dir`` (new or empty; no manifest), then each gets its download
    metadata, written by huggingface_hub's own function (so its format and its freshness rule are
    the library's): a made-up commit of ``name``, and the etag the hub would give the file (the
    sha256 of an LFS file, the git blob SHA-1 of the rest). Returns the folder."""
    try:
        from huggingface_hub._local_folder import write_download_metadata
    except ImportError:
        raise OptionsError(
            "--local-dir writes the download metadata with huggingface_hub's own function, and "
            "huggingface_hub is not installed (pip install huggingface_hub)"
        ) from None
    from ..storage.hub import upload_digest

    root = write(Path(out_dir))
    commit = hashlib.sha1(f"{name}@main".encode()).hexdigest()
    for f in sorted(p for p in root.iterdir() if p.is_file()):
        write_download_metadata(root, f.name, commit, upload_digest(f))
    return root


def cached_checkpoint(spec: SynthSpec, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``spec``'s checkpoint under the user cache, written once (see :func:`cached`)."""
    base = Path(cache_dir) if cache_dir else cache_root()
    key = "-".join(f"{k}{v}" for k, v in asdict(spec).items())
    return cached(
        cache_folder(base, f"synth-{key}"), lambda tmp: write_checkpoint(tmp, spec), what=str(spec)
    )


def cached(final: Path, write: Callable[[Path], object], *, what: str) -> Path:
    """``final``, written once by ``write(tmp)`` if it holds no manifest yet (``final`` names the
    cache's format: :func:`cache_folder`).

    Several ranks (or nodes) may race here: each writes into its own temporary
    folder and renames it into place; the loser's copy is discarded. The bytes
    are a pure function of what is written, so any winner is the right one.
    """
    if (final / MANIFEST_NAME).exists():
        return final
    base = final.parent
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".synth-", dir=base))
    except OSError as e:
        raise CheckpointError(
            f"cannot write the built-in checkpoint under {escape_name(base)} ({e.strerror}); "
            "set TPLOAD_CACHE to a writable folder, or pass --checkpoint DIR"
        ) from None
    log.info("writing the built-in synthetic checkpoint (%s) under %s, once", what, base)
    write(tmp)
    try:
        os.rename(tmp, final)
    except OSError:  # another process won the race (final exists and is complete)
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def cache_root() -> Path:
    """``$TPLOAD_CACHE``, else ``$XDG_CACHE_HOME/tpload``, else ``~/.cache/tpload`` (empty variables
    count as unset, and a relative one too: it would write into whatever folder the job started
    in)."""
    explicit = os.environ.get("TPLOAD_CACHE") or ""
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "tpload"


def spec_from(preset: str, **overrides: int | None) -> SynthSpec:
    """A preset with any non-None field overridden (the CLI's flags)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


def resolve_checkpoint(checkpoint: str | os.PathLike[str] | None) -> str:
    """The command line's checkpoint: the given one, or the built-in small synthetic one (written
    once)."""
    if checkpoint is not None:
        return os.fspath(checkpoint)
    return str(cached_checkpoint(PRESETS["small"]))
