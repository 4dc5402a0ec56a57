"""What the gate hands an offline writer: tensors whose bytes it just hashed against their anchor.

The offline exit paths (an export's rank files, the blake3 sidecar) take a :class:`Vouched`, which
only :func:`tpload.verification.gate.at_rest` makes, after every named tensor's sha256 matched the
manifest; a writer cannot be handed digests nothing checked. The digests are held as arrays (one
row per tensor), not one object per tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..model.errors import LoadError


@dataclass(frozen=True)
class Vouched:
    """Tensors checked at rest: their names, sha256 (rows of 32 bytes) and any hash taken along."""

    names: tuple[str, ...]
    sha256: np.ndarray
    """``(len(names), 32)`` uint8: each tensor's sha256, equal to the manifest's."""
    also: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Other hashes of the same bytes (``blake3``), hex, in the order of :attr:`names`."""
    _token: _GateToken | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._token is not _GATE:
            raise LoadError(
                "offline digests are vouched for only by the gate (verification/gate.at_rest)"
            )

    def hexes(self, hash: str) -> dict[str, str]:
        """{name: hex digest} of ``hash`` (``sha256`` or one taken along)."""
        if hash == "sha256":
            return {n: bytes(row).hex() for n, row in zip(self.names, self.sha256, strict=True)}
        return dict(zip(self.names, self.also[hash], strict=True))


class _GateToken:
    """The capability's type: its one instance, :data:`_GATE`, is held by gate.at_rest alone."""


_GATE = _GateToken()
"""Held by gate.at_rest alone (a constructor argument the gate passes; anything else is refused)."""


def vouched(
    names: tuple[str, ...], sha256: Mapping[str, str], also: Mapping[str, Mapping[str, str]]
) -> Vouched:
    """Made by the gate only, after every sha256 matched (gate.at_rest)."""
    rows = np.frombuffer(b"".join(bytes.fromhex(sha256[n]) for n in names), dtype=np.uint8).reshape(
        len(names), 32
    )
    return Vouched(names, rows, {h: tuple(d[n] for n in names) for h, d in also.items()}, _GATE)
