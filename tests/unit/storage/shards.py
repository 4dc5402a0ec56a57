"""Hand-written safetensors files for the storage tests (no tpload code), and a deadline for
tests whose failure mode is to block forever."""

from __future__ import annotations

import hashlib
import json
import signal
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

INDEX = "model.safetensors.index.json"
MANIFEST = "NATIVE_MANIFEST.json"
ESC = "\x1b[2J"  # clears a terminal when printed raw
EVIL = f"evil{ESC}.weight"
EVIL_SHOWN = "evil\\x1b[2J.weight"  # how a message must show it


def write_raw(path: Path, header: dict | bytes, data: bytes) -> None:
    """A safetensors file from a header (a dict, or raw bytes for malformed JSON) and data bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def f32(n: int, begin: int = 0) -> dict:
    """A header entry for an F32 [n] tensor at ``begin`` of the data."""
    return {"dtype": "F32", "shape": [n], "data_offsets": [begin, begin + 4 * n]}


def write_tensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A well-formed shard of uint8 arrays (stored as U8, in order, no padding between)."""
    header, offset, data = {}, 0, []
    for name, a in tensors.items():
        header[name] = {
            "dtype": "U8",
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
        data.append(a.tobytes())
    write_raw(path, header, b"".join(data))


def write_index(root: Path, wmap: dict) -> None:
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wmap}))


def manifest_entry(file: str, dtype: str, shape: list, data: bytes) -> dict:
    return {
        "file": file,
        "dtype": dtype,
        "shape": shape,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def write_manifest(root: Path, tensors: dict[str, dict]) -> None:
    (root / MANIFEST).write_text(json.dumps({"format": 1, "tensors": tensors}))


def one_tensor_ckpt(root: Path) -> Path:
    """A folder with one shard ``m.safetensors`` holding ``a`` (F32 [2]), its index and manifest."""
    root.mkdir(exist_ok=True)
    write_raw(root / "m.safetensors", {"a": f32(2)}, b"\0" * 8)
    write_index(root, {"a": "m.safetensors"})
    write_manifest(root, {"a": manifest_entry("m.safetensors", "F32", [2], b"\0" * 8)})
    return root


class Deadline(Exception):
    """The code under test blocked past its deadline."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Deadline` in the main thread if the block runs past ``seconds`` (SIGALRM
    interrupts a blocking ``open()`` of a FIFO, which a thread join could not)."""

    def expire(signum: int, frame: object) -> None:
        raise Deadline(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
