"""What a refresh's version manifest states, as values every floor may hold: a tensor of the
version (:class:`TensorEntry`) and a window an engine rank receives (:class:`WindowEntry`).

refresh/manifest.py reads and writes them as the manifest's canonical bytes; the gate's refresh
strategy (verification/pushed.py) judges a round by them. They stand on the data floor so the gate
reads the manifest's facts without importing anything of refresh/ (import-linter's gate-kernel)."""

from __future__ import annotations

from dataclasses import dataclass

from .values import Box, Triple


@dataclass(frozen=True)
class TensorEntry:
    """A tensor of the version, whole: what the engine's planner classifies and cuts."""

    name: str
    dtype: str
    """Safetensors spelling (``BF16``, ``F32``...)."""
    shape: tuple[int, ...]


@dataclass(frozen=True)
class WindowEntry:
    """One window an engine rank receives: a box of its tensor's bytes seen as ``view``, sent by
    trainer rank ``trainer``, with its fingerprint (the loader's, of the window's bytes as ``[rows,
    row bytes]``) and, at sha256 strength, the sha256 of those bytes."""

    name: str
    view: tuple[int, int]
    box: Box
    trainer: int
    fingerprint: Triple
    sha256: str | None = None

    @property
    def rows(self) -> int:
        return self.box[0][1] - self.box[0][0]

    @property
    def row_bytes(self) -> int:
        return self.box[1][1] - self.box[1][0]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class PushedVersion:
    """What one engine rank verifies of a round: the manifest it took (its sha256, version and
    strength: the handshake's terms), its digest for this rank and this rank's windows."""

    version: int
    sha256: str
    """The sha256 (hex) of the manifest's canonical bytes as received."""
    check: str
    """The strength: ``fingerprint`` or ``sha256``."""
    digest: str
    """This rank's digest, as the trainer computed it."""
    windows: tuple[WindowEntry, ...]
