"""Deferred tensors: not uploaded by the load, located so the model can stream them itself.

A config rule with ``role = "defer"`` (or ``load(defer=...)``) keeps a tensor
out of the arena, for tables too large to hold (n-gram embeddings, a head the
model quantizes on the fly). The load hands back one :class:`DeferredTensor`
per such tensor: where its stored bytes are, what they are, and the manifest's
sha256, so the model can check the bytes while it streams them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError
from .storage import Storage
from .storage.catalogue import natural_key, sha256_mismatch
from .storage.files import open_regular
from .text import escape_name

STREAM_CHUNK = 16 << 20


@dataclass(frozen=True)
class DeferredTensor:
    """Where one deferred tensor's stored bytes are."""

    name: str
    """Official tensor name."""
    path: Path
    """Absolute path of the shard file that holds it."""
    offset: int
    """Byte offset of its first stored byte in that file."""
    nbytes: int
    """Byte length of its stored data."""
    dtype: str
    """Stored dtype, safetensors spelling (``BF16``, ``F8_E4M3``...)."""
    shape: tuple[int, ...]
    """Stored shape."""
    sha256: str | None
    """The manifest's sha256 of the stored bytes (None when loaded with verify off and no manifest)."""
    verified: bool = False
    """Whether tpload hashed these bytes: never during a load (it does not read them);
    :meth:`chunks` checks them as the model streams."""

    def chunks(self, chunk_bytes: int = STREAM_CHUNK) -> Iterator[bytes]:
        """The stored bytes in order, ``chunk_bytes`` at a time; raises CheckpointError
        after the last chunk if they do not hash to :attr:`sha256`."""
        h = hashlib.sha256()
        fd = open_regular(self.path, "shard")
        try:
            at, left = self.offset, self.nbytes
            while left:
                data = os.pread(fd, min(chunk_bytes, left), at)
                if not data:
                    raise CheckpointError(f"{escape_name(self.path)}: tensor {escape_name(self.name)}: file ends "
                                          f"{left} bytes early")
                at += len(data)
                left -= len(data)
                h.update(data)
                yield data
        finally:
            os.close(fd)
        if self.sha256 is not None and h.hexdigest() != self.sha256:
            raise CheckpointError(sha256_mismatch(self.path, self.name, h.hexdigest(), self.sha256))


def locate(storage: Storage, names: tuple[str, ...] | list[str]) -> tuple[DeferredTensor, ...]:
    """A locator for each named tensor, in natural name order."""
    out = []
    for name in sorted(names, key=natural_key):
        s = storage.stored(name)
        meta = storage.catalogue.get(name)
        out.append(DeferredTensor(name, s.path.absolute(), s.offset, s.nbytes, meta.dtype, meta.shape, s.sha256))
    return tuple(out)
