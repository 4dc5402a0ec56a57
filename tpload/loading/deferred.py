"""Deferred tensors: not uploaded by the load, located so the model can stream them itself.

A config rule with ``role = "defer"`` (or ``load(defer=...)``) keeps a tensor
out of the arena, for tables too large to hold (n-gram embeddings, a head the
model quantizes on the fly). The load hands back one :class:`DeferredTensor`
per such tensor: where its stored bytes are, what they are, and the sha256 they
must hash to (the manifest's, or for a folder vouched for by whole-file digests,
the one this load took while it hashed the file whole: verification/gate.py), so
:meth:`DeferredTensor.chunks` checks the bytes as the model streams them. A
locator cannot be made without that digest unless the load ran with verify off.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..model.errors import CheckpointError
from ..model.templates import natural_sorted
from ..model.text import escape_name, sha256_mismatch
from ..storage.base import Storage
from ..storage.files import open_regular

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
    """The sha256 the stored bytes must hash to (None only when loaded with verify off)."""
    vouched_by: str = ""
    """What vouches for :attr:`sha256` (the manifest, or a whole-file digest checked in this load);
    empty only with verify off."""
    verified: bool = False
    """Whether tpload hashed these bytes as this tensor's: never during a load (it does not read
    them as one); :meth:`chunks` checks them as the model streams."""

    def __post_init__(self) -> None:
        if self.sha256 is None and self.vouched_by:
            raise CheckpointError(
                f"{escape_name(self.path)}: deferred tensor {escape_name(self.name)}: "
                "no digest to check it against"
            )
        if self.sha256 is not None and not self.vouched_by:
            raise CheckpointError(
                f"{escape_name(self.path)}: deferred tensor {escape_name(self.name)}: "
                "a digest with nothing vouching for it"
            )

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
                    raise CheckpointError(
                        f"{escape_name(self.path)}: tensor {escape_name(self.name)}: file ends "
                        f"{left} bytes early"
                    )
                at += len(data)
                left -= len(data)
                h.update(data)
                yield data
        finally:
            os.close(fd)
        if self.sha256 is not None and h.hexdigest() != self.sha256:
            raise CheckpointError(
                sha256_mismatch(
                    self.path, self.name, h.hexdigest(), self.sha256, vouched_by=self.vouched_by
                )
                + " (the file changed since the load?)"
            )


def locate(
    storage: Storage, digests: Mapping[str, str | None], vouched_by: str
) -> tuple[DeferredTensor, ...]:
    """A locator for each tensor of ``digests`` (name -> the sha256 the gate vouches for, None only
    with verify off), in natural name order."""
    out = []
    for name in natural_sorted(digests):
        s = storage.stored(name)
        meta = storage.catalogue.get(name)
        sha = digests[name]
        out.append(
            DeferredTensor(
                name,
                s.path.absolute(),
                s.offset,
                s.nbytes,
                meta.dtype,
                meta.shape,
                sha,
                vouched_by if sha is not None else "",
            )
        )
    return tuple(out)
